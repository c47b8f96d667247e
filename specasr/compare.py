"""Two runs compared: the one routine behind Side by side, Checkpoints and Windows.

Runs A and B are paired by clip, each clip's first repeat in each run, and every metric is reported as A - B on the
clips both decoded, with a paired bootstrap interval: acceptance (a1, a2c, L), and speed where a greedy baseline was
timed beside both runs, through pooled.contrast, as every experiment table takes them; the word error rate as
total edits over total reference words, resampled the same way; the median anchor error over the draft steps of all
clips. A single shared clip has no interval: every bootstrap draw would take that clip again.
"""

import difflib
from dataclasses import dataclass

import numpy as np
import pandas as pd

from specasr.dataset import evaluation_set
from specasr.intervals import Interval, bootstrap, pooled_bootstrap, pooled_estimate
from specasr.metrics import normalize_text, word_error_rate
from specasr.pooled import (
    DRAWS,
    METRICS,
    SEED,
    SPEEDS,
    TIMINGS,
    ClipResult,
    Weighting,
    clip_columns,
    clip_results,
    contrast,
    weighting,
)
from specasr.store import Store
from specasr.trace import Trace

DIFFERENCE = "A - B"
ACCEPTANCE = ("a1", "a2c", "L")
NO_INTERVAL = "one shared clip: no interval (a paired bootstrap needs at least two clips to resample)"
COLUMNS = ["metric", "A", "B", DIFFERENCE, "low", "high", "clips"]


class NoSharedClipError(ValueError):
    """The two runs decoded no clip in common."""


@dataclass(frozen=True)
class Difference:
    """One metric of run A and of run B on their shared clips, and A - B with its interval (None: one clip)."""

    metric: str
    a: float
    b: float
    difference: float
    low: float | None
    high: float | None


@dataclass(frozen=True)
class Comparison:
    """Run A against run B: the clips they share and every metric both define, as A - B."""

    pairs: list[tuple[Trace, Trace]]  # each shared clip's first repeat in A and in B, in A's (or the baseline's) order
    differences: list[Difference]
    rule: str  # how the clips were weighted over evaluation sets (pooled.weighting)

    @property
    def clips(self) -> int:
        return len(self.pairs)

    def table(self, **labels: str) -> pd.DataFrame:
        """One row per metric: A's value, B's, A - B, its interval (none for one clip: NO_INTERVAL) and the clip
        count; `labels` first, as columns of the same value in every row."""
        rows = [[d.metric, d.a, d.b, d.difference, d.low, d.high, self.clips] for d in self.differences]
        table = pd.DataFrame(rows, columns=COLUMNS)
        if self.clips == 1:
            table = table.drop(columns=["low", "high"])
        return pd.concat([pd.DataFrame(labels, index=table.index), table], axis=1)

    def caption(self, name_a: str, name_b: str) -> str:
        """What the table holds, in words: which run is A, which B, over which clips, and its intervals."""
        clips = "the one clip" if self.clips == 1 else f"the {self.clips} clips"
        intervals = NO_INTERVAL
        if self.clips > 1:
            intervals = f"low, high: 95% paired bootstrap interval ({DRAWS:,} draws, seed {SEED}; {self.rule})"
        speed = " Speedups are against the greedy run timed beside both." if self._timed else ""
        return (
            f"{DIFFERENCE}: A is {name_a}, B is {name_b}, on {clips} both decoded (each clip's first repeat). "
            f"{intervals}.{speed}"
        )

    @property
    def _timed(self) -> bool:
        return any(d.metric in SPEEDS for d in self.differences)


def first_repeats(traces: list[Trace]) -> dict[str, Trace]:
    """Each clip's first trace (its first repeat), by clip hash, in decode order."""
    first: dict[str, Trace] = {}
    for trace in traces:
        first.setdefault(trace.clip_hash, trace)
    return first


def compare(
    traces_a: list[Trace],
    traces_b: list[Trace],
    baseline: list[Trace] | None = None,
    weights: Weighting | None = None,
) -> Comparison:
    """Run A against run B (their traces, every repeat) on the clips both decoded: each metric both runs define, as
    A - B with its paired bootstrap interval. Speed too where `baseline` holds the greedy decodes timed beside both
    runs (a batch's baseline). Clips are weighted over evaluation sets as `weights` says, else by the sets their ids
    name (dataset.evaluation_set). NoSharedClipError where the runs share no clip."""
    first_a, first_b = first_repeats(traces_a), first_repeats(traces_b)
    order = first_a if baseline is None else first_repeats(baseline)  # a baseline's clip order, as experiments take it
    shared = [h for h in order if h in first_a and h in first_b]
    if not shared:
        raise NoSharedClipError("the two runs decoded no clip in common")
    pairs = [(first_a[h], first_b[h]) for h in shared]
    if weights is None:
        weights = weighting({h: evaluation_set(first_a[h].clip_id) for h in shared})
    if baseline is None:  # pairing alone: A's first repeats stand in for the baseline no speed is taken from
        firsts = [a for a, _ in pairs]
        arm_a, arm_b = clip_results(firsts, firsts, weights), clip_results(firsts, [b for _, b in pairs], weights)
        metrics = ACCEPTANCE
    else:  # every repeat: speed takes each clip's median over them
        greedy = [t for t in baseline if t.clip_hash in first_a and t.clip_hash in first_b]
        arm_a, arm_b = clip_results(greedy, traces_a, weights), clip_results(greedy, traces_b, weights)
        metrics = ACCEPTANCE + SPEEDS
    differences = [
        *_contrasts(arm_a, arm_b, metrics),
        *_word_error(arm_a, arm_b),
        *_anchor_error(pairs),
    ]
    if len(pairs) == 1:
        differences = [Difference(d.metric, d.a, d.b, d.difference, None, None) for d in differences]
    return Comparison(pairs, differences, weights.rule)


