"""Greedy vs speculative decoding, timed end to end on the same clips in one process, both arms through the
pipeline."""

import statistics
from dataclasses import asdict, dataclass, field, replace

import pandas as pd
from tqdm import tqdm

from specasr.audio import Clip
from specasr.metrics import acceptance, rho
from specasr.pipeline import Pipeline
from specasr.trace import Settings, Trace


@dataclass
class ArmResult:
    """Every decode of one arm: clip by clip, repetition by repetition."""

    settings: Settings
    traces: list[Trace] = field(default_factory=list)
    repeats: list[int] = field(default_factory=list)

    def of_clip(self, clip_hash: str) -> list[Trace]:
        return [t for t in self.traces if t.clip_hash == clip_hash]


@dataclass
class ClipTiming:
    clip_id: str
    draft: str
    tokens: int
    greedy_decode: float  # medians over the repetitions, seconds
    greedy_total: float
    speculative_decode: float
    speculative_total: float
    same_tokens: bool


def _median(traces: list[Trace], phase: str) -> float:
    return statistics.median(getattr(t.timings, phase) for t in traces)


def benchmark(
    pipeline: Pipeline, arms: dict[str, Settings], clips: list[Clip], repeats: int = 5
) -> tuple[pd.DataFrame, dict[str, ArmResult]]:
    """Decode every clip `repeats` times in every arm, interleaved, after one warm-up decode per arm.

    `arms` maps names to settings; the first must be greedy (no draft), the baseline of the others. No arm records
    verification peaks: the loop is timed, not the trace's diagnostics. Returns one row per clip and
    speculative arm (medians over repetitions) and every arm's decodes.
    """
    (baseline, *drafted) = arms
    if arms[baseline].draft is not None:
        raise ValueError("the first arm of a bench is the greedy baseline")
    arms = {name: replace(settings, verify_peaks=False) for name, settings in arms.items()}
    for settings in arms.values():
        pipeline.decode(clips[0], settings)
    results = {name: ArmResult(pipeline.resolved(settings)) for name, settings in arms.items()}
    for clip in tqdm(clips, desc="bench", unit="clip"):
        for repeat in range(repeats):
            for name, settings in arms.items():
                results[name].traces.append(pipeline.decode(clip, settings))
                results[name].repeats.append(repeat)
    rows = []
    for clip in clips:
        greedy = results[baseline].of_clip(clip.hash)
        for name in drafted:
            runs = results[name].of_clip(clip.hash)
            rows.append(
                ClipTiming(
                    clip_id=clip.id,
                    draft=name,
                    tokens=len(greedy[0].tokens),
                    greedy_decode=_median(greedy, "decode"),
                    greedy_total=_median(greedy, "total"),
                    speculative_decode=_median(runs, "decode"),
                    speculative_total=_median(runs, "total"),
                    same_tokens=all(s.tokens == greedy[0].tokens for s in runs),
                )
            )
    table = pd.DataFrame([asdict(r) for r in rows])
    table["decode_speedup"] = table.greedy_decode / table.speculative_decode
    table["total_speedup"] = table.greedy_total / table.speculative_total
    return table, results


def summary(table: pd.DataFrame, results: dict[str, ArmResult]) -> pd.DataFrame:
    """One row per draft: speedups (median over clips and pooled over time), acceptance, rho, lossless clips.

    Acceptance is counted on the first repetition (every repetition decodes the same tokens); rho on all of them.
    """
    rows = []
    for name, runs in table.groupby("draft", sort=False):
        result = results[name]
        first = [t for t, repeat in zip(result.traces, result.repeats, strict=True) if repeat == 0]
        accepted = acceptance(first)
        rows.append(
            {
                "draft": name,
                "clips": len(runs),
                "decode_speedup_median": runs.decode_speedup.median(),
                "total_speedup_median": runs.total_speedup.median(),
                "decode_speedup_pooled": runs.greedy_decode.sum() / runs.speculative_decode.sum(),
                "total_speedup_pooled": runs.greedy_total.sum() / runs.speculative_total.sum(),
                "L": accepted.L,
                "a1": accepted.a1,
                "a2c": accepted.a2c,
                "rho": rho(result.traces),
                "greedy_ms_per_token": 1000 * runs.greedy_decode.sum() / runs.tokens.sum(),
                "lossless_clips": int(runs.same_tokens.sum()),
            }
        )
    return pd.DataFrame(rows)
