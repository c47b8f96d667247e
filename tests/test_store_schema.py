"""A store written by an older specasr opens migrated, with its runs as they were; a newer or foreign file is
refused."""

from dataclasses import replace

import duckdb
import pandas as pd
import pytest

from specasr.migrations import SCHEMA_VERSION, migrate
from specasr.rows import run_frames
from specasr.store import Store, StoreError
from specasr.trace import Trace
from tests.test_store import SPECULATIVE, speculative_trace

SCHEMA_2_ON = ["decoder", "frame_seconds", "batch", "assistant", "graphs"]
SCHEMA_9 = {"decodes": ["token_texts", "target_runtime_layer"], "draft_steps": ["text"], "clips": ["audio_path"]}
SCHEMA_10 = {
    "runs": ["tree_width", "tree_nodes"],
    "rounds": ["drafted"],
    "draft_steps": ["node", "parent", "probability"],
}
SCHEMA_11 = {"runs": ["compile"]}


def before_schema(version: int, frames: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """A run's rows without the columns schema `version` (9, 10 or 11) and later added."""
    later = [columns for start, columns in ((9, SCHEMA_9), (10, SCHEMA_10), (11, SCHEMA_11)) if start >= version]
    return {
        table: frame.drop(columns=[c for cs in later for c in cs.get(table, [])]) for table, frame in frames.items()
    }


def stored_before_trees(trace: Trace) -> Trace:
    """A chain's trace as a store written before draft trees gives it back: the same nodes, no probabilities, and
    steps that were not compiled."""
    settings = replace(trace.settings, tree_nodes=trace.settings.k, compile=False)
    return replace(trace, settings=settings, steps=[replace(step, probability=None) for step in trace.steps])


def test_an_older_schema_is_migrated_on_open(tmp_path):
    path = tmp_path / "old.duckdb"
    old = replace(speculative_trace("c1", [2, 0]), segments=[])  # schema 1 has no segments table
    with duckdb.connect(str(path)) as con:
        migrate(con, 0, target=1)
        for table, frame in run_frames("oldrun", [old], "decode", None).items():
            if table != "segments":
                new_columns = [*SCHEMA_2_ON, "runtime_peaks"]  # nor later ones
                frame = before_schema(9, {table: frame})[table]
                con.register("frame", frame.drop(columns=new_columns, errors="ignore"))
                con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM frame")
    store = Store(path)
    with duckdb.connect(str(path)) as con:
        assert con.execute("SELECT * FROM schema_version").fetchall() == [("specasr", SCHEMA_VERSION)]
        tables = {t for (t,) in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    assert {"segments", "reference_frames"} <= tables
    assert store.runs().run_id.tolist() == ["oldrun"]
    # Its frames are read as 20 ms ones (only Whisper existed then), and a CPU run replayed no graphs.
    assert store.traces("oldrun") == [stored_before_trees(replace(old, settings=replace(old.settings, graphs=False)))]
    assert [run.batch for run in store.decoded("decode")] == [None]


def schema_7_frames(run_id: str, trace: Trace, window: str) -> dict[str, pd.DataFrame]:
    """A run's rows as schema 7 kept them: stored under `window`, an old window name, and without runtime peaks."""
    frames = run_frames(run_id, [trace], "decode", None)
    frames["runs"]["window"] = window
    frames["decodes"] = frames["decodes"].drop(columns="runtime_peaks")
    return before_schema(9, frames)


# The windows' old names, and the traces they come back as: runtime-paced's rule is runtime's now, and the old
# runtime (the last verified peak, at every depth) is runtime-last.
OLD_WINDOWS = {"runtime": "runtime-last", "runtime-paced": "runtime", "unrestricted": "unrestricted"}


def renamed_traces() -> dict[str, Trace]:
    return {
        old: speculative_trace(f"c{i}", [2, 0], replace(SPECULATIVE, window=new))
        for i, (old, new) in enumerate(OLD_WINDOWS.items())
    }


def test_runs_stored_under_the_old_runtime_windows_keep_their_rule(tmp_path):
    path = tmp_path / "old.duckdb"
    traces = renamed_traces()
    with duckdb.connect(str(path)) as con:
        migrate(con, 0, target=7)
        for old, trace in traces.items():
            for table, frame in schema_7_frames(old, trace, old).items():
                con.register("frame", frame)
                con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM frame")
    store = Store(path)
    expected = {old: [stored_before_trees(trace)] for old, trace in traces.items()}
    assert {old: store.traces(old) for old in OLD_WINDOWS} == expected
    assert sorted(store.runs().window) == sorted(OLD_WINDOWS.values())


def test_a_newer_schema_is_refused(store):
    with duckdb.connect(str(store.path)) as con:
        con.execute("UPDATE schema_version SET version = version + 1")
    message = f"newer specasr \\(schema {SCHEMA_VERSION + 1}, this one reads up to {SCHEMA_VERSION}\\)"
    with pytest.raises(StoreError, match=message):
        Store(store.path)


def test_a_foreign_duckdb_file_is_refused(tmp_path):
    path = tmp_path / "other.duckdb"
    with duckdb.connect(str(path)) as con:
        con.execute("CREATE TABLE inventory (item VARCHAR)")
    with pytest.raises(StoreError, match="is not a specasr run store"):
        Store(path)


def test_a_file_that_is_not_a_database_is_refused_and_left_untouched(tmp_path):
    path = tmp_path / "notes.duckdb"
    content = b"these are my notes, not a database\n" * 200
    path.write_bytes(content)
    refusal = r"notes\.duckdb is not a run store: it is not a DuckDB database; give"
    with pytest.raises(StoreError, match=refusal) as refused:
        Store(path)
    assert "IO Error" not in str(refused.value)  # the store's own words, never DuckDB's
    assert path.read_bytes() == content
    assert list(tmp_path.iterdir()) == [path]
