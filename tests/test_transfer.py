"""Export and import: the manifest, the destination rules, and imports refused whole where files are damaged, mixed
or do not hang together."""

import hashlib
import json
import shutil
from pathlib import Path

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_store import greedy_trace, speculative_trace
from test_store_schema import renamed_traces, schema_7_frames, stored_before_trees

from specasr import transfer
from specasr.migrations import SCHEMA_VERSION
from specasr.store import RUN_TABLES, Store, StoreError
from specasr.transfer import MANIFEST, export_runs, import_runs


def table_rows(store: Store) -> dict[str, list]:
    """Every row of every table, sorted: what an import that is refused must leave as it was."""
    with duckdb.connect(str(store.path)) as con:
        return {table: sorted(map(str, con.execute(f"SELECT * FROM {table}").fetchall())) for table in RUN_TABLES}


def test_parquet_export_imports_into_a_fresh_store(store, tmp_path):
    traces = [speculative_trace("c1", [3, 1, 0, 2]), speculative_trace("c2", [0])]
    run = store.write_run(traces, "bench")
    store.write_run([greedy_trace()], "decode")
    files = export_runs(store, [run], tmp_path / "export")
    assert sorted(f.name for f in files) == sorted(f"{table}.parquet" for table in RUN_TABLES)
    fresh = Store(tmp_path / "fresh.duckdb")
    assert import_runs(fresh, tmp_path / "export") == [run]
    assert fresh.traces(run) == traces
    assert fresh.runs().drop(columns="seconds").equals(store.runs(k=3).drop(columns="seconds"))
    with duckdb.connect(str(fresh.path)) as con:
        assert con.execute("SELECT count(*) FROM clips").fetchone() == (2,)  # the greedy run's clip stayed behind
    with pytest.raises(StoreError, match="already holds run"):
        import_runs(fresh, tmp_path / "export")


def test_the_manifest_lists_the_runs_and_each_files_rows_and_checksum(store, tmp_path):
    run = store.write_run([speculative_trace("c1", [3, 1]), speculative_trace("c2", [0])], "bench")
    files = export_runs(store, [run], tmp_path / "export")
    manifest = json.loads((tmp_path / "export" / MANIFEST).read_text())
    assert (manifest["format"], manifest["schema_version"], manifest["runs"]) == (1, SCHEMA_VERSION, [run])
    assert manifest["files"]["decodes.parquet"]["rows"] == 2 and manifest["files"]["rounds.parquet"]["rows"] == 3
    for path in files:
        assert manifest["files"][path.name]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export", "runs.duckdb"]  # no staging folder left


def test_an_export_refuses_a_file_a_missing_parent_and_a_folder_with_files_unless_forced(store, tmp_path):
    first = store.write_run([speculative_trace("c1", [3, 1])], "decode")
    second = store.write_run([greedy_trace()], "decode")
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(StoreError, match=r"notes\.txt is a file: give a folder to export into"):
        export_runs(store, [first], tmp_path / "notes.txt")
    with pytest.raises(StoreError, match="typo does not exist"):
        export_runs(store, [first], tmp_path / "typo" / "export")
    (tmp_path / "empty").mkdir()
    export_runs(store, [first], tmp_path / "empty")  # an empty folder is fine
    with pytest.raises(StoreError, match=r"empty already holds files: .*--force"):
        export_runs(store, [second], tmp_path / "empty")
    (tmp_path / "empty" / "readme.txt").write_text("kept")
    export_runs(store, [second], tmp_path / "empty", force=True)
    assert (tmp_path / "empty" / "readme.txt").read_text() == "kept"
    fresh = Store(tmp_path / "fresh.duckdb")
    assert import_runs(fresh, tmp_path / "empty") == [second]
    assert not (tmp_path / "typo").exists()


def test_a_failed_export_leaves_no_folder(store, tmp_path, monkeypatch):
    run = store.write_run([greedy_trace()], "decode")

    def full_disk(path: Path) -> str:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(transfer, "_sha256", full_disk)
    with pytest.raises(StoreError, match=r"export: it is on a full disk$"):
        export_runs(store, [run], tmp_path / "export")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs.duckdb"]


