import os
import subprocess
import sys
from dataclasses import fields, replace
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pytest

from specasr.reference import ClipReference
from specasr.rows import run_frames
from specasr.store import RUN_TABLES, SHARED_TABLES, Store, StoreBusyError, StoreError, StoreWriteError, default_db_path
from specasr.stored_metrics import run_summary
from specasr.trace import CodeVersion, DraftStep, Round, Segment, Settings, Timings, Trace, VerifiedToken
from specasr.transfer import export_runs, import_runs
from specasr.words import WordTime

REPO_ROOT = Path(__file__).resolve().parents[1]
CODE = CodeVersion("1.2.3", "0123abcd", False)
SPECULATIVE = Settings(draft="tiny-draft", k=3, runtime_layer=2, tree_nodes=3)  # as a decode resolves them
GREEDY = Settings()


def speculative_trace(clip: str, accepted: list[int], settings: Settings = SPECULATIVE, text: str = "the cat sat up"):
    """Rounds accepting these counts of K proposals. The step at round r and depth d has reference frame 10 r + d
    and draft peak d * r frames off it; accepted steps keep an attention row, and depth 1 a window centre."""
    k, start = settings.k, 0
    rounds, steps = [], []
    for r, count in enumerate(accepted):
        proposed = [100 + r * k + d for d in range(k)]
        rounds.append(Round(r, 0, start, proposed, count, 200 + r, draft_seconds=0.25, verify_seconds=0.5, drafted=k))
        for depth in range(1, k + 1):
            reference, kept = 10 * r + depth, depth <= count
            step = DraftStep(
                r,
                depth,
                proposed[depth - 1],
                accepted=kept,
                draft_peak=reference + depth * r,
                window_centre=reference if depth == 1 else None,
                reference_frame=reference,
                attention=[0.25, 0.5, 0.125] if kept else None,
                node=depth - 1,
                parent=depth - 2 if depth > 1 else None,
                probability=0.5**depth,
            )
            steps.append(step)
        start += count + 1
    tokens = list(range(start - 1))  # the last round's end-of-text is not a transcript token
    return Trace(
        clip,
        settings,
        tokens,
        text,
        clip_hash=f"hash-{clip}",
        clip_seconds=2.5,
        dataset="hand",
        reference_text="the cat sat down",
        code=CODE,
        draft_name="tiny-draft@abcd",
        draft_hash="abcd",
        segments=[Segment(0, 0, 125, 0, len(tokens))],
        reference_frames=[None if p == 0 else 2 * p for p in range(len(tokens))],
        reference_source="pocketsphinx",
        timings=Timings(features=0.125, encoder=0.25, decode=1.0, reference=0.5),
        rounds=rounds,
        steps=steps,
        verified=[VerifiedToken(p, t, [p, p + 1]) for p, t in enumerate(tokens)],
    )


def greedy_trace(clip: str = "g1") -> Trace:
    tokens = [5, 6, 7]
    return Trace(
        clip,
        GREEDY,
        tokens,
        "hello there",
        clip_hash=f"hash-{clip}",
        clip_seconds=1.0,
        dataset="other",
        code=CODE,
        segments=[Segment(0, 0, 50, 0, 3)],
        timings=Timings(features=0.5, encoder=0.25, decode=0.25),
        verified=[VerifiedToken(p, t, [p]) for p, t in enumerate(tokens)],
    )


def row_counts(path: Path, run_id: str) -> dict[str, int]:
    with duckdb.connect(str(path)) as con:
        return {
            table: con.execute(f"SELECT count(*) FROM {table} WHERE run_id = ?", [run_id]).fetchone()[0]
            for table in RUN_TABLES
            if table not in SHARED_TABLES
        }


def test_traces_come_back_equal(store):
    speculative = [speculative_trace("c1", [3, 1, 0, 2]), speculative_trace("c2", [0]), speculative_trace("c1", [2])]
    greedy = [greedy_trace()]
    run = store.write_run(speculative, "bench", repeats=[0, 0, 1])
    greedy_run = store.write_run(greedy, "decode")
    assert store.traces(run) == speculative
    assert store.traces(greedy_run) == greedy
    assert store.traces(greedy_run)[0].reference_frames is None
    with pytest.raises(StoreError, match="no run nonesuch in"):
        store.traces("nonesuch")
    with pytest.raises(KeyError):
        run_summary(store, [run, "nonesuch"])


