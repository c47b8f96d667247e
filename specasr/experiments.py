"""Experiments: a grid of drafts x windows x K x thresholds over the same clips, every decode kept in the run store,
and the paper's tables computed from the stored runs.

The greedy baseline runs once per clip and repetition and serves every cell; a second copy of it runs beside the
cells, the A/A check (`aa_check`); one more greedy pass per clip records every target layer's verification attention
peak (Table 7), untimed. The baseline, the cells and the copy are decoded clip by clip in turn (the order rotating
from clip to clip), repetitions interleaved, so that a drift of the machine's speed falls on every cell alike, and
written together as one batch of runs when all clips are done. Running the same grid again reuses a batch the store
holds; a grid that adds a cell decodes the baseline, its copy and every cell again, since timings compare only within
a batch.

Aggregation as in the paper where the evaluation sets allow it: every metric is taken within each set and the sets
are weighted equally, but only sets of at least MIN_SET_CLIPS clips count as sets of their own (`weighting`). Within
a set, acceptance is pooled over the rounds of each cell's first repetition (every repetition decodes the same
tokens) and speed is total time over total time of each clip's median over repetitions. Intervals are paired
bootstrap percentile intervals: the same clips in both arms, clips resampled within their set, the sets themselves
resampled where there are several, and for speed the repetitions of each drawn clip resampled too (the same ones in
every arm, timed side by side), so that speed intervals hold run-to-run noise.
"""

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import PurePath

import numpy as np
import pandas as pd
from tqdm import tqdm

from specasr.audio import Clip
from specasr.intervals import Interval, aa_table, pooled_bootstrap, pooled_estimate
from specasr.metrics import (
    PeakAgreement,
    choose_runtime_layer,
    correction_pays,
    odds_ratio,
    outcome_counts,
    outcome_error,
    peak_agreement,
    predicted_speed_change,
    proposals_per_round,
    step_cost,
)
from specasr.pipeline import Pipeline
from specasr.store import DecodedRun, Store
from specasr.trace import Settings, Trace
from specasr.windows import RUNTIME_WINDOWS

COMMAND = "experiment"
AGGREGATION = (
    "within a set, acceptance pooled over the rounds of each cell's first repetition and speed as total over total "
    "of each clip's median over repetitions; 95% paired bootstrap intervals (10,000 draws, seed 0): clips resampled "
    "within their set, and the sets themselves where there are several; for speed, each drawn clip's repetitions "
    "resampled too, the same repetitions in both arms (timed side by side); peak agreement, restart outcomes and "
    "anchor errors pooled over clips"
)
PROTOCOL = (
    "real loop: every cell decodes with rounds of its own, so a window's conditional acceptance is taken on its own "
    "loop's survivors (matched rounds: python -m specasr matched)"
)
MIN_SET_CLIPS = 20  # a smaller evaluation set is not weighted as a set of its own
REPEATS = 5  # timing repetitions: fewer leave the speed intervals little run-to-run noise to resample
DRAWS = 10_000
SEED = 0
WINDOW_CONTRASTS = (  # (a, b): b - a
    ("unrestricted", "correct"),
    ("shift", "unrestricted"),
    ("shift", "correct"),
    ("unrestricted", "runtime"),
    ("unrestricted", "runtime-last"),
)
RUNTIME_BASE = "unrestricted"  # the uncorrected loop a runtime window is compared with (Table 16)
LARGE_ERROR_MS = 200.0
DRAFT_CONTRASTS = (("no-audio", "control"), ("no-audio", "anchordraft"), ("control", "anchordraft"))


@dataclass(frozen=True)
class Grid:
    """The cells of an experiment: every draft x window x K x threshold on top of `base` (target, device, ...)."""

    base: Settings
    drafts: tuple[str, ...]
    windows: tuple[str, ...] = ("unrestricted",)
    ks: tuple[int, ...] = (4,)
    thresholds: tuple[float, ...] = (0.0,)

    def baseline(self) -> Settings:
        return replace(self.base, draft=None, verify_peaks=False, reference="never")

    def peaks(self) -> Settings:
        """Greedy decoding that records every layer's verification peak next to the reference frames."""
        return replace(self.base, draft=None, verify_peaks=True, reference="always")

    def cells(self) -> list[Settings]:
        """Reference frames for every cell (anchor errors under any window); no per-layer verification peaks, so
        the loop is timed as it would run."""
        return [
            replace(self.base, draft=d, window=w, k=k, threshold=t, reference="always", verify_peaks=False)
            for d in self.drafts
            for w in self.windows
            for k in self.ks
            for t in self.thresholds
        ]


