"""Result first, store second: a command prints (or saves) its result whatever becomes of the store write, and the
runs command repairs and exports a store without surprises."""

import json
import os
import subprocess
import sys

import pytest
from test_experiments import hand_trace

from specasr.cli import main
from specasr.dataset import DEFAULT_SPEECH_DIR
from specasr.store import LEVEL_TABLES, Store, StoreError
from specasr.trace import Settings

NOT_STORED = "specasr: result not stored in "


def _disk_full(monkeypatch) -> None:
    def write_runs(self, *args, **kwargs):
        raise StoreError("IO Error: could not write to the file: No space left on device")

    monkeypatch.setattr(Store, "write_runs", write_runs)


def test_a_decode_whose_store_cannot_open_still_prints_its_transcript(capsys, sample_clips, tmp_path):
    folder_as_store = tmp_path / "runs.duckdb"  # a folder where the store file should be: DuckDB cannot open it
    folder_as_store.mkdir()
    assert main(["decode", str(sample_clips[0].path), "--db", str(folder_as_store)]) == 1
    out, err = capsys.readouterr()
    assert "cooler judgment" in out
    assert err.splitlines()[-1].startswith(f"{NOT_STORED}{folder_as_store}: ") and "Traceback" not in err


def test_a_decode_on_a_full_disk_still_prints_its_record(capsys, monkeypatch, sample_clips, tmp_path):
    _disk_full(monkeypatch)
    db = tmp_path / "runs.duckdb"
    assert main(["decode", str(sample_clips[0].path), "--draft", "random", "--json", "--db", str(db)]) == 1
    out, err = capsys.readouterr()
    record = json.loads(out)  # printed before the write: it names the id the run was to be stored under
    assert "cooler judgment" in record["text"] and record["run_id"] not in Store(db).runs().run_id.tolist()
    assert err.splitlines()[-1] == f"{NOT_STORED}{db}: IO Error: could not write to the file: No space left on device"


KILLED_AFTER_THE_COMMIT = """
import os, sys
from specasr.cli import main
from specasr.store import Store

write_runs = Store.write_runs


def write_then_die(self, *args, **kwargs):
    write_runs(self, *args, **kwargs)
    os._exit(137)  # killed right after the commit: what stdout still buffers is lost


Store.write_runs = write_then_die
main(sys.argv[1:])
"""


def test_a_json_decode_killed_after_its_commit_has_printed_its_record(sample_clips, tmp_path):
    db = tmp_path / "runs.duckdb"
    argv = ["decode", str(sample_clips[0].path), "--draft", "random", "--k", "2", "--json", "--db", str(db)]
    command = [sys.executable, "-c", KILLED_AFTER_THE_COMMIT, *argv]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)  # stdout a pipe: block-buffered
    assert done.returncode == 137, done.stderr[-2000:]
    record = json.loads(done.stdout)
    assert "cooler judgment" in record["text"] and Store(db).runs().run_id.tolist() == [record["run_id"]]


def test_a_bench_on_a_full_disk_prints_and_saves_its_tables(capsys, monkeypatch, speech, tmp_path):
    _disk_full(monkeypatch)
    out_file = tmp_path / "bench.txt"
    argv = ["bench", "--clips", "1", "--repeats", "1", "--k", "2", "--out", str(out_file)]
    assert main([*argv, "--db", str(tmp_path / "runs.duckdb")]) == 1
    out, err = capsys.readouterr()
    assert "decode_speedup" in out and "A/A check" in out and "stored " not in out
    assert out_file.read_text() == out
    assert err.splitlines()[-1].startswith(NOT_STORED) and "No space left on device" in err


def test_bench_out_refuses_an_existing_file_unless_forced_and_a_missing_folder(capsys, tmp_path):
    taken = tmp_path / "bench.txt"
    taken.write_text("yesterday's tables")
    assert main(["bench", "--out", str(taken)]) == 2
    assert f"--out: {taken} exists; give --force to replace it" in capsys.readouterr().err
    assert taken.read_text() == "yesterday's tables"
    assert main(["experiment", "--out", str(tmp_path / "typo" / "tables.txt")]) == 2
    assert f"--out: {tmp_path / 'typo'} does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["bench", "experiment"])