def test_a_runtime_windows_readout_comes_back(store):
    settings = replace(SPECULATIVE, window="runtime")
    trace = replace(speculative_trace("c1", [2, 1], settings), runtime_peaks=[3, 5, 8, 9])
    assert store.traces(store.write_run([trace], "decode")) == [trace]


def test_runs_written_side_by_side_share_a_batch(store):
    speculative, greedy = [speculative_trace("c1", [3, 1])], [greedy_trace()]
    pair = store.write_runs([(speculative, None), (greedy, None)], "bench")
    alone = store.write_run(greedy, "bench")
    batches = {run.run_id: run.batch for run in store.decoded("bench")}
    assert batches[pair[0]] == batches[pair[1]] != batches[alone]
    assert [store.traces(run) for run in pair] == [speculative, greedy]
    with pytest.raises(ValueError, match="at least one trace"):
        store.write_runs([(greedy, None), ([], None)], "bench")
    assert len(store.runs()) == 3  # the refused batch left nothing, not even its first run


def test_schema_has_a_column_for_every_trace_field(store):
    with duckdb.connect(str(store.path)) as con:
        columns = {
            table: {c for (c,) in con.execute(f"SELECT column_name FROM (DESCRIBE {table})").fetchall()}
            for table in RUN_TABLES
        }
    levels = {"segments": Segment, "rounds": Round, "draft_steps": DraftStep, "verified_tokens": VerifiedToken}
    for table, kind in levels.items():
        assert {f.name for f in fields(kind)} <= columns[table]
    assert {f.name for f in fields(Settings)} | {f.name for f in fields(CodeVersion)} <= columns["runs"]


def test_write_run_refuses_mixed_or_empty_runs(store):
    with pytest.raises(ValueError, match="at least one trace"):
        store.write_run([], "decode")
    with pytest.raises(ValueError, match="share their settings"):
        store.write_run([speculative_trace("c1", [1]), greedy_trace()], "bench")
    with pytest.raises(ValueError, match="repeat numbers"):
        store.write_run([greedy_trace()], "bench", repeats=[0, 1])
    assert store.runs().empty


def test_reference_frames_round_trip(store):
    key = ("hash-c1", "whisper-tiny.en", "cpu", "float32", "pocketsphinx")
    words = [WordTime("the", 0.25, 0.5, True), WordTime("cat", None, None, False)]
    reference = ClipReference("pocketsphinx", [[1, 2], [3]], [10, None, 40], words)
    assert store.reference(*key) is None
    store.save_reference(*key, reference)
    assert store.reference(*key) == reference
    replaced = ClipReference("file", [[]], [], [])
    store.save_reference(*key, replaced)
    assert store.reference(*key) == replaced
    assert store.reference("hash-c2", *key[1:]) is None


def test_delete_run_removes_every_row_of_that_run_only(store):
    kept_traces = [speculative_trace("c1", [2, 1])]
    deleted = store.write_run([speculative_trace("c1", [3]), speculative_trace("c2", [1])], "bench")
    kept = store.write_run(kept_traces, "bench")
    store.delete_run(deleted)
    assert set(row_counts(store.path, deleted).values()) == {0}
    assert store.traces(kept) == kept_traces
    assert store.runs().run_id.tolist() == [kept]
    with duckdb.connect(str(store.path)) as con:
        assert con.execute("SELECT clip_hash FROM clips").fetchall() == [("hash-c1",)]
    with pytest.raises(KeyError, match=deleted):
        store.delete_run(deleted)


def test_default_path_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECASR_DB", str(tmp_path / "elsewhere.duckdb"))
    assert default_db_path() == tmp_path / "elsewhere.duckdb"


# ---------------------------------------------------------------------------------------------------------------------
# Crashes and concurrency

# The writers build their traces with this module's helpers, as the test does.
WRITE_AND_HANG = """
import sys, time
from specasr.rows import run_frames
from specasr.store import Store
from tests.test_store import big_trace
store = Store(sys.argv[1])
traces = [big_trace()]
with store._connect() as con:
    con.begin()
    store._insert_run(con, run_frames("killedrun", traces, "bench", None))
    print("inserted", flush=True)
    time.sleep(600)
"""

WRITE_RUNS = """
import sys
from specasr.store import Store
from tests.test_store import speculative_trace
store = Store(sys.argv[1])
traces = [speculative_trace("c1", [3, 1, 0, 2])]
for run in range(int(sys.argv[2])):
    store.write_run(traces, f"writer {sys.argv[3]} run {run}")
"""