@dataclass(frozen=True)
class GridRuns:
    baseline: str
    peaks: str
    cells: dict[Settings, str]  # by the settings each cell was asked with
    second_baseline: str | None = None  # the baseline timed again beside it (the A/A check); None in older batches


def run_grid(pipeline: Pipeline, store: Store, grid: Grid, clips: list[Clip], repeats: int = REPEATS) -> GridRuns:
    """Decode every clip under the baseline, every cell and the baseline's second copy (`repeats` times each) and the
    peaks pass (once), unless the store holds them: the timed runs all from one batch, the untimed peaks pass from
    any."""
    cells = {settings: pipeline.resolved(settings) for settings in grid.cells()}
    baseline, peaks = pipeline.resolved(grid.baseline()), pipeline.resolved(grid.peaks())
    timed = [baseline, *dict.fromkeys(cells.values()), baseline]  # the copy last, away from the baseline
    held = store.decoded(COMMAND)
    timed_ids = _held_batch(held, timed, _decodes(clips, repeats))
    peaks_id = _latest(held, peaks, _decodes(clips, 1))
    slots = [] if timed_ids else [(settings, repeats) for settings in timed]
    slots += [] if peaks_id else [(peaks, 1)]
    written = iter(_decode_interleaved(pipeline, store, slots, clips) if slots else ())
    timed_ids = timed_ids or [next(written) for _ in timed]
    peaks_id = peaks_id or next(written)
    by_settings = dict(zip(timed[1:-1], timed_ids[1:-1], strict=True))
    return GridRuns(timed_ids[0], peaks_id, {asked: by_settings[s] for asked, s in cells.items()}, timed_ids[-1])


def _decodes(clips: list[Clip], repeats: int) -> frozenset[tuple[str, int]]:
    return frozenset((clip.hash, repeat) for clip in clips for repeat in range(repeats))


def _latest(held: list[DecodedRun], settings: Settings, decoded: frozenset) -> str | None:
    """The latest run of these settings over exactly these decodes, from any batch."""
    return next((run.run_id for run in reversed(held) if (run.settings, run.decoded) == (settings, decoded)), None)


def _held_batch(held: list[DecodedRun], timed: list[Settings], decoded: frozenset) -> list[str] | None:
    """The run ids, in the order of `timed`, of the latest batch that holds a run of each of its settings (of one
    listed twice, two runs) over exactly these decodes; None where no batch does."""
    batches: dict[str, list[DecodedRun]] = {}
    for run in held:
        if run.batch is not None and run.decoded == decoded:
            batches.setdefault(run.batch, []).append(run)
    for runs in reversed(batches.values()):
        found = _take(runs, timed)
        if found is not None:
            return found
    return None


def _take(runs: list[DecodedRun], timed: list[Settings]) -> list[str] | None:
    """A distinct run of `runs` for each of `timed`, the earliest first; None where one is missing."""
    left, found = list(runs), []
    for settings in timed:
        run = next((run for run in left if run.settings == settings), None)
        if run is None:
            return None
        left.remove(run)
        found.append(run.run_id)
    return found


def stored_grid(store: Store, target: str) -> GridRuns | None:
    """The latest experiment on `target` found in the store: its greedy baseline and the baseline's second copy (the
    first and second baseline run of its batch), the cells decoded beside it (the latest run of each settings) and
    the latest peaks pass over the same clips; None where there is none."""
    runs = [run for run in store.decoded(COMMAND) if run.settings.target == target]
    baselines = [run for run in runs if run.settings.draft is None and not run.settings.verify_peaks]
    if not baselines:
        return None
    latest = baselines[-1]
    baseline, *copies = [run for run in baselines if run.batch == latest.batch] if latest.batch else [latest]
    clips = _clips(baseline)
    peaks = [run for run in runs if run.settings.verify_peaks and run.settings.draft is None and _clips(run) == clips]
    cells = {
        run.settings: run.run_id
        for run in runs
        if run.settings.draft is not None and run.batch == baseline.batch and _clips(run) == clips
    }
    second = copies[0].run_id if copies else None
    return GridRuns(baseline.run_id, peaks[-1].run_id, cells, second) if peaks else None


