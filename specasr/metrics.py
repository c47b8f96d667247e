"""Metrics computed from traces: WER, acceptance, anchor error, speed, the cost rule and bootstrap intervals."""

import json
import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from functools import cache
from importlib.resources import files

import jiwer
import numpy as np
import pandas as pd
from numpy.typing import ArrayLike
from transformers.models.whisper.english_normalizer import EnglishTextNormalizer

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
    steps = [(s.depth, s.draft_peak, s.reference_frame) for t in traces for s in t.steps]
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
    """Measured cost of one draft step over one verification pass, pooled over rounds.

    Draft seconds include the draft's catch-up on the tokens verified in the previous round, so this
    is the full draft cost per proposed token, not the bare proposal step.
    """
    rounds = [r for t in traces for r in t.rounds]
    steps = sum(len(r.proposed) for r in rounds)
    verify = sum(r.verify_seconds for r in rounds)
    if not steps or verify <= 0:
        raise ValueError("need rounds with draft steps and positive verification time to measure rho")
    return step_cost(sum(r.draft_seconds for r in rounds), steps, verify, len(rounds))


def step_cost(draft_seconds: ArrayLike, steps: ArrayLike, verify_seconds: ArrayLike, rounds: ArrayLike) -> ArrayLike:
    """rho from its sums: draft seconds per proposed token over verification seconds per round (elementwise)."""
    return (draft_seconds / steps) / (verify_seconds / rounds)


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


def predicted_round_speedup(L: float, k: float, rho: float) -> float:
    """Tokens per unit of target-pass cost relative to greedy, (1 + L) / (1 + K*rho); k: draft steps per round (K,
    or their mean where rounds stop drafting early).

    The idealised decode-phase speedup: it ignores features, encoder and per-round overheads.
    """
    return (1 + L) / (1 + k * rho)


def proposals_per_round(traces: list[Trace]) -> float:
    """The mean number of proposals a round kept: K, less where rounds stopped early or met the length limit."""
    rounds = [r for t in traces for r in t.rounds]
    if not rounds:
        raise ValueError("no rounds to count proposals in")
    return sum(len(r.proposed) for r in rounds) / len(rounds)


@dataclass
class LoopCosts:
    """What the cost model (1 + L) / (1 + K rho) leaves out of a measured loop: it prices a verification pass as
    one greedy step and the loop's work outside draft steps and verification passes as nothing."""

    verify_steps: float  # one verification pass, in tokens of our greedy loop's decode phase
    outside_share: float  # of the speculative decode phase: the prompt pass, host reads, bookkeeping

    def accounted_speedup(self, model_speedup: float) -> float:
        """The cost model's decode speedup with these two costs put back."""
        return model_speedup * (1 - self.outside_share) / self.verify_steps


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
class Interval:
    """A point estimate with its bootstrap interval."""

    estimate: float
    low: float
    high: float


def paired_bootstrap(
    arm_a: Sequence,
    arm_b: Sequence,
    metric: Callable[[list], float],
    draws: int = 5000,
    seed: int = 42,
    level: float = 0.95,
) -> Interval:
    """Percentile interval for metric(arm_b) - metric(arm_a) by paired utterance resampling.

    The arms are matched (same utterances, same order: traces, or any per-utterance records with a clip_id);
    each draw applies the same resampled indices to both.
    """
    for i, (a, b) in enumerate(zip(arm_a, arm_b, strict=False)):
        if a.clip_id != b.clip_id:
            raise ValueError(f"arms differ at utterance {i}: {a.clip_id!r} vs {b.clip_id!r}")

    def difference(a: list, b: list) -> float | None:
        before, after = metric(a), metric(b)
        return None if before is None or after is None else after - before

    return bootstrap(difference, [arm_a, arm_b], draws, seed, level)


def bootstrap(
    statistic: Callable[..., float | None],
    arms: list[Sequence],
    draws: int = 10_000,
    seed: int = 0,
    level: float = 0.95,
) -> Interval:
    """Percentile interval for statistic(*arms) by resampling utterances: the arms are matched lists (one item per
    utterance, same order), and each draw takes the same indices from every arm. Draws where the statistic is
    undefined (ValueError, None or NaN) are skipped; more than half undefined is an error."""
    sizes = {len(arm) for arm in arms}
    if len(sizes) != 1 or not sizes.pop():
        raise ValueError(f"arms must be matched and non-empty, got {[len(arm) for arm in arms]} utterances")
    estimate = _defined(statistic, arms)
    if len(arms[0]) == 1:  # every draw takes the one utterance again: no spread to estimate
        return Interval(estimate, float(estimate), float(estimate))
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(draws):
        index = rng.integers(0, len(arms[0]), size=len(arms[0])).tolist()
        try:
            values.append(_defined(statistic, [[arm[i] for i in index] for arm in arms]))
        except ValueError:
            continue
    if len(values) * 2 < draws:
        raise ValueError(f"statistic undefined in {draws - len(values)} of {draws} bootstrap draws")
    low, high = np.quantile(values, [(1 - level) / 2, (1 + level) / 2])
    return Interval(estimate, float(low), float(high))


