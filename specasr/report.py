"""The paper's tables from an experiment's runs (`experiments.run_grid`): the cells, their contrasts, the attention
peaks against the reference frames, the restart outcomes, the runtime correction, the K and threshold sweep and the
A/A check, pooled over clips as `specasr.pooled` takes them.
"""

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import numpy as np
import pandas as pd

from specasr.experiments import REPEATS, GridRuns, cell_name, draft_label, grid_traces, shape_label
from specasr.intervals import AA_TOLERANCE, Interval, aa_table, pooled_bootstrap
from specasr.metrics import (
    PeakAgreement,
    choose_runtime_layer,
    odds_ratio,
    outcome_error,
    peak_agreement,
    predicted_speed_change,
    step_cost,
)
from specasr.pooled import (
    DRAWS,
    LARGE_ERROR_MS,
    METRICS,
    SEED,
    ClipResult,
    Contrast,
    Weighting,
    arm_columns,
    bootstrap_interval,
    clip_columns,
    clip_results,
    contrast,
    differences,
    point_estimate,
    restart_errors,
    shared_clips,
    speeds,
    survival,
)
from specasr.store import Store
from specasr.trace import RUNTIME_WINDOWS, Settings, Trace

AGGREGATION = (
    "within a set, acceptance pooled over the rounds of each cell's first repetition and speed as total over total "
    "of each clip's median over repetitions; 95% paired bootstrap intervals (10,000 draws, seed 0) resampling clips "
    "within their set, the same clips in both arms; repetition noise measured by the A/A check; peak agreement, "
    "restart outcomes and anchor errors pooled over clips"
)
WINDOW_CONTRASTS = (  # (a, b): b - a
    ("unrestricted", "correct"),
    ("shift", "unrestricted"),
    ("shift", "correct"),
    ("unrestricted", "runtime"),
    ("unrestricted", "runtime-last"),
)
# The uncorrected loops a runtime window is compared with (Table 16): no window, and a window 0.5 s off, which the
# correction has accepted length to win back (dL > 0), so that the cost rule's sign test can disagree.
RUNTIME_BASES = ("unrestricted", "shift")
DRAFT_CONTRASTS = (("no-audio", "control"), ("no-audio", "anchordraft"), ("control", "anchordraft"))


@dataclass(frozen=True)
class Cell:
    draft: str
    window: str
    k: int
    tree_width: int  # 1: a chain
    tree_nodes: int  # verified per round
    threshold: float
    run_id: str | None  # None: not stored (experiments.GridRuns.not_stored)
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


def cell(settings: Settings, run_id: str | None, results: list[ClipResult]) -> Cell:
    columns = arm_columns(results)
    decode, total = speeds(columns).values()
    return Cell(
        draft=draft_label(settings.draft),
        window=settings.window,
        k=settings.k,
        tree_width=settings.tree_width,
        tree_nodes=settings.nodes,
        threshold=settings.threshold,
        run_id=run_id,
        clips=len(results),
        lossless_clips=sum(r.lossless for r in results),
        a1=point_estimate(METRICS["a1"], columns),
        a2c=point_estimate(METRICS["a2c"], columns),
        L=point_estimate(METRICS["L"], columns),
        s=[point_estimate(survival(depth), columns) for depth in range(settings.k + 1)],
        decode_speedup=decode.estimate,
        decode_speedup_low=decode.low,
        decode_speedup_high=decode.high,
        total_speedup=total.estimate,
        total_speedup_low=total.low,
        total_speedup_high=total.high,
    )


