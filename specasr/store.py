"""The run store: one DuckDB file of runs, their clips and every level of their traces, the reusable reference
frames, and the queries the dashboard and the experiment runner need.

A run is the list of traces decoded under one `Settings` (a `decode` command is a run of one trace; a bench is one
run per arm). Runs decoded side by side, interleaved clip by clip, are written as one batch: timings compare only
within a batch. DuckDB lets one process at a time open a file, so every operation opens a short-lived connection and
waits while another process holds the file. A run (or a batch) is written in one transaction: a write that fails or
is killed leaves no rows. Metrics come from the stored rows through metrics.py; none is stored as the only copy.
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
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb
import numpy as np
import pandas as pd
import soundfile

from specasr.align import ClipReference, WordTime
from specasr.audio import SAMPLE_RATE
from specasr.cache import cache_dir
from specasr.metrics import (
    Acceptance,
    anchor_error_table,
    pooled_acceptance,
    word_error_rate,
)
from specasr.trace import CodeVersion, DraftStep, Round, Segment, Settings, Timings, Trace, VerifiedToken

if TYPE_CHECKING:
    from specasr.compare import Comparison

APPLICATION = "specasr"
RETRY_SECONDS = 0.05
# Processes take turns through the file's lock; threads of one process share one database and would conflict
# when two transactions insert the same clip, so they take turns here.
_THREAD_WRITES = threading.Lock()


class StoreError(RuntimeError):
    """The file cannot be used as a run store, or a store operation was refused."""


class StoreBusyError(StoreError):
    """Another process held the store's file for longer than the timeout."""


class UnknownRunError(StoreError, KeyError):
    """No run with that id in the store (a KeyError too, for callers that look runs up)."""

    __str__ = StoreError.__str__  # KeyError's would quote the message


@dataclass(frozen=True)
class DecodedRun:
    """A stored run as the experiment runner matches it: its settings and the (clip hash, repeat) pairs it decoded."""

    run_id: str
    batch: str | None  # shared by the runs decoded beside it; None in runs stored before batches were kept
    settings: Settings
    decoded: frozenset[tuple[str, int]]


def default_db_path() -> Path:
    """$SPECASR_DB, else runs.duckdb in the cache folder."""
    configured = os.environ.get("SPECASR_DB")
    return Path(configured) if configured else cache_dir() / "runs.duckdb"


# ---------------------------------------------------------------------------------------------------------------------
# Schema: an ordered list of migrations; a store's version is the number of them applied.