def test_out_never_overwrites_a_store_or_a_file_the_command_reads(capsys, speech, tmp_path, command):
    store = tmp_path / "runs.duckdb"
    Store(store)
    other = tmp_path / "other.duckdb"
    Store(other)
    held = {path: path.read_bytes() for path in (store, other)}
    manifest = DEFAULT_SPEECH_DIR / "manifest.tsv"
    clip = speech[0].path
    refused = {
        store: "is the run store (--db)",
        tmp_path / "new.duckdb": "is the run store (--db)",  # the store the command would create
        other: "is a DuckDB database",
        manifest: "is a file this command reads",
        clip: "is a file this command reads",
    }
    for out, why in refused.items():
        db = tmp_path / "new.duckdb" if out.name == "new.duckdb" else store
        assert main([command, "--db", str(db), "--out", str(out), "--force"]) == 2
        assert f"--out: {out} {why}" in capsys.readouterr().err
    assert {path: path.read_bytes() for path in held} == held and not (tmp_path / "new.duckdb").exists()


def test_bench_out_with_force_replaces_the_file_and_json_goes_there_too(capsys, speech, tmp_path):
    out_file = tmp_path / "bench.json"
    out_file.write_text("yesterday's tables")
    argv = ["bench", "--clips", "1", "--repeats", "1", "--k", "2", "--json", "--no-store"]
    assert main([*argv, "--out", str(out_file), "--force"]) == 0
    out = capsys.readouterr().out
    assert json.loads(out_file.read_text()) == json.loads(out) and json.loads(out)["runs"] == {}


def test_experiment_out_saves_the_printed_tables(capsys, sample_clips, tmp_path):
    out_file = tmp_path / "experiment.txt"
    argv = ["experiment", "--clips", "1", "--draft", "random", "--k", "2", "--repeats", "1"]
    assert main([*argv, "--db", str(tmp_path / "runs.duckdb"), "--out", str(out_file)]) == 0
    out = capsys.readouterr().out
    assert "Cells (Tables 1, 2, 3, 6)" in out and out_file.read_text() == out


def test_an_experiment_on_a_full_disk_prints_and_saves_its_tables(capsys, monkeypatch, sample_clips, tmp_path):
    _disk_full(monkeypatch)
    out_file = tmp_path / "experiment.txt"
    argv = ["experiment", "--clips", "1", "--draft", "random", "--k", "2", "--repeats", "1", "--out", str(out_file)]
    assert main([*argv, "--db", str(tmp_path / "runs.duckdb")]) == 1
    out, err = capsys.readouterr()
    assert "Cells (Tables 1, 2, 3, 6)" in out and "greedy run (not stored)" in out and out_file.read_text() == out
    assert err.splitlines()[-1].startswith(NOT_STORED) and "No space left on device" in err


def test_an_experiment_whose_store_cannot_open_prints_its_tables_first(capsys, sample_clips, tmp_path):
    folder_as_store = tmp_path / "runs.duckdb"  # a folder where the store file should be: DuckDB cannot open it
    folder_as_store.mkdir()
    argv = ["experiment", "--clips", "1", "--draft", "random", "--k", "2", "--repeats", "1"]
    assert main([*argv, "--db", str(folder_as_store)]) == 1
    out, err = capsys.readouterr()
    assert "Cells (Tables 1, 2, 3, 6)" in out and "greedy run (not stored)" in out
    assert err.splitlines()[-1].startswith(f"{NOT_STORED}{folder_as_store}: ") and "Traceback" not in err


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_an_experiment_on_a_read_only_store_prints_its_tables_first(capsys, sample_clips, tmp_path):
    folder = tmp_path / "readonly"
    folder.mkdir()
    folder.chmod(0o555)
    argv = ["experiment", "--clips", "1", "--draft", "random", "--k", "2", "--repeats", "1", "--json"]
    try:
        assert main([*argv, "--db", str(folder / "runs.duckdb")]) == 1
    finally:
        folder.chmod(0o755)
    out, err = capsys.readouterr()
    assert json.loads(out)["baseline_run"] is None
    last = err.splitlines()[-1]
    assert last.startswith(f"{NOT_STORED}{folder / 'runs.duckdb'}: ") and "no permission to write" in last


def _store_with_a_run(path) -> tuple[Store, str]:
    store = Store(path)
    settings = Settings(draft="random", k=2, reference="never")
    return store, store.write_run([hand_trace(settings, "u", [1, 2], 1.0), hand_trace(settings, "v", [0], 1.0)], "t")


