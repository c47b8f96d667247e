"""Experiments: a grid of drafts x windows x K x draft trees x thresholds over the same clips, every decode kept in the
run store and in memory, for the paper's tables (`specasr.report`).

The greedy baseline runs once per clip and repetition and serves every cell; a second copy of it runs beside the
cells, the A/A check (`report.aa_check`); one more greedy pass per clip records every target layer's verification
attention peak (Table 7), untimed. The baseline, the cells and the copy are decoded clip by clip in turn (the order
rotating from clip to clip), repetitions interleaved, so that a drift of the machine's speed falls on every cell
alike. They form one batch of runs, stored clip by clip: each clip's decodes of every run in one transaction as soon
as the clip is done, so that a grid stopped half way (Ctrl-C, a crash, a lost machine) keeps every finished clip, and
running the same command again decodes only the clips its batch lacks. Running the same grid again reuses a batch
the store holds; a grid that adds a cell decodes the baseline, its copy and every cell again, since timings compare
only within a batch. A batch the store refuses still makes its tables, from the decodes held in memory.
"""

import json
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import PurePath

from tqdm import tqdm

from specasr.audio import Clip
from specasr.pipeline import Pipeline
from specasr.ranks import ALONE, Ranks
from specasr.store import ClipBatch, DecodedRun, Store, StoreError
from specasr.trace import Settings, Trace

COMMAND = "experiment"
PROTOCOL = (
    "real loop: every cell decodes with rounds of its own, so a window's conditional acceptance is taken on its own "
    "loop's survivors (matched rounds: python -m specasr matched)"
)
REPEATS = 5  # timing repetitions: fewer leave the speed intervals little run-to-run noise to resample


class GridInterrupted(KeyboardInterrupt):
    """Ctrl-C while a grid decodes; its message says what the store kept and how to resume."""


@dataclass(frozen=True)
class Grid:
    """The cells of an experiment: every draft x window x K x tree x threshold on top of `base` (target, device, ...);
    a tree is (width, nodes), (1, None) the chain."""

    base: Settings
    drafts: tuple[str, ...]
    windows: tuple[str, ...] = ("unrestricted",)
    ks: tuple[int, ...] = (4,)
    thresholds: tuple[float, ...] = (0.0,)
    trees: tuple[tuple[int, int | None], ...] = ((1, None),)

    def baseline(self) -> Settings:
        return replace(self.base, draft=None, verify_peaks=False, reference="never")

    def peaks(self) -> Settings:
        """Greedy decoding that records every layer's verification peak next to the reference frames."""
        return replace(self.base, draft=None, verify_peaks=True, reference="always")

    def cells(self) -> list[Settings]:
        """Reference frames for every cell (anchor errors under any window); no per-layer verification peaks, so
        the loop is timed as it would run."""
        return [
            replace(
                self.base,
                draft=d,
                window=w,
                k=k,
                threshold=t,
                tree_width=width,
                tree_nodes=nodes,
                reference="always",
                verify_peaks=False,
            )
            for d in self.drafts
            for w in self.windows
            for k in self.ks
            for width, nodes in self.trees
            for t in self.thresholds
        ]


@dataclass(frozen=True)
class GridTraces:
    """An experiment's decodes, run by run: what its tables are computed from."""

    baseline: list[Trace]
    peaks: list[Trace]
    cells: dict[Settings, list[Trace]]  # by the settings each cell was asked with
    second_baseline: list[Trace]  # empty for a batch stored before the A/A check


@dataclass(frozen=True)
class GridRuns:
    """An experiment's runs by their ids in the store: None for a run `run_grid` decoded but could not store
    (`not_stored` says why) and for the second baseline of a batch stored before the A/A check. Where run_grid made
    the record, `traces` holds every run's decodes, so that the tables need not read them back."""

    baseline: str | None
    peaks: str | None
    cells: dict[Settings, str | None]  # by the settings each cell was asked with
    second_baseline: str | None = None
    traces: GridTraces | None = field(default=None, compare=False)
    not_stored: list[str] = field(default_factory=list)  # one line per write the store refused