# `runtime` became the centre that moves on with depth (what runtime-paced was); the one that stays is runtime-last.
# Runs stored (or exported) before keep what they measured under the new names, renamed in this order.
RENAMED_WINDOWS = (("runtime", "runtime-last"), ("runtime-paced", "runtime"))
MIGRATIONS: list[list[str]] = [
    [
        "CREATE TABLE schema_version (application VARCHAR NOT NULL, version INTEGER NOT NULL)",
        """CREATE TABLE runs (
            run_id VARCHAR PRIMARY KEY,
            created TIMESTAMP NOT NULL,  -- UTC
            command VARCHAR NOT NULL,
            target VARCHAR NOT NULL,
            device VARCHAR NOT NULL,
            dtype VARCHAR NOT NULL,
            draft VARCHAR,
            draft_dtype VARCHAR,
            k INTEGER NOT NULL,
            "window" VARCHAR NOT NULL,
            half_width_ms DOUBLE NOT NULL,
            runtime_layer INTEGER,
            threshold DOUBLE NOT NULL,
            aligner VARCHAR NOT NULL,
            reference VARCHAR NOT NULL,
            verify_peaks BOOLEAN NOT NULL,
            keep_attention BOOLEAN NOT NULL,
            max_seconds DOUBLE NOT NULL,
            package_version VARCHAR NOT NULL,
            git_commit VARCHAR,
            git_dirty BOOLEAN
        )""",
        """CREATE TABLE clips (
            clip_hash VARCHAR PRIMARY KEY,
            clip_id VARCHAR NOT NULL,
            clip_seconds DOUBLE NOT NULL,
            dataset VARCHAR NOT NULL,
            reference_text VARCHAR NOT NULL
        )""",
        """CREATE TABLE decodes (
            run_id VARCHAR NOT NULL,
            decode INTEGER NOT NULL,  -- index within the run
            repeat INTEGER NOT NULL,
            clip_hash VARCHAR NOT NULL,
            clip_id VARCHAR NOT NULL,
            text VARCHAR NOT NULL,
            tokens INTEGER[] NOT NULL,
            draft_name VARCHAR NOT NULL,
            draft_hash VARCHAR,
            reference_frames INTEGER[],
            reference_source VARCHAR,
            features_seconds DOUBLE NOT NULL,
            encoder_seconds DOUBLE NOT NULL,
            decode_seconds DOUBLE NOT NULL,
            reference_seconds DOUBLE NOT NULL,
            wer DOUBLE,  -- against the clip's reference text, where it has words
            PRIMARY KEY (run_id, decode)
        )""",
        # The per-decode levels carry no key index: their rows are unique by construction and indexes slow writes.
        """CREATE TABLE rounds (
            run_id VARCHAR NOT NULL,
            decode INTEGER NOT NULL,
            index INTEGER NOT NULL,
            segment INTEGER NOT NULL,
            start INTEGER NOT NULL,
            proposed INTEGER[] NOT NULL,
            accepted INTEGER NOT NULL,
            target_token INTEGER NOT NULL,
            draft_seconds DOUBLE NOT NULL,
            verify_seconds DOUBLE NOT NULL
        )""",
        """CREATE TABLE draft_steps (
            run_id VARCHAR NOT NULL,
            decode INTEGER NOT NULL,
            round INTEGER NOT NULL,
            depth INTEGER NOT NULL,
            token INTEGER NOT NULL,
            accepted BOOLEAN NOT NULL,
            draft_peak INTEGER,
            window_centre INTEGER,
            reference_frame INTEGER,
            attention FLOAT[]
        )""",
        """CREATE TABLE verified_tokens (
            run_id VARCHAR NOT NULL,
            decode INTEGER NOT NULL,
            position INTEGER NOT NULL,
            token INTEGER NOT NULL,
            verify_peaks INTEGER[] NOT NULL
        )""",
    ],
    [
        """CREATE TABLE segments (
            run_id VARCHAR NOT NULL,
            decode INTEGER NOT NULL,
            index INTEGER NOT NULL,
            start_frame INTEGER NOT NULL,
            valid_frames INTEGER NOT NULL,
            first_token INTEGER NOT NULL,
            tokens INTEGER NOT NULL
        )""",
        """CREATE TABLE reference_frames (
            clip_hash VARCHAR NOT NULL,
            target VARCHAR NOT NULL,
            device VARCHAR NOT NULL,
            dtype VARCHAR NOT NULL,
            aligner VARCHAR NOT NULL,
            source VARCHAR NOT NULL,
            window_tokens INTEGER[][] NOT NULL,
            frames INTEGER[] NOT NULL,
            words VARCHAR NOT NULL,  -- JSON list of WordTime
            created TIMESTAMP NOT NULL,  -- UTC
            PRIMARY KEY (clip_hash, target, device, dtype, aligner)
        )""",
    ],
    ["""ALTER TABLE runs ADD COLUMN decoder VARCHAR DEFAULT 'specasr'"""],
    ["""ALTER TABLE decodes ADD COLUMN frame_seconds DOUBLE DEFAULT 0.02"""],  # stores before it held Whisper only
    ["""ALTER TABLE runs ADD COLUMN batch VARCHAR"""],  # NULL for runs written before batches were kept
    ["""ALTER TABLE runs ADD COLUMN assistant VARCHAR"""],  # the transformers-assisted peer's assistant
    [  # whether our loops replayed captured steps; before, only CUDA's speculative rounds did
        """ALTER TABLE runs ADD COLUMN graphs BOOLEAN DEFAULT false""",
        """UPDATE runs SET graphs = device LIKE 'cuda%' AND draft IS NOT NULL AND decoder = 'specasr'""",
    ],
    [
        *(f"""UPDATE runs SET "window" = '{new}' WHERE "window" = '{old}'""" for old, new in RENAMED_WINDOWS),
        """ALTER TABLE decodes ADD COLUMN runtime_peaks INTEGER[]""",  # NULL for runs stored before it was kept
    ],
    [  # a trace that renders without its model: token texts, the runtime layer, the clip's audio; runs get names
        """ALTER TABLE decodes ADD COLUMN token_texts VARCHAR[]""",
        """ALTER TABLE decodes ADD COLUMN target_runtime_layer INTEGER""",
        """ALTER TABLE draft_steps ADD COLUMN text VARCHAR""",
        """ALTER TABLE clips ADD COLUMN audio_path VARCHAR DEFAULT ''""",
        """ALTER TABLE runs ADD COLUMN name VARCHAR DEFAULT ''""",
        """ALTER TABLE runs ADD COLUMN note VARCHAR DEFAULT ''""",
        """CREATE TABLE clip_audio (
            clip_hash VARCHAR PRIMARY KEY,
            flac BLOB NOT NULL  -- the waveform as FLAC, 24-bit, 16 kHz mono
        )""",
    ],
]
SCHEMA_VERSION = len(MIGRATIONS)

