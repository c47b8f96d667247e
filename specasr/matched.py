"""Matched rounds (paper C.1): every window condition drafts from the same round starts and is followed through K
depths, so that each depth's acceptance is compared on the same rounds and not on each loop's own survivors.

A clip is read once per target: its greedy transcript and reference frames, and one teacher-forced pass that gives
the draft's input features and the target's verification peaks at every position. Each condition runs the draft once
over the whole transcript, as the loop's catch-up reads it, then drafts every round as the loop drafts it
(`specasr.tree`: a chain of K proposals at tree width 1) from the start's last catch-up row, its window centred as the
loop centres it after that many verified tokens. A node is accepted when its token is the transcript's at its depth
and its parent is accepted: after a correct prefix the target's choice is the transcript token. So on the rounds the
loop ran, a rollout drafts, accepts and attends as the loop did.
"""

from dataclasses import asdict, dataclass, replace
from functools import partial

import numpy as np
import torch
from tqdm import tqdm

from specasr import tree
from specasr.audio import Clip
from specasr.decode import LoopOptions, read
from specasr.draft import Draft, DraftCache, DraftOutput
from specasr.experiments import draft_label
from specasr.kept_rollouts import KeptRollouts, pack_clip, unpack_clip
from specasr.matched_tables import Condition, Rollouts
from specasr.pipeline import Pipeline
from specasr.pooled import Weighting
from specasr.ranks import ALONE, Ranks
from specasr.targets import Target
from specasr.targets.base import audio_peaks
from specasr.trace import DraftStep, Settings, spine
from specasr.windows import NO_WINDOW, WindowPolicy

PROTOCOL = (
    "matched rounds: every window starts from the same rounds ({starts}) and is followed through K depths; draft "
    "inputs from one teacher-forced target pass per clip; s_k and a_k^c pooled over rounds along each round's spine "
    "(its accepted path, then the draft's most probable node), anchor errors over the proposals each depth reaches"
)
AGGREGATION = (
    "within a set, s_k and a_k^c pooled over rounds; 95% paired bootstrap intervals (10,000 draws, seed 0) resampling "
    "clips within their set, the same clips in every condition; anchor errors and outcome medians pooled over clips"
)
STARTS = {
    "loop": "the round starts of the unrestricted real loop of the same draft, K and tree",
    "all": "every transcript position",
}


@dataclass
class ClipView:
    """What every condition reads of one clip: the target's greedy transcript, each token's reference frame (-1:
    none), the encoder output, every layer's states at every input position (prompt + transcript), and each
    layer's verification peak while predicting each transcript token."""

    clip: Clip
    subset: str
    tokens: list[int]  # prompt + transcript + end-of-text
    reference: np.ndarray  # (transcript,) frame or -1
    memory: torch.Tensor  # (1, frames, d_model)
    valid_frames: int
    hidden: torch.Tensor  # (inputs, n_layers + 1, d_model)
    peaks: torch.Tensor  # (transcript + 1, n_layers): the last row predicts end-of-text
    frame_ms: float


def read_clip(pipeline: Pipeline, settings: Settings, clip: Clip, subset: str, reference: bool = True) -> ClipView:
    """The clip's greedy transcript and, with `reference`, its reference frames (as the pipeline makes them); then
    one teacher-forced pass."""
    aligned = "always" if reference else "never"
    trace = pipeline.decode(clip, replace(settings, draft=None, reference=aligned, verify_peaks=False))
    if len(trace.segments) != 1:
        raise ValueError(f"{clip.id}: matched rounds read one window of audio; this clip has {len(trace.segments)}")
    target = pipeline.target(settings)
    with torch.inference_mode():
        memory = target.encode(target.features(target.samples(clip.audio)))
    frames = trace.reference_frames or [None] * len(trace.tokens)
    return teacher_forced(target, clip, subset, trace.tokens, frames, memory, target.valid_frames(len(clip.audio)))


def teacher_forced(
    target: Target,
    clip: Clip,
    subset: str,
    transcript: list[int],
    reference: list[int | None],
    memory: torch.Tensor,
    valid_frames: int,
) -> ClipView:
    """One target pass over the prompt and the transcript: every layer's states and verification peaks."""
    tokens = [*target.prompt, *transcript, target.eot]
    with torch.inference_mode():
        cache = target.new_cache(memory, capacity=len(tokens) - 1)
        out = target.forward(
            torch.tensor([tokens[:-1]], device=memory.device),
            cache,
            taps=tuple(range(target.n_layers + 1)),
            attention_layers=tuple(range(target.n_layers)),
        )
    return ClipView(
        clip=clip,
        subset=subset,
        tokens=tokens,
        reference=np.array([NO_WINDOW if f is None else f for f in reference]),
        memory=memory,
        valid_frames=valid_frames,
        hidden=out.hidden[0].view(len(tokens) - 1, target.n_layers + 1, target.d_model),
        peaks=audio_peaks(out.audio_attention[:, :, len(target.prompt) - 1 :], valid_frames),
        frame_ms=target.frame_seconds * 1000,
    )


