"""Metrics computed from traces: WER, acceptance, anchor error, speed and the cost rule (their intervals come from
intervals.py; the same metrics from a store's rows, in stored_metrics.py)."""

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib.resources import files

import jiwer
import numpy as np
import pandas as pd
from numpy.typing import ArrayLike
from transformers.models.whisper.english_normalizer import EnglishTextNormalizer

from specasr.intervals import bootstrap, pooled_bootstrap
from specasr.trace import Trace


@cache
def _normalizer() -> EnglishTextNormalizer:
    # Whisper's British-to-American spelling table; transformers ships the normalizer but not the table.
    spelling = json.loads(files("whisper_normalizer").joinpath("normalizers/english.json").read_text())
    return EnglishTextNormalizer(spelling)


def normalize_text(text: str) -> str:
    """Whisper's English text normalizer (casing, punctuation, numbers, spelling)."""
    return _normalizer()(text)


def word_error_rate(references: list[str], hypotheses: list[str]) -> float:
    """Corpus WER (total edits / total reference words) after Whisper's English normalization."""
    pairs = [(normalize_text(r), normalize_text(h)) for r, h in zip(references, hypotheses, strict=True)]
    pairs = [(r, h) for r, h in pairs if r]
    if not pairs:
        raise ValueError("no reference words to score")
    refs, hyps = zip(*pairs, strict=True)
    return jiwer.wer(list(refs), list(hyps))


@dataclass
class Acceptance:
    """Acceptance pooled over rounds: survival s_k (s[0] = 1), conditional a_k^c (index 0 is depth 1), L."""

    rounds: int
    s: list[float]
    conditional: list[float | None]  # None where no round survived to the previous depth
    L: float  # mean accepted draft tokens per round = sum_{k>=1} s_k
    tokens_per_round: float

    @property
    def a1(self) -> float | None:
        """Restart acceptance s_1."""
        return self.s[1] if len(self.s) > 1 else None

    @property
    def a2c(self) -> float | None:
        """Continuation acceptance a_2^c = s_2 / s_1."""
        return self.conditional[1] if len(self.conditional) > 1 else None


def acceptance(traces: list[Trace]) -> Acceptance:
    """Pool every round of every trace; K is the largest of the traces' K."""
    k_max = max((t.settings.k for t in traces), default=0)
    accepted = [r.accepted for t in traces for r in t.rounds]
    return pooled_acceptance(accepted, k_max, sum(len(t.tokens) for t in traces))


def pooled_acceptance(accepted: Sequence[int], k_max: int, tokens: int) -> Acceptance:
    """Acceptance from every round's accepted count, and the transcript tokens those rounds produced.

    A round survives depth k when its first k proposals were accepted, so a round that proposed
    fewer than k tokens (length limit, confidence stop) does not survive it.
    """
    if not len(accepted):
        raise ValueError("no speculative rounds to score (greedy traces have none)")
    counts = np.bincount(np.asarray(accepted, dtype=int), minlength=k_max + 1)
    survivors = counts[::-1].cumsum()[::-1][: k_max + 1]  # rounds with accepted >= k
    s = (survivors / len(accepted)).tolist()
    conditional = [s[k] / s[k - 1] if s[k - 1] > 0 else None for k in range(1, k_max + 1)]
    # A round advances 1 + accepted tokens; the last round's end-of-text is not a transcript token.
    return Acceptance(len(accepted), s, conditional, sum(s[1:]), tokens / len(accepted))


def anchor_error_by_depth(traces: list[Trace]) -> pd.DataFrame:
    """|draft_peak - reference_frame| in frames per draft depth, over steps where both are known."""
    steps = [(s.depth, s.draft_peak, s.reference_frame) for t in traces for s in t.spine]
    return anchor_error_table(pd.DataFrame(steps, columns=["depth", "draft_peak", "reference_frame"]))


def anchor_error_table(steps: pd.DataFrame) -> pd.DataFrame:
    """Per depth: n, median, mean and p90 of |draft_peak - reference_frame| (frames) from draft-step rows."""
    known = steps.dropna(subset=["draft_peak", "reference_frame"])
    error = (known.draft_peak.astype(float) - known.reference_frame.astype(float)).abs()
    errors = pd.DataFrame({"depth": known.depth.astype(int), "error": error}).groupby("depth")["error"]
    table = pd.DataFrame(
        {"n": errors.size(), "median": errors.median(), "mean": errors.mean(), "p90": errors.quantile(0.9)}
    )
    return table.reset_index().astype({"depth": int, "n": int})