def run_grid(
    pipeline: Pipeline,
    store: Store | None,
    grid: Grid,
    clips: list[Clip],
    repeats: int = REPEATS,
    progress: type[tqdm] = tqdm,
    ranks: Ranks = ALONE,
) -> GridRuns | None:
    """Decode every clip under the baseline, every cell and the baseline's second copy (`repeats` times each) and the
    peaks pass (once), unless the store holds them: the timed runs all from one batch, the untimed peaks pass from
    any. What it decodes it stores as one batch, clip by clip, completing the batch an interrupted run left; where the
    store refuses it (StoreError), the decodes are kept all the same, their runs without ids and the reason in
    `not_stored`; without a store (None: it did not open) it decodes everything and stores nothing. Ctrl-C is a
    GridInterrupted. progress: the bar class that reports the decodes (tqdm's interface).

    Under torchrun (`ranks`), every rank decodes a share of the clips the store lacks, each clip's decodes on one
    rank; the first rank alone reads and writes the store (the others pass None) and returns the runs, the others
    None."""
    ranks.check_timed_alike(grid.base.device)
    cells = {settings: pipeline.resolved(settings) for settings in grid.cells()}
    baseline, peaks = pipeline.resolved(grid.baseline()), pipeline.resolved(grid.peaks())
    timed = [baseline, *dict.fromkeys(cells.values()), baseline]  # the copy last, away from the baseline
    held = store.decoded(COMMAND) if store is not None else []
    timed_ids = _held_batch(held, timed, _decodes(clips, repeats)) or [None] * len(timed)
    ids = [*timed_ids, _latest(held, peaks, _decodes(clips, 1))]
    decodes = {i: store.traces(run_id) for i, run_id in enumerate(ids) if run_id is not None}  # the reused runs'
    slots = [(settings, 1 if i == len(timed) else repeats) for i, settings in enumerate([*timed, peaks])]
    fresh = [i for i in range(len(slots)) if i not in decodes]
    batch = _resumable(held, [slots[i] for i in fresh], clips) if fresh else None
    fresh, stored = ranks.broadcast((fresh, sorted(batch.stored) if batch else []))  # the first rank's store says
    decoded = _decoded(pipeline, [slots[i] for i in fresh], clips, frozenset(stored), progress, ranks)
    if not ranks.first:
        deque(decoded, maxlen=0)  # its share, sent to the first rank
        return None
    not_stored = []
    if fresh:
        written, traces, not_stored = _complete(
            store, batch, [slots[i] for i in fresh], clips, decoded, _described(fresh, len(timed))
        )
        for i, run_id, found in zip(fresh, written, traces, strict=True):
            ids[i], decodes[i] = run_id, found
    by_settings = dict(zip(timed[1:-1], range(1, len(timed) - 1), strict=True))
    by_cell = {asked: by_settings[settings] for asked, settings in cells.items()}
    copy, peaks_pass = len(timed) - 1, len(timed)
    return GridRuns(
        baseline=ids[0],
        peaks=ids[peaks_pass],
        cells={asked: ids[i] for asked, i in by_cell.items()},
        second_baseline=ids[copy],
        traces=GridTraces(
            decodes[0], decodes[peaks_pass], {asked: decodes[i] for asked, i in by_cell.items()}, decodes[copy]
        ),
        not_stored=not_stored,
    )


@dataclass(frozen=True)
class Resumed:
    """The batch a grid's fresh runs go to, one id per run, and the clips it holds of every one (none where new)."""

    into: ClipBatch
    stored: frozenset[str]  # clip hashes