def two_exports(store: Store, tmp_path: Path) -> tuple[Path, Path]:
    first = store.write_run([speculative_trace("c1", [3, 1]), speculative_trace("c2", [1])], "bench")
    second = store.write_run([greedy_trace("g1"), greedy_trace("g2")], "bench")
    return export_runs(store, [first], tmp_path / "a")[0].parent, export_runs(store, [second], tmp_path / "b")[0].parent


def mixed(a: Path, b: Path, into: Path, manifest: bool) -> Path:
    """Export a with b's decodes and level rows: the issue's mixed export."""
    shutil.copytree(a, into)
    for table in ("decodes", "segments", "rounds", "draft_steps", "verified_tokens"):
        shutil.copy(b / f"{table}.parquet", into / f"{table}.parquet")
    if not manifest:
        (into / MANIFEST).unlink()
    return into


@pytest.mark.parametrize("manifest", [True, False], ids=["with manifest", "without manifest"])
def test_a_mixed_export_is_refused_and_nothing_is_imported(store, tmp_path, manifest):
    a, b = two_exports(store, tmp_path)
    fresh = Store(tmp_path / "fresh.duckdb")
    message = "checksum differs" if manifest else "does not hang together: 2 decodes rows, 1 runs rows, 2 clips rows"
    with pytest.raises(StoreError, match=message):
        import_runs(fresh, mixed(a, b, tmp_path / "mixed", manifest), trust_unverified=True)
    assert fresh.runs().empty and fresh.orphans() == {}


def test_damaged_files_are_refused_with_the_file_named(store, tmp_path):
    a, _ = two_exports(store, tmp_path)
    fresh = Store(tmp_path / "fresh.duckdb")
    rounds = a / "rounds.parquet"
    rounds.write_bytes(rounds.read_bytes()[:100])
    with pytest.raises(StoreError, match=f"{rounds} is not the file that was exported"):
        import_runs(fresh, a)
    (a / MANIFEST).unlink()  # without its manifest, refused unless trusted; then Parquet itself finds the truncation
    with pytest.raises(StoreError, match=f"{a} has no {MANIFEST}: .* import it anyway with --trust-unverified"):
        import_runs(fresh, a)
    with pytest.raises(StoreError, match=f"{a} is not a readable run export: .*rounds.parquet"):
        import_runs(fresh, a, trust_unverified=True)
    (a / "runs.parquet").unlink()
    with pytest.raises(StoreError, match=r"runs\.parquet missing"):
        import_runs(fresh, a, trust_unverified=True)
    assert fresh.runs().empty


def test_a_manifest_that_disagrees_with_its_files_is_refused(store, tmp_path):
    a, _ = two_exports(store, tmp_path)
    fresh = Store(tmp_path / "fresh.duckdb")
    manifest = json.loads((a / MANIFEST).read_text())
    for change, message in [
        (lambda m: m["files"]["rounds.parquet"].update(rows=99), "rounds.parquet holds 3 rows, its manifest 99"),
        (lambda m: m.update(runs=["other"]), "its manifest other"),
        (lambda m: m.update(schema_version=SCHEMA_VERSION + 1), "newer specasr"),
        (lambda m: m["files"].pop("clip_audio.parquet"), "does not match its files: clip_audio.parquet"),
        (lambda m: m.pop("files"), "is not a run export's manifest"),
    ]:
        changed = json.loads(json.dumps(manifest))
        change(changed)
        (a / MANIFEST).write_text(json.dumps(changed))
        with pytest.raises(StoreError, match=message):
            import_runs(fresh, a)
    (a / MANIFEST).write_text("{not json")
    with pytest.raises(StoreError, match="is not a run export's manifest"):
        import_runs(fresh, a)
    assert fresh.runs().empty


