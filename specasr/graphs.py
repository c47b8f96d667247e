"""The decoding loops as captured steps over static tensors: CUDA graphs, replayed with no host work between them.

Every step reads and writes tensors that stay put: caches attended whole under masks, positions and counts kept on
the device, the window policy's tables. A greedy step reads the token the last one chose and chooses the next; a
round drafts from what the last verification left, then verifies, accepts and updates it, all on the device. The
host only launches replays and reads back: one small copy per token (greedy: read while the device runs the next
step) and one per round (proposals, choices, acceptance, the end flag and the trace rows, in one transfer). Off CUDA
the same steps run eagerly over the same tensors, which is how they are tested on any machine.
"""

import statistics
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TypeVar

import torch
from torch import Tensor

from specasr.decode import Decoded, LoopOptions, Origin, SegmentRows, Stopwatch
from specasr.draft import Draft
from specasr.targets import Target
from specasr.targets.base import DecoderOutput, audio_peaks
from specasr.trace import Round, Settings
from specasr.windows import NO_WINDOW, WindowPolicy

GRAPH_DEVICES = ("cuda",)  # where steps are captured; elsewhere they run eagerly over the same tensors
Steps = TypeVar("Steps")


class CapturedStep:
    """A step over static tensors: captured once as a CUDA graph and replayed, or run eagerly off CUDA."""

    def __init__(self, step: Callable[[], None], capture: bool, warmup: int = 2):
        self.step, self.graph = step, None
        if not capture:
            return
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # kernels choose their algorithms and workspaces outside the graph
            for _ in range(warmup):
                step()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            step()

    def __call__(self) -> None:
        if self.graph is None:
            self.step()
        else:
            self.graph.replay()


class HostReads:
    """Copies of a device tensor taken in stream order and read back in that order, so that the host can read one
    while the device runs the steps queued after it."""

    def __init__(self, source: Tensor, depth: int = 2):
        cuda = source.device.type == "cuda"
        self.source = source
        self.copies = [torch.empty(source.shape, dtype=source.dtype, pin_memory=cuda) for _ in range(depth)]
        self.events = [torch.cuda.Event() if cuda else None for _ in range(depth)]
        self.taken = self.read = 0

    def take(self) -> None:
        slot = self.taken % len(self.copies)
        self.copies[slot].copy_(self.source, non_blocking=True)
        if self.events[slot] is not None:
            self.events[slot].record()
        self.taken += 1

    def next(self) -> list:
        slot = self.read % len(self.copies)
        if self.events[slot] is not None:
            self.events[slot].synchronize()
        self.read += 1
        return self.copies[slot].tolist()


def _copy_into(buffers, values) -> None:
    """Every tensor field of a dataclass copied into the same field of another; other fields assigned."""
    for field in fields(buffers):
        buffer, value = getattr(buffers, field.name), getattr(values, field.name)
        if isinstance(buffer, Tensor):
            buffer.copy_(value)
        else:
            setattr(buffers, field.name, value)


def _split(values: list, size: int) -> list[list]:
    return [values[i : i + size] for i in range(0, len(values), size)]


def _reused(captured: dict | None, key: tuple, make: Callable[[], Steps]) -> Steps:
    if captured is None:
        return make()
    if key not in captured:
        captured[key] = make()
    return captured[key]


def replay_seconds(steps: list[CapturedStep], inputs: list[Tensor], repeats: int) -> list[float]:
    """Median device seconds of each step, the steps replayed back to back `repeats` times from the same `inputs`
    (restored before each repetition, outside the timing, and at the end): the kernels' own time, without the host's
    gaps."""
    saved = [t.clone() for t in inputs]

    def restore() -> None:
        for tensor, value in zip(inputs, saved, strict=True):
            tensor.copy_(value)

    stopwatch = Stopwatch(inputs[0].device)
    marks = []
    for _ in range(repeats):
        restore()
        row = [stopwatch.mark()]
        for step in steps:
            step()
            row.append(stopwatch.mark())
        marks.append(row)
    restore()
    return [statistics.median(stopwatch.seconds(row[i], row[i + 1]) for row in marks) for i in range(len(steps))]