def _partners(cells: dict[Settings, list[ClipResult]], pairs: tuple[tuple[str, str], ...], key: str):
    """(a, b, settings_a, settings_b) for cells that differ only in `key` (window or draft label), per pair. A window
    comes with its runtime layer, which a stored run names under the runtime windows only."""
    fields = ("window", "runtime_layer") if key == "window" else (key,)
    for settings_b in cells:
        for a, b in pairs:
            if _label(settings_b, key) != b:
                continue
            for settings_a in cells:
                same_cell = replace(settings_a, **{field: getattr(settings_b, field) for field in fields}) == settings_b
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
    equal draft, K, tree and threshold, drafts (audio vs no-audio, Tables 1 and 6; AnchorDraft vs control, Table 3)
    at equal window, K, tree and threshold, and each draft tree against the chain of its draft, window and K."""
    found = []
    for a, b, settings_a, settings_b in _partners(_with_audio(cells), WINDOW_CONTRASTS, "window"):
        fixed = f"{draft_label(settings_b.draft)} {_shape_threshold(settings_b)}"
        found += contrast(f"{b}-{a}", fixed, ("a1", "a2c", "L"), cells[settings_a], cells[settings_b])
    for a, b, settings_a, settings_b in _partners(cells, DRAFT_CONTRASTS, "draft"):
        fixed = f"{settings_b.window} {_shape_threshold(settings_b)}"
        found += contrast(f"{b}-{a}", fixed, list(METRICS), cells[settings_a], cells[settings_b])
    for chain, tree in _tree_partners(cells):
        fixed = f"{draft_label(tree.draft)} {tree.window} K={tree.k}"
        name = f"tree {tree.tree_width}x{tree.nodes}-chain"
        found += contrast(name, fixed, list(METRICS), cells[chain], cells[tree])
    return found


def _tree_partners(cells: dict[Settings, list[ClipResult]]):
    """(chain, tree) settings of cells that differ only in their draft tree."""
    for tree in (s for s in cells if s.tree_width > 1):
        for nodes in (None, tree.k):  # a chain's node count as asked, or as resolved
            chain = replace(tree, tree_width=1, tree_nodes=nodes)
            if chain in cells:
                yield chain, tree


def _shape_threshold(settings: Settings) -> str:
    return f"{shape_label(settings)} threshold={settings.threshold:g}"


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
            restarts = [[s for s in r.trace.spine if s.depth == 1] for r in results]
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
        restarts = [restart_errors(r.trace) for r in results]
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
    """Table 16: each runtime window against the uncorrected loops (RUNTIME_BASES) of the same draft, K and threshold.

    Anchor errors, medians over the corrected loop against the reference frames: the readout's (its verification peak
    at the runtime layer, every verified token) and the window centre's (every draft step, and at each depth 1..K).
    Gross: dL / (1 + L), the speed change if the round cost stayed the same. Cost: the correction's added seconds per
    round (_correction_cost), in verification passes of the uncorrected loop. The cost rule predicts a gain when
    dL / (1 + L) > cost / (1 + K rho) (paper eq. 5), K the uncorrected rounds' mean draft passes, and the change itself
    (eq. 4, predicted_change); net: the measured change in decode and end-to-end speed. Cost, rho and the predicted
    change come from every repetition (each clip its median) with intervals over clips; predicted_pays is "yes" or
    "no" where the predicted change's interval excludes 0 and "undetermined" where it holds it, and `agrees` says
    whether a determined prediction has the measured change's sign (None where undetermined).
    """
    rows = []
    pairs = tuple((base, window) for base in RUNTIME_BASES for window in RUNTIME_WINDOWS)
    for uncorrected_window, window, settings_a, settings_b in _partners(_with_audio(cells), pairs, "window"):
        base, corrected = shared_clips(cells[settings_a], cells[settings_b])
        columns = arm_columns(base, corrected)
        uncorrected = columns._replace(arms=columns.arms[:1])
        L = point_estimate(METRICS["L"], uncorrected)
        delta = differences(("a1", "a2c", "L"), columns)
        cost = bootstrap_interval(_correction_cost, columns)
        measured_rho = bootstrap_interval(_rho, uncorrected)
        predicted = bootstrap_interval(_predicted_change, columns)
        net = {
            phase: bootstrap_interval(lambda a, b, phase=phase: a[phase] / b[phase] - 1, columns)
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
                "uncorrected": uncorrected_window,
                "k": settings_b.k,
                "tree_width": settings_b.tree_width,
                "tree_nodes": settings_b.nodes,
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
                **_with_interval("cost", cost),
                **_with_interval("rho", measured_rho),
                **_with_interval("predicted_change", predicted),
                "predicted_pays": _pays(predicted),
                **{f"net_{p}": n.estimate for p, n in net.items()},
                **{f"net_{p}_{end}": getattr(n, end) for p, n in net.items() for end in ("low", "high")},
                "measured_pays": net["decode"].estimate > 0,
            }
        )
    table = pd.DataFrame(rows)
    if len(table):
        determined = table.predicted_pays != "undetermined"
        table["agrees"] = [
            (pays == "yes") == measured if known else None
            for pays, measured, known in zip(table.predicted_pays, table.measured_pays, determined, strict=True)
        ]
    return table


def _with_interval(name: str, interval: Interval) -> dict[str, float]:
    return {name: interval.estimate, f"{name}_low": interval.low, f"{name}_high": interval.high}


def _pays(predicted: Interval) -> str:
    """The cost rule's verdict: yes or no where the predicted change's interval excludes 0."""
    if predicted.low > 0:
        return "yes"
    return "no" if predicted.high < 0 else "undetermined"


def _predicted_change(base: dict[str, np.ndarray], corrected: dict[str, np.ndarray]) -> np.ndarray:
    """Paper eq. 4 from pooled sums: the uncorrected loop's L, rho and passes per round, the change in L, the cost."""
    L = METRICS["L"](base)
    steps = base["passes"] / base["rounds"]
    return predicted_speed_change(METRICS["L"](corrected) - L, L, _correction_cost(base, corrected), steps, _rho(base))


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
    for step in (s for t in traces for s in t.spine if None not in (s.window_centre, s.reference_frame)):
        errors.setdefault(step.depth, []).append(abs(step.window_centre - step.reference_frame))
    return errors