def pooled_estimate(
    statistic: Callable[..., np.ndarray],
    arms: list[dict[str, np.ndarray]],
    strata: Sequence[str] | None = None,
    repeated: Collection[str] = (),
) -> float:
    """The statistic of pooled sums on the sample itself (see pooled_bootstrap)."""
    return pooled_bootstrap(statistic, arms, 0, strata=strata, repeated=repeated).estimate


def pooled_bootstrap(
    statistic: Callable[..., np.ndarray],
    arms: list[dict[str, np.ndarray]],
    draws: int = 10_000,
    seed: int = 0,
    level: float = 0.95,
    strata: Sequence[str] | None = None,
    chunk: int = 1000,
    resample_strata: bool = False,
    repeated: Collection[str] = (),
) -> Interval:
    """Percentile interval for a statistic of pooled sums, all draws at once.

    Each arm holds per-utterance columns (utterances on the first axis, the same utterances in every arm). The
    statistic takes each arm's column sums, as a dict, and computes elementwise over leading axes: ratios of sums,
    such as acceptance pooled over rounds or total time over total time. With `strata` (one label per utterance,
    such as its evaluation set) the statistic is taken within each stratum and averaged with equal weights; a
    stratum where it is undefined on the sample is left out. Every draw resamples utterances within their
    stratum, the same ones in every arm; with `resample_strata` it first draws as many strata as there are, with
    replacement, each with a resample of its own, so that the interval covers the variation between strata and not
    only within them. Draws where the statistic is not finite are skipped, more than half is an error. With no
    draws the interval is the estimate itself.

    The `repeated` columns hold timing repetitions, (utterances, repetitions): an utterance counts the median of
    its repetitions. A draw resamples the repetitions of every utterance it takes, with replacement, so that the
    interval holds run-to-run noise too; repetition r of every repeated column of every arm was timed side by side,
    so the same repetitions are taken from all of them. Repetitions draw from a stream of their own: the utterances
    drawn are those of a bootstrap without them.
    """
    sizes = {len(column) for arm in arms for column in arm.values()}
    if len(sizes) != 1 or not (n := sizes.pop()):
        raise ValueError("arms must hold the same non-empty utterances")
    repetitions = _repetitions(arms, repeated)
    labels = np.zeros(n, dtype=int) if strata is None else np.unique(np.asarray(strata), return_inverse=True)[1]
    groups = [np.flatnonzero(labels == label) for label in range(labels.max() + 1)]
    rng, repetition_rng = np.random.default_rng(seed), np.random.default_rng([seed, 1])

    def evaluate(indices: list[np.ndarray], resample: bool = True) -> np.ndarray:
        """The statistic per stratum: indices[g] (draws, members) picks stratum g's utterances in each draw."""
        taken = [(index, _pick_repetitions(repetition_rng, index.shape, repetitions, resample)) for index in indices]
        sums = [
            {name: np.stack([_sums(c, *pick, name in repeated) for pick in taken], axis=1) for name, c in arm.items()}
            for arm in arms
        ]
        return statistic(*sums)  # (draws, strata)

    with np.errstate(divide="ignore", invalid="ignore"):
        per_stratum = evaluate([group[None] for group in groups], resample=False)[0]
        defined = np.isfinite(per_stratum)
        if not defined.any():
            raise ValueError("statistic undefined on the sample")
        estimate = float(per_stratum[defined].mean())
        if not draws:
            return Interval(estimate, estimate, estimate)
        values = []
        kept = np.flatnonzero(defined)
        slots = len(kept) if resample_strata else 1
        for start in range(0, draws, chunk):
            size = min(chunk, draws - start)
            taken = []
            for _ in range(slots):  # each slot: one stratum per draw, with its own resample of utterances
                per_stratum = evaluate([rng.choice(group, size=(size, len(group))) for group in groups])[:, kept]
                if not resample_strata:
                    taken.append(per_stratum.mean(axis=1))
                    continue
                taken.append(per_stratum[np.arange(size), rng.integers(0, len(kept), size=size)])
            values.append(np.mean(taken, axis=0))
    values = np.concatenate(values)
    values = values[np.isfinite(values)]
    if len(values) * 2 < draws:
        raise ValueError(f"statistic undefined in {draws - len(values)} of {draws} draws")
    low, high = np.quantile(values, [(1 - level) / 2, (1 + level) / 2])
    return Interval(estimate, float(low), float(high))


