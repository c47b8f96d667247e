"""Greedy vs speculative decoding, timed end to end on the same clips in one process."""

import statistics
from dataclasses import dataclass, replace

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
    draft: Draft,
    clips: list[tuple[str, np.ndarray]],
    config: SpeculativeConfig,
    repeats: int = 5,
) -> tuple[pd.DataFrame, list[Trace]]:
    """Per-clip medians of greedy and speculative wall-clock, alternating the two after one warm-up each.

    Returns the per-clip table and the speculative traces of the last repetition (for acceptance and rho).
    """
    config = replace(config, verify_peaks=False)  # time the loop, not the per-layer trace
    transcribe(target, clips[0][1])
    speculative_transcribe(target, draft, clips[0][1], config)
    rows, traces = [], []
    for clip_id, audio in tqdm(clips, desc="bench", unit="clip"):
        greedy, speculative = [], []
        for _ in range(repeats):
            greedy.append(transcribe(target, audio, clip_id))
            speculative.append(speculative_transcribe(target, draft, audio, config, clip_id))
        traces.append(speculative[-1])
        rows.append(
            ClipTiming(
                clip_id=clip_id,
                tokens=len(greedy[0].tokens),
                greedy_decode=_median(greedy, "decode"),
                greedy_total=_median(greedy, "total"),
                speculative_decode=_median(speculative, "decode"),
                speculative_total=_median(speculative, "total"),
                same_tokens=all(s.tokens == greedy[0].tokens for s in speculative),
            )
        )
    table = pd.DataFrame([r.__dict__ for r in rows])
    table["decode_speedup"] = table.greedy_decode / table.speculative_decode
    table["total_speedup"] = table.greedy_total / table.speculative_total
    return table, traces


def summary(table: pd.DataFrame, traces: list[Trace]) -> dict[str, float]:
    accepted = acceptance(traces)
    return {
        "clips": len(table),
        "decode_speedup_median": table.decode_speedup.median(),
        "total_speedup_median": table.total_speedup.median(),
        "decode_speedup_pooled": table.greedy_decode.sum() / table.speculative_decode.sum(),
        "total_speedup_pooled": table.greedy_total.sum() / table.speculative_total.sum(),
        "L": accepted.L,
        "a1": accepted.a1,
        "a2c": accepted.a2c,
        "rho": rho(traces),
        "greedy_ms_per_token": 1000 * table.greedy_decode.sum() / table.tokens.sum(),
        "lossless_clips": int(table.same_tokens.sum()),
    }