def test_runs_exported_under_the_old_runtime_windows_keep_their_rule(store, tmp_path):
    """Exports from before manifests (schema 7, no clip_audio file) still import, after the consistency checks."""
    traces = renamed_traces()
    for old, trace in traces.items():
        frames = schema_7_frames(old, trace, old)
        (tmp_path / old).mkdir()
        with duckdb.connect() as con:
            for table in frames:
                con.register("frame", frames[table])
                con.execute(f"COPY (SELECT * FROM frame) TO '{tmp_path / old / table}.parquet' (FORMAT parquet)")
        assert import_runs(store, tmp_path / old, trust_unverified=True) == [old]
        assert store.traces(old) == [stored_before_trees(trace)]
    exported = export_runs(store, ["runtime-paced"], tmp_path / "new")  # a new export keeps its names
    store.delete_run("runtime-paced")
    assert import_runs(store, exported[0].parent) == ["runtime-paced"]
    assert store.traces("runtime-paced") == [stored_before_trees(traces["runtime-paced"])]


# ---------------------------------------------------------------------------------------------------------------------
# Fuzz: damaged export folders are refused whole

FILES = [f"{table}.parquet" for table in RUN_TABLES]


@pytest.fixture(scope="module")
def small_export(tmp_path_factory) -> dict[str, bytes]:
    """A small real export (one speculative run of two clips) as file name -> bytes."""
    folder = tmp_path_factory.mktemp("export")
    store = Store(folder / "runs.duckdb")
    run = store.write_run([speculative_trace("c1", [3, 1]), speculative_trace("c2", [1, 0])], "bench")
    export_runs(store, [run], folder / "export")
    return {path.name: path.read_bytes() for path in (folder / "export").iterdir()}


damage = st.one_of(
    st.tuples(st.just("shuffle"), st.permutations(FILES)),
    st.tuples(st.just("truncate"), st.sampled_from(FILES), st.floats(0, 1, exclude_max=True)),
    st.tuples(st.just("flip"), st.sampled_from(FILES), st.floats(0, 1, exclude_max=True), st.integers(1, 255)),
    st.tuples(st.just("none")),
)


def damaged(files: dict[str, bytes], how: tuple) -> dict[str, bytes]:
    files = dict(files)
    if how[0] == "shuffle":
        files |= {new: files[old] for old, new in zip(FILES, how[1], strict=True)}
    elif how[0] == "truncate":
        files[how[1]] = files[how[1]][: int(len(files[how[1]]) * how[2])]
    elif how[0] == "flip":
        data = bytearray(files[how[1]])
        data[int(len(data) * how[2])] ^= how[3]
        files[how[1]] = bytes(data)
    return files


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(how=damage, keep_manifest=st.booleans())
def test_a_damaged_export_is_refused_whole_or_imports_whole(small_export, tmp_path, how, keep_manifest):
    folder = tmp_path / f"fuzz-{hashlib.sha256(repr((how, keep_manifest)).encode()).hexdigest()[:12]}"
    folder.mkdir()
    for name, data in damaged(small_export, how).items():
        if keep_manifest or name != MANIFEST:
            (folder / name).write_bytes(data)
    store = Store(folder / "runs.duckdb")
    store.write_run([greedy_trace()], "decode")
    before = table_rows(store)
    untouched = how[0] == "none" or damaged(small_export, how) == small_export
    try:
        imported = import_runs(store, folder, trust_unverified=not keep_manifest)
    except StoreError as error:
        assert "\n" not in str(error)
        assert not untouched, error
        assert table_rows(store) == before
        return
    # Only a file Parquet reads as another, without a manifest to tell, can import: whole and consistent then.
    assert untouched or not keep_manifest
    assert store.orphans() == {}
    assert [len(store.traces(run)) for run in imported] == [2]


def test_runs_import_of_an_export_without_its_manifest_needs_trust(capsys, store, tmp_path):
    from specasr.cli import main

    run = store.write_run([greedy_trace()], "decode")
    folder = export_runs(store, [run], tmp_path / "export")[0].parent
    (folder / MANIFEST).unlink()
    fresh = str(tmp_path / "fresh.duckdb")
    assert main(["runs", "import", str(folder), "--db", fresh]) != 0
    assert f"has no {MANIFEST}" in capsys.readouterr().err and Store(fresh).runs().empty
    assert main(["runs", "import", str(folder), "--db", fresh, "--trust-unverified"]) == 0
    assert Store(fresh).runs().run_id.tolist() == [run]