RUN_TABLES = ("runs", "clips", "decodes", "segments", "rounds", "draft_steps", "verified_tokens", "clip_audio")
SHARED_TABLES = ("clips", "clip_audio")  # rows keyed by clip hash, shared by every run that decoded the clip
OPTIONAL_EXPORTS = ("clip_audio",)  # absent from exports written before it was kept
SETTINGS_COLUMNS = [f.name for f in fields(Settings)]
CODE_COLUMNS = [f.name for f in fields(CodeVersion)]
TIMING_COLUMNS = [f"{f.name}_seconds" for f in fields(Timings)]
CLIP_COLUMNS = ["clip_hash", "clip_id", "clip_seconds", "dataset", "reference_text", "audio_path"]
CLIP_ONLY_COLUMNS = CLIP_COLUMNS[2:]  # kept once per clip; a decode row keeps the hash and id
REFERENCE_KEY = ("clip_hash", "target", "device", "dtype", "aligner")


@dataclass(frozen=True)
class _Level:
    """A trace level below the decode: its table, its row dataclass and the columns that order a decode's rows."""

    table: str
    kind: type
    order: tuple[str, ...]


_LEVELS = {  # keyed by the names Trace.tables() uses
    "segments": _Level("segments", Segment, ("index",)),
    "rounds": _Level("rounds", Round, ("index",)),
    "steps": _Level("draft_steps", DraftStep, ("round", "depth")),
    "verified": _Level("verified_tokens", VerifiedToken, ("position",)),
}


def _schema_version(con: duckdb.DuckDBPyConnection, path: Path) -> int:
    """The store's schema version: 0 for a database without tables."""
    tables = {t for (t,) in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    if not tables:
        return 0
    if "schema_version" in tables:
        rows = con.execute("SELECT application, version FROM schema_version").fetchall()
        if len(rows) == 1 and rows[0][0] == APPLICATION:
            return rows[0][1]
    raise StoreError(f"{path} is not a specasr run store: it is a DuckDB database with other tables")


def _migrate(con: duckdb.DuckDBPyConnection, path: Path, target: int = SCHEMA_VERSION) -> None:
    """Apply the migrations the store lacks, up to `target`, in one transaction."""
    con.begin()
    version = _schema_version(con, path)
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"{path} was written by a newer specasr (schema {version}, this one reads up to {SCHEMA_VERSION}); "
            "upgrade specasr to use it"
        )
    if version < target:
        for statement in (s for migration in MIGRATIONS[version:target] for s in migration):
            con.execute(statement)
        con.execute("DELETE FROM schema_version")
        con.execute("INSERT INTO schema_version VALUES (?, ?)", [APPLICATION, target])
    con.commit()


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


