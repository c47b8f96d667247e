"""Runs carried between stores as a folder of Parquet files, one per table, and a manifest.

The manifest (manifest.json) lists the runs, each file's row count and SHA-256 and the schema version. An import
checks every file against it, reads the rows without storing them to check that they hang together (every decode has
its run and clip, every run its decodes, every level row its decode), then adds them in one transaction: a refused
export imports nothing. An export written before manifests were kept has none: it is imported after the same
consistency checks, and its corruption is caught only where Parquet or the store's types catch it.
"""

import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path

import duckdb

from specasr.migrations import CHAIN_NODES, RENAMED_WINDOWS, SCHEMA_VERSION
from specasr.store import ORPHANS, RUN_TABLES, SHARED_TABLES, WRITE_FAILURES, Store, StoreError, first_line, write_error

MANIFEST = "manifest.json"
FORMAT = 1  # of the manifest
OPTIONAL_TABLES = ("clip_audio",)  # absent from exports written before it was kept

# Rows of a table that belong to the chosen runs, where the table has no run_id.
_RUN_ROWS = dict.fromkeys(
    SHARED_TABLES, "clip_hash IN (SELECT clip_hash FROM decodes WHERE list_contains($run_ids, run_id))"
)


def export_runs(store: Store, run_ids: Sequence[str], folder: Path | str, force: bool = False) -> list[Path]:
    """Write the runs' rows as one Parquet file per table into `folder`, with their manifest; returns the Parquet
    files. A folder that already holds files is refused unless `force`, which replaces its export files and keeps
    any other. The files are written into a sibling folder first and moved in: a killed export leaves no half one."""
    folder = Path(folder)
    _check_destination(folder, force)
    run_ids = store.rows("runs", run_ids, ["run_id"]).run_id.tolist()  # UnknownRunError for any the store lacks
    staging = folder.parent / f".{folder.name}.{uuid.uuid4().hex[:8]}.partial"
    try:
        staging.mkdir()
        counts = {}
        with store.transaction() as con:  # one snapshot of every table
            for table in RUN_TABLES:
                path = staging / f"{table}.parquet"
                rows = f"SELECT * FROM {table} WHERE {_RUN_ROWS.get(table, 'list_contains($run_ids, run_id)')}"
                try:
                    copy = f"COPY ({rows}) TO {_literal(path)} (FORMAT parquet)"
                    (counts[path.name],) = con.execute(copy, {"run_ids": run_ids}).fetchone()
                except WRITE_FAILURES as error:
                    raise write_error(path, error) from error
        files = {name: {"rows": rows, "sha256": _sha256(staging / name)} for name, rows in counts.items()}
        manifest = {"format": FORMAT, "schema_version": SCHEMA_VERSION, "runs": run_ids, "files": files}
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2))
        _publish(staging, folder)
    except OSError as error:
        raise write_error(folder, error) from error
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return [folder / name for name in files]


def import_runs(store: Store, folder: Path | str, trust_unverified: bool = False) -> list[str]:
    """Add the runs exported to `folder`, in one transaction, after checking the files against their manifest and
    that their rows hang together; refused (StoreError, nothing imported) where any check fails or this store
    already holds one of the runs. An export without its manifest (or made before manifests) is refused unless
    `trust_unverified`, and then checked for consistency only. Returns the run ids."""
    folder = Path(folder)
    if not folder.is_dir():
        raise StoreError(f"{folder} is not a folder: give the folder a run export was written to")
    manifest = _read_manifest(folder)
    if manifest is None and not trust_unverified:
        raise StoreError(
            f"{folder} has no {MANIFEST}: its files cannot be checked against what was exported; import it anyway "
            "with --trust-unverified"
        )
    sources = _sources(folder, manifest)
    if manifest is not None:
        _check_checksums(sources, manifest)
    run_ids = _check_rows(folder, sources, manifest)
    with store.transaction() as con:
        present = con.execute("SELECT run_id FROM runs WHERE list_contains(?, run_id)", [run_ids]).fetchall()
        if present:
            raise StoreError(f"{store.path} already holds run {', '.join(r for (r,) in present)}")
        for table, path in sources.items():
            try:
                columns = [c[0] for c in con.execute(f"SELECT * FROM {_parquet(path)} LIMIT 0").description]
                store.insert(con, table, _parquet(path), columns)
            except WRITE_FAILURES:
                raise
            except duckdb.Error as error:
                raise StoreError(f"{path} does not fit the store's {table} table: {first_line(str(error))}") from error
            if table == "decodes" and "runtime_peaks" not in columns:  # exported before the windows' renaming
                for old, new in RENAMED_WINDOWS:
                    rename = 'UPDATE runs SET "window" = ? WHERE "window" = ? AND list_contains(?, run_id)'
                    con.execute(rename, [new, old, run_ids])
        for statement in CHAIN_NODES:  # exported before draft trees; a store's own rows all have their nodes
            con.execute(statement)
    return run_ids


