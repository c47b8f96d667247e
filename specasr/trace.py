"""The trace: the single record of one decode, shared by engine, metrics, store and dashboard.

Levels (DESIGN.md): the decode itself, its rounds, the draft steps of each round, and every
verified token. Metrics are computed from these rows; nothing here is a summary.
"""

from dataclasses import asdict, dataclass, field, fields

import pandas as pd


@dataclass
class Timings:
    """Seconds per phase. `decode` is the whole token loop; `draft` and `verify` are its parts."""

    features: float = 0.0
    encoder: float = 0.0
    decode: float = 0.0
    draft: float = 0.0
    verify: float = 0.0

    @property
    def total(self) -> float:
        return self.features + self.encoder + self.decode

    def as_dict(self) -> dict[str, float]:
        return {**asdict(self), "total": self.total}


@dataclass
class Round:
    """One draft proposal block followed by one target verification pass."""

    index: int
    start: int  # transcript tokens known before the round
    proposed: list[int]
    accepted: int
    target_token: int  # the target's own next token after the accepted prefix (end-of-text included)
    draft_seconds: float
    verify_seconds: float


@dataclass
class DraftStep:
    """One draft proposal: depth 1 is the restart, 2..K the continuation."""

    round: int
    depth: int
    token: int
    accepted: bool
    draft_peak: int | None  # frame of the head-averaged audio attention peak; None for a no-audio draft
    window_centre: int | None
    reference_frame: int | None
    attention: list[float] | None = None  # the full head-averaged row over valid frames, when kept


@dataclass
class VerifiedToken:
    """A transcript token and the audio frame (padding excluded) the target attended most while predicting it,
    per decoder layer, head-averaged."""

    position: int  # index in the transcript
    token: int
    verify_peaks: list[int]


@dataclass
class Trace:
    clip_id: str
    target: str
    device: str
    dtype: str  # the target's
    tokens: list[int]
    text: str
    timings: Timings = field(default_factory=Timings)
    draft: str = "none"  # name and hash, or "none" for autoregressive greedy
    draft_dtype: str | None = None
    k: int = 0
    window: str = "unrestricted"
    half_width_ms: float = 0.0
    runtime_layer: int | None = None
    valid_frames: int = 0
    rounds: list[Round] = field(default_factory=list)
    steps: list[DraftStep] = field(default_factory=list)
    verified: list[VerifiedToken] = field(default_factory=list)

    def tables(self) -> dict[str, pd.DataFrame]:
        """One DataFrame per level; the decode level is a single row keyed by clip_id."""
        decode = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _CHILDREN}
        decode["timings"] = self.timings.as_dict()
        return {
            "decode": pd.DataFrame([decode]),
            **{name: _frame(getattr(self, name), kind) for name, kind in _CHILDREN.items()},
        }

    @classmethod
    def from_tables(cls, tables: dict[str, pd.DataFrame]) -> "Trace":
        decode = tables["decode"].iloc[0].to_dict()
        timings = {k: v for k, v in decode.pop("timings").items() if k != "total"}
        children = {
            name: [kind(**_plain(row)) for row in tables[name].to_dict("records")] for name, kind in _CHILDREN.items()
        }
        return cls(**_plain(decode), timings=Timings(**timings), **children)


_CHILDREN = {"rounds": Round, "steps": DraftStep, "verified": VerifiedToken}


def _frame(rows: list, kind: type) -> pd.DataFrame:
    frame = pd.DataFrame([asdict(r) for r in rows], columns=[f.name for f in fields(kind)])
    optional_ints = [f.name for f in fields(kind) if f.type == int | None]
    return frame.astype(dict.fromkeys(optional_ints, "Int64"))


def _plain(row: dict) -> dict:
    """Undo pandas' conversions: numpy scalars and arrays to Python, missing values back to None."""
    out = {}
    for key, value in row.items():
        if hasattr(value, "tolist"):
            value = value.tolist()
        elif value is pd.NA or (isinstance(value, float) and value != value):
            value = None
        out[key] = value
    return out