def _literal(path: Path) -> str:
    return "'" + str(path).replace("'", "''") + "'"


def _parquet(path: Path) -> str:
    return f"read_parquet({_literal(path)})"


def _now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


# ---------------------------------------------------------------------------------------------------------------------
# The store


class Store:
    """A DuckDB file of runs. Every method opens its own connection and closes it before returning."""

    def __init__(self, path: Path | str | None = None, timeout: float = 60.0):
        self.path = Path(path) if path is not None else default_db_path()
        self.timeout = timeout
        if self.path == default_db_path():
            self.path.parent.mkdir(parents=True, exist_ok=True)
        elif not self.path.parent.is_dir():  # a mistyped folder is not made behind the user's back
            raise StoreError(f"{self.path.parent} does not exist: create it first, or give a store path in a folder")
        with _THREAD_WRITES, self._connect() as con:
            _migrate(con, self.path)
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
                    raise StoreError(f"cannot open {self.path} as a run store: {error}") from error
                if time.monotonic() >= deadline:
                    raise StoreBusyError(
                        f"{self.path} is busy: another process is writing to it (waited {self.timeout:g} s)"
                    ) from error
            time.sleep(RETRY_SECONDS)

    @contextmanager
    def _transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A connection in one transaction, committed only if the block completes (closing it rolls back)."""
        with _THREAD_WRITES, self._connect() as con:
            con.begin()
            yield con
            con.commit()

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
    ) -> list[str]:
        """Store runs decoded side by side as one batch, in one transaction: each run's traces and repeat numbers,
        as `write_run` takes them, and the waveforms in `audio`. Returns the run ids in order."""
        batch = uuid.uuid4().hex[:12]
        run_ids = [uuid.uuid4().hex[:12] for _ in runs]
        frames = [  # built before taking the file
            _run_frames(run_id, traces, command, repeats, batch)
            for run_id, (traces, repeats) in zip(run_ids, runs, strict=True)
        ]
        sounds = [(clip_hash, _flac(waveform)) for clip_hash, waveform in (audio or {}).items()]
        sounds = pd.DataFrame(sounds, columns=["clip_hash", "flac"])
        with self._transaction() as con:
            for run in frames:
                self._insert_run(con, run)
            self._insert_run(con, {"clip_audio": sounds})
        return run_ids

    def label_run(self, run_id: str, name: str, note: str) -> None:
        """Give a run a name (shown with it everywhere) and a note."""
        with self._transaction() as con:
            self._known_runs(con, [run_id])
            con.execute("UPDATE runs SET name = ?, note = ? WHERE run_id = ?", [name.strip(), note.strip(), run_id])

    def _insert_run(self, con: duckdb.DuckDBPyConnection, frames: dict[str, pd.DataFrame]) -> None:
        """Insert every row of a run; the caller owns the transaction."""
        for table, frame in frames.items():
            con.register("frame", frame)
            self._insert_select(con, table, "frame", list(frame.columns))

    def _insert_select(self, con: duckdb.DuckDBPyConnection, table: str, source: str, columns: list[str]) -> None:
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
            return [trace for _, trace in self._read_run(con, run_id)]

    def _read_run(self, con: duckdb.DuckDBPyConnection, run_id: str) -> list[tuple[int, Trace]]:
        """(repeat, trace) for every decode of a run."""
        self._known_runs(con, [run_id])
        decodes = con.execute(_DECODE_ROWS, [run_id]).df()
        by_decode = {
            name: _split_by_decode(self._level_rows(con, level, run_id), decodes["decode"])
            for name, level in _LEVELS.items()
        }
        decoded = []
        for i, repeat in enumerate(decodes["repeat"].tolist()):
            tables = {"decode": decodes.iloc[[i]]} | {name: rows[i] for name, rows in by_decode.items()}
            decoded.append((repeat, Trace.from_tables(tables)))
        return decoded

    def audio(self, clip_hash: str) -> np.ndarray | None:
        """The clip's waveform (16 kHz float32 mono) where the store keeps it."""
        with self._connect() as con:
            row = con.execute("SELECT flac FROM clip_audio WHERE clip_hash = ?", [clip_hash]).fetchone()
        return None if row is None else soundfile.read(io.BytesIO(row[0]), dtype="float32")[0]

    def _level_rows(self, con: duckdb.DuckDBPyConnection, level: _Level, run_id: str) -> pd.DataFrame:
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
    ) -> pd.DataFrame:
        """The run history, newest first, one row per run: its settings, code, row counts, seconds and median WER.

        `draft` matches the settings' draft or the start of the draft's name ("none" for greedy runs); `since` and
        `until` bound the creation time (UTC).
        """
        wanted = dict(target=target, draft=draft, window=window, k=k, dataset=dataset, since=since, until=until)
        chosen = {name: value for name, value in wanted.items() if value is not None}
        where = " AND ".join(_RUN_FILTERS[name] for name in chosen) or "TRUE"
        with self._connect() as con:
            return _overview(con, where, chosen)

    def decoded(self, command: str) -> list[DecodedRun]:
        """Every run of `command`, oldest first."""
        settings = _columns(SETTINGS_COLUMNS)
        with self._connect() as con:
            rows = con.execute(
                f"SELECT run_id, batch, list((clip_hash, repeat)), {settings} FROM runs JOIN decodes USING (run_id) "
                f"WHERE command = ? GROUP BY ALL ORDER BY min(created), run_id",
                [command],
            ).fetchall()
        return [
            DecodedRun(run_id, batch, Settings(*values), frozenset(tuple(pair) for pair in clips))
            for run_id, batch, clips, *values in rows
        ]

    # Deleting

    def delete_run(self, run_id: str) -> None:
        """Remove a run and every row of it, in one transaction; clips no other run decoded go too."""
        with self._transaction() as con:
            self._known_runs(con, [run_id])
            for table in RUN_TABLES:
                if table not in SHARED_TABLES:
                    con.execute(f"DELETE FROM {table} WHERE run_id = ?", [run_id])
            for table in SHARED_TABLES:
                con.execute(f"DELETE FROM {table} WHERE clip_hash NOT IN (SELECT clip_hash FROM decodes)")

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
        with self._transaction() as con:
            con.execute(
                f"INSERT OR REPLACE INTO reference_frames ({columns}) "
                "VALUES (?, ?, ?, ?, ?, ?, CAST(? AS INTEGER[][]), CAST(? AS INTEGER[]), ?, ?)",
                [*key, reference.source, reference.window_tokens, reference.frames, words, _now()],
            )

    # Export and import

    def export_runs(self, run_ids: Sequence[str], folder: Path | str) -> list[Path]:
        """Write the runs' rows as one Parquet file per table into `folder`; returns the files."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        paths = [folder / f"{table}.parquet" for table in RUN_TABLES]
        with self._connect() as con:
            chosen = {"run_ids": self._known_runs(con, run_ids)}
            for table, path in zip(RUN_TABLES, paths, strict=True):
                rows = f"SELECT * FROM {table} WHERE {_RUN_ROWS.get(table, 'list_contains($run_ids, run_id)')}"
                con.execute(f"COPY ({rows}) TO {_literal(path)} (FORMAT parquet)", chosen)
        return paths

    def import_runs(self, folder: Path | str) -> list[str]:
        """Add the runs exported to `folder`, in one transaction; refused if this store already holds any of them."""
        sources = {table: Path(folder) / f"{table}.parquet" for table in RUN_TABLES}
        missing = [path.name for table, path in sources.items() if not path.is_file() and table not in OPTIONAL_EXPORTS]
        if missing:
            raise StoreError(f"{folder} is not a run export: {', '.join(missing)} missing")
        with self._transaction() as con:
            run_ids = [r for (r,) in con.execute(f"SELECT run_id FROM {_parquet(sources['runs'])}").fetchall()]
            present = con.execute("SELECT run_id FROM runs WHERE list_contains(?, run_id)", [run_ids]).fetchall()
            if present:
                raise StoreError(f"{self.path} already holds run {', '.join(r for (r,) in present)}")
            for table, path in sources.items():
                if not path.is_file():
                    continue
                columns = [c[0] for c in con.execute(f"SELECT * FROM {_parquet(path)} LIMIT 0").description]
                self._insert_select(con, table, _parquet(path), columns)
                if table == "decodes" and "runtime_peaks" not in columns:  # exported before the windows' renaming
                    for old, new in RENAMED_WINDOWS:
                        rename = 'UPDATE runs SET "window" = ? WHERE "window" = ? AND list_contains(?, run_id)'
                        con.execute(rename, [new, old, run_ids])
        return run_ids

    # Queries: metrics from the stored rows, through the functions of metrics.py

    def survival(self, run_ids: Sequence[str]) -> pd.DataFrame:
        """Per speculative run and depth 0..K: survival s (1 at depth 0) and conditional acceptance a_k^c."""
        with self._connect() as con:
            acceptances = self._acceptances(con, run_ids)
        rows = [
            {"run_id": run_id, "depth": depth, "s": s, "conditional": [None, *result.conditional][depth]}
            for run_id, result in acceptances.items()
            for depth, s in enumerate(result.s)
        ]
        return pd.DataFrame(rows, columns=["run_id", "depth", "s", "conditional"])

    def anchor_error_by_depth(self, run_ids: Sequence[str]) -> pd.DataFrame:
        """Per run and draft depth: n, median, mean and p90 of |draft peak - reference frame| in frames."""
        with self._connect() as con:
            run_ids = self._known_runs(con, run_ids)
            steps = con.execute(
                "SELECT run_id, depth, draft_peak, reference_frame FROM draft_steps WHERE list_contains(?, run_id)",
                [run_ids],
            ).df()
        by_run = dict(tuple(steps.groupby("run_id")))
        tables = [anchor_error_table(by_run[r]).assign(run_id=r) for r in run_ids if r in by_run]
        columns = ["run_id", "depth", "n", "median", "mean", "p90"]
        return pd.concat(tables, ignore_index=True)[columns] if tables else pd.DataFrame(columns=columns)

    def run_summary(self, run_ids: Sequence[str]) -> pd.DataFrame:
        """One row per run: its arm, sizes, acceptance (None for greedy runs), total seconds and median WER."""
        with self._connect() as con:
            run_ids = self._known_runs(con, run_ids)
            overview = _overview(con, "list_contains($run_ids, run_id)", {"run_ids": run_ids})
            acceptances = self._acceptances(con, run_ids)
        summary = overview.set_index("run_id").loc[run_ids].reset_index()
        for name in ("a1", "a2c", "L"):
            summary[name] = [getattr(acceptances[r], name) if r in acceptances else None for r in run_ids]
        columns = ["run_id", "target", "draft_name", "window", "k", "clips", "decodes", "rounds", "draft_steps"]
        return summary[[*columns, "tokens", "a1", "a2c", "L", "seconds", "median_wer"]]

    def compare_runs(self, run_a: str, run_b: str) -> "Comparison":
        """Run A against run B on the clips both decoded, each metric as A - B with its paired bootstrap interval
        (compare.compare, as Side by side, Checkpoints and Windows show it); speed too where both runs were timed in
        one batch beside a greedy baseline."""
        from specasr.compare import compare  # compare reads traces through experiments, which imports this module

        with self._connect() as con:
            traces_a, traces_b = (_by_repeat(self._read_run(con, run)) for run in (run_a, run_b))
            baseline = con.execute(_BATCH_BASELINE, {"a": run_a, "b": run_b}).fetchone()
            greedy = None if baseline is None else _by_repeat(self._read_run(con, baseline[0]))
        return compare(traces_a, traces_b, greedy)

    def _acceptances(self, con: duckdb.DuckDBPyConnection, run_ids: Sequence[str]) -> dict[str, Acceptance]:
        """Each speculative run's acceptance pooled over its rounds, in run_ids order (greedy runs have none)."""
        run_ids = self._known_runs(con, run_ids)
        rows = con.execute(_ACCEPTED_COUNTS, [run_ids]).fetchall()
        found = {run_id: pooled_acceptance(accepted, k, tokens) for run_id, k, tokens, accepted in rows}
        return {run_id: found[run_id] for run_id in run_ids if run_id in found}