def _execute(store: Store, sql: str, *params) -> None:
    with store._connect() as con:
        con.execute(sql, list(params))


def test_runs_doctor_lists_orphan_rows_and_fix_removes_them(capsys, tmp_path):
    db = tmp_path / "runs.duckdb"
    store, run_id = _store_with_a_run(db)
    assert main(["runs", "doctor", "--db", str(db)]) == 0
    assert capsys.readouterr().out == f"no orphan rows in {db}\n"
    _execute(store, "DELETE FROM runs WHERE run_id = ?", run_id)  # what a mixed import left behind
    orphans = store.orphans()
    assert orphans["decodes"] == 2
    assert main(["runs", "doctor", "--db", str(db)]) == 1
    listed = capsys.readouterr().out.splitlines()
    assert listed[0] == f"orphan rows in {db}:"
    assert "  decodes: 2" in listed and listed[-1] == "give --fix to remove them"
    assert main(["runs", "doctor", "--fix", "--db", str(db)]) == 0
    removed = capsys.readouterr().out.splitlines()
    assert removed[0] == f"removed orphan rows from {db}:" and "  decodes: 2" in removed
    assert not any(store.orphans().values())


def test_runs_show_prints_the_summary_of_a_run_without_decodes(capsys, tmp_path):
    db = tmp_path / "runs.duckdb"
    store, run_id = _store_with_a_run(db)
    for table in (*LEVEL_TABLES, "decodes"):
        _execute(store, f"DELETE FROM {table} WHERE run_id = ?", run_id)
    assert main(["runs", "show", run_id, "--db", str(db)]) == 0
    assert run_id in capsys.readouterr().out


def test_runs_export_refuses_an_existing_export_unless_forced(capsys, tmp_path):
    db = tmp_path / "runs.duckdb"
    _, run_id = _store_with_a_run(db)
    folder = tmp_path / "export"
    assert main(["runs", "export", run_id, "--parquet", str(folder), "--db", str(db)]) == 0
    written = {path.name: path.stat().st_mtime_ns for path in folder.iterdir()}
    capsys.readouterr()
    assert main(["runs", "export", run_id, "--parquet", str(folder), "--db", str(db)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "--force" in err
    assert {path.name: path.stat().st_mtime_ns for path in folder.iterdir()} == written
    assert main(["runs", "export", run_id, "--parquet", str(folder), "--force", "--db", str(db)]) == 0


def test_runs_export_to_a_file_is_a_message(capsys, tmp_path):
    db = tmp_path / "runs.duckdb"
    _, run_id = _store_with_a_run(db)
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    assert main(["runs", "export", run_id, "--parquet", str(a_file), "--db", str(db)]) == 2
    assert capsys.readouterr().err.startswith("error:") and a_file.read_text() == "mine"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["decode", "clip.wav", "--db", "typo/runs.duckdb"], "--db: typo does not exist"),
        (["bench", "--out", "typo/bench.txt"], "--out: typo does not exist"),
    ],
)
def test_store_and_output_paths_are_checked_before_any_work(capsys, tmp_path, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    try:
        code = main(argv)
    except SystemExit as stop:
        code = stop.code
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err and not (tmp_path / "typo").exists()


def test_a_reference_cache_that_fails_is_warned_of_once_and_the_decode_goes_on(capsys, monkeypatch, sample_clips):
    def busy(self, *args):
        raise StoreError("runs.duckdb is busy: another process is writing to it (waited 60 s)")

    monkeypatch.setattr(Store, "reference", busy)
    monkeypatch.setattr(Store, "save_reference", busy)
    clip = str(sample_clips[0].path)
    with pytest.warns(UserWarning, match="reference frames not cached in .*busy") as warned:
        assert main(["decode", clip, "--window", "correct", "--json"]) == 0
    assert len(warned) == 1
    assert json.loads(capsys.readouterr().out)["reference_source"] == "pocketsphinx"


def test_an_export_never_lands_on_the_store(capsys, tmp_path):
    store = tmp_path / "runs.duckdb"
    Store(store)
    before = store.read_bytes()
    assert main(["runs", "export", "any", "--parquet", str(store), "--force", "--db", str(store)]) != 0
    assert "is a file: give a folder to export into" in capsys.readouterr().err and store.read_bytes() == before