def big_trace() -> Trace:
    """Thousands of rounds, and over a row group of verified tokens, so that DuckDB writes some of the uncommitted
    rows into the file itself."""
    big = speculative_trace("big", [1] * 3000)
    return replace(big, verified=[VerifiedToken(p, 7, [p, p]) for p in range(130_000)])


def start_python(script: str, *args) -> subprocess.Popen:
    command = [sys.executable, "-c", script, *map(str, args)]
    return subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_killed_write_leaves_no_rows(store):
    before = [speculative_trace("c1", [3, 1])]
    kept = store.write_run(before, "decode")
    writer = start_python(WRITE_AND_HANG, store.path)
    try:
        line = writer.stdout.readline()
        assert line == "inserted\n", writer.stderr.read()
        with pytest.raises(StoreBusyError, match="another process is writing"):
            Store(store.path, timeout=0.2)
    finally:
        writer.kill()
        writer.wait()
    assert set(row_counts(store.path, "killedrun").values()) == {0}
    reopened = Store(store.path)
    assert reopened.runs().run_id.tolist() == [kept]
    assert reopened.traces(kept) == before


def test_concurrent_writers_lose_no_run(store):
    trace = speculative_trace("c1", [3, 1, 0, 2])
    writers = [start_python(WRITE_RUNS, store.path, 15, n) for n in range(2)]
    for writer in writers:
        _, stderr = writer.communicate(timeout=300)
        assert writer.returncode == 0, stderr
    history = store.runs()
    assert sorted(history.command) == sorted(f"writer {n} run {run}" for n in range(2) for run in range(15))
    assert (history.decodes == 1).all() and (history.rounds == 4).all() and (history.draft_steps == 12).all()
    for run_id in history.run_id:
        assert store.traces(run_id) == [trace]


def test_a_trace_keeps_what_renders_it_without_a_model(store, tmp_path):
    """Token texts, the runtime layer, the clip's file and, for a clip with no file, its waveform."""
    trace = speculative_trace("c1", [2, 1])
    trace = replace(
        trace,
        token_texts=[f" w{t}" for t in trace.tokens],
        target_runtime_layer=3,
        audio_path="/data/c1.flac",
        steps=[replace(step, text=f" p{step.token}") for step in trace.steps],
    )
    waveform = np.sin(np.arange(16000) / 7).astype(np.float32) * 0.5
    run = store.write_run([trace], "dashboard", audio={trace.clip_hash: waveform})
    assert store.traces(run) == [trace]
    assert np.abs(store.audio(trace.clip_hash) - waveform).max() < 1e-6  # 24-bit FLAC
    assert store.audio("hash-other") is None
    exported = export_runs(store, [run], tmp_path / "export")
    fresh = Store(tmp_path / "fresh.duckdb")
    import_runs(fresh, exported[0].parent)
    assert fresh.traces(run) == [trace] and np.array_equal(fresh.audio(trace.clip_hash), store.audio(trace.clip_hash))
    store.delete_run(run)
    assert store.audio(trace.clip_hash) is None  # no run decodes the clip any more


def test_runs_get_a_name_and_a_note_and_otherwise_a_label_naming_the_clip(store):
    single = store.write_run([speculative_trace("c1", [2])], "dashboard")
    pair = store.write_run([speculative_trace("c1", [1]), speculative_trace("c2", [1])], "experiment")
    labels = dict(zip(store.runs().run_id, store.runs().label, strict=True))
    assert labels == {
        single: "c1: tiny-draft unrestricted K=3 (dashboard)",
        pair: "2 clips: tiny-draft unrestricted K=3 (experiment)",
    }
    store.label_run(single, "  baseline take  ", "before the fix")
    row = store.runs().set_index("run_id").loc[single]
    assert (row["label"], row["name"], row["note"]) == ("baseline take", "baseline take", "before the fix")
    with pytest.raises(KeyError):
        store.label_run("nonesuch", "x", "")


def test_a_store_in_a_folder_that_does_not_exist_is_refused_and_nothing_is_made(tmp_path):
    with pytest.raises(StoreError, match=r"typo does not exist: create it first, or give a store path in a folder"):
        Store(tmp_path / "typo" / "runs.duckdb")
    assert not (tmp_path / "typo").exists()


# ---------------------------------------------------------------------------------------------------------------------
# Writes the file system refuses, and rows left without their run