# ---------------------------------------------------------------------------------------------------------------------
# Rows in and out


def _run_frames(
    run_id: str, traces: list[Trace], command: str, repeats: list[int] | None, batch: str | None = None
) -> dict[str, pd.DataFrame]:
    """A run's rows, table by table, from the traces' own tables."""
    _check_run(traces, repeats)
    first = traces[0]
    run = {"run_id": run_id, "created": _now(), "command": command, "batch": batch}
    run |= asdict(first.settings) | asdict(first.code)
    per_trace = [trace.tables() for trace in traces]
    decodes = pd.concat([tables["decode"] for tables in per_trace], ignore_index=True).assign(
        run_id=run_id,
        decode=range(len(traces)),
        repeat=repeats if repeats is not None else 0,
        wer=[_word_error_rate(trace) for trace in traces],
    )
    frames = {
        "runs": pd.DataFrame([run]),
        "clips": decodes[CLIP_COLUMNS].drop_duplicates("clip_hash"),
        "decodes": decodes.drop(columns=[*SETTINGS_COLUMNS, *CODE_COLUMNS, *CLIP_ONLY_COLUMNS]),
    }
    for name, level in _LEVELS.items():
        rows = pd.concat([tables[name].assign(decode=i) for i, tables in enumerate(per_trace)], ignore_index=True)
        frames[level.table] = rows.assign(run_id=run_id)
    return frames