def _median(values: list[float]) -> float | None:
    return float(np.median(values)) if values else None


def _correction_cost(base: dict[str, np.ndarray], corrected: dict[str, np.ndarray]) -> np.ndarray:
    """The correction's added seconds per round, in verification passes of the uncorrected loop: the change in
    verification (with the attention readout) per round, and in draft seconds per draft pass (window masks) times the
    corrected loop's passes per round. Per-unit times, so that rounds that accept less cost no less."""
    verify = base["verify"] / base["rounds"]
    added_verify = corrected["verify"] / corrected["rounds"] - verify
    added_draft = (corrected["draft"] / corrected["passes"] - base["draft"] / base["passes"]) * (
        corrected["passes"] / corrected["rounds"]
    )
    return (added_verify + added_draft) / verify


def _rho(sums: dict[str, np.ndarray]) -> np.ndarray:
    return step_cost(sums["draft"], sums["passes"], sums["verify"], sums["rounds"])


def sweep_table(cells: pd.DataFrame) -> pd.DataFrame:
    """Table 21: speed and acceptance by K, draft tree and threshold for each draft and window, its fastest setting
    marked."""
    shape = ["k", "tree_width", "tree_nodes", "threshold"]
    sweep = cells[["draft", "window", *shape, "decode_speedup", "total_speedup", "a1", "a2c", "L"]].copy()
    sweep["s2"] = [s[2] if len(s) > 2 else None for s in cells.s]
    fastest = cells.groupby(["draft", "window"]).decode_speedup.transform("max")
    sweep["fastest"] = cells.decode_speedup == fastest
    return sweep.sort_values(["draft", "window", *shape]).reset_index(drop=True)


def aa_check(
    baseline: list[Trace], second: list[Trace], weights: Weighting | None = None, tolerance: float = AA_TOLERANCE
) -> pd.DataFrame:
    """The A/A check (intervals.aa_table): the greedy baseline's time over its second copy's, decoded beside it in
    the same batch, per phase, taken and resampled like every cell's speed. Where its interval excludes 1 or reaches
    past 1 +- tolerance, the grid's speed figures are unreliable."""
    return aa_table(speeds(arm_columns(clip_results(baseline, second, weights))), tolerance)


def repetition_note(repeats: int) -> str | None:
    """What the speed intervals leave out with fewer than REPEATS timing repetitions; None with enough."""
    if repeats == 1:
        return "one timing repetition per clip: a clip's time is one run, stalls included"
    if repeats < REPEATS:
        return f"{repeats} timing repetitions per clip (under {REPEATS}): a clip's median leaves few stalls out"
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


def tables(
    store: Store | None, runs: GridRuns, weights: Weighting | None = None, aa_tolerance: float = AA_TOLERANCE
) -> Tables:
    """The paper's tables from the runs' decodes (`experiments.grid_traces`), metrics weighted over evaluation sets as
    `weights` says (one set for all where it is not given), the tables the paper gives set by set, and the A/A check
    with its tolerance."""
    traces = grid_traces(store, runs)
    greedy = traces.baseline
    results = {settings: clip_results(greedy, cell, weights) for settings, cell in traces.cells.items()}
    every_set = weights.each_set() if weights else None
    per_set = {settings: clip_results(greedy, cell, every_set) for settings, cell in traces.cells.items()}

    def cell_table(results: dict[Settings, list[ClipResult]]) -> pd.DataFrame:
        return pd.DataFrame([asdict(cell(settings, runs.cells[settings], rows)) for settings, rows in results.items()])

    cells = cell_table(results)
    half_width = next(iter(runs.cells), Settings()).half_width_ms
    second = traces.second_baseline
    return Tables(
        cells=cells,
        contrasts=pd.DataFrame([asdict(c) for c in contrasts(results)], columns=list(Contrast.__dataclass_fields__)),
        peaks=peak_table(traces.peaks, results, half_width),
        outcomes=outcome_table(results),
        runtime=runtime_table(results),
        sweep=sweep_table(cells),
        cells_by_set=by_set(per_set, cell_table),
        outcomes_by_set=by_set(per_set, outcome_table),
        runtime_by_set=by_set(per_set, runtime_table),
        aa=aa_check(greedy, second, weights, aa_tolerance) if second else aa_table({}),
    )