def _complete(
    store: Store | None,
    batch: Resumed,
    slots: list[tuple[Settings, int]],
    clips: list[Clip],
    decoded: Iterator[tuple[Clip, list[list[Trace]]]],
    what: str,
) -> tuple[list[str | None], list[list[Trace]], list[str]]:
    """Store the decodes of the clips the batch lacks, each clip's decodes of every slot as they come. Returns each
    slot's run id (None unless the batch holds every clip), its traces over all clips in their order (the stored
    ones read back), and why the store refused them where it did; without a store, no ids and no reasons."""
    by_clip = {clip.hash: [[] for _ in slots] for clip in clips}
    for slot, run_id in enumerate(batch.into.run_ids if batch.stored else ()):
        for trace in store.traces(run_id):
            by_clip[trace.clip_hash][slot].append(trace)
    stored, refused = set(batch.stored), None
    try:
        for clip, traces in decoded:
            by_clip[clip.hash] = traces
            if store is not None and refused is None:
                try:
                    store.write_runs([(t, list(range(len(t)))) for t in traces], COMMAND, into=batch.into)
                    stored.add(clip.hash)
                except StoreError as error:
                    refused = " ".join(str(error).split())
    except KeyboardInterrupt:
        if store is None:
            raise GridInterrupted("nothing stored: the store did not open") from None
        kept = f"{len(stored)} of {len(by_clip)} clips stored in batch {batch.into.batch}"
        raise GridInterrupted(f"{kept}; run the same command again to decode the rest") from None
    traces = [[t for clip in by_clip.values() for t in clip[slot]] for slot in range(len(slots))]
    if store is None:
        return [None] * len(slots), traces, []
    if refused is None:
        return list(batch.into.run_ids), traces, []
    held = f"stored for {len(stored)} of {len(by_clip)} clips" if stored else "not stored"
    return [None] * len(slots), traces, [f"{len(slots)} runs of the grid ({what}) {held}: {refused}"]


def _described(fresh: list[int], timed: int) -> str:
    """Which of a grid's runs these are: indices into its `timed` runs (decoded all or none), then its peaks pass."""
    parts = [f"the baseline, its copy and {timed - 2} cells"] if 0 in fresh else []
    return " and ".join(parts + (["the peaks pass"] if timed in fresh else []))


def grid_traces(store: Store | None, runs: GridRuns) -> GridTraces:
    """The runs' decodes: those `runs` holds (always, where no store opened), else read from the store."""
    if runs.traces is not None:
        return runs.traces
    second = store.traces(runs.second_baseline) if runs.second_baseline else []
    cells = {settings: store.traces(run_id) for settings, run_id in runs.cells.items()}
    return GridTraces(store.traces(runs.baseline), store.traces(runs.peaks), cells, second)


def _decodes(clips: list[Clip], repeats: int) -> frozenset[tuple[str, int]]:
    return _repeated(frozenset(clip.hash for clip in clips), repeats)


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
            return [run.run_id for run in found]
    return None


def _resumable(held: list[DecodedRun], slots: list[tuple[Settings, int]], clips: list[Clip]) -> Resumed:
    """The latest batch stored clip by clip for these clips that holds a run of each slot (of settings listed twice,
    two), every one over the same clips with all their repetitions: the batch an interrupted grid left, to complete;
    else a new one."""
    wanted = {clip.hash for clip in clips}
    batches: dict[str, list[DecodedRun]] = {}
    for run in held:
        if run.batch_clips == len(wanted) and _clips(run) <= wanted:
            batches.setdefault(run.batch, []).append(run)
    for batch, runs in reversed(batches.items()):
        found = _take(runs, [settings for settings, _ in slots])
        stored = frozenset(_clips(found[0])) if found else frozenset()
        if found and all(run.decoded == _repeated(stored, n) for run, (_, n) in zip(found, slots, strict=True)):
            return Resumed(ClipBatch(batch, tuple(run.run_id for run in found), len(wanted)), stored)
    return Resumed(ClipBatch.new(len(slots), len(wanted)), frozenset())


def _repeated(clip_hashes: frozenset[str], repeats: int) -> frozenset[tuple[str, int]]:
    return frozenset((clip_hash, repeat) for clip_hash in clip_hashes for repeat in range(repeats))


def _take(runs: list[DecodedRun], wanted: list[Settings]) -> list[DecodedRun] | None:
    """A distinct run of `runs` for each of `wanted`, the earliest first; None where one is missing."""
    left, found = list(runs), []
    for settings in wanted:
        run = next((run for run in left if run.settings == settings), None)
        if run is None:
            return None
        left.remove(run)
        found.append(run)
    return found


def stored_grid(store: Store, target: str) -> GridRuns | None:
    """The latest whole experiment on `target` found in the store (not a batch an interrupted grid left): its greedy
    baseline and the baseline's second copy (the first and second baseline run of its batch), the cells decoded
    beside it (the latest run of each settings) and the latest peaks pass over the same clips; None where there is
    none."""
    runs = [run for run in store.decoded(COMMAND) if run.settings.target == target and _whole(run)]
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


