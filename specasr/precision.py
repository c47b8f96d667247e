"""Numerical exactness (paper A.4): a loop run in low precision against float32 greedy decoding of the same clips.

Speculative decoding is lossless under exact arithmetic only. In float16 or bfloat16 a near-tie between two tokens
can resolve the other way; this module measures how often: token and utterance agreement with the float32 greedy
transcript, each arm's WER, and the argmax flip rate, the share of the low-precision transcript's positions where a
float32 recomputation (encoder and decoder, teacher-forced on that transcript) would have chosen another token.
"""

from dataclasses import dataclass, replace

import pandas as pd
import torch
from tqdm import tqdm

from specasr.audio import Clip, split_windows
from specasr.metrics import word_error_rate
from specasr.pipeline import Pipeline
from specasr.targets import Target
from specasr.trace import Settings, Trace


@dataclass
class Flips:
    positions: int  # transcript tokens checked (end-of-text included)
    flips: int  # of them, where float32 chooses another token
    margins: list[float]  # at each flip, float32's logit margin of its choice over the token emitted


def token_agreement(reference: list[int], candidate: list[int]) -> tuple[int, int]:
    """(positions where both transcripts hold the same token, the longer transcript's length)."""
    same = sum(a == b for a, b in zip(reference, candidate, strict=False))
    return same, max(len(reference), len(candidate))


@torch.inference_mode()
def argmax_flips(target: Target, clip: Clip, trace: Trace) -> Flips:
    """Teacher-force every segment of a low-precision trace through the float32 `target` and compare its greedy
    choice with the token the trace emitted at each position."""
    positions, flips, margins = 0, 0, []
    windows = split_windows(clip.audio, target.window_samples, target.cut_samples)
    for segment, (start, end) in zip(trace.segments, windows, strict=True):
        memory = target.encode(target.features(clip.audio[start:end]))
        emitted = trace.tokens[segment.first_token : segment.first_token + segment.tokens]
        if len(target.prompt) + len(emitted) < target.max_length:
            emitted = [*emitted, target.eot]
        inputs = torch.tensor([[*target.prompt, *emitted[:-1]]], device=memory.device)
        states = target.forward(inputs, target.new_cache(memory, inputs.shape[1])).states[:, len(target.prompt) - 1 :]
        choices = target.greedy_tokens(states, 0)[0]  # suppresses what Whisper never starts with in row 0 only
        logits = target.logits(states)[0].float()
        emitted = torch.tensor(emitted, device=logits.device)
        differs = choices != emitted
        margin = logits.gather(1, choices[:, None])[:, 0] - logits.gather(1, emitted[:, None])[:, 0]
        positions += len(emitted)
        flips += int(differs.sum())
        margins += margin[differs].tolist()
    return Flips(positions, flips, margins)


def precision_table(
    pipeline: Pipeline, clips: list[Clip], arms: dict[str, Settings], reference: Settings
) -> pd.DataFrame:
    """One row per arm (low-precision loops) against `reference` (float32 greedy) over `clips`: token and utterance
    agreement, WER of both, argmax flip rate and the median float32 margin at the flips."""
    reference = replace(reference, draft=None, dtype="float32", verify_peaks=False)
    checker = pipeline.target(reference)
    truth = {clip.hash: pipeline.decode(clip, reference) for clip in tqdm(clips, desc="float32 greedy", unit="clip")}
    texts, rows = [clip.text for clip in clips], []
    for name, settings in arms.items():
        traces = [pipeline.decode(clip, settings) for clip in tqdm(clips, desc=name, unit="clip")]
        agreement = [token_agreement(truth[t.clip_hash].tokens, t.tokens) for t in traces]
        flips = [argmax_flips(checker, clip, trace) for clip, trace in zip(clips, traces, strict=True)]
        margins = [m for f in flips for m in f.margins]
        rows.append(
            {
                "arm": name,
                "dtype": pipeline.resolved(settings).dtype,
                "clips": len(clips),
                "token_exact": sum(s for s, _ in agreement) / max(1, sum(n for _, n in agreement)),
                "utterance_exact": sum(truth[t.clip_hash].tokens == t.tokens for t in traces) / len(traces),
                "wer_float32_greedy": word_error_rate(texts, [truth[c.hash].text for c in clips]),
                "wer": word_error_rate(texts, [t.text for t in traces]),
                "positions": sum(f.positions for f in flips),
                "flip_rate": sum(f.flips for f in flips) / max(1, sum(f.positions for f in flips)),
                "flips": sum(f.flips for f in flips),
                "flip_margin_median": float(pd.Series(margins).median()) if margins else None,
            }
        )
    return pd.DataFrame(rows)