def verify_anchor_error(traces: list[Trace], reference_frames: list[list[int | None]], layer: int) -> float:
    """Median |verification attention peak at `layer` - reference frame| over verified tokens with a reference.

    reference_frames[i][position] is the frame of traces[i]'s transcript token at that position.
    """
    errors = [
        abs(token.verify_peaks[layer] - frames[token.position])
        for trace, frames in zip(traces, reference_frames, strict=True)
        for token in trace.verified
        if frames[token.position] is not None
    ]
    if not errors:
        raise ValueError("no verified tokens with a reference frame")
    return float(np.median(errors))


def speedup(baseline_seconds: list[float], candidate_seconds: list[float]) -> float:
    """Total baseline wall-clock / total candidate wall-clock over the same utterances."""
    if not baseline_seconds or len(baseline_seconds) != len(candidate_seconds):
        raise ValueError(
            f"need matched non-empty timings, got {len(baseline_seconds)} and {len(candidate_seconds)} utterances"
        )
    baseline, candidate = sum(baseline_seconds), sum(candidate_seconds)
    if baseline <= 0 or candidate <= 0:
        raise ValueError(f"total wall-clock must be positive, got {baseline} and {candidate} s")
    return baseline / candidate


def rho(traces: list[Trace]) -> float:
    """Measured cost of one draft pass over one verification pass, pooled over rounds.

    Draft seconds include the draft's catch-up on the tokens verified in the previous round, so this is the full
    draft cost per depth drafted (a chain's proposed token, a tree's frontier), not the bare proposal step.
    """
    rounds = [r for t in traces for r in t.rounds]
    passes = sum(t.draft_passes for t in traces)
    verify = sum(r.verify_seconds for r in rounds)
    if not passes or verify <= 0:
        raise ValueError("need rounds with draft steps and positive verification time to measure rho")
    return step_cost(sum(r.draft_seconds for r in rounds), passes, verify, len(rounds))


def step_cost(draft_seconds: ArrayLike, passes: ArrayLike, verify_seconds: ArrayLike, rounds: ArrayLike) -> ArrayLike:
    """rho from its sums: draft seconds per draft pass over verification seconds per round (elementwise)."""
    return (draft_seconds / passes) / (verify_seconds / rounds)


def correction_pays(delta_L: float, L: float, delta_cost: float, k: float, rho: float) -> bool:
    """Cost rule (paper eq. 5): a correction pays when dL / (1 + L) > dC / (1 + K*rho).

    delta_cost is the correction's added cost per round in units of one verification pass.
    """
    return delta_L / (1 + L) > delta_cost / (1 + k * rho)


def predicted_speed_change(delta_L: float, L: float, delta_cost: float, k: float, rho: float) -> float:
    """The relative speed change the cost model predicts for a correction (paper eq. 4): tokens per unit of cost
    after, (1 + L + dL) / (1 + K*rho + dC), over before, (1 + L) / (1 + K*rho), less one. Positive exactly where
    `correction_pays`."""
    return (1 + k * rho) * (1 + L + delta_L) / ((1 + L) * (1 + k * rho + delta_cost)) - 1


def predicted_round_speedup(L: float, k: float, rho: float, verification: float = 1.0) -> float:
    """Tokens per unit of target-pass cost relative to greedy, (1 + L) / (v + K rho): a round's verification costs v
    and each of its k draft passes rho (K, or their mean where rounds stop drafting early). The paper prices a
    verification as one greedy step (v = 1, rho relative to it); a tree's v(N) grows with the nodes it verifies and
    its rho(W) with the frontier a draft pass reads, both in greedy steps.

    The idealised decode-phase speedup: it ignores features, encoder and per-round overheads.
    """
    return (1 + L) / (verification + k * rho)


