"""The run store: one DuckDB file of runs, their clips and every level of their traces, and the reusable reference
frames. The schema lives in migrations.py, the metrics of stored runs in metrics.py, export and import in transfer.py.

A run is the list of traces decoded under one `Settings` (a `decode` command is a run of one trace; a bench is one
run per arm). Runs decoded side by side, interleaved clip by clip, are written as one batch: timings compare only
within a batch. DuckDB lets one process at a time open a file, so every operation opens a short-lived connection and
waits while another process holds the file. A run (or a batch) is written in one transaction: a write that fails or
is killed leaves no rows, and its failure is a StoreError of one line (busy, read-only, full disk), never DuckDB's.
A long batch is written clip by clip (`ClipBatch`), each clip's decodes of all its runs in one transaction, so that
a batch stopped half way keeps every clip written and can be completed later.
"""

import io
import json
import os
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from datetime import datetime
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import soundfile

from specasr.cache import cache_dir
from specasr.migrations import SCHEMA_VERSION, migrate, schema_version
from specasr.overview import RUN_FILTERS, overview
from specasr.reference import ClipReference
from specasr.rows import LEVELS, SETTINGS_COLUMNS, Level, flac, run_frames, traces_from_rows, utc_now
from specasr.trace import Settings, Trace
from specasr.words import WordTime

RETRY_SECONDS = 0.05
# Processes take turns through the file's lock; threads of one process share one database and would conflict
# when two transactions insert the same clip, so they take turns here.
_THREAD_WRITES = threading.Lock()


class StoreError(RuntimeError):
    """The file cannot be used as a run store, or a store operation was refused."""


class StoreBusyError(StoreError):
    """Another process held the store's file for longer than the timeout."""


class StoreWriteError(StoreError):
    """A file could not be written: its folder or file is read-only, the disk is full, permission was denied..."""


class UnknownRunError(StoreError, KeyError):
    """No run with that id in the store (a KeyError too, for callers that look runs up)."""

    __str__ = StoreError.__str__  # KeyError's would quote the message


# What the operating system says, through DuckDB or Python, and what it means for the file being written.
_WRITE_FAILURES = {
    "No space left on device": "it is on a full disk",
    "Disk quota exceeded": "its disk quota is used up",
    "Read-only file system": "it is on a read-only file system",
    "Permission denied": "permission denied",
}


def write_error(path: Path, error: Exception) -> StoreWriteError:
    """The error of one line for a failure to write `path`: why, as the system said it."""
    message = str(error)
    reason = next((why for said, why in _WRITE_FAILURES.items() if said in message), first_line(message))
    if reason == "permission denied" and path.parent.exists() and not os.access(path.parent, os.W_OK):
        reason = f"no permission to write in its folder {path.parent}"
    elif reason == "permission denied" and path.exists() and not os.access(path, os.W_OK):
        reason = "no permission to write it"
    return StoreWriteError(f"cannot write {path}: {reason}")


def first_line(message: str) -> str:
    """An error's first line: DuckDB's messages go on to quote the query."""
    return message.strip().splitlines()[0] if message.strip() else message


# The errors a write to a file can end in: DuckDB's where the file system refused it or the commit failed, and Python's.
DUCKDB_WRITE_FAILURES = (duckdb.IOException, duckdb.PermissionException, duckdb.TransactionException)
WRITE_FAILURES = (OSError, *DUCKDB_WRITE_FAILURES)


@dataclass(frozen=True)
class DecodedRun:
    """A stored run as the experiment runner matches it: its settings and the (clip hash, repeat) pairs it decoded."""

    run_id: str
    batch: str | None  # shared by the runs decoded beside it; None in runs stored before batches were kept
    settings: Settings
    decoded: frozenset[tuple[str, int]]
    batch_clips: int | None = None  # the clips its batch holds when complete, where written clip by clip


@dataclass(frozen=True)
class ClipBatch:
    """Where `write_runs` puts one clip's decodes of runs stored clip by clip: their batch, their ids (a run the store
    holds gets the decodes after its own) and how many clips the batch holds when complete."""

    batch: str
    run_ids: tuple[str, ...]
    clips: int

    @classmethod
    def new(cls, runs: int, clips: int) -> "ClipBatch":
        """Fresh ids for a batch of `runs` runs over `clips` clips (0: written whole)."""
        return cls(_new_id(), tuple(_new_id() for _ in range(runs)), clips)