@dataclass(frozen=True)
class Weighting:
    """How clips are grouped before their metrics are averaged: each clip's evaluation set, the set it is weighted
    in, and the rule that made them."""

    sets: dict[str, str]  # clip hash -> its evaluation set
    groups: dict[str, str]  # clip hash -> the set whose metrics it counts in
    rule: str  # in words, with each set's size


def weighting(sets: dict[str, str], minimum: int = MIN_SET_CLIPS) -> Weighting:
    """Evaluation sets (clip hash -> set) of at least `minimum` clips are weighted equally, and the clips of smaller
    sets make one set more if together they reach `minimum`. Where they do not, or fewer than two sets would remain,
    every metric is pooled over all clips: a set of a few clips weighted like one of dozens would carry the estimate
    with next to no variance to show for it."""
    sizes = Counter(sets.values())
    large = sorted(name for name, n in sizes.items() if n >= minimum)
    small = sorted(name for name, n in sizes.items() if n < minimum)
    merged = sum(sizes[name] for name in small)
    listed = ", ".join(f"{name} ({sizes[name]})" for name in large)
    if len(large) + (merged >= minimum) < 2 or 0 < merged < minimum:
        why = f"sets under {minimum} clips: {', '.join(small)} ({merged} clips)" if small else "one set"
        return Weighting(sets, dict.fromkeys(sets, "all"), f"pooled over all {len(sets)} clips as one set ({why})")
    if not small:
        return Weighting(sets, sets, f"sets of at least {minimum} clips weighted equally: {listed}")
    group = f"{len(small)} smaller sets"
    rule = f"sets of at least {minimum} clips weighted equally: {listed}, {group} merged ({merged} clips)"
    return Weighting(sets, {clip: group if name in small else name for clip, name in sets.items()}, rule)


def _clips(run: DecodedRun) -> set[str]:
    return {clip for clip, _ in run.decoded}


def _decode_interleaved(
    pipeline: Pipeline, store: Store, slots: list[tuple[Settings, int]], clips: list[Clip]
) -> list[str]:
    """Every slot's decodes (its settings, so many repetitions), clip by clip, repetitions interleaved; then the runs,
    one per slot, stored as one batch. Returns their run ids in the order of `slots`."""
    for settings in dict.fromkeys(settings for settings, _ in slots):
        pipeline.decode(clips[0], settings)  # warm-up, not kept: the first decode of a cell loads and allocates
    traces: list[list[Trace]] = [[] for _ in slots]
    order = list(range(len(slots)))
    with tqdm(total=sum(repeats for _, repeats in slots) * len(clips), unit="decode") as bar:
        for i, clip in enumerate(clips):
            turn = order[i % len(order) :] + order[: i % len(order)]
            for repeat in range(max(repeats for _, repeats in slots)):
                for slot in (j for j in turn if repeat < slots[j][1]):
                    settings = slots[slot][0]
                    bar.set_postfix_str(f"{clip.id} {cell_name(settings)}", refresh=False)
                    traces[slot].append(pipeline.decode(clip, settings))
                    bar.update()
    numbered = [(runs, [r for _ in clips for r in range(n)]) for runs, (_, n) in zip(traces, slots, strict=True)]
    return store.write_runs(numbered, COMMAND)


def cell_name(settings: Settings) -> str:
    if settings.draft is None:
        return "greedy with verification peaks" if settings.verify_peaks else "greedy"
    return f"{draft_label(settings.draft)} {settings.window} K={settings.k} threshold={settings.threshold:g}"


def draft_label(draft: str) -> str:
    """A shipped draft's variant or a folder's name: whisper-tiny.en/control -> control."""
    return PurePath(draft).name


