"""Decoding loops over one window's encoder output, step by step from the host: autoregressive greedy (the baseline)
and speculative decoding. `specasr.graphs` runs the same loops as captured steps on a CUDA device.

The speculative loop returns exactly the greedy tokens under exact arithmetic: the target verifies each round's
draft tree (a chain of proposals at width 1; `specasr.tree`) in one pass and keeps the longest path that matches its
own greedy choices, plus its own next token. Rows are recorded in clip coordinates (`Origin`, `SegmentRows`); the
pipeline times the phases (`PhaseTimer`).
"""

import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import Tensor

from specasr import tree
from specasr.draft import Draft, DraftOutput
from specasr.targets import Target
from specasr.targets.base import TreeRows, audio_peaks
from specasr.trace import DraftStep, Round, Settings, SettingsError, Timings, VerifiedToken
from specasr.windows import NO_WINDOW, RUNTIME_WINDOWS, WindowPolicy

FREE_READ_DEVICES = ("cpu",)  # reading a proposal's confidence there costs no wait, so a round stops drafting at it


class PhaseTimer:
    """Wall-clock seconds per phase; waits for the device so GPU work is charged to its phase."""

    def __init__(self, device: torch.device):
        self.device = device
        self.timings = Timings()

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @contextmanager
    def phase(self, name: str):
        self.sync()
        start = time.perf_counter()
        yield
        self.sync()
        setattr(self.timings, name, getattr(self.timings, name) + time.perf_counter() - start)