def _new_id() -> str:
    return uuid.uuid4().hex[:12]


def is_duckdb_file(path: Path) -> bool:
    """Whether `path` is a DuckDB database file, by its header (bytes 8-11 of every one read DUCK)."""
    try:
        with open(path, "rb") as file:
            return file.read(12)[8:] == b"DUCK"
    except OSError:
        return False


def default_db_path() -> Path:
    """$SPECASR_DB, else runs.duckdb in the cache folder."""
    configured = os.environ.get("SPECASR_DB")
    return Path(configured) if configured else cache_dir() / "runs.duckdb"


RUN_TABLES = ("runs", "clips", "decodes", "segments", "rounds", "draft_steps", "verified_tokens", "clip_audio")
SHARED_TABLES = ("clips", "clip_audio")  # rows keyed by clip hash, shared by every run that decoded the clip
LEVEL_TABLES = ("segments", "rounds", "draft_steps", "verified_tokens")  # rows keyed by run and decode
REFERENCE_KEY = ("clip_hash", "target", "device", "dtype", "aligner")

# Rows `runs` can neither show nor delete, table by table, in the order that removes them in one pass: decodes whose
# run or clip is gone, runs without a decode, then the rows of decodes that are gone and clips no decode uses.
ORPHANS = {
    "decodes": "run_id NOT IN (SELECT run_id FROM runs) OR clip_hash NOT IN (SELECT clip_hash FROM clips)",
    "runs": "run_id NOT IN (SELECT run_id FROM decodes)",
    **dict.fromkeys(
        LEVEL_TABLES,
        "NOT EXISTS (SELECT 1 FROM decodes d WHERE d.run_id = t.run_id AND d.decode = t.decode)",
    ),
    **dict.fromkeys(SHARED_TABLES, "clip_hash NOT IN (SELECT clip_hash FROM decodes)"),
}


# The order of a run's rows in each table below the run.
_ROW_ORDER = {"decodes": ("decode",)} | {level.table: ("decode", *level.order) for level in LEVELS.values()}


def _column_types(con: duckdb.DuckDBPyConnection) -> dict[str, dict[str, str]]:
    """Every table's columns, in order, with their SQL types."""
    rows = con.execute(
        "SELECT table_name, column_name, data_type FROM information_schema.columns ORDER BY ordinal_position"
    ).fetchall()
    types: dict[str, dict[str, str]] = {}
    for table, column, data_type in rows:
        types.setdefault(table, {})[column] = data_type
    return types


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _columns(names: Sequence[str]) -> str:
    return ", ".join(map(_quote, names))


# ---------------------------------------------------------------------------------------------------------------------
# The store


