"""Decoding loops over one window's encoder output, step by step from the host: autoregressive greedy (the baseline)
and speculative decoding. `specasr.graphs` runs the same loops as captured steps on a CUDA device.

The speculative loop returns exactly the greedy tokens under exact arithmetic: the target verifies each round's
draft tree (a chain of proposals at width 1; `specasr.tree`) in one pass and keeps the longest path that matches its
own greedy choices, plus its own next token. Rows are recorded in clip coordinates (`specasr.records`); the
pipeline times the phases (`PhaseTimer`).
"""

import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor

from specasr import tree
from specasr.draft import Draft, DraftOutput
from specasr.records import Decoded, Origin, RoundRecord, SegmentRows
from specasr.targets import Target
from specasr.targets.base import TreeRows, audio_peaks
from specasr.trace import RUNTIME_WINDOWS, Round, Settings, SettingsError, Timings
from specasr.windows import WindowPolicy

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


def checked_layer(layer: int, layers: int) -> int:
    """`layer`, refused where it is not one of a target's `layers` decoder layers."""
    if not 0 <= layer < layers:
        raise SettingsError(f"runtime layer {layer} is not one of the target's decoder layers 0..{layers - 1}")
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
    runtime_layer: int | None = None  # the decoder layer the runtime windows read; None under the others

    @property
    def room(self) -> int:
        """Cache slots a round may write past its last verified token: its verification block, its draft tree."""
        return max(self.k + 1, self.nodes + 1, (self.k - 1) * self.width)

    @classmethod
    def of(cls, settings: Settings, target: Target) -> "LoopOptions":
        """The one place a loop's options are resolved. The runtime layer is the settings' (the target's by
        default), read and checked under the runtime windows only: the others ignore it. A verification pass reads
        every layer to record verification peaks, else the runtime layer for the runtime windows, else none."""
        runtime = settings.window in RUNTIME_WINDOWS
        layer = checked_layer(settings.readout_layer(target.runtime_layer), target.n_layers) if runtime else None
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
            runtime_layer=layer,
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
        outcome.drafted = candidates.drafted
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
            out.hidden[:, rows], out.state[:, rows], None if out.attention is None else out.attention[:, rows]
        )
        stop_below = self.options.threshold if self.stops_early else None
        depths = max(1, min(k, budget))
        base = self.draft_cache.length
        candidates = tree.grow(
            draft, root, self.draft_cache, base, centres, self._mask, self.options.width, depths, stop_below
        )
        return candidates, centres

    def _mask(self, centres: Tensor) -> Tensor | None:
        """Which of the valid audio frames the draft may attend; None for all of them, which its cache holds."""
        restricted = self.draft.config.audio and self.options.window != "unrestricted"
        return self.policy.mask(centres) if restricted else None