class GreedySteps:
    """A static cache and the greedy loop's two steps for one target and audio length: the prompt's pass and one
    token's step, each ending in the target's greedy choice, which the next step reads as its token."""

    def __init__(self, target: Target, memory: Tensor, layers: tuple[int, ...]):
        device = memory.device
        self.target, self.layers = target, layers
        self.cache = target.new_cache(memory, target.max_length, static=True)
        self.prompt = torch.tensor([target.prompt], device=device)
        self.token = torch.zeros(1, 1, dtype=torch.long, device=device)
        self.position = torch.zeros(1, dtype=torch.long, device=device)
        self.valid_frames = torch.full((), memory.shape[1], device=device)
        self.record = torch.zeros(1 + len(layers), dtype=torch.long, device=device)  # the token, its peak per layer
        capture = device.type in GRAPH_DEVICES
        self.first = CapturedStep(self._first, capture)
        self.next = CapturedStep(self._next, capture)

    def load(self, memory: Tensor, valid_frames: int) -> None:
        """A new segment, written into the same tensors."""
        _copy_into(self.cache, self.target.new_cache(memory, self.cache.capacity, static=True))
        self.valid_frames.fill_(valid_frames)

    def _first(self) -> None:
        positions = torch.arange(self.prompt.shape[1], device=self.prompt.device)
        self._choose(self.target.forward(self.prompt, self.cache, attention_layers=self.layers, positions=positions), 0)
        self.position.fill_(self.prompt.shape[1])

    def _next(self) -> None:
        out = self.target.forward(self.token, self.cache, attention_layers=self.layers, positions=self.position)
        self._choose(out, 1)
        self.position.add_(1)

    def _choose(self, out: DecoderOutput, first_index: int) -> None:
        token = self.target.greedy_tokens(out.states[:, -1:], first_index)
        self.token.copy_(token)
        peaks = audio_peaks(out.audio_attention[:, :, -1:], self.valid_frames) if self.layers else token[0, :0]
        self.record.copy_(torch.cat([token.view(1), peaks.reshape(-1)]))

    def run(self, rows: SegmentRows) -> Decoded:
        """The segment's greedy transcript; the host reads each token while the device runs the step after it."""
        most = self.target.max_length - len(self.target.prompt)  # transcript tokens a window holds
        reads = HostReads(self.record)
        self.first()
        reads.take()
        while True:
            if reads.taken < most:
                self.next()
                reads.take()
            token, *peaks = reads.next()
            if rows.verified([token], peaks) or len(rows.tokens) == most:
                return rows.result

    def device_seconds(self, repeats: int = 50) -> float:
        """Median device seconds of one token's step."""
        self.first()
        return replay_seconds([self.next], [self.token, self.position], repeats)[0]


@torch.inference_mode()
def greedy(
    target: Target,
    memory: Tensor,
    valid_frames: int,
    verify_peaks: bool = False,
    origin: Origin = Origin(),
    captured: dict | None = None,
) -> Decoded:
    """`decode.greedy` as captured steps: the same tokens and rows. captured: where the steps are kept between
    segments and clips; none: captured anew."""
    steps = greedy_steps(captured, target, memory, verify_peaks)
    steps.load(memory, valid_frames)
    return steps.run(SegmentRows(target, origin, verify_peaks, len(steps.layers)))


def greedy_steps(captured: dict | None, target: Target, memory: Tensor, verify_peaks: bool) -> GreedySteps:
    layers = tuple(range(target.n_layers)) if verify_peaks else ()
    key = ("greedy", id(target), memory.shape[1], layers)
    return _reused(captured, key, lambda: GreedySteps(target, memory, layers))