def roll_out(
    target: Target, draft: Draft, view: ClipView, settings: Settings, starts: list[int], group: str = "all"
) -> Rollouts:
    """The draft's tree (its width and nodes) from each round start (verified transcript tokens) under the settings'
    window, every option as the loop reads it (`LoopOptions.of`).

    A round after v verified tokens restarts at draft position P + v - 2 (P prompt tokens), which reads the target's
    state there and the last verified token, and its nodes at depth d predict transcript token v + d - 1.
    """
    options = LoopOptions.of(settings, target)
    k, width, prompt = options.k, options.width, len(target.prompt)
    policy = _policy(target, view, options)
    window = policy.mask if draft.config.audio else lambda centres: None
    centres = torch.full((len(starts), k), NO_WINDOW, device=view.memory.device)
    if starts:
        centres = torch.stack([policy.centres(v, k, v) for v in starts])
    roots = [prompt + v - 2 for v in starts]
    root_centres = torch.full((len(view.tokens) - 1,), NO_WINDOW, device=view.memory.device)
    root_centres[roots] = centres[:, 0]  # elsewhere none: no other row's output is read, and keys come before audio
    truth = torch.tensor(view.tokens[prompt:] + [-1] * (k + 1), device=view.memory.device)  # nothing past the end
    rounds = len(starts)
    tokens, accepted, peaks = np.full((rounds, k), -1), np.zeros((rounds, k), dtype=bool), np.full((rounds, k), -1)
    restarts = np.zeros((rounds, width), dtype=bool)
    with torch.inference_mode():
        cache = draft.new_cache(view.memory, view.valid_frames, len(view.tokens) - 1 + (k - 1) * width)
        forced = _catch_up(draft, view, cache, window(root_centres))
        for i in sorted(range(rounds), key=lambda i: -starts[i]):  # a tree overwrites later starts' rows only
            cache.length = roots[i] + 1
            candidates = tree.grow(draft, _row(forced, roots[i]), cache, cache.length, centres[i], window, width, k)
            found = _round(candidates, options.nodes, truth[starts[i] : starts[i] + k + 1], target.eot, k)
            tokens[i], accepted[i], peaks[i], restarts[i] = found
    index = np.asarray(starts, dtype=int)[:, None] + np.arange(k)[None, :]  # transcript index of each depth
    return Rollouts(
        clip_hash=view.clip.hash,
        group=group,
        starts=np.asarray(starts, dtype=int),
        tokens=tokens,
        accepted=accepted,
        draft_peaks=peaks,
        centres=centres.cpu().numpy(),
        reference=np.concatenate([view.reference, np.full(k + 1, NO_WINDOW)])[index],
        restarts=restarts,
        frame_ms=view.frame_ms,
    )


def _policy(target: Target, view: ClipView, options: LoopOptions) -> WindowPolicy:
    """The window as the loop centres it on this clip, the runtime windows reading the teacher-forced peaks."""
    transcript = len(view.tokens) - len(target.prompt) - 1
    policy = WindowPolicy(
        options.window,
        options.half_width_ms,
        view.valid_frames,
        [None if f < 0 else int(f) for f in view.reference],
        target.frame_seconds,
        view.memory.device,
        transcript + options.k + 1,
    )
    if options.runtime_layer is not None:
        policy.observe_verified(0, view.peaks[:, options.runtime_layer])
    return policy


def _catch_up(draft: Draft, view: ClipView, cache: DraftCache, mask: torch.Tensor | None) -> DraftOutput:
    """The draft over every position at once, as the loop's catch-ups read them: position t reads the target's
    features f_t and the token x_{t+1}."""
    features = view.hidden[:, list(draft.config.taps)].flatten(1)
    inputs = torch.tensor([view.tokens[1:]], device=features.device)
    return draft(features[None], inputs, cache, mask)


def _row(out: DraftOutput, row: int) -> DraftOutput:
    """One row of the draft's output, a round's root."""
    return DraftOutput(*(None if x is None else x[:, row : row + 1] for x in (out.hidden, out.state, out.attention)))