def passes_per_round(traces: list[Trace]) -> float:
    """The mean draft passes of a round, its deepest node: K, less where rounds stopped early or met the length
    limit (a chain's proposals)."""
    rounds = sum(len(t.rounds) for t in traces)
    if not rounds:
        raise ValueError("no rounds to count draft passes in")
    return sum(t.draft_passes for t in traces) / rounds


@dataclass
class LoopCosts:
    """What a measured loop spends beside its draft and verification passes, which the cost model leaves out."""

    verify_steps: float  # one verification pass in the loop, in tokens of our greedy loop's decode phase
    outside_share: float  # of the speculative decode phase: the prompt pass, host reads, bookkeeping

    def accounted_speedup(self, model_speedup: float) -> float:
        """The cost model's decode speedup with the work outside the rounds put back."""
        return model_speedup * (1 - self.outside_share)


def loop_costs(traces: list[Trace], greedy: list[Trace]) -> LoopCosts:
    """Loop costs of speculative decodes, against our greedy loop's decodes of the same clips."""
    rounds = [r for t in traces for r in t.rounds]
    greedy_tokens = sum(len(t.tokens) for t in greedy)
    decode = sum(t.timings.decode for t in traces)
    if not rounds or not greedy_tokens or decode <= 0:
        raise ValueError("need speculative rounds, greedy tokens and positive decode time to account a loop")
    step = sum(t.timings.decode for t in greedy) / greedy_tokens
    verify = sum(r.verify_seconds for r in rounds) / len(rounds)
    inside = sum(r.draft_seconds + r.verify_seconds for r in rounds)
    return LoopCosts(verify_steps=verify / step, outside_share=1 - inside / decode)


@dataclass
class PeakAgreement:
    """How well one attention-peak track follows reference frames (paper Table 7)."""

    source: str  # whose peaks: a target layer's verification, or a draft's restart step
    tokens: int
    pooled_r: float  # Pearson r over all tokens of all utterances
    within_r: float  # mean Pearson r inside each utterance (utterances with at least 3 tokens)
    shuffled_r: float  # mean within-utterance r after shuffling the reference frames: the floor
    median_error_ms: float
    inside_window: float  # fraction of peaks within the window half-width of the reference frame