def _check_run(traces: list[Trace], repeats: list[int] | None) -> None:
    if not traces:
        raise ValueError("a run needs at least one trace")
    if repeats is not None and len(repeats) != len(traces):
        raise ValueError(f"got {len(repeats)} repeat numbers for {len(traces)} traces")
    first = traces[0]
    if any(t.settings != first.settings or t.code != first.code for t in traces):
        raise ValueError("the traces of a run must share their settings and code version")
    if not all(t.clip_hash for t in traces):
        raise ValueError("every trace of a run needs its clip's hash")


def _flac(waveform: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, waveform, SAMPLE_RATE, format="FLAC", subtype="PCM_24")
    return buffer.getvalue()


def _word_error_rate(trace: Trace) -> float | None:
    """The decode's WER against the clip's reference text; None where that has no words."""
    try:
        return word_error_rate([trace.reference_text], [trace.text])
    except ValueError:
        return None


def _split_by_decode(rows: pd.DataFrame, decodes: pd.Series) -> list[pd.DataFrame]:
    """A level's rows of every decode, without the decode column (empty for a decode that has none)."""
    groups = dict(tuple(rows.groupby("decode")))
    empty = rows.iloc[:0]
    return [groups.get(decode, empty).drop(columns="decode") for decode in decodes]


