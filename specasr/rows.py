"""A run's traces as the store's rows, table by table, and back: the one mapping between Trace and the schema."""

import io
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime

import numpy as np
import pandas as pd
import soundfile

from specasr.audio import SAMPLE_RATE
from specasr.metrics import word_error_rate
from specasr.trace import CodeVersion, DraftStep, Round, Segment, Settings, Trace, VerifiedToken

SETTINGS_COLUMNS = [f.name for f in fields(Settings)]
CODE_COLUMNS = [f.name for f in fields(CodeVersion)]
CLIP_COLUMNS = ["clip_hash", "clip_id", "clip_seconds", "dataset", "reference_text", "audio_path"]
CLIP_ONLY_COLUMNS = CLIP_COLUMNS[2:]  # kept once per clip; a decode row keeps the hash and id


@dataclass(frozen=True)
class Level:
    """A trace level below the decode: its table, its row dataclass and the columns that order a decode's rows."""

    table: str
    kind: type
    order: tuple[str, ...]


LEVELS = {  # keyed by the names Trace.tables() uses
    "segments": Level("segments", Segment, ("index",)),
    "rounds": Level("rounds", Round, ("index",)),
    "steps": Level("draft_steps", DraftStep, ("round", "node")),
    "verified": Level("verified_tokens", VerifiedToken, ("position",)),
}


def run_frames(
    run_id: str, traces: list[Trace], command: str, repeats: list[int] | None, batch: str | None = None
) -> dict[str, pd.DataFrame]:
    """A run's rows, table by table, from the traces' own tables."""
    _check_run(traces, repeats)
    first = traces[0]
    run = {"run_id": run_id, "created": utc_now(), "command": command, "batch": batch}
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
    for name, level in LEVELS.items():
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


def flac(waveform: np.ndarray) -> bytes:
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


def traces_from_rows(decodes: pd.DataFrame, levels: dict[str, pd.DataFrame]) -> list[Trace]:
    """A run's traces from its decode rows (one per trace, joined with clip and run) and each level's rows (keyed as
    LEVELS, with their decode column)."""
    by_decode = {name: _split_by_decode(rows, decodes["decode"]) for name, rows in levels.items()}
    return [
        Trace.from_tables({"decode": decodes.iloc[[i]]} | {name: rows[i] for name, rows in by_decode.items()})
        for i in range(len(decodes))
    ]


def utc_now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)
