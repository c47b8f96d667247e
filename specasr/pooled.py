"""A cell's clips next to the greedy baseline's, and the metrics pooled over them: acceptance and speed as ratios of
sums over clips, weighted over evaluation sets, with paired bootstrap intervals.

Aggregation as in the paper where the evaluation sets allow it: every metric is taken within each set and the sets
of at least MIN_SET_CLIPS clips are weighted equally (`weighting`). Within a set, acceptance is pooled over the rounds
of each cell's first repetition (every repetition decodes the same tokens) and speed is total time over total time of
each clip's median over repetitions. Intervals are paired bootstrap percentile intervals: the same clips in both
arms, clips resampled within their set, and the sets themselves resampled too unless the intervals condition on them
(one clip: its repetitions). Repetition noise is the A/A check's to measure (intervals.aa_verdict)."""

import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import NamedTuple

import numpy as np

from specasr.intervals import Interval, pooled_bootstrap, pooled_estimate
from specasr.metrics import outcome_counts
from specasr.trace import Trace

MIN_SET_CLIPS = 20  # a smaller evaluation set is not weighted as a set of its own
DRAWS = 10_000
SEED = 0
LARGE_ERROR_MS = 200.0


@dataclass(frozen=True)
class Weighting:
    """How clips are grouped before their metrics are averaged: each clip's evaluation set, the set it is weighted
    in (None: left out of the weighted estimate), whether intervals resample the sets, and the rule in words."""

    sets: dict[str, str]  # clip hash -> its evaluation set
    groups: dict[str, str | None]  # clip hash -> the set whose metrics it counts in; None: reported apart only
    rule: str  # in words, with each set's size
    resample_sets: bool = True  # False: intervals condition on the sets, resampling clips within them only

    def each_set(self) -> "Weighting":
        """Every set on its own, as the per-set tables take them."""
        return replace(self, groups=dict(self.sets), rule="each set on its own")


def weighting(sets: dict[str, str], minimum: int = MIN_SET_CLIPS, resample_sets: bool = True) -> Weighting:
    """Evaluation sets (clip hash -> set) of at least `minimum` clips are weighted equally. The clips of smaller sets
    make one set more, "other", where together they reach `minimum`; where they do not, they are left out of the
    weighted estimate and reported apart: a set of a few clips weighted like one of dozens would carry the estimate
    with next to no variance to show for it. Where no set reaches `minimum`, every clip is pooled as one set."""
    sizes = Counter(sets.values())
    large = sorted(name for name, n in sizes.items() if n >= minimum)
    small = sorted((name for name, n in sizes.items() if n < minimum), key=lambda name: (-sizes[name], name))
    merged = sum(sizes[name] for name in small)
    intervals = "intervals resample the sets too" if resample_sets else "intervals condition on the sets"
    listed = ", ".join(f"{name} ({sizes[name]})" for name in small)
    if not large:
        rule = f"no set reaches {minimum} clips: pooled over all {len(sets)} clips as one set ({listed})"
        return Weighting(sets, dict.fromkeys(sets, "all"), rule, resample_sets)
    rule = f"sets of at least {minimum} clips weighted equally: " + ", ".join(f"{n} ({sizes[n]})" for n in large)
    small_group = None
    if merged >= minimum:
        rule += f"; sets under {minimum} clips merged into one set, other ({merged} clips): {listed}"
        small_group = "other"
    elif small:
        rule += (
            f"; sets under {minimum} clips left out of the weighted estimate and reported apart, as together they "
            f"make no set of {minimum}: {listed}"
        )
    groups = {clip: small_group if name in small else name for clip, name in sets.items()}
    if len(set(groups.values()) - {None}) > 1:
        rule += f"; {intervals}"
    return Weighting(sets, groups, rule, resample_sets)