def _check_destination(folder: Path, force: bool) -> None:
    if folder.exists() and not folder.is_dir():
        raise StoreError(f"{folder} is a file: give a folder to export into")
    if not folder.parent.is_dir():
        raise StoreError(f"{folder.parent} does not exist: create it first, or export into a folder that does")
    if folder.is_dir() and any(folder.iterdir()) and not force:
        raise StoreError(f"{folder} already holds files: export into a new or empty folder, or force it (--force)")


def _publish(staging: Path, folder: Path) -> None:
    """Move a finished export into place: the whole folder where there is none yet, else file by file."""
    if folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()
    if not folder.exists():
        staging.rename(folder)
        return
    (folder / MANIFEST).unlink(missing_ok=True)  # first, so that a half-replaced export fails its checks
    for path in sorted(staging.iterdir(), key=lambda path: path.name == MANIFEST):
        os.replace(path, folder / path.name)


def _read_manifest(folder: Path) -> dict | None:
    path = folder / MANIFEST
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text())
        newer = manifest["format"] > FORMAT or manifest["schema_version"] > SCHEMA_VERSION
        files = {name: (int(entry["rows"]), str(entry["sha256"])) for name, entry in manifest["files"].items()}
        runs = [str(run_id) for run_id in manifest["runs"]]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise StoreError(f"{path} is not a run export's manifest ({type(error).__name__}: {error})") from error
    if newer:
        raise StoreError(f"{path} was written by a newer specasr: upgrade specasr to import it")
    if not runs or not files:
        raise StoreError(f"{path} is not a run export's manifest: it lists no runs or no files")
    return manifest


def _sources(folder: Path, manifest: dict | None) -> dict[str, Path]:
    """The export's file of each table; StoreError naming those that are missing, or not in its manifest."""
    found = {table: folder / f"{table}.parquet" for table in RUN_TABLES if (folder / f"{table}.parquet").is_file()}
    needed = [t for t in RUN_TABLES if t not in OPTIONAL_TABLES]
    if manifest is not None:
        needed = [t for t in RUN_TABLES if f"{t}.parquet" in manifest["files"]]
        unlisted = [f"{t}.parquet" for t in found if t not in needed]
        unknown = [name for name in manifest["files"] if name.removesuffix(".parquet") not in RUN_TABLES]
        if unlisted or unknown:
            raise StoreError(f"{folder}'s manifest does not match its files: {', '.join(unlisted + unknown)}")
    missing = [f"{t}.parquet" for t in needed if t not in found]
    if missing:
        raise StoreError(f"{folder} is not a complete run export: {', '.join(missing)} missing")
    return found


def _check_checksums(sources: dict[str, Path], manifest: dict) -> None:
    for path in sources.values():
        if _sha256(path) != manifest["files"][path.name]["sha256"]:
            raise StoreError(f"{path} is not the file that was exported (its checksum differs): re-export the runs")


def _check_rows(folder: Path, sources: dict[str, Path], manifest: dict | None) -> list[str]:
    """The export's run ids, after reading its files as tables of their own: each as many rows as its manifest says,
    the runs its manifest lists, and no row that the store would hold as an orphan."""
    with duckdb.connect() as con:
        try:
            for table, path in sources.items():
                con.execute(f"CREATE VIEW {table} AS SELECT * FROM {_parquet(path)}")
                (rows,) = con.execute(f"SELECT count(*) FROM {table}").fetchone()
                if manifest is not None and rows != manifest["files"][path.name]["rows"]:
                    raise StoreError(f"{path} holds {rows} rows, its manifest {manifest['files'][path.name]['rows']}")
            run_ids = [r for (r,) in con.execute("SELECT run_id FROM runs").fetchall()]
            orphans = {
                table: con.execute(f"SELECT count(*) FROM {table} AS t WHERE {where}").fetchone()[0]
                for table, where in ORPHANS.items()
                if table in sources
            }
        except duckdb.Error as error:
            raise StoreError(f"{folder} is not a readable run export: {first_line(str(error))}") from error
    if manifest is not None and sorted(run_ids) != sorted(manifest["runs"]):
        raise StoreError(f"{folder} holds runs {', '.join(run_ids)}, its manifest {', '.join(manifest['runs'])}")
    if len(set(run_ids)) != len(run_ids):
        raise StoreError(f"{folder} holds a run twice: runs.parquet repeats a run id")
    broken = ", ".join(f"{count} {table} rows" for table, count in orphans.items() if count)
    if broken:
        raise StoreError(f"{folder} does not hang together: {broken} without their run, decode or clip")
    return run_ids


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _literal(path: Path) -> str:
    return "'" + str(path).replace("'", "''") + "'"


def _parquet(path: Path) -> str:
    return f"read_parquet({_literal(path)})"