def timed_ratio(
    numerator: np.ndarray, denominator: np.ndarray, draws: int = 10_000, seed: int = 0, level: float = 0.95
) -> Interval:
    """Total time over total time of two arms timed side by side, from their (clips, repetitions) seconds, each clip
    its median over repetitions: a speedup (baseline over candidate) or an A/A ratio. The interval resamples clips
    and the repetitions within each, the same in both arms (pooled_bootstrap)."""
    arms = [{"seconds": np.asarray(numerator, float)}, {"seconds": np.asarray(denominator, float)}]
    return pooled_bootstrap(lambda a, b: a["seconds"] / b["seconds"], arms, draws, seed, level, repeated={"seconds"})


def aa_table(ratios: dict[str, Interval]) -> pd.DataFrame:
    """The A/A check: the same settings timed twice side by side, one row per phase with the ratio of their times
    and its interval. They disagree where the interval excludes 1."""
    rows = [
        {"phase": phase, "ratio": r.estimate, "low": r.low, "high": r.high, "disagrees": not r.low <= 1 <= r.high}
        for phase, r in ratios.items()
    ]
    return pd.DataFrame(rows, columns=["phase", "ratio", "low", "high", "disagrees"])


def aa_warning(table: pd.DataFrame) -> str | None:
    """What an A/A table (aa_table) means where its copies disagree: a speed difference up to their ratio's distance
    from 1 is this machine's noise, not the settings'. None where they agree."""
    apart = table[table.disagrees.astype(bool)]
    if apart.empty:
        return None
    ratios = "; ".join(f"{r.phase} {r.ratio:.3f}x [{r.low:.3f}, {r.high:.3f}]" for r in apart.itertuples())
    size = (apart.ratio - 1).abs().max()
    return (
        f"A/A check: the same settings timed twice disagree ({ratios}); speed differences of {size:.1%} or less "
        "are machine noise here"
    )


def _repetitions(arms: list[dict[str, np.ndarray]], repeated: Collection[str]) -> int:
    """The repetitions every repeated column holds (0 where none is repeated)."""
    counts = {arm[name].shape[1] for arm in arms for name in repeated if name in arm}
    if len(counts) > 1 or 0 in counts:
        raise ValueError(f"repeated columns must hold the same non-zero number of repetitions, got {sorted(counts)}")
    return counts.pop() if counts else 0


def _pick_repetitions(
    rng: np.random.Generator, shape: tuple[int, ...], repetitions: int, resample: bool
) -> np.ndarray | None:
    """Per drawn utterance (`shape`: draws, members), the repetitions it takes: a resample, or all in order."""
    if not repetitions:
        return None
    if resample:
        return rng.integers(0, repetitions, size=(*shape, repetitions))
    return np.broadcast_to(np.arange(repetitions), (*shape, repetitions))


def _sums(column: np.ndarray, index: np.ndarray, picks: np.ndarray | None, repeated: bool) -> np.ndarray:
    """The column summed over the utterances each draw took (`index`: draws, members); a repeated column counts each
    utterance's median over its picked repetitions."""
    taken = column[index]
    if repeated:
        taken = np.median(np.take_along_axis(taken, picks, axis=-1), axis=-1)
    return taken.sum(axis=1)


def _defined(statistic: Callable[..., float | None], arms: list[list]) -> float:
    """statistic(*arms) as a float; ValueError where it is undefined."""
    value = statistic(*arms)
    if value is None or math.isnan(value):
        raise ValueError(f"statistic is undefined on this sample ({value})")
    return float(value)


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
    """Odds ratio from outcome_counts (last axis); inf or NaN where a cell is empty."""
    accepted_small, accepted_large, rejected_small, rejected_large = np.moveaxis(counts, -1, 0)
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
    errors = [
        [
            [
                abs(s.draft_peak - s.reference_frame) * t.frame_seconds * 1000
                for s in t.steps
                if s.depth == depth and s.draft_peak is not None and s.reference_frame is not None
            ]
            for t in traces
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