def _by_repeat(decoded: list[tuple[int, Trace]]) -> list[Trace]:
    """A run's traces, repeat by repeat (decode order within a repeat): each clip's first repeat comes first."""
    return [trace for _, trace in sorted(decoded, key=lambda pair: pair[0])]


# ---------------------------------------------------------------------------------------------------------------------
# Query text


# A decode's plain row as Trace.tables() makes it: the decode, its clip and its run's settings and code.
_DECODE_ROWS = """
    SELECT d.*, c.* EXCLUDE (clip_hash, clip_id), r.* EXCLUDE (run_id, created, command, batch)
    FROM decodes d JOIN clips c USING (clip_hash) JOIN runs r USING (run_id)
    WHERE d.run_id = ? ORDER BY d.decode
"""

_RUN_FILTERS = {
    "target": "target = $target",
    "draft": "(draft = $draft OR starts_with(draft_name, $draft))",
    "window": '"window" = $window',
    "k": "k = $k",
    "dataset": "run_id IN (SELECT run_id FROM decodes JOIN clips USING (clip_hash) WHERE dataset = $dataset)",
    "since": "created >= CAST($since AS TIMESTAMP)",
    "until": "created <= CAST($until AS TIMESTAMP)",
}

# Rows of a table that belong to the chosen runs, where the table has no run_id.
_RUN_ROWS = dict.fromkeys(
    SHARED_TABLES, "clip_hash IN (SELECT clip_hash FROM decodes WHERE list_contains($run_ids, run_id))"
)

