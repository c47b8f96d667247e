"""The trace: the single record of one decode, shared by engine, metrics, store and dashboard."""

from dataclasses import asdict, dataclass, field


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
class Trace:
    clip_id: str
    target: str
    device: str
    dtype: str
    tokens: list[int]
    text: str
    timings: Timings = field(default_factory=Timings)
    draft: str = "none"
    k: int = 0