@dataclass(frozen=True)
class ClipResult:
    """One cell on one clip, next to the greedy baseline on the same clip."""

    trace: Trace  # the first repetition
    subset: str  # the clip's evaluation set
    group: str  # the set it is weighted in (`weighting`)
    resample_sets: bool  # intervals resample the sets too (`Weighting.resample_sets`)
    decode: tuple[float, ...]  # seconds, repetition by repetition (the baseline's beside them: timed side by side)
    total: tuple[float, ...]
    greedy_decode: tuple[float, ...]
    greedy_total: tuple[float, ...]
    features: tuple[float, ...]
    encoder: tuple[float, ...]
    draft: tuple[float, ...]  # seconds in draft passes, repetition by repetition
    verify: tuple[float, ...]  # seconds in verification passes
    lossless: bool  # every repetition gave the greedy tokens

    def medians(self) -> dict[str, float]:
        """Each phase's median over the repetitions, the baseline's first."""
        phases = ("greedy_decode", "greedy_total", "features", "encoder", "decode", "total")
        return {phase: statistics.median(getattr(self, phase)) for phase in phases}


def clip_results(baseline: list[Trace], traces: list[Trace], weights: Weighting | None = None) -> list[ClipResult]:
    """A cell's clips in the baseline's order, each with its repetitions' timings and its sets (one set for all where
    `weights` is not given); clips the weighting leaves out are not among them."""
    cell = _by_clip(traces)
    results = []
    for clip_hash, greedy in _by_clip(baseline).items():
        repeats = cell.get(clip_hash)
        group = weights.groups[clip_hash] if weights else "all"
        if repeats is None or group is None:
            continue
        results.append(
            ClipResult(
                trace=repeats[0],
                subset=weights.sets[clip_hash] if weights else "all",
                group=group,
                resample_sets=weights.resample_sets if weights else True,
                decode=_seconds(repeats, "decode"),
                total=_seconds(repeats, "total"),
                greedy_decode=_seconds(greedy, "decode"),
                greedy_total=_seconds(greedy, "total"),
                features=_seconds(repeats, "features"),
                encoder=_seconds(repeats, "encoder"),
                draft=tuple(t.draft_seconds for t in repeats),
                verify=tuple(t.verify_seconds for t in repeats),
                lossless=all(t.tokens == greedy[0].tokens for t in repeats),
            )
        )
    return results


def _seconds(repeats: list[Trace], phase: str) -> tuple[float, ...]:
    return tuple(getattr(t.timings, phase) for t in repeats)


def _by_clip(traces: list[Trace]) -> dict[str, list[Trace]]:
    grouped: dict[str, list[Trace]] = {}
    for trace in traces:
        grouped.setdefault(trace.clip_hash, []).append(trace)
    return grouped


def clip_columns(results: list[ClipResult]) -> dict[str, np.ndarray]:
    """Per clip (rows): its first repetition's rounds that survived each depth 0..K, its timings (TIMINGS: clips x
    repetitions), and its restart proposals by outcome and anchor error (metrics.outcome_counts)."""
    depths = range(max((r.trace.settings.k for r in results), default=0) + 1)
    survivors = [[sum(round.accepted >= d for round in r.trace.rounds) for d in depths] for r in results]
    timings = {name: [getattr(r, name) for r in results] for name in TIMINGS}
    outcomes = [outcome_counts(*restart_errors(r.trace), LARGE_ERROR_MS) for r in results]
    return {
        "survivors": np.array(survivors, dtype=float),
        "outcomes": np.array(outcomes, dtype=float).reshape(len(results), 4),
        "rounds": np.array([len(r.trace.rounds) for r in results], dtype=float),
        "passes": np.array([r.trace.draft_passes for r in results], dtype=float),
    } | {name: np.array(v, dtype=float) for name, v in timings.items()}


def restart_errors(trace: Trace) -> tuple[list[float], list[bool]]:
    """The anchor error (ms) and outcome of every restart proposal whose draft peak and reference frame are known."""
    restarts = [s for s in trace.spine if s.depth == 1 and None not in (s.draft_peak, s.reference_frame)]
    frame_ms = trace.frame_seconds * 1000
    return [abs(s.draft_peak - s.reference_frame) * frame_ms for s in restarts], [s.accepted for s in restarts]


def _survivors(sums: dict[str, np.ndarray], depth: int) -> np.ndarray:
    """Rounds that survived `depth`, summed over clips; NaN beyond K."""
    survivors = sums["survivors"]
    return survivors[..., depth] if depth < survivors.shape[-1] else np.full(survivors.shape[:-1], np.nan)


def survival(depth: int) -> Callable[[dict[str, np.ndarray]], np.ndarray]:
    return lambda sums: _survivors(sums, depth) / _survivors(sums, 0)