class FailingCommits:
    """A DuckDB connection whose commits fail as the file system said."""

    def __init__(self, con: duckdb.DuckDBPyConnection, said: str):
        self.con, self.said = con, said

    def __getattr__(self, name):
        return getattr(self.con, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.con.close()

    def commit(self):
        raise duckdb.IOException(f'IO Error: Could not write file "runs.duckdb.wal": {self.said}\n\nmore detail')


def failing_commits(monkeypatch, said: str) -> None:
    connect = duckdb.connect
    monkeypatch.setattr(duckdb, "connect", lambda *args, **kwargs: FailingCommits(connect(*args, **kwargs), said))


WRITES = {
    "write_run": lambda store, run: store.write_run([greedy_trace("g2")], "decode"),
    "label_run": lambda store, run: store.label_run(run, "name", "note"),
    "delete_run": lambda store, run: store.delete_run(run),
    "save_reference": lambda store, run: store.save_reference(
        "hash-c1", "t", "cpu", "float32", "a", ClipReference("file", [[1]], [1], [])
    ),
    "remove_orphans": lambda store, run: store.remove_orphans(),
}


@pytest.mark.parametrize("write", WRITES)
def test_a_full_disk_is_one_line_naming_the_store_and_nothing_is_written(store, monkeypatch, write):
    run = store.write_run([speculative_trace("c1", [2, 1])], "decode")
    before = store.runs()
    failing_commits(monkeypatch, "No space left on device")
    with pytest.raises(StoreWriteError) as refused:
        WRITES[write](store, run)
    assert str(refused.value) == f"cannot write {store.path}: it is on a full disk"
    monkeypatch.undo()
    pd.testing.assert_frame_equal(store.runs(), before)
    assert store.reference("hash-c1", "t", "cpu", "float32", "a") is None


def test_a_refused_permission_is_a_store_write_error(store, monkeypatch):
    failing_commits(monkeypatch, "Permission denied")
    with pytest.raises(StoreWriteError, match=f"cannot write {store.path}: permission denied$"):
        store.write_run([greedy_trace()], "decode")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_store_in_a_read_only_folder_reads_and_refuses_writes_with_one_line(tmp_path):
    folder = tmp_path / "readonly"
    folder.mkdir()
    store = Store(folder / "runs.duckdb")
    run = store.write_run([greedy_trace()], "decode")
    folder.chmod(0o555)
    try:
        reopened = Store(folder / "runs.duckdb")
        assert reopened.traces(run) == [greedy_trace()]
        refused = f"cannot write {reopened.path}: no permission to write in its folder {folder}$"
        with pytest.raises(StoreWriteError, match=refused):
            reopened.write_run([greedy_trace("g2")], "decode")
        with pytest.raises(StoreWriteError, match=f"no permission to write in its folder {folder}$"):
            Store(folder / "new.duckdb")
        assert reopened.runs().run_id.tolist() == [run]
    finally:
        folder.chmod(0o755)


def insert_orphans(path: Path) -> None:
    """Rows a mixed import left before imports were checked: decodes (and their rows) of a run that is not stored,
    a run without decodes, and a clip no decode uses."""
    lost = run_frames("lostrun", [speculative_trace("c7", [1, 2])], "decode", None)
    alone = run_frames("emptyrun", [speculative_trace("c8", [1])], "decode", None)
    with duckdb.connect(str(path)) as con:
        for table, frame in lost.items():
            if table != "runs":
                con.register("frame", frame)
                con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM frame")
        for table in ("runs", "clips"):
            con.register("frame", alone[table])
            con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM frame")


ORPHANED = {"decodes": 1, "runs": 1, "segments": 1, "rounds": 2, "draft_steps": 6, "verified_tokens": 4, "clips": 2}


def test_orphan_rows_are_found_and_removed_in_one_go(store):
    kept = [speculative_trace("c1", [3, 1])]
    run = store.write_run(kept, "decode")
    assert store.orphans() == {}
    insert_orphans(store.path)
    assert store.orphans() == ORPHANED
    assert store.orphans() == ORPHANED  # counting removes nothing
    assert store.remove_orphans() == ORPHANED
    assert store.orphans() == {} and store.remove_orphans() == {}
    assert store.runs().run_id.tolist() == [run] and store.traces(run) == kept


def test_a_run_without_decodes_can_be_shown_and_deleted(store):
    insert_orphans(store.path)
    assert store.traces("emptyrun") == []
    summary = run_summary(store, ["emptyrun"]).iloc[0]
    assert (summary.decodes, summary.clips, summary.tokens, summary.seconds) == (0, 0, 0, 0.0)
    assert "emptyrun" in store.runs().run_id.tolist()
    store.delete_run("emptyrun")
    assert "runs" not in store.orphans()