def _whole(run: DecodedRun) -> bool:
    """Whether the run holds every clip of its batch: not one an interrupted grid left part way."""
    return run.batch_clips is None or len(_clips(run)) == run.batch_clips


def _clips(run: DecodedRun) -> set[str]:
    return {clip for clip, _ in run.decoded}


def _decoded(
    pipeline: Pipeline,
    slots: list[tuple[Settings, int]],
    clips: list[Clip],
    stored: frozenset[str],
    progress: Callable[..., tqdm],
    ranks: Ranks,
) -> Iterator[tuple[Clip, list[list[Trace]]]]:
    """Every slot's decodes of the clips not `stored`, clip by clip as they are done: each rank decodes its share of
    the clips (`Ranks.shares`, by length), and the first rank yields them all, with each slot's decodes of the clip in
    repetition order; the other ranks yield nothing."""
    left = [i for i, clip in enumerate(clips) if clip.hash not in stored]
    if not slots or not left:
        return
    shares = ranks.shares([len(clips[i].audio) for i in left])
    mine = [left[j] for j in shares[ranks.rank]]
    progress = progress if ranks.first else partial(tqdm, disable=True)
    if mine:
        for settings in progress(dict.fromkeys(settings for settings, _ in slots), desc="warm-up", unit="cells"):
            pipeline.decode(clips[mine[0]], settings)  # not kept: the first decode of a cell loads and allocates
    per_clip = sum(repeats for _, repeats in slots)
    with progress(total=per_clip * len(left), desc="timed", unit="decodes") as bar:
        own = _decode_interleaved(pipeline, slots, clips, mine, bar)
        for rank, (i, traces) in ranks.gathered(own, max(map(len, shares), default=0), _clip_json, _clip_traces):
            if rank:
                bar.update(per_clip)
            yield clips[i], traces


def _decode_interleaved(
    pipeline: Pipeline, slots: list[tuple[Settings, int]], clips: list[Clip], mine: list[int], bar: tqdm
) -> Iterator[tuple[int, list[list[Trace]]]]:
    """Every slot's decodes (its settings, so many repetitions) of the clips at the indices `mine`, clip by clip,
    repetitions interleaved: yields each clip's index with each slot's decodes of it, in repetition order."""
    order = list(range(len(slots)))
    for i in mine:  # the turn rotates with the clip's place in the grid, resumed or shared out or not
        turn = order[i % len(order) :] + order[: i % len(order)]
        traces: list[list[Trace]] = [[] for _ in slots]
        for repeat in range(max(repeats for _, repeats in slots)):
            for slot in (j for j in turn if repeat < slots[j][1]):
                settings = slots[slot][0]
                traces[slot].append(pipeline.decode(clips[i], settings))
                bar.set_postfix_str(f"{clips[i].id}, {cell_name(settings)}: {traces[slot][-1].brief}", refresh=False)
                bar.update()
        yield i, traces


def _clip_json(decoded: tuple[int, list[list[Trace]]]) -> bytes:
    i, traces = decoded
    return json.dumps({"clip": i, "traces": [[t.to_dict() for t in slot] for slot in traces]}).encode()


def _clip_traces(data: bytes) -> tuple[int, list[list[Trace]]]:
    decoded = json.loads(data)
    return decoded["clip"], [[Trace.from_dict(t) for t in slot] for slot in decoded["traces"]]


def cell_name(settings: Settings) -> str:
    if settings.draft is None:
        return "greedy with verification peaks" if settings.verify_peaks else "greedy"
    return f"{draft_label(settings.draft)} {settings.window} {shape_label(settings)} threshold={settings.threshold:g}"


def shape_label(settings: Settings) -> str:
    """K, and for a tree its width and the nodes it verifies: "K=4", "K=4 tree 3x12"."""
    tree = f" tree {settings.tree_width}x{settings.nodes}" if settings.tree_width > 1 else ""
    return f"K={settings.k}{tree}"


def draft_label(draft: str) -> str:
    """A shipped draft's variant or a folder's name: whisper-tiny.en/control -> control."""
    return PurePath(draft).name