def _round(candidates: tree.Candidates, nodes: int, truth: torch.Tensor, eot: int, k: int) -> tuple[list, ...]:
    """One round's spine (tokens, accepted, draft peaks; K each, -1 past its end) and its restart hits (W): the
    `nodes` most probable candidates verified against the transcript. truth: the transcript from the round's first
    token on, the target's choice after each depth of an accepted path."""
    chosen = tree.choose(candidates, nodes)
    block = tree.block(candidates, chosen, k)
    count, path = tree.accept(block, truth[block.depths], eot, k, k)
    sources = candidates.sources.index_select(0, chosen)  # the draft row that predicted each node
    attention = candidates.attention
    peaks = attention.index_select(0, sources).argmax(dim=-1) if attention is not None else torch.full_like(sources, -1)
    restarts = (candidates.tokens[candidates.depths == 1] == truth[0]).cumsum(0) > 0  # tree.top at the root: top m
    values = [block.tokens, block.parents, block.depths, block.probabilities, count, path, peaks, restarts]
    tokens, parents, depths, probabilities, (count,), path, peaks, restarts = read(values)
    on_path = set(path[1 : count + 1])  # block rows, which name the nodes here: the root is row 0
    drafted = zip(range(1, len(tokens) + 1), tokens, depths[1:], parents[1:], probabilities, peaks, strict=True)
    steps = [
        DraftStep(0, depth, token, row in on_path, peak, None, None, node=row, parent=parent or None, probability=p)
        for row, token, depth, parent, p, peak in drafted
    ]
    found = spine(steps)
    missing = [-1] * (k - len(found))
    return (
        [s.token for s in found] + missing,
        [s.accepted for s in found] + [False] * len(missing),
        [s.draft_peak for s in found] + missing,
        restarts,
    )


def round_starts(pipeline: Pipeline, settings: Settings, clip: Clip, view: ClipView, starts: str) -> list[int]:
    """`loop`: where the unrestricted real loop of these settings started its rounds; `all`: every position."""
    if starts == "all":
        return list(range(1, len(view.tokens) - len(pipeline.target(settings).prompt)))
    if starts != "loop":
        raise ValueError(f"unknown round starts {starts!r}; choose one of {', '.join(STARTS)}")
    trace = pipeline.decode(clip, replace(settings, window="unrestricted", threshold=0.0, reference="never"))
    return [r.start for r in trace.rounds]


def run_matched(
    pipeline: Pipeline,
    settings: Settings,
    drafts: list[str],
    windows: list[str],
    clips: list[Clip],
    weights: Weighting,
    starts: str = "loop",
    ranks: Ranks = ALONE,
) -> list[Condition] | None:
    """Every draft under every window from the same round starts, clip by clip, but for the clips the weighting
    leaves out. Each clip's rollouts are kept in the pipeline's store as it is done, and read from there where the
    store holds them (`kept_rollouts`); Ctrl-C is a MatchedInterrupted. Under torchrun (`ranks`), every rank rolls
    out a share of the clips the store lacks; the first rank alone keeps the store and returns the conditions, the
    others None."""
    cells = {(d, w): replace(settings, draft=d, window=w) for d in drafts for w in windows}
    kept = KeptRollouts(pipeline.store, {cell: pipeline.resolved(s) for cell, s in cells.items()}, starts)
    chosen = [c for c in clips if weights.groups[c.hash] is not None]
    missing = set(ranks.broadcast([c.hash for c in chosen if c.hash not in kept.stored]))  # the first rank's store
    todo = [c for c in chosen if c.hash in missing]
    shares = ranks.shares([len(c.audio) for c in todo])
    own = (
        (todo[i].hash, _roll_out_clip(pipeline, settings, cells, todo[i], weights.sets[todo[i].hash], starts))
        for i in shares[ranks.rank]
    )
    rounds = max(map(len, shares), default=0)
    encode, decode = partial(pack_clip, cells=list(cells)), partial(unpack_clip, cells=list(cells))
    rolled = {}
    done = len(chosen) - len(todo)
    with tqdm(total=len(chosen), initial=done, desc="matched rounds", unit="clip", disable=not ranks.first) as bar:
        try:
            for _, (clip_hash, arrays) in ranks.gathered(own, rounds, encode, decode):
                kept.put(clip_hash, arrays)
                rolled[clip_hash] = arrays
                bar.update()
        except KeyboardInterrupt:
            raise kept.interrupted([c.hash for c in chosen]) from None
    if not ranks.first:
        return None
    found = {cell: [] for cell in cells}
    for clip in chosen:
        for cell, columns in (rolled.get(clip.hash) or kept.get(clip.hash)).items():
            found[cell].append(Rollouts(clip.hash, weights.groups[clip.hash], **columns))
    tree_shape = settings.tree_width, settings.nodes
    return [Condition(draft_label(d), w, *tree_shape, r, weights.resample_sets) for (d, w), r in found.items()]


def _roll_out_clip(
    pipeline: Pipeline, settings: Settings, cells: dict, clip: Clip, subset: str, starts: str
) -> dict[tuple[str, str], dict]:
    """Every cell's rollouts of one clip from the round starts of its draft, as the store keeps them: all but the
    clip and its set."""
    target, view = pipeline.target(settings), read_clip(pipeline, settings, clip, subset)
    drafts = dict.fromkeys(d for d, _ in cells)
    rounds = {d: round_starts(pipeline, replace(settings, draft=d), clip, view, starts) for d in drafts}
    found = {(d, w): roll_out(target, pipeline.draft(cell), view, cell, rounds[d]) for (d, w), cell in cells.items()}
    return {cell: {n: v for n, v in asdict(r).items() if n not in ("clip_hash", "group")} for cell, r in found.items()}
