"""Intervals: bootstrap percentile intervals over utterances (paired, general and of pooled sums), and the A/A
timing check built on them."""

import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd


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
    its repetitions, and draws resample utterances only. Resampling the repetitions too, and taking the median of
    each resample, widens the interval far past the estimate's spread where a few repetitions are slow
    (tests/test_timing.py simulates it); run-to-run noise is the A/A check's to measure (aa_verdict). Of a single
    utterance, whose resamples are all alike, the draws resample its repetitions instead, the same ones in every
    repeated column (repetition r of every arm was timed side by side), each draw the statistic of their medians.
    """
    timed = arms
    arms = [{name: np.median(c, axis=1) if name in repeated else c for name, c in arm.items()} for arm in arms]
    sizes = {len(column) for arm in arms for column in arm.values()}
    if len(sizes) != 1 or not (n := sizes.pop()):
        raise ValueError("arms must hold the same non-empty utterances")
    labels = np.zeros(n, dtype=int) if strata is None else np.unique(np.asarray(strata), return_inverse=True)[1]
    groups = [np.flatnonzero(labels == label) for label in range(labels.max() + 1)]
    rng = np.random.default_rng(seed)

    def evaluate(indices: list[np.ndarray]) -> np.ndarray:
        """The statistic per stratum: indices[g] (draws, members) picks stratum g's utterances in each draw."""
        sums = [
            {name: np.stack([c[index].sum(axis=1) for index in indices], axis=1) for name, c in arm.items()}
            for arm in arms
        ]
        return statistic(*sums)  # (draws, strata)

    with np.errstate(divide="ignore", invalid="ignore"):
        per_stratum = evaluate([group[None] for group in groups])[0]
        defined = np.isfinite(per_stratum)
        if not defined.any():
            raise ValueError("statistic undefined on the sample")
        estimate = float(per_stratum[defined].mean())
        if not draws:
            return Interval(estimate, estimate, estimate)
        if n == 1 and repeated:
            return _interval(estimate, _repetition_draws(statistic, timed, repeated, draws, rng), draws, level)
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
    return _interval(estimate, np.concatenate(values), draws, level)


def _repetition_draws(
    statistic: Callable[..., np.ndarray],
    arms: list[dict[str, np.ndarray]],
    repeated: Collection[str],
    draws: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """The statistic of one utterance in each draw of its repetitions, paired across the repeated columns."""
    counts = {column.shape[1] for arm in arms for name, column in arm.items() if name in repeated}
    if len(counts) != 1:
        raise ValueError(f"the repeated columns must hold as many repetitions each, got {sorted(counts)}")
    count = counts.pop()
    taken = rng.integers(0, count, size=(draws, count))
    sums = [
        {
            name: np.median(c[0][taken], axis=1)[:, None] if name in repeated else np.broadcast_to(c, (draws, *c.shape))
            for name, c in arm.items()
        }
        for arm in arms
    ]
    with np.errstate(divide="ignore", invalid="ignore"):
        return statistic(*sums)[:, 0]


def _interval(estimate: float, values: np.ndarray, draws: int, level: float) -> Interval:
    """The percentile interval of the draws where the statistic is defined (an error where most are not)."""
    values = values[np.isfinite(values)]
    if len(values) * 2 < draws:
        raise ValueError(f"statistic undefined in {draws - len(values)} of {draws} draws")
    low, high = np.quantile(values, [(1 - level) / 2, (1 + level) / 2])
    return Interval(estimate, float(low), float(high))


AA_TOLERANCE = 0.03  # how far from 1 the A/A interval may reach before speed tables are unreliable


def aa_table(ratios: dict[str, Interval], tolerance: float = AA_TOLERANCE) -> pd.DataFrame:
    """The A/A check: the same settings timed twice side by side, one row per phase with the ratio of their times
    and its interval. A phase is reliable where its interval holds 1 and lies within 1 +- tolerance: otherwise the
    copies disagree, or this machine's noise is too large to tell speeds `tolerance` apart."""
    rows = [
        {
            "phase": phase,
            "ratio": r.estimate,
            "low": r.low,
            "high": r.high,
            "tolerance": tolerance,
            "reliable": r.low <= 1 <= r.high and 1 - tolerance <= r.low and r.high <= 1 + tolerance,
        }
        for phase, r in ratios.items()
    ]
    return pd.DataFrame(rows, columns=["phase", "ratio", "low", "high", "tolerance", "reliable"])


def aa_verdict(table: pd.DataFrame) -> dict | None:
    """The A/A check as a JSON record: the decode phase's ratio and interval, the tolerance, and whether the speed
    tables beside it are reliable (every phase is). None where there was no A/A copy."""
    if table.empty:
        return None
    decode = table.set_index("phase").loc["decode"]
    return {
        "ratio": float(decode.ratio),
        "interval": [float(decode.low), float(decode.high)],
        "tolerance": float(decode.tolerance),
        "reliable": bool(table.reliable.all()),
    }


def unreliable_mark(table: pd.DataFrame) -> str:
    """What a speed table's title carries where the A/A check beside it (aa_table) finds it unreliable; empty where
    it is reliable or there was no A/A copy."""
    verdict = aa_verdict(table)
    return " (UNRELIABLE speed figures: the A/A check below)" if verdict and not verdict["reliable"] else ""


def aa_warning(table: pd.DataFrame) -> str | None:
    """Why the speed tables beside an A/A check (aa_table) are unreliable; None where they are reliable."""
    failed = table[~table.reliable.astype(bool)]
    if failed.empty:
        return None
    reasons = []
    for r in failed.itertuples():
        why = "the copies disagree" if not r.low <= 1 <= r.high else f"wider than +-{r.tolerance:.0%}"
        reasons.append(f"{r.phase} {r.ratio:.3f}x [{r.low:.3f}, {r.high:.3f}]: {why}")
    return (
        f"UNRELIABLE speed figures: the same settings timed twice ({'; '.join(reasons)}); speed differences of "
        f"{max((failed.ratio - 1).abs().max(), (failed.high - 1).max(), (1 - failed.low).max()):.1%} or less are this "
        "machine's noise"
    )


def _defined(statistic: Callable[..., float | None], arms: list[list]) -> float:
    """statistic(*arms) as a float; ValueError where it is undefined."""
    value = statistic(*arms)
    if value is None or math.isnan(value):
        raise ValueError(f"statistic is undefined on this sample ({value})")
    return float(value)