_RUN_OVERVIEW = f"""
    SELECT runs.*, d.draft_name, d.clips, d.first_clip, d.decodes, coalesce(r.rounds, 0) AS rounds,
           coalesce(s.draft_steps, 0) AS draft_steps, d.tokens, d.median_wer,
           {", ".join(f"d.{c}" for c in TIMING_COLUMNS)}
    FROM runs
    JOIN (
        SELECT run_id, any_value(draft_name) AS draft_name, count(DISTINCT clip_hash) AS clips, count(*) AS decodes,
               arg_min(clip_id, decode) AS first_clip,
               sum(len(tokens)) AS tokens, median(wer) AS median_wer,
               {", ".join(f"sum({c}) AS {c}" for c in TIMING_COLUMNS)}
        FROM decodes GROUP BY run_id
    ) d USING (run_id)
    LEFT JOIN (SELECT run_id, count(*) AS rounds FROM rounds GROUP BY run_id) r USING (run_id)
    LEFT JOIN (SELECT run_id, count(*) AS draft_steps FROM draft_steps GROUP BY run_id) s USING (run_id)
"""

# Every speculative run's K, transcript tokens and rounds' accepted counts.
_ACCEPTED_COUNTS = """
    SELECT run_id, any_value(runs.k), any_value(d.tokens), list(accepted ORDER BY rounds.decode, rounds.index)
    FROM rounds
    JOIN runs USING (run_id)
    JOIN (SELECT run_id, sum(len(tokens)) AS tokens FROM decodes GROUP BY run_id) d USING (run_id)
    WHERE list_contains($1, run_id)
    GROUP BY run_id
"""


# The greedy run timed beside two runs: the first baseline of the batch both belong to (its A/A copy comes later).
_BATCH_BASELINE = """
    SELECT run_id FROM runs
    WHERE draft IS NULL AND NOT verify_peaks
      AND batch = (SELECT batch FROM runs WHERE run_id = $a) AND batch = (SELECT batch FROM runs WHERE run_id = $b)
    ORDER BY created, run_id LIMIT 1
"""


def _overview(con: duckdb.DuckDBPyConnection, where: str, params: dict) -> pd.DataFrame:
    """_RUN_OVERVIEW's rows that match, newest first, with each run's phase seconds summed into its total."""
    frame = con.execute(f"SELECT * FROM ({_RUN_OVERVIEW}) WHERE {where} ORDER BY created DESC, run_id", params).df()
    frame["seconds"] = [Timings(*phases).total for phases in frame[TIMING_COLUMNS].itertuples(index=False)]
    frame["label"] = [run_label(row) for row in frame.itertuples(index=False)]
    return frame.drop(columns=TIMING_COLUMNS)


def run_label(run) -> str:
    """A run as people name it: its name where it has one, else its clip (or clip count) and settings."""
    if run.name:
        return run.name
    clips = run.first_clip if run.clips == 1 else f"{run.clips} clips"
    arm = "greedy" if run.draft_name == "none" else f"{run.draft_name.split('@')[0]} {run.window} K={run.k}"
    return f"{clips}: {arm} ({run.command})"