def compare_runs(store: Store, run_a: str, run_b: str) -> Comparison:
    """Stored run A against stored run B, as `compare` takes them; speed too where both runs were timed in one batch
    beside a greedy baseline (its first greedy run: the A/A copy comes later)."""
    batches = store.rows("runs", [run_a, run_b], ["batch"]).batch
    baseline = None
    if batches.nunique() == 1 and batches.notna().all():
        batch = store.runs(batch=batches.iloc[0])
        greedy = batch[batch.draft.isna() & ~batch.verify_peaks.astype(bool)].sort_values(["created", "run_id"])
        baseline = None if greedy.empty else _by_repeat(store, greedy.run_id.iloc[0])
    return compare(_by_repeat(store, run_a), _by_repeat(store, run_b), baseline)


def _by_repeat(store: Store, run_id: str) -> list[Trace]:
    """A run's traces, repeat by repeat (decode order within a repeat): each clip's first repeat comes first."""
    repeats = store.rows("decodes", [run_id], ["repeat"]).repeat
    return [trace for _, trace in sorted(zip(repeats, store.traces(run_id), strict=True), key=lambda pair: pair[0])]


def _contrasts(arm_a: list[ClipResult], arm_b: list[ClipResult], metrics: tuple[str, ...]) -> list[Difference]:
    """The experiments' contrasts (b - a there, so B's arm goes first), with each run's own value beside them."""
    found = contrast(DIFFERENCE, "", metrics, arm_b, arm_a)
    strata, columns_a, columns_b = [r.group for r in arm_a], clip_columns(arm_a), clip_columns(arm_b)

    def value(metric: str, columns: dict[str, np.ndarray]) -> float:
        return pooled_estimate(METRICS[metric], [columns], strata, TIMINGS)

    return [
        Difference(c.metric, value(c.metric, columns_a), value(c.metric, columns_b), c.estimate, c.low, c.high)
        for c in found
    ]


def _word_error(arm_a: list[ClipResult], arm_b: list[ClipResult]) -> list[Difference]:
    """Word error rate as total edits over total reference words, clips resampled like the contrasts'; nothing where
    no shared clip has reference words."""
    columns, strata = [_word_columns(arm) for arm in (arm_a, arm_b)], [r.group for r in arm_a]

    def rate(sums: dict[str, np.ndarray]) -> np.ndarray:
        return sums["edits"] / sums["words"]

    try:
        a, b = (pooled_estimate(rate, [arm], strata) for arm in columns)
        resample_sets = all(r.resample_sets for r in arm_a)
        interval = pooled_bootstrap(
            lambda a, b: rate(a) - rate(b), columns, DRAWS, SEED, strata=strata, resample_strata=resample_sets
        )
    except ValueError:  # no reference words
        return []
    return [_difference("wer", a, b, interval)]


def _word_columns(arm: list[ClipResult]) -> dict[str, np.ndarray]:
    """Per clip: the words of its normalized reference text, and the decode's edits against them."""
    words = [len(normalize_text(r.trace.reference_text).split()) for r in arm]
    edits = [
        round(word_error_rate([r.trace.reference_text], [r.trace.text]) * n) if n else 0
        for r, n in zip(arm, words, strict=True)
    ]
    return {"edits": np.array(edits, dtype=float), "words": np.array(words, dtype=float)}


def _anchor_error(pairs: list[tuple[Trace, Trace]]) -> list[Difference]:
    """Median |draft peak - reference frame| (ms) over every draft step of the shared clips, clips resampled; nothing
    where either run has no such step."""
    errors = [[_anchor_errors_ms(trace) for trace in arm] for arm in zip(*pairs, strict=True)]
    a, b = (_pooled_median(arm) for arm in errors)
    if a is None or b is None:
        return []

    def difference(a: list[np.ndarray], b: list[np.ndarray]) -> float | None:
        first, second = _pooled_median(a), _pooled_median(b)
        return None if first is None or second is None else first - second

    return [_difference("anchor_error_ms", a, b, bootstrap(difference, errors, DRAWS, SEED))]


def _anchor_errors_ms(trace: Trace) -> np.ndarray:
    known = [s for s in trace.spine if s.draft_peak is not None and s.reference_frame is not None]
    return np.array([abs(s.draft_peak - s.reference_frame) for s in known], dtype=float) * trace.frame_seconds * 1000


def _pooled_median(per_clip: list[np.ndarray]) -> float | None:
    pooled = np.concatenate(per_clip)
    return float(np.median(pooled)) if len(pooled) else None


def _difference(metric: str, a: float, b: float, interval: Interval) -> Difference:
    return Difference(metric, a, b, interval.estimate, interval.low, interval.high)


@dataclass(frozen=True)
class Word:
    text: str
    changed: bool  # the other transcript does not have it at this place


def word_diff(text_a: str, text_b: str) -> tuple[list[Word], list[Word]]:
    """Both transcripts word by word (as written: case and punctuation count), each word the other transcript lacks
    at that place marked changed: A's deleted or replaced words and B's inserted or replacing ones."""
    words_a, words_b = text_a.split(), text_b.split()
    matcher = difflib.SequenceMatcher(None, words_a, words_b, autojunk=False)
    same_a, same_b = set(), set()
    for block in matcher.get_matching_blocks():
        same_a.update(range(block.a, block.a + block.size))
        same_b.update(range(block.b, block.b + block.size))
    return (
        [Word(word, i not in same_a) for i, word in enumerate(words_a)],
        [Word(word, i not in same_b) for i, word in enumerate(words_b)],
    )