def peak_agreement(
    source: str,
    peaks: list[list[int | None]],
    frames: list[list[int | None]],
    half_width: int,
    frame_ms: float,
    seed: int = 0,
) -> PeakAgreement:
    """peaks[u][i]: the attention peak for token i of utterance u; frames[u][i]: its reference frame; half_width in
    frames of `frame_ms`."""
    rng = np.random.default_rng(seed)
    pairs = [
        np.array([(p, f) for p, f in zip(utterance_peaks, utterance_frames, strict=True) if None not in (p, f)])
        for utterance_peaks, utterance_frames in zip(peaks, frames, strict=True)
    ]
    pairs = [p for p in pairs if len(p)]
    if not pairs:
        raise ValueError(f"{source}: no tokens with both a peak and a reference frame")
    pooled = np.concatenate(pairs)
    usable = [p for p in pairs if len(p) >= 3 and p[:, 0].std() > 0 and p[:, 1].std() > 0]
    errors = np.abs(pooled[:, 0] - pooled[:, 1])
    return PeakAgreement(
        source=source,
        tokens=len(pooled),
        pooled_r=_pearson(pooled[:, 0], pooled[:, 1]),
        within_r=_mean([_pearson(p[:, 0], p[:, 1]) for p in usable]),
        shuffled_r=_mean([_pearson(p[:, 0], rng.permutation(p[:, 1])) for p in usable]),
        median_error_ms=float(np.median(errors) * frame_ms),
        inside_window=float(np.mean(errors <= half_width)),
    )


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson r; NaN where either side is constant (a flat peak track has no correlation to report)."""
    return float(np.corrcoef(x, y)[0, 1]) if x.std() > 0 and y.std() > 0 else math.nan


def _mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else math.nan


def choose_runtime_layer(inside_window: list[float], tolerance: float = 0.02) -> int:
    """Paper D.2: the earliest layer whose peaks fall inside the window within `tolerance` of the best layer.

    inside_window[layer]: the fraction of that layer's verification peaks inside the window.
    """
    best = max(inside_window)
    return next(layer for layer, inside in enumerate(inside_window) if inside >= best - tolerance)


@dataclass
class OutcomeError:
    """Restart anchor error split by proposal outcome (paper Table 10)."""

    accepted: int
    rejected: int
    accepted_median_ms: float
    rejected_median_ms: float
    large_at_accept: float  # share of accepted proposals whose error exceeds the large-error bound
    large_at_reject: float
    odds_ratio: float  # odds of a large error among rejected over among accepted proposals


def outcome_counts(errors_ms: Sequence[float], accepted: Sequence[bool], large_ms: float = 200.0) -> np.ndarray:
    """[accepted small, accepted large, rejected small, rejected large] proposal counts."""
    large, accepted = np.asarray(errors_ms) > large_ms, np.asarray(accepted, dtype=bool)
    return np.array(
        [np.sum(accepted & ~large), np.sum(accepted & large), np.sum(~accepted & ~large), np.sum(~accepted & large)]
    )


def odds_ratio(counts: np.ndarray) -> np.ndarray:
    """Odds ratio from outcome_counts (last axis), every cell plus one half (Haldane-Anscombe), so that an empty cell
    gives a finite ratio: a bootstrap that dropped such draws kept only alike ones (2.000 [2.000, 2.000])."""
    accepted_small, accepted_large, rejected_small, rejected_large = np.moveaxis(np.asarray(counts) + 0.5, -1, 0)
    return (rejected_large * accepted_small) / (rejected_small * accepted_large)


def outcome_error(errors_ms: Sequence[float], accepted: Sequence[bool], large_ms: float = 200.0) -> OutcomeError:
    errors, accepted = np.asarray(errors_ms, dtype=float), np.asarray(accepted, dtype=bool)
    if not accepted.any() or accepted.all():
        raise ValueError("need both accepted and rejected proposals with an anchor error")
    counts = outcome_counts(errors, accepted, large_ms)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = float(odds_ratio(counts))
    return OutcomeError(
        accepted=int(accepted.sum()),
        rejected=int((~accepted).sum()),
        accepted_median_ms=float(np.median(errors[accepted])),
        rejected_median_ms=float(np.median(errors[~accepted])),
        large_at_accept=counts[1] / counts[:2].sum(),
        large_at_reject=counts[3] / counts[2:].sum(),
        odds_ratio=ratio,
    )


def depth_profile(traces: list[Trace], draws: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Per draft depth: restart-to-late anchor error (median |draft peak - reference frame|, ms) and conditional
    acceptance a_k^c, each with a 95% interval from resampling the traces (clips); a single trace has no spread."""
    k_max = max((t.settings.k for t in traces), default=0)
    survivors = np.array([[sum(r.accepted >= d for r in t.rounds) for d in range(k_max + 1)] for t in traces], float)
    spines = [t.spine for t in traces]
    errors = [
        [
            [
                abs(s.draft_peak - s.reference_frame) * t.frame_seconds * 1000
                for s in spine
                if s.depth == depth and s.draft_peak is not None and s.reference_frame is not None
            ]
            for t, spine in zip(traces, spines, strict=True)
        ]
        for depth in range(k_max + 1)
    ]
    rows = []
    for depth in range(1, k_max + 1):
        row = {"depth": depth, "n": sum(len(e) for e in errors[depth])}
        try:
            error = bootstrap(_pooled_median, [errors[depth]], draws, seed)
            row |= {"anchor_error_ms": error.estimate, "error_low": error.low, "error_high": error.high}
        except ValueError:
            row |= dict.fromkeys(("anchor_error_ms", "error_low", "error_high"))
        try:
            conditional = pooled_bootstrap(
                lambda sums, d=depth: sums["s"][..., d] / sums["s"][..., d - 1], [{"s": survivors}], draws, seed
            )
            row |= {
                "conditional": conditional.estimate,
                "conditional_low": conditional.low,
                "conditional_high": conditional.high,
            }
        except ValueError:
            row |= dict.fromkeys(("conditional", "conditional_low", "conditional_high"))
        rows.append(row)
    return pd.DataFrame(rows)


def _pooled_median(per_clip: list[list[float]]) -> float | None:
    pooled = [value for values in per_clip for value in values]
    return float(np.median(pooled)) if pooled else None