class Store:
    """A DuckDB file of runs. Every method opens its own connection and closes it before returning."""

    def __init__(self, path: Path | str | None = None, timeout: float = 60.0):
        self.path = Path(path) if path is not None else default_db_path()
        self.timeout = timeout
        if self.path == default_db_path():
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as error:
                raise write_error(self.path.parent, error) from error
        elif not self.path.parent.is_dir():  # a mistyped folder is not made behind the user's back
            raise StoreError(f"{self.path.parent} does not exist: create it first, or give a store path in a folder")
        if self.path.is_file() and self.path.stat().st_size and not is_duckdb_file(self.path):
            raise StoreError(f"{self.path} is not a run store: it is not a DuckDB database; give another file")
        with self.transaction() as con:
            version = schema_version(con)
            if version is None:
                raise StoreError(f"{self.path} is not a specasr run store: it is a DuckDB database with other tables")
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path} was written by a newer specasr (schema {version}, this one reads up to "
                    f"{SCHEMA_VERSION}); upgrade specasr to use it"
                )
            if version < SCHEMA_VERSION:
                migrate(con, version)
            self._types = _column_types(con)

    def _connect(self) -> duckdb.DuckDBPyConnection:
        """A new connection, retried while another process holds the file.

        Reads connect read-write too: in one process DuckDB refuses a read-only connection beside a read-write
        one, and across processes a read-only one conflicts with a writer all the same.
        """
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                return duckdb.connect(str(self.path))
            except duckdb.Error as error:
                if "Could not set lock" not in str(error):
                    if any(said in str(error) for said in _WRITE_FAILURES):
                        raise write_error(self.path, error) from error
                    raise StoreError(f"cannot open {self.path} as a run store: {first_line(str(error))}") from error
                if time.monotonic() >= deadline:
                    raise StoreBusyError(
                        f"{self.path} is busy: another process is writing to it (waited {self.timeout:g} s)"
                    ) from error
            time.sleep(RETRY_SECONDS)

    @contextmanager
    def transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A connection in one transaction, committed only if the block completes (closing it rolls back); a write
        the file system refuses is a StoreWriteError."""
        with _THREAD_WRITES, self._connect() as con:
            try:
                con.begin()
                yield con
                con.commit()
            except DUCKDB_WRITE_FAILURES as error:
                raise write_error(self.path, error) from error
            except duckdb.InterruptException as error:  # Ctrl-C inside DuckDB: nothing was committed
                raise KeyboardInterrupt from error

    def _known_runs(self, con: duckdb.DuckDBPyConnection, run_ids: Sequence[str]) -> list[str]:
        """The run ids as a list; UnknownRunError naming any this store lacks."""
        run_ids = list(run_ids)
        rows = con.execute("SELECT run_id FROM runs WHERE list_contains(?, run_id)", [run_ids]).fetchall()
        found = {r for (r,) in rows}
        missing = [r for r in run_ids if r not in found]
        if missing:
            raise UnknownRunError(f"no run {', '.join(missing)} in {self.path}")
        return run_ids

    # Writing

    def write_run(
        self,
        traces: list[Trace],
        command: str,
        repeats: list[int] | None = None,
        audio: Mapping[str, np.ndarray] | None = None,
    ) -> str:
        """Store traces decoded under one Settings and code version (each with its clip's hash) as a new run, in one
        transaction; `repeats` numbers each trace's repeat of its clip (default 0); `audio` maps clip hashes to
        waveforms to keep beside the run (clips with no file of their own). Returns the run id."""
        return self.write_runs([(traces, repeats)], command, audio)[0]

    def write_runs(
        self,
        runs: Sequence[tuple[list[Trace], list[int] | None]],
        command: str,
        audio: Mapping[str, np.ndarray] | None = None,
        into: ClipBatch | None = None,
    ) -> list[str]:
        """Store runs decoded side by side as one batch, in one transaction: each run's traces and repeat numbers,
        as `write_run` takes them, and the waveforms in `audio`; `into`: add them to a batch stored clip by clip
        instead of a new one. Returns the run ids in order."""
        into = into or ClipBatch.new(len(runs), 0)
        frames = [  # built before taking the file
            run_frames(run_id, traces, command, repeats, into.batch)
            for run_id, (traces, repeats) in zip(into.run_ids, runs, strict=True)
        ]
        sounds = [(clip_hash, flac(waveform)) for clip_hash, waveform in (audio or {}).items()]
        sounds = pd.DataFrame(sounds, columns=["clip_hash", "flac"])
        with self.transaction() as con:
            for run in frames:
                if into.clips:
                    run = self._extending(con, run, into.clips)
                self._insert_run(con, run)
            self._insert_run(con, {"clip_audio": sounds})
        return list(into.run_ids)

    def _extending(self, con: duckdb.DuckDBPyConnection, run: dict[str, pd.DataFrame], clips: int) -> dict:
        """A run's rows as they join a batch stored clip by clip: new, or numbered after the decodes it holds."""
        run_id = run["runs"].run_id.iloc[0]
        [(held,)] = con.execute("SELECT count(*) FROM decodes WHERE run_id = ?", [run_id]).fetchall()
        if not held:
            return run | {"runs": run["runs"].assign(batch_clips=clips)}
        later = {table: frame.assign(decode=frame.decode + held) for table, frame in run.items() if "decode" in frame}
        return {table: frame for table, frame in run.items() if table != "runs"} | later

    def label_run(self, run_id: str, name: str, note: str) -> None:
        """Give a run a name (shown with it everywhere) and a note."""
        with self.transaction() as con:
            self._known_runs(con, [run_id])
            con.execute("UPDATE runs SET name = ?, note = ? WHERE run_id = ?", [name.strip(), note.strip(), run_id])

    def _insert_run(self, con: duckdb.DuckDBPyConnection, frames: dict[str, pd.DataFrame]) -> None:
        """Insert every row of a run; the caller owns the transaction."""
        for table, frame in frames.items():
            con.register("frame", frame)
            self.insert(con, table, "frame", list(frame.columns))

    def insert(self, con: duckdb.DuckDBPyConnection, table: str, source: str, columns: list[str]) -> None:
        """Insert the named columns of a relation, cast to the table's types: an all-NULL column or an empty list
        has no type of its own. Clips are shared between runs, so a clip already stored is kept."""
        types = self._types[table]
        unknown = [c for c in columns if c not in types]
        if unknown:
            raise StoreError(f"table {table} of {self.path} has no column {', '.join(unknown)}")
        casts = ", ".join(f"CAST({_quote(c)} AS {types[c]})" for c in columns)
        verb = "INSERT OR IGNORE" if table in SHARED_TABLES else "INSERT"
        con.execute(f"{verb} INTO {table} ({_columns(columns)}) SELECT {casts} FROM {source}")

    # Reading

    def traces(self, run_id: str) -> list[Trace]:
        """A run's traces, rebuilt exactly as they were written, in decode order."""
        with self._connect() as con:
            self._known_runs(con, [run_id])
            decodes = con.execute(_DECODE_ROWS, [run_id]).df()
            levels = {name: self._level_rows(con, level, run_id) for name, level in LEVELS.items()}
        return traces_from_rows(decodes, levels)

    def rows(self, table: str, run_ids: Sequence[str], columns: Sequence[str]) -> pd.DataFrame:
        """The named columns of a table's rows that belong to the runs, ordered by run, decode and the level's own
        order: what metrics.py reads of stored runs. UnknownRunError naming any run this store lacks."""
        order = ["run_id", *_ROW_ORDER.get(table, ())]
        with self._connect() as con:
            run_ids = self._known_runs(con, run_ids)
            return con.execute(
                f"SELECT {_columns(columns)} FROM {table} WHERE list_contains(?, run_id) ORDER BY {_columns(order)}",
                [run_ids],
            ).df()

    def audio(self, clip_hash: str) -> np.ndarray | None:
        """The clip's waveform (16 kHz float32 mono) where the store keeps it."""
        with self._connect() as con:
            row = con.execute("SELECT flac FROM clip_audio WHERE clip_hash = ?", [clip_hash]).fetchone()
        return None if row is None else soundfile.read(io.BytesIO(row[0]), dtype="float32")[0]

    def _level_rows(self, con: duckdb.DuckDBPyConnection, level: Level, run_id: str) -> pd.DataFrame:
        columns = _columns(["decode", *(f.name for f in fields(level.kind))])
        order = _columns(["decode", *level.order])
        return con.execute(f"SELECT {columns} FROM {level.table} WHERE run_id = ? ORDER BY {order}", [run_id]).df()

    def runs(
        self,
        target: str | None = None,
        draft: str | None = None,
        window: str | None = None,
        k: int | None = None,
        dataset: str | None = None,
        since: datetime | str | None = None,
        until: datetime | str | None = None,
        batch: str | None = None,
        run_ids: Sequence[str] | None = None,
        clip_hash: str | None = None,
    ) -> pd.DataFrame:
        """The run history, newest first, one row per run: its settings, code, row counts, seconds and median WER.

        `draft` matches the settings' draft or the start of the draft's name ("none" for greedy runs); `since` and
        `until` bound the creation time (UTC); `run_ids` must all be stored (UnknownRunError); `clip_hash`: the runs
        that decoded that audio.
        """
        wanted = dict(target=target, draft=draft, window=window, k=k, dataset=dataset, since=since, until=until)
        wanted |= dict(clip_hash=clip_hash)
        chosen = {name: value for name, value in wanted.items() if value is not None}
        chosen |= {name: value for name, value in dict(batch=batch, run_ids=run_ids).items() if value is not None}
        where = " AND ".join(RUN_FILTERS[name] for name in chosen) or "TRUE"
        with self._connect() as con:
            if run_ids is not None:
                chosen["run_ids"] = self._known_runs(con, run_ids)
            return overview(con, where, chosen)

    def decoded(self, command: str) -> list[DecodedRun]:
        """Every run of `command`, oldest first."""
        settings = _columns(SETTINGS_COLUMNS)
        with self._connect() as con:
            rows = con.execute(
                f"SELECT run_id, batch, batch_clips, list((clip_hash, repeat)), {settings} FROM runs "
                f"JOIN decodes USING (run_id) WHERE command = ? GROUP BY ALL ORDER BY min(created), run_id",
                [command],
            ).fetchall()
        return [
            DecodedRun(run_id, batch, Settings(*values), frozenset(tuple(pair) for pair in clips), batch_clips)
            for run_id, batch, batch_clips, clips, *values in rows
        ]

    # Deleting

    def delete_run(self, run_id: str) -> None:
        """Remove a run and every row of it, in one transaction; clips no other run decoded go too."""
        with self.transaction() as con:
            self._known_runs(con, [run_id])
            for table in RUN_TABLES:
                if table not in SHARED_TABLES:
                    con.execute(f"DELETE FROM {table} WHERE run_id = ?", [run_id])
            for table in SHARED_TABLES:
                con.execute(f"DELETE FROM {table} WHERE {ORPHANS[table]}")

    def orphans(self) -> dict[str, int]:
        """Rows `runs` can neither show nor delete (see ORPHANS), per table that has any: what remove_orphans would
        remove, counted by removing them in a transaction that is then rolled back."""
        with _THREAD_WRITES, self._connect() as con:
            con.begin()
            found = _remove_orphans(con)
            con.rollback()
        return found

    def remove_orphans(self) -> dict[str, int]:
        """Remove every orphan row, in one transaction; returns how many went, per table."""
        with self.transaction() as con:
            return _remove_orphans(con)

    # Matched rounds' rollouts, kept clip by clip

    def rollouts(self, conditions: Sequence[str]) -> dict[tuple[str, str], bytes]:
        """The rollouts stored under these conditions: (clip hash, condition) -> their arrays."""
        with self._connect() as con:
            query = "SELECT clip_hash, condition, arrays FROM rollouts WHERE list_contains(?, condition)"
            rows = con.execute(query, [list(conditions)]).fetchall()
        return {(clip_hash, condition): arrays for clip_hash, condition, arrays in rows}

    def save_rollouts(self, clip_hash: str, arrays: Mapping[str, bytes]) -> None:
        """Keep one clip's rollouts (condition -> their arrays) in one transaction, replacing any stored."""
        rows = [(clip_hash, condition, data, utc_now()) for condition, data in arrays.items()]
        with self.transaction() as con:
            con.executemany("INSERT OR REPLACE INTO rollouts VALUES (?, ?, ?, ?)", rows)

    # The reference-frame cache

    def reference(self, clip_hash: str, target: str, device: str, dtype: str, aligner: str) -> ClipReference | None:
        """The clip's stored reference frames for this target and aligner, if any."""
        where = " AND ".join(f"{c} = ?" for c in REFERENCE_KEY)
        with self._connect() as con:
            row = con.execute(
                f"SELECT source, window_tokens, frames, words FROM reference_frames WHERE {where}",
                [clip_hash, target, device, dtype, aligner],
            ).fetchone()
        if row is None:
            return None
        source, window_tokens, frames, words = row
        return ClipReference(source, window_tokens, frames, [WordTime(**word) for word in json.loads(words)])

    def save_reference(
        self, clip_hash: str, target: str, device: str, dtype: str, aligner: str, reference: ClipReference
    ) -> None:
        """Store (or replace) a clip's reference frames for this target and aligner."""
        key = [clip_hash, target, device, dtype, aligner]
        words = json.dumps([asdict(word) for word in reference.words])
        columns = _columns([*REFERENCE_KEY, "source", "window_tokens", "frames", "words", "created"])
        with self.transaction() as con:
            con.execute(
                f"INSERT OR REPLACE INTO reference_frames ({columns}) "
                "VALUES (?, ?, ?, ?, ?, ?, CAST(? AS INTEGER[][]), CAST(? AS INTEGER[]), ?, ?)",
                [*key, reference.source, reference.window_tokens, reference.frames, words, utc_now()],
            )


def _remove_orphans(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    removed = {
        table: con.execute(f"DELETE FROM {table} AS t WHERE {where}").fetchone()[0] for table, where in ORPHANS.items()
    }
    return {table: count for table, count in removed.items() if count}


# ---------------------------------------------------------------------------------------------------------------------
# Query text


# A decode's plain row as Trace.tables() makes it: the decode, its clip and its run's settings and code.
_DECODE_ROWS = """
    SELECT d.*, c.* EXCLUDE (clip_hash, clip_id), r.* EXCLUDE (run_id, created, command, batch)
    FROM decodes d JOIN clips c USING (clip_hash) JOIN runs r USING (run_id)
    WHERE d.run_id = ? ORDER BY d.decode
"""
