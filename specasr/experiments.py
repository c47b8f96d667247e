"""Experiments: a grid of drafts x windows x K x thresholds over the same clips, every decode kept in the run store,
and the paper's tables computed from the stored runs.

The greedy baseline runs once per clip and repetition and serves every cell. Each cell is one run, written when all
its decodes are done; running the same grid again skips the cells the store already holds. Acceptance is pooled over
the rounds of each cell's first repetition (every repetition decodes the same tokens); speed uses each clip's
median over repetitions, pooled over clips (total time over total time). Intervals are paired utterance-bootstrap
percentile intervals: the same clips in both arms, a clip resampled with all its repetitions.
"""

import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import PurePath

import numpy as np
import pandas as pd
from tqdm import tqdm

from specasr.audio import Clip
from specasr.metrics import acceptance, pooled_bootstrap
from specasr.pipeline import Pipeline
from specasr.store import Store
from specasr.trace import Settings, Trace

COMMAND = "experiment"
AGGREGATION = (
    "acceptance pooled over the rounds of each cell's first repetition; speed: each clip's median over repetitions, "
    "total over total; 95% paired utterance-bootstrap intervals (10,000 draws, seed 0); one evaluation set"
)
DRAWS = 10_000
SEED = 0
WINDOW_CONTRASTS = (("unrestricted", "correct"), ("shift", "unrestricted"), ("shift", "correct"))  # (a, b): b - a
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


def run_grid(
    pipeline: Pipeline, store: Store, grid: Grid, clips: list[Clip], repeats: int = 1
) -> tuple[str, dict[Settings, str]]:
    """Decode every clip `repeats` times under the baseline and every cell the store does not hold yet.

    Returns the baseline's run id and each cell's (by the settings it was asked with).
    """
    wanted = frozenset((clip.hash, repeat) for clip in clips for repeat in range(repeats))
    finished = {settings: run_id for run_id, settings, decoded in store.decoded(COMMAND) if decoded == wanted}
    runs = {}
    for settings in [grid.baseline(), *grid.cells()]:
        resolved = pipeline.resolved(settings)
        if resolved not in finished:
            pipeline.decode(clips[0], settings)  # warm-up, not kept: the first decode of a cell loads and allocates
            traces, numbers = [], []
            for clip in tqdm(clips, desc=cell_name(resolved), unit="clip"):
                for repeat in range(repeats):
                    traces.append(pipeline.decode(clip, settings))
                    numbers.append(repeat)
            finished[resolved] = store.write_run(traces, COMMAND, numbers)
        runs[settings] = finished[resolved]
    baseline = runs.pop(grid.baseline())
    return baseline, runs


def cell_name(settings: Settings) -> str:
    if settings.draft is None:
        return "greedy"
    return f"{draft_label(settings.draft)} {settings.window} K={settings.k} threshold={settings.threshold:g}"


def draft_label(draft: str) -> str:
    """A shipped draft's variant or a folder's name: whisper-tiny.en/control -> control."""
    return PurePath(draft).name


@dataclass(frozen=True)
class ClipResult:
    """One cell on one clip, next to the greedy baseline on the same clip."""

    trace: Trace  # the first repetition
    decode: float  # seconds, median over repetitions
    total: float
    greedy_decode: float
    greedy_total: float
    lossless: bool  # every repetition gave the greedy tokens


def clip_results(baseline: list[Trace], traces: list[Trace]) -> list[ClipResult]:
    """A cell's clips in the baseline's order, each with its repetitions' medians."""
    cell = _by_clip(traces)
    results = []
    for clip_hash, greedy in _by_clip(baseline).items():
        repeats = cell.get(clip_hash)
        if repeats is None:
            continue
        results.append(
            ClipResult(
                trace=repeats[0],
                decode=statistics.median(t.timings.decode for t in repeats),
                total=statistics.median(t.timings.total for t in repeats),
                greedy_decode=statistics.median(t.timings.decode for t in greedy),
                greedy_total=statistics.median(t.timings.total for t in greedy),
                lossless=all(t.tokens == greedy[0].tokens for t in repeats),
            )
        )
    return results


def _by_clip(traces: list[Trace]) -> dict[str, list[Trace]]:
    grouped: dict[str, list[Trace]] = {}
    for trace in traces:
        grouped.setdefault(trace.clip_hash, []).append(trace)
    return grouped


def clip_columns(results: list[ClipResult]) -> dict[str, np.ndarray]:
    """Per clip (rows): its first repetition's rounds that survived each depth 0..K, and its median timings."""
    depths = range(max((r.trace.settings.k for r in results), default=0) + 1)
    survivors = [[sum(round.accepted >= d for round in r.trace.rounds) for d in depths] for r in results]
    timings = {
        name: [getattr(r, name) for r in results] for name in ("decode", "total", "greedy_decode", "greedy_total")
    }
    return {"survivors": np.array(survivors, dtype=float)} | {name: np.array(v) for name, v in timings.items()}