class Stopwatch:
    """Marks on the device's own timeline (CUDA events) or the host clock, read after a sync."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, start, end) -> float:
        if not self.cuda:
            return end - start
        end.synchronize()
        return start.elapsed_time(end) / 1000


@dataclass(frozen=True)
class Origin:
    """Where a segment starts in its clip; the loops record rows in clip coordinates."""

    segment: int = 0
    frame: int = 0
    token: int = 0
    round: int = 0


@dataclass
class Decoded:
    """What a loop produced for one segment: its transcript tokens and its trace rows."""

    tokens: list[int]
    rounds: list[Round] = field(default_factory=list)
    steps: list[DraftStep] = field(default_factory=list)
    verified: list[VerifiedToken] = field(default_factory=list)
    runtime_peaks: list[int] = field(default_factory=list)  # a runtime window's readout, a frame per token


@dataclass
class Outcome:
    """A round read back on the host: the nodes it kept (parents before children; a chain's proposals in order), the
    accepted path through them and what the trace rows need."""

    new: list[int]  # the tokens the round adds: the accepted path's, then the target's own next (the correction)
    tokens: list[int]
    parents: list[int]  # each node's parent among the nodes; -1 below the root
    depths: list[int]
    probabilities: list[float]  # the draft's, of each node's token below its parent
    path: list[int]  # the accepted nodes, depth 1 first
    draft_peaks: list[int] | None  # each node's draft attention peak (segment frame); None without audio attention
    centres: list[int]  # each depth's window centre (segment frame) or NO_WINDOW
    peaks: list[int]  # verification peaks of the root and the path's nodes, row by row, a frame per attention layer
    attention: list[list[float]] | None = None  # each node's draft attention row, where the trace keeps them


@dataclass(frozen=True)
class RoundRecord:
    """The layout of what a round hands the host in one read (float64, so probabilities travel with the integers):
    `pack` on the device, `unpack` on the host. N nodes, a path of K + 1 rows, `layers` attention layers."""

    nodes: int
    depth: int
    layers: int

    def sizes(self) -> dict[str, int]:
        n, k = self.nodes, self.depth
        return {
            "limit": 1,  # the deepest a node could be kept at: the length limit, a chain's confidence stop
            "accepted": 1,
            "new": k + 1,  # the target's choices along the path
            "tokens": n,
            "parents": n + 1,  # the block's parent rows, the root's own first
            "depths": n + 1,
            "probabilities": n,
            "path": k + 1,  # block rows
            "draft_peaks": n,
            "centres": k,
            "peaks": (k + 1) * self.layers,  # of the path's rows
        }

    def pack(
        self,
        block: tree.Block,
        limit: Tensor,
        accepted: Tensor,
        path: Tensor,
        choices: Tensor,
        peaks: Tensor,
        draft_peaks: Tensor,
        centres: Tensor,
    ) -> Tensor:
        """A verified block's record: `choices` and `peaks` are the verification's, row by row; `path` its rows the
        target accepted (`tree.accept`)."""
        parts = {
            "limit": limit,
            "accepted": accepted,
            "new": choices.index_select(0, path),
            "tokens": block.tokens,
            "parents": block.parents,
            "depths": block.depths,
            "probabilities": block.probabilities,
            "path": path,
            "draft_peaks": draft_peaks,
            "centres": centres,
            "peaks": peaks.index_select(0, path),
        }
        return torch.cat([parts[name].reshape(-1).double() for name in self.sizes()])

    def unpack(self, values: list[float], audio: bool) -> Outcome:
        """The round's nodes no deeper than its limit, counted among themselves."""
        parts, at = {}, 0
        for name, size in self.sizes().items():
            parts[name], at = values[at : at + size], at + size
        probabilities = parts.pop("probabilities")
        whole = {name: [int(v) for v in found] for name, found in parts.items()}
        (limit,), (accepted,) = whole["limit"], whole["accepted"]
        kept = [i for i, depth in enumerate(whole["depths"][1:]) if depth <= limit]
        index = {node: i for i, node in enumerate(kept)}
        return Outcome(
            new=whole["new"][: accepted + 1],
            tokens=[whole["tokens"][i] for i in kept],
            parents=[index.get(whole["parents"][i + 1] - 1, -1) for i in kept],
            depths=[whole["depths"][i + 1] for i in kept],
            probabilities=[probabilities[i] for i in kept],
            path=[index[row - 1] for row in whole["path"][1 : accepted + 1]],
            draft_peaks=[whole["draft_peaks"][i] for i in kept] if audio else None,
            centres=whole["centres"],
            peaks=whole["peaks"][: (accepted + 1) * self.layers],
        )


class SegmentRows:
    """A segment's transcript and trace rows in clip coordinates, built from what a loop read back from the device."""

    def __init__(
        self,
        target: Target,
        origin: Origin,
        verify_peaks: bool,
        layers: int,
        policy: WindowPolicy | None = None,
        readout: int | None = None,
    ):
        """readout: which of the `layers` attention layers a runtime window reads (`readout_column`), or None."""
        self.eot, self.origin, self.policy = target.eot, origin, policy
        self.verify_peaks, self.layers, self.readout = verify_peaks, layers, readout
        self.result = Decoded([])
        self.tokens = self.result.tokens

    def verified(self, new: list[int], peaks: list[int]) -> bool:
        """Tokens `new` follow the transcript (the last may be end-of-text); `peaks` holds, row by row, the frame each
        attention layer peaked at while predicting them. Whether the transcript ended."""
        finished = new[-1] == self.eot
        taken = new[:-1] if finished else new
        start, n, frame = self.origin.token + len(self.tokens), self.layers, self.origin.frame
        if self.verify_peaks:
            self.result.verified += [
                VerifiedToken(start + i, token, [p + frame for p in peaks[i * n : (i + 1) * n]])
                for i, token in enumerate(taken)
            ]
        if self.readout is not None:
            self.result.runtime_peaks += [peaks[i * n + self.readout] + frame for i in range(len(taken))]
        self.tokens += taken
        return finished

    def round(self, outcome: Outcome, seconds: tuple[float, float]) -> bool:
        """One round: its nodes, the path the target accepted and its own next token, and the seconds of drafting
        and of verification. Whether the transcript ended."""
        new = outcome.new
        if self.eot in new:
            new = new[: new.index(self.eot) + 1]
        index, start, origin = self.origin.round + len(self.result.rounds), len(self.tokens), self.origin
        accepted = len(outcome.path)
        self.result.rounds.append(
            Round(index, origin.segment, origin.token + start, outcome.tokens, accepted, outcome.new[-1], *seconds)
        )
        on_path, offset = set(outcome.path), origin.frame
        for node, (token, depth) in enumerate(zip(outcome.tokens, outcome.depths, strict=True)):
            centre, reference = outcome.centres[depth - 1], self.policy.reference_frame(start + depth - 1)
            parent = outcome.parents[node]
            self.result.steps.append(
                DraftStep(
                    round=index,
                    depth=depth,
                    token=token,
                    accepted=node in on_path,
                    draft_peak=None if outcome.draft_peaks is None else outcome.draft_peaks[node] + offset,
                    window_centre=None if centre == NO_WINDOW else centre + offset,
                    reference_frame=None if reference is None else reference + offset,
                    attention=None if outcome.attention is None else outcome.attention[node],
                    node=node,
                    parent=None if parent < 0 else parent,
                    probability=outcome.probabilities[node],
                )
            )
        return self.verified(new, outcome.peaks)


@torch.inference_mode()
def greedy(
    target: Target, memory: Tensor, valid_frames: int, verify_peaks: bool = False, origin: Origin = Origin()
) -> Decoded:
    """The target's greedy transcript (prompt and end-of-text excluded), one cached step per token; with
    verify_peaks, where every decoder layer attended while predicting each token."""
    layers = tuple(range(target.n_layers)) if verify_peaks else ()
    cache = target.new_cache(memory)
    out = target.forward(torch.tensor([target.prompt], device=memory.device), cache, attention_layers=layers)
    rows = SegmentRows(target, origin, verify_peaks, len(layers))
    while len(target.prompt) + len(rows.tokens) < target.max_length:
        token = target.greedy_tokens(out.states[:, -1:], len(rows.tokens))
        peaks = audio_peaks(out.audio_attention[:, :, -1:], valid_frames) if layers else token[:0]
        (value,), peaks = read([token, peaks])
        if rows.verified([value], peaks):
            break
        out = target.forward(token, cache, attention_layers=layers)
    return rows.result


def greedy_tokens(target: Target, memory: Tensor) -> list[int]:
    return greedy(target, memory, memory.shape[1]).tokens


def runtime_layer(settings: Settings, target: Target) -> int:
    """The decoder layer the runtime windows read: the settings' where they name one, else the target's."""
    layer = settings.runtime_layer if settings.runtime_layer is not None else target.runtime_layer
    if not 0 <= layer < target.n_layers:
        raise SettingsError(f"runtime layer {layer} is not one of the target's decoder layers 0..{target.n_layers - 1}")
    return layer


@dataclass(frozen=True)
class LoopOptions:
    """What a speculative loop reads of its settings, resolved against its target once."""

    k: int  # the tree's depth: proposals per round for a chain
    threshold: float
    window: str
    half_width_ms: float
    verify_peaks: bool  # record every decoder layer's verification peak
    keep_attention: bool  # keep each draft step's attention row in the trace
    attention_layers: tuple[int, ...]  # the decoder layers whose audio attention a verification pass reads
    readout: int | None  # where the runtime layer sits among them: the runtime windows' readout; None for the others
    width: int  # draft-tree children per frontier node; 1: a chain
    nodes: int  # draft-tree nodes verified per round (a chain's: K)

    @property
    def room(self) -> int:
        """Cache slots a round may write past its last verified token: its verification block, its draft tree."""
        return max(self.k + 1, self.nodes + 1, (self.k - 1) * self.width)

    @classmethod
    def of(cls, settings: Settings, target: Target) -> "LoopOptions":
        """The runtime layer is the settings' (the target's by default); a verification pass reads every layer to
        record verification peaks, else the runtime layer for the runtime windows, else none."""
        layer = runtime_layer(settings, target)
        runtime = settings.window in RUNTIME_WINDOWS
        layers = tuple(range(target.n_layers)) if settings.verify_peaks else (layer,) if runtime else ()
        return cls(
            k=settings.k,
            threshold=settings.threshold,
            window=settings.window,
            half_width_ms=settings.half_width_ms,
            verify_peaks=settings.verify_peaks,
            keep_attention=settings.keep_attention,
            attention_layers=layers,
            readout=layers.index(layer) if runtime else None,
            width=settings.tree_width,
            nodes=settings.nodes,
        )


def read(tensors: list[Tensor]) -> list[list]:
    """Several small tensors copied to the host at once: a round's one wait for the device."""
    flat = torch.cat([t.reshape(-1).double() for t in tensors]).tolist()
    found, at = [], 0
    for tensor in tensors:
        values = flat[at : at + tensor.numel()]
        found.append(values if tensor.is_floating_point() else [int(v) for v in values])
        at += tensor.numel()
    return found


def node_limit(block: tree.Block, threshold: float, budget: int | Tensor, k: int) -> Tensor:
    """The deepest a node of the round may be kept at: K, the length limit (`budget` more tokens before the window
    is full) and, in a chain, the depth of its first proposal below the confidence threshold."""
    unsure = torch.where(block.probabilities < threshold, block.depths[1:], k)
    return torch.minimum(unsure.min(), torch.as_tensor(budget, device=unsure.device))


def verification_peaks(audio_attention: Tensor | None, valid_frames: int | Tensor, choices: Tensor) -> Tensor:
    """(rows, attention layers) peak frame of each row of a pass that chose `choices`; the runtime windows pay for
    this readout every round."""
    if audio_attention is None:
        return choices.new_zeros(len(choices), 0)
    return audio_peaks(audio_attention, valid_frames)


class HostGreedy:
    """`greedy` as a `specasr.loops.Loop`."""

    def __init__(self, target: Target, verify_peaks: bool):
        self.target, self.verify_peaks = target, verify_peaks

    def __call__(self, memory, valid_frames, origin=Origin(), reference=None, on_round=None) -> Decoded:
        return greedy(self.target, memory, valid_frames, self.verify_peaks, origin)


class HostSpeculative:
    """The speculative loop stepped from the host (batch 1), over caches that grow with the transcript."""

    def __init__(self, target: Target, draft: Draft, options: LoopOptions):
        self.target, self.draft, self.options = target, draft, options

    @torch.inference_mode()
    def __call__(self, memory, valid_frames, origin=Origin(), reference=None, on_round=None) -> Decoded:
        return _SpeculativeLoop(self.target, self.draft, memory, valid_frames, self.options, reference, origin).run(
            on_round
        )


class _SpeculativeLoop:
    """One segment's rounds, step by step from the host, each in four phases: propose (the draft catches up on the
    tokens the last verification accepted and grows its tree, no deeper than the length limit and, for a chain where
    reading the device is free, than its first proposal below the confidence threshold; elsewhere the round drops
    such proposals), verify (the target's pass over the tree), accept (the longest agreeing path and the target's next
    token) and record (the trace rows). Window centres and masks are computed on the device; but for those
    confidences on a CPU, the host reads the device once per round."""

    def __init__(self, target, draft, memory, valid_frames, options: LoopOptions, reference, origin):
        self.target, self.draft, self.options = target, draft, options
        self.device = memory.device
        capacity = target.max_length + options.room  # the last round may run past the length limit
        self.policy = WindowPolicy(
            options.window,
            options.half_width_ms,
            valid_frames,
            reference,
            target.frame_seconds,
            self.device,
            capacity + options.k,
        )
        layers = len(options.attention_layers)
        self.rows = SegmentRows(target, origin, options.verify_peaks, layers, self.policy, options.readout)
        self.stopwatch = Stopwatch(self.device)
        self.stops_early = options.threshold > 0 and self.device.type in FREE_READ_DEVICES
        self.target_cache = target.new_cache(memory, capacity)
        self.draft_cache = draft.new_cache(memory, valid_frames, capacity)

    def _pass(self, block: Tensor, tree_rows: TreeRows | None = None):
        return self.target.forward(
            block,
            self.target_cache,
            taps=self.draft.config.taps,
            attention_layers=self.options.attention_layers,
            tree=tree_rows,
        )

    def _observe(self, peaks: Tensor, verified: int, new: int) -> None:
        """The runtime windows' centres follow the verification peaks of the `new` tokens after `verified`."""
        if self.options.readout is not None:
            self.policy.observe_verified(verified, peaks[:new, self.options.readout])

    def run(self, on_round: Callable[[Round], None] | None = None) -> Decoded:
        target, tokens = self.target, self.rows.tokens
        prompt = torch.tensor([target.prompt], device=self.device)
        out = self._pass(prompt)
        first = target.greedy_tokens(out.states[:, -1:], 0)[0]
        peaks = verification_peaks(out.audio_attention, self.policy.valid_frames, first)[-1:]
        (value,), rows = read([first, peaks])
        self._observe(peaks, 0, 1)
        if self.rows.verified([value], rows):
            return self.rows.result
        # The draft at position t reads (f_t, x_{t+1}); these are the positions it has yet to read, the last one
        # real at row `last`.
        features, inputs, last = out.hidden, torch.cat([prompt[:, 1:], first[None]], dim=1), prompt.shape[1] - 1
        while len(target.prompt) + len(tokens) < target.max_length:
            done, features, inputs, last = self._round(features, inputs, last)
            if on_round is not None:
                on_round(self.rows.result.rounds[-1])
            if done:
                break
        return self.rows.result

    def _round(self, features: Tensor, inputs: Tensor, last: int) -> tuple[bool, Tensor, Tensor, int]:
        """Propose, verify, accept, record; then the caches keep the accepted path. Returns whether the transcript
        ended and what the next catch-up reads: the verified features and the target's choices along the path, real
        up to row `accepted`."""
        options, k = self.options, self.options.k
        verified = len(self.rows.tokens)
        position = len(self.target.prompt) + verified - 1  # of the last token, which the target has not read yet
        budget = self.target.max_length - len(self.target.prompt) - verified - 1
        start = self.stopwatch.mark()
        candidates, centres = self._propose(features, inputs, last, verified, budget)
        chosen = tree.choose(candidates, options.nodes)
        block = tree.block(candidates, chosen, k)
        drafted = self.stopwatch.mark()
        out = self._pass(torch.cat([inputs[0, last : last + 1], block.tokens])[None], block.rows(position))
        choices = self.target.greedy_tokens(out.states, verified)[0]
        peaks = verification_peaks(out.audio_attention, self.policy.valid_frames, choices)
        verified_at = self.stopwatch.mark()
        limit = node_limit(block, options.threshold, budget, k)
        accepted, path = tree.accept(block, choices, self.target.eot, limit, k)
        attention, rows = candidates.attention, candidates.sources.index_select(0, chosen)  # each node's draft row
        draft_peaks = attention.index_select(0, rows).argmax(dim=-1) if attention is not None else rows * 0
        layout = RoundRecord(len(block.tokens), k, len(options.attention_layers))
        (values,) = read([layout.pack(block, limit, accepted, path, choices, peaks, draft_peaks, centres)])
        outcome = layout.unpack(values, attention is not None)
        if attention is not None and options.keep_attention:  # a second read; the nodes a round keeps come first
            outcome.attention = attention.index_select(0, rows[: len(outcome.tokens)]).float().cpu().tolist()
        self._observe(peaks.index_select(0, path), verified, len(outcome.path) + 1)
        seconds = self.stopwatch.seconds(start, drafted), self.stopwatch.seconds(drafted, verified_at)
        finished = self.rows.round(outcome, seconds)
        if options.width > 1:  # a chain's path is in place already
            self.target_cache.move(position + path, position + torch.arange(k + 1, device=self.device))
        self.target_cache.length = position + 1 + len(outcome.path)
        self.draft_cache.length = position
        return finished, out.hidden.index_select(1, path), choices.index_select(0, path)[None], len(outcome.path)

    def _propose(self, features: Tensor, inputs: Tensor, last: int, verified: int, budget: int):
        """The draft catches up on rows up to `last` and grows its tree; returns it and each depth's window centre."""
        draft, n_prompt, k = self.draft, len(self.target.prompt), self.options.k
        # The step at draft position t predicts transcript token t + 2 - n_prompt.
        first = self.draft_cache.length
        caught_up = self.policy.centres(first + 2 - n_prompt, last + 1, verified)
        out = draft(features[:, : last + 1], inputs[:, : last + 1], self.draft_cache, self._mask(caught_up))
        centres = torch.cat([caught_up[last : last + 1], self.policy.centres(verified + 1, k - 1, verified)])
        rows = slice(last, last + 1)
        root = DraftOutput(
            out.hidden[:, rows], out.features[:, rows], None if out.attention is None else out.attention[:, rows]
        )
        stop_below = self.options.threshold if self.stops_early else None
        depths = max(1, min(k, budget))
        base = self.draft_cache.length
        candidates = tree.grow(
            draft, root, self.draft_cache, base, centres, self._mask, self.options.width, depths, stop_below
        )
        return candidates, centres

    def _mask(self, centres: Tensor) -> Tensor | None:
        """Which of the valid audio frames the draft may attend."""
        return self.policy.mask(centres) if self.draft.config.audio else None