@dataclass
class RoundState:
    """What a round reads and writes on the device."""

    verified: Tensor  # (1,) transcript tokens the target has confirmed
    last: Tensor  # (1,) the row of `inputs` that holds the last of them
    features: Tensor  # (1, rows, taps x d_model) the target features the draft catches up on, real up to `last`
    inputs: Tensor  # (1, rows) the tokens x_{t+1} beside them
    proposals: Tensor  # (K,) target token ids
    confidences: Tensor  # (K,) the draft's probability of each
    centres: Tensor  # (K,) each step's window centre
    attention: Tensor  # (K, frames) each step's head-averaged audio attention (zeros without audio attention)
    record: Tensor  # what the host reads: `RoundSteps.run` unpacks it


class RoundSteps:
    """Static caches, window tables and state for one target, draft, audio length and loop options, and the three
    steps over them: the prompt's pass, a round's drafting (the catch-up on the last verified tokens and K proposals)
    and its verification (K + 1 tokens, the greedy choices, acceptance and the state for the next round). A round is
    two replays, so that the device times drafting and verification apart."""

    def __init__(self, target: Target, draft: Draft, memory: Tensor, options: LoopOptions):
        device, frames, k = memory.device, memory.shape[1], options.k
        self.target, self.draft, self.options, self.k = target, draft, options, k
        self.layers, self.readout = options.attention_layers, options.readout
        rows = max(k + 1, len(target.prompt))  # a catch-up after the prompt's pass or after a verification
        capacity = target.max_length + rows  # padding rows may run past the length limit
        self.target_cache = target.new_cache(memory, capacity, static=True)
        self.draft_cache = draft.new_cache(memory, frames, capacity, frames=frames)
        self.policy = WindowPolicy(
            options.window, options.half_width_ms, frames, [], target.frame_seconds, device, capacity + k
        )
        self.prompt = torch.tensor([target.prompt], device=device)
        on = {"dtype": torch.long, "device": device}
        width = len(draft.config.taps) * target.d_model
        self.state = RoundState(
            verified=torch.zeros(1, **on),
            last=torch.zeros(1, **on),
            features=torch.zeros(1, rows, width, dtype=target.dtype, device=device),
            inputs=torch.zeros(1, rows, **on),
            proposals=torch.zeros(k, **on),
            confidences=torch.zeros(k, device=device),
            centres=torch.full((k,), NO_WINDOW, **on),
            attention=torch.zeros(k, frames, device=device),
            record=torch.zeros(3 + 4 * k + 1 + (k + 1) * len(self.layers), **on),
        )
        capture = device.type in GRAPH_DEVICES
        self.first = CapturedStep(self._first, capture)
        self.propose = CapturedStep(self._propose, capture)
        self.verify = CapturedStep(self._verify, capture)

    def load(self, memory: Tensor, valid_frames: int, reference: list[int | None] | None) -> None:
        """A new segment, written into the same tensors."""
        capacity, frames = self.draft_cache.capacity, self.draft_cache.frames
        _copy_into(self.target_cache, self.target.new_cache(memory, capacity, static=True))
        _copy_into(self.draft_cache, self.draft.new_cache(memory, valid_frames, capacity, frames=frames))
        self.policy.reset(valid_frames, reference)

    def _peaks(self, out: DecoderOutput) -> Tensor:
        """(rows, attention layers) peak frame of each row; the runtime windows pay for this readout every round."""
        if not self.layers:
            return out.states.new_zeros(out.states.shape[1], 0, dtype=torch.long)
        return audio_peaks(out.audio_attention, self.policy.valid_frames)

    def _observe(self, first: int | Tensor, peaks: Tensor) -> None:
        if self.readout is not None:
            self.policy.observe_verified(first, peaks[:, self.readout])

    def _first(self) -> None:
        """The prompt's pass: the first token, and the rows the draft catches up on first."""
        target, state, n_prompt = self.target, self.state, self.prompt.shape[1]
        positions = torch.arange(n_prompt, device=self.prompt.device)
        out = target.forward(self.prompt, self.target_cache, self.draft.config.taps, self.layers, positions)
        first = target.greedy_tokens(out.states[:, -1:], 0)[0]
        peaks = self._peaks(out)[-1:]
        self._observe(0, peaks)
        state.verified.fill_(1)
        state.last.fill_(n_prompt - 1)
        state.features[:, :n_prompt].copy_(out.hidden)
        state.inputs[:, :n_prompt].copy_(torch.cat([self.prompt[0, 1:], first])[None])
        done = (first == target.eot) | (n_prompt + 1 >= target.max_length)
        state.record[: 2 + peaks.numel()].copy_(torch.cat([done.long(), first, peaks.reshape(-1)]))

    def _propose(self) -> None:
        """The draft catches up on the rows the last pass verified and proposes K tokens."""
        draft, policy, state, k = self.draft, self.policy, self.state, self.k
        n_prompt, frames = self.prompt.shape[1], self.draft_cache.frames
        verified, last = state.verified, state.last
        position = n_prompt + verified - 1  # of the last verified token, which the target has not read yet
        first = position - 1 - last  # the draft's position at the first row; the one at t predicts token t + 2 - P
        rows = torch.arange(state.inputs.shape[1], device=last.device)
        caught_up = policy.centres(first + 2 - n_prompt, len(rows), verified)
        out = draft(state.features, state.inputs, self.draft_cache, policy.mask(caught_up, frames), first + rows)
        centres = torch.cat([caught_up.index_select(0, last), policy.centres(verified + 1, k - 1, verified)])
        hidden, features = out.hidden.index_select(1, last)[:, 0], out.features.index_select(1, last)
        attention = [] if out.attention is None else [out.attention[0].index_select(0, last)]
        for depth in range(k):
            confidence, choice = draft.logits(hidden).softmax(dim=-1).max(dim=-1)
            proposal = draft.vocab_to_target(choice)
            state.proposals[depth : depth + 1].copy_(proposal)
            state.confidences[depth : depth + 1].copy_(confidence)
            if depth + 1 == k:
                break
            window = policy.mask(centres[depth + 1 : depth + 2], frames)
            out = draft(features, proposal[:, None], self.draft_cache, window, position + depth)
            hidden, features = out.hidden[:, -1], out.features[:, -1:]
            if out.attention is not None:
                attention.append(out.attention[0, -1:])
        state.centres.copy_(centres)
        if attention:
            state.attention.copy_(torch.cat(attention))

    def _verify(self) -> None:
        """The target verifies the last verified token and the K proposals in one pass; acceptance, the round's
        record and the next round's state follow on the device."""
        target, state, k = self.target, self.state, self.k
        n_prompt = self.prompt.shape[1]
        verified = state.verified.clone()
        position = n_prompt + verified - 1
        block = torch.cat([state.inputs.index_select(1, state.last), state.proposals[None]], dim=1)
        depths = torch.arange(k + 1, device=block.device)
        out = target.forward(block, self.target_cache, self.draft.config.taps, self.layers, position + depths)
        choices = target.greedy_tokens(out.states, 1)[0]
        peaks = self._peaks(out)
        accepted, kept = self._accept(choices, verified)
        ends = (choices == target.eot) & (depths <= accepted)  # the transcript takes choices up to `accepted`
        finished = ends.any()
        taken = torch.where(finished, ends.long().argmax(), accepted + 1)  # tokens it takes, end-of-text excluded
        self._observe(verified, peaks)
        state.verified.add_(taken)
        done = finished | (n_prompt + state.verified >= target.max_length)
        state.features[:, : k + 1].copy_(out.hidden)
        state.inputs[:, : k + 1].copy_(choices[None])
        state.last.copy_(accepted)
        draft_peaks = state.attention.argmax(dim=-1)
        record = [done.long(), accepted[None], kept, choices, state.proposals, draft_peaks, state.centres, peaks]
        state.record.copy_(torch.cat([t.reshape(-1) for t in record]))

    def _accept(self, choices: Tensor, verified: Tensor) -> tuple[Tensor, Tensor]:
        """How many proposals the target keeps (`decode.accepted_length`, on the device) of the ones the round
        proposed: K, fewer at the length limit or past the first proposal below the confidence threshold."""
        state, k, eot = self.state, self.k, self.target.eot
        depths = torch.arange(k, device=choices.device)
        unsure = state.confidences < self.options.threshold
        first_unsure = torch.where(unsure.any(), unsure.long().argmax() + 1, k)
        budget = self.target.max_length - self.prompt.shape[1] - verified - 1
        kept = torch.minimum(budget, first_unsure).clamp(max=k)
        ending = (state.proposals == eot).long()
        agree = (state.proposals == choices[:k]) & (depths < kept) & (ending.cumsum(0) - ending == 0)
        return agree.long().cumprod(0).sum(), kept

    def run(self, rows: SegmentRows, on_round: Callable[[Round], None] | None = None) -> Decoded:
        """The segment's rounds: the host reads each round's record once, then starts the next round before it
        writes the trace rows of this one."""
        stopwatch, k, n_layers = Stopwatch(self.prompt.device), self.k, len(self.layers)
        self.first()
        done, token, *peaks = self.state.record[: 2 + n_layers].tolist()
        if rows.verified([token], peaks) or done:
            return rows.result
        marks = self._launch(stopwatch)
        while marks is not None:
            record = self.state.record.tolist()
            attention = self._attention(record[2]) if self.options.keep_attention else None
            done, accepted, kept = record[:3]
            choices, (proposals, draft_peaks, centres) = record[3 : 4 + k], _split(record[4 + k : 4 + 4 * k], k)
            peaks = record[4 + 4 * k :]
            seconds = stopwatch.seconds(marks[0], marks[1]), stopwatch.seconds(marks[1], marks[2])
            marks = None if done else self._launch(stopwatch)
            draft_peaks = draft_peaks[:kept] if self.draft.config.audio else None
            rows.round(proposals[:kept], accepted, choices, draft_peaks, centres, peaks, seconds, attention)
            if on_round is not None:
                on_round(rows.result.rounds[-1])
        return rows.result

    def _launch(self, stopwatch: Stopwatch) -> tuple:
        start = stopwatch.mark()
        self.propose()
        drafted = stopwatch.mark()
        self.verify()
        return start, drafted, stopwatch.mark()

    def _attention(self, kept: int) -> list[list[float]] | None:
        """Each kept step's audio attention over the valid frames: a second read, where the trace keeps them."""
        if not self.draft.config.audio:
            return None
        return self.state.attention[:kept, : self.policy.frames].float().cpu().tolist()

    def device_seconds(self, repeats: int = 50) -> tuple[float, float]:
        """Median device seconds of a round's drafting and verification, replayed back to back from the state after
        the prompt's pass."""
        self.first()
        state = self.state
        inputs = [state.verified, state.last, state.features, state.inputs]
        drafting, verification = replay_seconds([self.propose, self.verify], inputs, repeats)
        return drafting, verification


def speculative(
    target: Target,
    draft: Draft,
    memory: Tensor,
    valid_frames: int,
    settings: Settings,
    reference: list[int | None] | None = None,
    origin: Origin = Origin(),
    on_round: Callable[[Round], None] | None = None,
    captured: dict | None = None,
) -> Decoded:
    """`decode.speculative` as captured steps: the same tokens and rows. captured: where the steps are kept between
    segments and clips; none: captured anew."""
    with torch.inference_mode():
        steps = round_steps(captured, target, draft, memory, settings)
        steps.load(memory, valid_frames, reference)
        rows = SegmentRows(target, origin, steps.options.verify_peaks, len(steps.layers), steps.policy, steps.readout)
        return steps.run(rows, on_round)


def round_steps(captured: dict | None, target: Target, draft: Draft, memory: Tensor, settings: Settings) -> RoundSteps:
    options = LoopOptions.of(settings, target)
    key = ("round", id(target), id(draft), memory.shape[1], options)
    return _reused(captured, key, lambda: RoundSteps(target, draft, memory, options))
