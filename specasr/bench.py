"""Greedy vs speculative decoding, timed end to end on the same clips in one process."""

import statistics
from dataclasses import asdict, dataclass, replace

import numpy as np
import pandas as pd
from tqdm import tqdm

from specasr.decode import SpeculativeConfig, speculative_transcribe, transcribe
from specasr.draft import Draft
from specasr.metrics import acceptance, rho
from specasr.targets import WhisperTarget
from specasr.trace import Trace


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
    target: WhisperTarget,
    drafts: dict[str, Draft],
    clips: list[tuple[str, np.ndarray]],
    config: SpeculativeConfig,
    repeats: int = 5,
) -> tuple[pd.DataFrame, dict[str, list[Trace]]]:
    """Per-clip medians of greedy and of each draft's speculative wall-clock, interleaved after one warm-up each.

    Returns one row per clip and draft, and each draft's speculative traces of the last repetition.
    """
    config = replace(config, verify_peaks=False)  # time the loop, not the per-layer trace
    transcribe(target, clips[0][1])
    for draft in drafts.values():
        speculative_transcribe(target, draft, clips[0][1], config)
    rows, traces = [], {name: [] for name in drafts}
    for clip_id, audio in tqdm(clips, desc="bench", unit="clip"):
        greedy, speculative = [], {name: [] for name in drafts}
        for _ in range(repeats):
            greedy.append(transcribe(target, audio, clip_id))
            for name, draft in drafts.items():
                speculative[name].append(speculative_transcribe(target, draft, audio, config, clip_id))
        for name, runs in speculative.items():
            traces[name].append(runs[-1])
            rows.append(
                ClipTiming(
                    clip_id=clip_id,
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
    return table, traces


def summary(table: pd.DataFrame, traces: dict[str, list[Trace]]) -> pd.DataFrame:
    """One row per draft: speedups (median over clips and pooled over time), acceptance, rho, lossless clips."""
    rows = []
    for name, runs in table.groupby("draft", sort=False):
        accepted = acceptance(traces[name])
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
                "rho": rho(traces[name]),
                "greedy_ms_per_token": 1000 * runs.greedy_decode.sum() / runs.tokens.sum(),
                "lossless_clips": int(runs.same_tokens.sum()),
            }
        )
    return pd.DataFrame(rows)