@dataclass(frozen=True)
class ClipResult:
    """One cell on one clip, next to the greedy baseline on the same clip."""

    trace: Trace  # the first repetition
    subset: str  # the clip's evaluation set
    group: str  # the set it is weighted in (`weighting`)
    decode: tuple[float, ...]  # seconds, repetition by repetition (the baseline's beside them: timed side by side)
    total: tuple[float, ...]
    greedy_decode: tuple[float, ...]
    greedy_total: tuple[float, ...]
    lossless: bool  # every repetition gave the greedy tokens


def clip_results(baseline: list[Trace], traces: list[Trace], weights: Weighting | None = None) -> list[ClipResult]:
    """A cell's clips in the baseline's order, each with its repetitions' timings and its sets (one set for all where
    `weights` is not given)."""
    cell = _by_clip(traces)
    results = []
    for clip_hash, greedy in _by_clip(baseline).items():
        repeats = cell.get(clip_hash)
        if repeats is None:
            continue
        results.append(
            ClipResult(
                trace=repeats[0],
                subset=weights.sets[clip_hash] if weights else "all",
                group=weights.groups[clip_hash] if weights else "all",
                decode=_seconds(repeats, "decode"),
                total=_seconds(repeats, "total"),
                greedy_decode=_seconds(greedy, "decode"),
                greedy_total=_seconds(greedy, "total"),
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
    outcomes = [outcome_counts(*_restart_errors(r.trace), LARGE_ERROR_MS) for r in results]
    return {
        "survivors": np.array(survivors, dtype=float),
        "outcomes": np.array(outcomes, dtype=float).reshape(len(results), 4),
        "rounds": np.array([len(r.trace.rounds) for r in results], dtype=float),
        "proposed": np.array([sum(len(round.proposed) for round in r.trace.rounds) for r in results], dtype=float),
        "draft": np.array([r.trace.draft_seconds for r in results]),
        "verify": np.array([r.trace.verify_seconds for r in results]),
    } | {name: np.array(v, dtype=float) for name, v in timings.items()}


def _restart_errors(trace: Trace) -> tuple[list[float], list[bool]]:
    """The anchor error (ms) and outcome of every restart proposal whose draft peak and reference frame are known."""
    restarts = [s for s in trace.steps if s.depth == 1 and None not in (s.draft_peak, s.reference_frame)]
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
SPEEDS = ("decode_speedup", "total_speedup")
TIMINGS = ("decode", "total", "greedy_decode", "greedy_total")  # columns of clips x repetitions


Columns = tuple[list[dict[str, np.ndarray]], list[str]]  # each arm's clip columns, and each clip's evaluation set


def _columns(*arms: list[ClipResult]) -> Columns:
    """The arms' clip columns, built once for every metric taken of them (the arms hold the same clips)."""
    return [clip_columns(arm) for arm in arms], [r.group for r in arms[0]]


def _interval(statistic: Callable[..., np.ndarray], columns: Columns, timed: bool = True) -> Interval:
    """The statistic's interval; a timed one (reading TIMINGS) resamples each clip's repetitions too, and one that
    is not is spared that work."""
    arms, strata = columns
    if not timed:
        arms = [{name: column for name, column in arm.items() if name not in TIMINGS} for arm in arms]
    repeated = TIMINGS if timed else ()
    return pooled_bootstrap(statistic, arms, DRAWS, SEED, strata=strata, resample_strata=True, repeated=repeated)


def _estimate(metric: Callable[..., np.ndarray], columns: Columns) -> float | None:
    try:
        return pooled_estimate(metric, *columns, repeated=TIMINGS)
    except ValueError:
        return None


@dataclass(frozen=True)
class Cell:
    draft: str
    window: str
    k: int
    threshold: float
    run_id: str
    clips: int
    lossless_clips: int
    a1: float | None
    a2c: float | None
    L: float
    s: list[float | None]  # survival by depth, s[0] = 1
    decode_speedup: float
    decode_speedup_low: float
    decode_speedup_high: float
    total_speedup: float
    total_speedup_low: float
    total_speedup_high: float


def cell(settings: Settings, run_id: str, results: list[ClipResult]) -> Cell:
    columns = _columns(results)
    decode = _interval(METRICS["decode_speedup"], columns)
    total = _interval(METRICS["total_speedup"], columns)
    return Cell(
        draft=draft_label(settings.draft),
        window=settings.window,
        k=settings.k,
        threshold=settings.threshold,
        run_id=run_id,
        clips=len(results),
        lossless_clips=sum(r.lossless for r in results),
        a1=_estimate(METRICS["a1"], columns),
        a2c=_estimate(METRICS["a2c"], columns),
        L=_estimate(METRICS["L"], columns),
        s=[_estimate(survival(depth), columns) for depth in range(settings.k + 1)],
        decode_speedup=decode.estimate,
        decode_speedup_low=decode.low,
        decode_speedup_high=decode.high,
        total_speedup=total.estimate,
        total_speedup_low=total.low,
        total_speedup_high=total.high,
    )


@dataclass(frozen=True)
class Contrast:
    name: str  # "b-a": b minus a
    fixed: str  # what both arms share: the draft or the window, K and threshold
    metric: str
    clips: int
    estimate: float
    low: float
    high: float


def _shared(arm_a: list[ClipResult], arm_b: list[ClipResult]) -> tuple[list[ClipResult], list[ClipResult]]:
    """Both arms on the clips both decoded, in the same order."""
    both = {r.trace.clip_hash for r in arm_a} & {r.trace.clip_hash for r in arm_b}
    return [r for r in arm_a if r.trace.clip_hash in both], [r for r in arm_b if r.trace.clip_hash in both]


def contrast(
    name: str, fixed: str, metrics: Sequence[str], arm_a: list[ClipResult], arm_b: list[ClipResult]
) -> list[Contrast]:
    """metric(b) - metric(a) for each metric on the clips both arms decoded, with its paired bootstrap interval;
    metrics undefined on these arms (a2c at K = 1) are left out."""
    arms = _shared(arm_a, arm_b)
    found = _differences(metrics, _columns(*arms))
    return [Contrast(name, fixed, metric, len(arms[0]), **asdict(interval)) for metric, interval in found.items()]


def _differences(metrics: Sequence[str], columns: Columns) -> dict[str, Interval]:
    found = {}
    for metric in metrics:
        measure = METRICS[metric]
        try:
            found[metric] = _interval(lambda a, b, measure=measure: measure(b) - measure(a), columns, metric in SPEEDS)
        except ValueError:
            continue
    return found


def _partners(cells: dict[Settings, list[ClipResult]], pairs: tuple[tuple[str, str], ...], key: str):
    """(a, b, settings_a, settings_b) for cells that differ only in `key` (window or draft label), per pair."""
    for settings_b in cells:
        for a, b in pairs:
            if _label(settings_b, key) != b:
                continue
            for settings_a in cells:
                same_cell = replace(settings_a, **{key: getattr(settings_b, key)}) == settings_b
                if same_cell and _label(settings_a, key) == a:
                    yield a, b, settings_a, settings_b


def _with_audio(cells: dict[Settings, list[ClipResult]]) -> dict[Settings, list[ClipResult]]:
    """The cells whose draft attends to the audio: a window changes nothing for the others."""
    return {s: results for s, results in cells.items() if _attends(results)}


def _attends(results: list[ClipResult]) -> bool:
    return any(step.draft_peak is not None for r in results for step in r.trace.steps)


def _label(settings: Settings, key: str) -> str:
    return draft_label(settings.draft) if key == "draft" else getattr(settings, key)


def contrasts(cells: dict[Settings, list[ClipResult]]) -> list[Contrast]:
    """The paper's contrasts among the cells present: windows (Table 2, and the runtime windows of Table 16) at
    equal draft, K and threshold, and drafts (audio vs no-audio, Tables 1 and 6; AnchorDraft vs control, Table 3)
    at equal window, K and threshold."""
    found = []
    for a, b, settings_a, settings_b in _partners(_with_audio(cells), WINDOW_CONTRASTS, "window"):
        fixed = f"{draft_label(settings_b.draft)} {_k_threshold(settings_b)}"
        found += contrast(f"{b}-{a}", fixed, ("a1", "a2c", "L"), cells[settings_a], cells[settings_b])
    for a, b, settings_a, settings_b in _partners(cells, DRAFT_CONTRASTS, "draft"):
        fixed = f"{settings_b.window} {_k_threshold(settings_b)}"
        found += contrast(f"{b}-{a}", fixed, list(METRICS), cells[settings_a], cells[settings_b])
    return found


def _k_threshold(settings: Settings) -> str:
    return f"K={settings.k} threshold={settings.threshold:g}"


def peak_table(peaks: list[Trace], cells: dict[Settings, list[ClipResult]], half_width_ms: float) -> pd.DataFrame:
    """Table 7: the target's verification peak per layer (greedy pass) and each audio draft's restart peak (its
    unrestricted cells) against the reference frames, with the shuffled-frame floor; `runtime_layer` marks the
    layer the paper's D.2 rule picks."""
    traces = [*peaks, *(r.trace for results in cells.values() for r in results)]
    frame_ms = traces[0].frame_seconds * 1000 if traces else 1.0  # one target per experiment: its frame
    half_width = round(half_width_ms / frame_ms)
    frames = [t.reference_frames or [] for t in peaks]
    layers = max((len(v.verify_peaks) for t in peaks for v in t.verified), default=0)
    rows = []
    for layer in range(layers):
        by_position = [{v.position: v.verify_peaks[layer] for v in t.verified} for t in peaks]
        track = [[p.get(i) for i in range(len(f))] for p, f in zip(by_position, frames, strict=True)]
        rows.append(peak_agreement(f"target layer {layer} verification", track, frames, half_width, frame_ms))
    for settings, results in cells.items():
        if settings.window == "unrestricted" and _attends(results):
            restarts = [[s for s in r.trace.steps if s.depth == 1] for r in results]
            rows.append(
                peak_agreement(
                    f"{cell_name(settings)} restart",
                    [[s.draft_peak for s in steps] for steps in restarts],
                    [[s.reference_frame for s in steps] for steps in restarts],
                    half_width,
                    frame_ms,
                )
            )
    table = pd.DataFrame([asdict(row) for row in rows], columns=list(PeakAgreement.__dataclass_fields__))
    verification = table.source.str.endswith("verification")
    table["runtime_layer"] = False
    if verification.any():
        table.loc[choose_runtime_layer(table.inside_window[verification].tolist()), "runtime_layer"] = True
    return table


def outcome_table(cells: dict[Settings, list[ClipResult]]) -> pd.DataFrame:
    """Table 10: every audio cell's restart proposals (depth 1) split by outcome, at the positions where they were
    made: median anchor error of accepted and rejected ones, share above 200 ms, and the odds ratio of a large
    error at rejection over acceptance with its interval."""
    rows = []
    for settings, results in cells.items():
        restarts = [_restart_errors(r.trace) for r in results]
        errors = [error for clip_errors, _ in restarts for error in clip_errors]
        accepted = [outcome for _, clip_outcomes in restarts for outcome in clip_outcomes]
        try:
            outcome = outcome_error(errors, accepted, LARGE_ERROR_MS)
            ratio = pooled_bootstrap(lambda sums: odds_ratio(sums["outcomes"]), [clip_columns(results)], DRAWS, SEED)
        except ValueError:  # no audio attention, or no accepted (or no rejected) restart
            continue
        rows.append({"cell": cell_name(settings), **asdict(outcome), "odds_low": ratio.low, "odds_high": ratio.high})
    return pd.DataFrame(rows)


def runtime_table(cells: dict[Settings, list[ClipResult]]) -> pd.DataFrame:
    """Table 16: each runtime window against the unrestricted loop of the same draft, K and threshold.

    Anchor errors, medians over the corrected loop against the reference frames: the readout's (its verification peak
    at the runtime layer, every verified token) and the window centre's (every draft step, and at each depth 1..K).
    Gross: dL / (1 + L), the speed change if the round cost stayed the same. Cost: the correction's added seconds per
    round (_correction_cost), in verification passes of the uncorrected loop. The cost rule predicts a gain when
    dL / (1 + L) > cost / (1 + K rho) (paper eq. 5), K the uncorrected rounds' mean proposals, and the change itself
    (eq. 4, predicted_change); net: the measured change in decode and end-to-end speed.
    """
    rows = []
    pairs = tuple((RUNTIME_BASE, window) for window in RUNTIME_WINDOWS)
    for _, window, settings_a, settings_b in _partners(_with_audio(cells), pairs, "window"):
        base, corrected = _shared(cells[settings_a], cells[settings_b])
        columns = _columns(base, corrected)
        uncorrected = ([columns[0][0]], columns[1])
        L = pooled_estimate(METRICS["L"], *uncorrected)
        delta = _differences(("a1", "a2c", "L"), columns)
        cost = pooled_estimate(_correction_cost, *columns)
        measured_rho = pooled_estimate(_rho, *uncorrected)
        steps = proposals_per_round([r.trace for r in base])
        net = {
            phase: _interval(lambda a, b, phase=phase: a[phase] / b[phase] - 1, columns)
            for phase in ("decode", "total")
        }
        traces = [r.trace for r in corrected]
        frame_ms = traces[0].frame_seconds * 1000
        readout, centre = _median(_readout_errors(traces)), _centre_errors(traces)
        everywhere = _median([e for errors in centre.values() for e in errors])
        rows.append(
            {
                "draft": draft_label(settings_b.draft),
                "window": window,
                "k": settings_b.k,
                "threshold": settings_b.threshold,
                "readout_error_frames": readout,
                "readout_error_ms": None if readout is None else readout * frame_ms,
                "centre_error_frames": everywhere,
                "centre_error_ms": None if everywhere is None else everywhere * frame_ms,
                "centre_error_by_depth": [_median(centre.get(d, [])) for d in range(1, settings_b.k + 1)],
                **{f"d_{m}": delta[m].estimate if m in delta else None for m in ("a1", "a2c", "L")},
                "d_L_low": delta["L"].low,
                "d_L_high": delta["L"].high,
                "gross": delta["L"].estimate / (1 + L),
                "cost": cost,
                "rho": measured_rho,
                "predicted_pays": correction_pays(delta["L"].estimate, L, cost, steps, measured_rho),
                "predicted_change": predicted_speed_change(delta["L"].estimate, L, cost, steps, measured_rho),
                **{f"net_{p}": n.estimate for p, n in net.items()},
                **{f"net_{p}_{end}": getattr(n, end) for p, n in net.items() for end in ("low", "high")},
                "measured_pays": net["decode"].estimate > 0,
            }
        )
    return pd.DataFrame(rows)


def _readout_errors(traces: list[Trace]) -> list[int]:
    """|runtime readout - reference frame| in frames, for every verified token that has both."""
    return [
        abs(peak - frame)
        for t in traces
        # strict=False: tokens past the reference frames (a transcript that left greedy's) have none
        for peak, frame in zip(t.runtime_peaks or [], t.reference_frames or [], strict=False)
        if frame is not None
    ]


def _centre_errors(traces: list[Trace]) -> dict[int, list[int]]:
    """|window centre - reference frame| in frames, by draft depth, for every draft step that has both."""
    errors: dict[int, list[int]] = {}
    for step in (s for t in traces for s in t.steps if None not in (s.window_centre, s.reference_frame)):
        errors.setdefault(step.depth, []).append(abs(step.window_centre - step.reference_frame))
    return errors


def _median(values: list[float]) -> float | None:
    return float(np.median(values)) if values else None


def _correction_cost(base: dict[str, np.ndarray], corrected: dict[str, np.ndarray]) -> np.ndarray:
    """The correction's added seconds per round, in verification passes of the uncorrected loop: the change in
    verification (with the attention readout) per round, and in draft seconds per proposal (window masks) times the
    corrected loop's proposals per round. Per-unit times, so that rounds that accept less cost no less."""
    verify = base["verify"] / base["rounds"]
    added_verify = corrected["verify"] / corrected["rounds"] - verify
    added_draft = (corrected["draft"] / corrected["proposed"] - base["draft"] / base["proposed"]) * (
        corrected["proposed"] / corrected["rounds"]
    )
    return (added_verify + added_draft) / verify


def _rho(sums: dict[str, np.ndarray]) -> np.ndarray:
    return step_cost(sums["draft"], sums["proposed"], sums["verify"], sums["rounds"])


def sweep_table(cells: pd.DataFrame) -> pd.DataFrame:
    """Table 21: speed and acceptance by K and threshold for each draft and window, its fastest setting marked."""
    sweep = cells[["draft", "window", "k", "threshold", "decode_speedup", "total_speedup", "a1", "a2c"]].copy()
    sweep["s2"] = [s[2] if len(s) > 2 else None for s in cells.s]
    fastest = cells.groupby(["draft", "window"]).decode_speedup.transform("max")
    sweep["fastest"] = cells.decode_speedup == fastest
    return sweep.sort_values(["draft", "window", "k", "threshold"]).reset_index(drop=True)


def aa_check(baseline: list[Trace], second: list[Trace], weights: Weighting | None = None) -> pd.DataFrame:
    """The A/A check (metrics.aa_table): the greedy baseline's time over its second copy's, decoded beside it in the
    same batch, per phase, taken and resampled like every cell's speed. The copies disagree where the interval
    excludes 1, and a speed difference between cells up to that ratio's distance from 1 is then machine noise."""
    columns = _columns(clip_results(baseline, second, weights))
    return aa_table({phase: _interval(METRICS[f"{phase}_speedup"], columns) for phase in ("decode", "total")})


def repetition_note(repeats: int) -> str | None:
    """What the speed intervals leave out with fewer than REPEATS timing repetitions; None with enough."""
    if repeats == 1:
        return "one timing repetition per clip: speed intervals hold no run-to-run noise"
    if repeats < REPEATS:
        return f"{repeats} timing repetitions per clip (under {REPEATS}): speed intervals hold little run-to-run noise"
    return None


@dataclass
class Tables:
    cells: pd.DataFrame
    contrasts: pd.DataFrame
    peaks: pd.DataFrame
    outcomes: pd.DataFrame
    runtime: pd.DataFrame
    sweep: pd.DataFrame
    cells_by_set: pd.DataFrame  # the cells, each evaluation set on its own (Tables 1, 6)
    outcomes_by_set: pd.DataFrame  # Table 10, each set on its own
    runtime_by_set: pd.DataFrame  # Table 16, each set on its own
    aa: pd.DataFrame  # the A/A check (aa_check); empty for an experiment stored before it


def by_set(
    results: dict[Settings, list[ClipResult]], table: Callable[[dict[Settings, list[ClipResult]]], pd.DataFrame]
) -> pd.DataFrame:
    """`table` computed on each evaluation set's clips alone, the set's rows first in its name and clip count."""
    frames = []
    for name in sorted({r.subset for rows in results.values() for r in rows}):
        subset = {settings: [r for r in rows if r.subset == name] for settings, rows in results.items()}
        frame = table({settings: rows for settings, rows in subset.items() if rows})
        clips = len({r.trace.clip_hash for rows in subset.values() for r in rows})
        frames.append(frame.assign(set=name, set_clips=clips)[["set", "set_clips", *frame.columns]])
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def tables(store: Store, runs: GridRuns, weights: Weighting | None = None) -> Tables:
    """The paper's tables from the stored runs, metrics weighted over evaluation sets as `weights` says (one set for
    all where it is not given), and the tables the paper gives set by set."""
    greedy = store.traces(runs.baseline)
    results = {settings: clip_results(greedy, store.traces(run_id), weights) for settings, run_id in runs.cells.items()}

    def cell_table(results: dict[Settings, list[ClipResult]]) -> pd.DataFrame:
        return pd.DataFrame([asdict(cell(settings, runs.cells[settings], rows)) for settings, rows in results.items()])

    cells = cell_table(results)
    half_width = next(iter(runs.cells), Settings()).half_width_ms
    second = runs.second_baseline
    aa = aa_check(greedy, store.traces(second), weights) if second else aa_table({})
    return Tables(
        cells=cells,
        contrasts=pd.DataFrame([asdict(c) for c in contrasts(results)], columns=list(Contrast.__dataclass_fields__)),
        peaks=peak_table(store.traces(runs.peaks), results, half_width),
        outcomes=outcome_table(results),
        runtime=runtime_table(results),
        sweep=sweep_table(cells),
        cells_by_set=by_set(results, cell_table),
        outcomes_by_set=by_set(results, outcome_table),
        runtime_by_set=by_set(results, runtime_table),
        aa=aa,
    )