def _survivors(sums: dict[str, np.ndarray], depth: int) -> np.ndarray:
    """Rounds that survived `depth`, summed over clips; NaN beyond K."""
    survivors = sums["survivors"]
    return survivors[..., depth] if depth < survivors.shape[-1] else np.full(survivors.shape[:-1], np.nan)


# Each metric is a ratio of sums over clips (acceptance pooled over rounds, total time over total time), so that
# a bootstrap can resample clips for all its draws at once (metrics.pooled_bootstrap).
METRICS: dict[str, Callable[[dict[str, np.ndarray]], np.ndarray]] = {
    "a1": lambda sums: _survivors(sums, 1) / _survivors(sums, 0),
    "a2c": lambda sums: _survivors(sums, 2) / _survivors(sums, 1),
    "L": lambda sums: sums["survivors"][..., 1:].sum(axis=-1) / _survivors(sums, 0),
    "decode_speedup": lambda sums: sums["greedy_decode"] / sums["decode"],
    "total_speedup": lambda sums: sums["greedy_total"] / sums["total"],
}


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
    s: list[float]  # survival by depth, s[0] = 1
    decode_speedup: float
    decode_speedup_low: float
    decode_speedup_high: float
    total_speedup: float
    total_speedup_low: float
    total_speedup_high: float


def cell(settings: Settings, run_id: str, results: list[ClipResult]) -> Cell:
    accepted = acceptance([r.trace for r in results])
    columns = [clip_columns(results)]
    decode = pooled_bootstrap(METRICS["decode_speedup"], columns, DRAWS, SEED)
    total = pooled_bootstrap(METRICS["total_speedup"], columns, DRAWS, SEED)
    return Cell(
        draft=draft_label(settings.draft),
        window=settings.window,
        k=settings.k,
        threshold=settings.threshold,
        run_id=run_id,
        clips=len(results),
        lossless_clips=sum(r.lossless for r in results),
        a1=accepted.a1,
        a2c=accepted.a2c,
        L=accepted.L,
        s=accepted.s,
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


def contrast(name: str, fixed: str, metric: str, arm_a: list[ClipResult], arm_b: list[ClipResult]) -> Contrast | None:
    """metric(b) - metric(a) on the clips both arms decoded, with its paired bootstrap interval; None where the
    metric is undefined (a2c at K = 1)."""
    shared = {r.trace.clip_hash for r in arm_a} & {r.trace.clip_hash for r in arm_b}
    columns = [clip_columns([r for r in arm if r.trace.clip_hash in shared]) for arm in (arm_a, arm_b)]
    measure = METRICS[metric]
    try:
        interval = pooled_bootstrap(lambda a, b: measure(b) - measure(a), columns, DRAWS, SEED)
    except ValueError:
        return None
    return Contrast(name, fixed, metric, len(shared), **asdict(interval))


def contrasts(cells: dict[Settings, list[ClipResult]]) -> list[Contrast]:
    """The paper's contrasts among the cells present: windows (Table 2) at equal draft, K and threshold, and drafts
    (audio vs no-audio, Tables 1 and 6; AnchorDraft vs control, Table 3) at equal window, K and threshold."""
    found = []
    for settings, results in cells.items():
        shared = f"K={settings.k} threshold={settings.threshold:g}"
        for a, b in WINDOW_CONTRASTS:
            if settings.window == b and (other := cells.get(replace(settings, window=a))) is not None:
                fixed = f"{draft_label(settings.draft)} {shared}"
                found += [contrast(f"{b}-{a}", fixed, m, other, results) for m in ("a1", "a2c", "L")]
        for a, b in DRAFT_CONTRASTS:
            if draft_label(settings.draft) != b:
                continue
            for other_settings, other in cells.items():
                same_cell = replace(other_settings, draft=settings.draft) == settings
                if same_cell and draft_label(other_settings.draft) == a:
                    fixed = f"{settings.window} {shared}"
                    found += [contrast(f"{b}-{a}", fixed, m, other, results) for m in METRICS]
    return [c for c in found if c is not None]


def tables(store: Store, baseline: str, runs: dict[Settings, str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The cells table (one row per cell) and the contrasts table, from the stored runs."""
    greedy = store.traces(baseline)
    results = {settings: clip_results(greedy, store.traces(run_id)) for settings, run_id in runs.items()}
    cells = [cell(settings, runs[settings], rows) for settings, rows in results.items()]
    return (
        pd.DataFrame([asdict(c) for c in cells]),
        pd.DataFrame([asdict(c) for c in contrasts(results)], columns=[f for f in Contrast.__dataclass_fields__]),
    )