# Each metric is a ratio of sums over clips (acceptance pooled over rounds, total time over total time), so that
# a bootstrap can resample clips for all its draws at once (metrics.pooled_bootstrap); a clip's time is the median of
# its repetitions.
METRICS: dict[str, Callable[[dict[str, np.ndarray]], np.ndarray]] = {
    "a1": survival(1),
    "a2c": lambda sums: _survivors(sums, 2) / _survivors(sums, 1),
    "L": lambda sums: sums["survivors"][..., 1:].sum(axis=-1) / _survivors(sums, 0),
    "decode_speedup": lambda sums: sums["greedy_decode"] / sums["decode"],
    "total_speedup": lambda sums: sums["greedy_total"] / sums["total"],
}
PHASES = ("decode", "total")
SPEEDS = tuple(f"{phase}_speedup" for phase in PHASES)
TIMINGS = ("decode", "total", "greedy_decode", "greedy_total", "draft", "verify")  # columns of clips x repetitions


class Columns(NamedTuple):
    """Each arm's clip columns, each clip's weighted set, and whether intervals resample the sets."""

    arms: list[dict[str, np.ndarray]]
    strata: list[str]
    resample_sets: bool = True


def arm_columns(*arms: list[ClipResult]) -> Columns:
    """The arms' clip columns, built once for every metric taken of them (the arms hold the same clips)."""
    first = arms[0]
    return Columns([clip_columns(arm) for arm in arms], [r.group for r in first], all(r.resample_sets for r in first))


def bootstrap_interval(statistic: Callable[..., np.ndarray], columns: Columns, timed: bool = True) -> Interval:
    """The statistic's interval; a timed one (reading TIMINGS) counts each clip's median over its repetitions, and
    one that is not is spared that work."""
    arms = columns.arms
    if not timed:
        arms = [{name: column for name, column in arm.items() if name not in TIMINGS} for arm in arms]
    repeated = TIMINGS if timed else ()
    return pooled_bootstrap(
        statistic, arms, DRAWS, SEED, strata=columns.strata, resample_strata=columns.resample_sets, repeated=repeated
    )


def speeds(columns: Columns) -> dict[str, Interval]:
    """Decode-phase and end-to-end time of the baseline over the arm's, each with its interval: the one way every
    speed figure is taken (bench and experiments, and the A/A checks of both)."""
    return {phase: bootstrap_interval(METRICS[f"{phase}_speedup"], columns) for phase in PHASES}


def point_estimate(metric: Callable[..., np.ndarray], columns: Columns) -> float | None:
    try:
        return pooled_estimate(metric, columns.arms, columns.strata, repeated=TIMINGS)
    except ValueError:
        return None


@dataclass(frozen=True)
class Contrast:
    name: str  # "b-a": b minus a
    fixed: str  # what both arms share: the draft or the window, K and threshold
    metric: str
    clips: int
    estimate: float
    low: float
    high: float


def shared_clips(arm_a: list[ClipResult], arm_b: list[ClipResult]) -> tuple[list[ClipResult], list[ClipResult]]:
    """Both arms on the clips both decoded, in the same order."""
    both = {r.trace.clip_hash for r in arm_a} & {r.trace.clip_hash for r in arm_b}
    return [r for r in arm_a if r.trace.clip_hash in both], [r for r in arm_b if r.trace.clip_hash in both]


def contrast(
    name: str, fixed: str, metrics: Sequence[str], arm_a: list[ClipResult], arm_b: list[ClipResult]
) -> list[Contrast]:
    """metric(b) - metric(a) for each metric on the clips both arms decoded, with its paired bootstrap interval;
    metrics undefined on these arms (a2c at K = 1) are left out."""
    arms = shared_clips(arm_a, arm_b)
    found = differences(metrics, arm_columns(*arms))
    return [Contrast(name, fixed, metric, len(arms[0]), **asdict(interval)) for metric, interval in found.items()]


def differences(metrics: Sequence[str], columns: Columns) -> dict[str, Interval]:
    found = {}
    for metric in metrics:
        measure = METRICS[metric]
        try:
            found[metric] = bootstrap_interval(
                lambda a, b, measure=measure: measure(b) - measure(a), columns, metric in SPEEDS
            )
        except ValueError:
            continue
    return found
