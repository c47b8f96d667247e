"""The decoding loops as captured steps over static tensors: CUDA graphs, replayed with no host work between them.

Every step reads and writes tensors that stay put: caches attended whole under masks, positions and counts kept on
the device, the window policy's tables. A greedy step reads the token the last one chose and chooses the next; a
round drafts from what the last verification left, then verifies, accepts and updates it, all on the device. The
host only launches replays and reads back: one small copy per token (greedy: read while the device runs the next
step) and one per round (proposals, choices, acceptance, the end flag and the trace rows, in one transfer). Off CUDA
the same steps run eagerly over the same tensors, which is how they are tested on any machine.

Compiled, each step is traced whole by torch.compile (inductor) on its first call and captured after that, so that a
graph replays fused kernels. Compiled steps run outside inference mode, whose tensors torch.compile cannot trace.
"""

import statistics
import threading
import time
from collections.abc import Callable, Iterable, Iterator, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import TypeVar

import torch
from torch import Tensor
from torch._dynamo.utils import counters

from specasr import tree
from specasr.decode import LoopOptions, Stopwatch, node_limit, verification_peaks
from specasr.draft import Draft, DraftOutput
from specasr.profiling import count_kernels
from specasr.records import Decoded, Origin, Outcome, RoundRecord, SegmentRows
from specasr.targets import Target
from specasr.targets.base import DecoderOutput, audio_peaks
from specasr.trace import Round
from specasr.windows import NO_WINDOW, WindowPolicy

GRAPH_DEVICES = ("cuda",)  # where steps are captured; elsewhere they run eagerly over the same tensors
# Off where compiled steps measured slower: on a 2-core CPU every compiled decode was slower than the plain host loop
# (docs/measurements.md, "Compiled steps"); on CUDA they have not been measured yet
COMPILED_BY_DEFAULT = {"cpu": False, "cuda": False}
MOST_COMPILED_SHAPES = 64  # graphs one step's code compiles to in a process: one per target, draft, K, tree, frames
# One step made at a time in a process: a compile patches dynamo's settings process-wide, and PyTorch captures one
# graph at a time
_MAKING = threading.Lock()
Steps = TypeVar("Steps")


class CapturedStep:
    """A step over static tensors: captured once as a CUDA graph and replayed, or run eagerly off CUDA; compiled
    first where asked. compile_seconds: its first call's, which traces and compiles it."""

    def __init__(self, step: Callable[[], None], capture: bool, compile: bool = False, warmup: int = 2):
        self.step, self.graph, self.compile_seconds = step, None, 0.0
        with _MAKING:
            if compile:  # a CPU's compiled kernels named to the profiler too, so that they can be counted
                self.step = torch.compile(step, fullgraph=True, options={"cpp.enable_kernel_profile": True})
                start = time.perf_counter()
                patch = torch._dynamo.config.patch(
                    recompile_limit=MOST_COMPILED_SHAPES, fail_on_recompile_limit_hit=True
                )
                with patch:
                    self.step()
                self.compile_seconds = time.perf_counter() - start
            if capture:
                self._capture(warmup)

    def _capture(self, warmup: int) -> None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # kernels choose their algorithms and workspaces outside the graph
            for _ in range(warmup):
                self.step()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        # Other sessions' decodes may run on the device meanwhile: only this thread's unsafe calls spoil the capture
        with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
            self.step()

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
    """Every tensor field of a dataclass (or tuple of tensors: a cache's layers) copied into the same field of
    another; other fields assigned."""
    for field in fields(buffers):
        buffer, value = getattr(buffers, field.name), getattr(values, field.name)
        if isinstance(buffer, Tensor):
            buffer.copy_(value)
        elif isinstance(buffer, tuple):
            for tensor, layer in zip(buffer, value, strict=True):
                tensor.copy_(layer)
        else:
            setattr(buffers, field.name, value)


def _reused(captured: MutableMapping | None, key: tuple, make: Callable[[], Steps]) -> Steps:
    if captured is None:
        return make()
    if key not in captured:
        captured[key] = make()
    return captured[key]


def compiled_graphs() -> int:
    """Graphs torch.compile has made in this process so far (counted by dynamo)."""
    return counters["stats"]["unique_graphs"]


def compile_seconds(made: Iterable) -> float:
    """Seconds these sets of steps spent compiling, on their first calls."""
    steps = (step for kept in made for step in vars(kept).values())
    return sum(step.compile_seconds for step in steps if isinstance(step, CapturedStep))


@dataclass(frozen=True)
class StepCost:
    """One static step: its median device seconds, replayed back to back with the loop's other steps (the kernels'
    own time, without the host's gaps), and the kernels one uncaptured run of it launches (profiling.count_kernels)."""

    seconds: float
    kernels: int


def step_costs(steps: dict[str, CapturedStep], inputs: list[Tensor], repeats: int) -> dict[str, StepCost]:
    """Each step's cost, the steps replayed back to back `repeats` times from the same `inputs` (restored before each
    repetition, outside the timing, and at the end), then run once more each, uncaptured, under the profiler."""
    saved = [t.clone() for t in inputs]

    def restore() -> None:
        for tensor, value in zip(inputs, saved, strict=True):
            tensor.copy_(value)

    stopwatch = Stopwatch(inputs[0].device)
    marks = []
    for _ in range(repeats):
        restore()
        row = [stopwatch.mark()]
        for step in steps.values():
            step()
            row.append(stopwatch.mark())
        marks.append(row)
    restore()
    kernels = [count_kernels(step.step) for step in steps.values()]
    restore()
    return {
        name: StepCost(statistics.median(stopwatch.seconds(row[i], row[i + 1]) for row in marks), kernels[i])
        for i, name in enumerate(steps)
    }


@dataclass(frozen=True)
class StepMode:
    """How a loop's static steps run: captured as CUDA graphs where `graphs` and the device replays them; compiled by
    torch.compile where `compile`."""

    graphs: bool = True
    compile: bool = False

    def capture(self, device: torch.device) -> bool:
        return self.graphs and device.type in GRAPH_DEVICES

    @contextmanager
    def running(self) -> Iterator[None]:
        """Inference mode, except for compiled steps: torch.compile traces no inference tensors."""
        with torch.inference_mode(not self.compile), torch.no_grad():
            yield


class GreedySteps:
    """A static cache and the greedy loop's two steps for one target and audio length: the prompt's pass and one
    token's step, each ending in the target's greedy choice, which the next step reads as its token."""

    def __init__(self, target: Target, memory: Tensor, layers: tuple[int, ...], mode: StepMode = StepMode()):
        device = memory.device
        self.target, self.layers = target, layers
        self.cache = target.new_cache(memory, target.max_length, static=True)
        self.prompt = torch.tensor([target.prompt], device=device)
        self.token = torch.zeros(1, 1, dtype=torch.long, device=device)
        self.position = torch.zeros(1, dtype=torch.long, device=device)
        self.valid_frames = torch.full((), memory.shape[1], device=device)
        self.record = torch.zeros(1 + len(layers), dtype=torch.long, device=device)  # the token, its peak per layer
        capture = mode.capture(device)
        self.first = CapturedStep(self._first, capture, mode.compile)
        self.next = CapturedStep(self._next, capture, mode.compile)

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

    def costs(self, repeats: int = 50) -> dict[str, StepCost]:
        """One token's step, after the prompt's pass."""
        self.first()
        return step_costs({"step": self.next}, [self.token, self.position], repeats)


class CapturedGreedy:
    """`decode.greedy` as static steps, a Loop: the same tokens and rows. captured: where the steps are kept between
    segments and clips (keyed by target and audio length); none: made anew for every segment."""

    def __init__(
        self, target: Target, verify_peaks: bool, captured: MutableMapping | None = None, mode: StepMode = StepMode()
    ):
        self.target, self.captured, self.mode = target, captured, mode
        self.layers = tuple(range(target.n_layers)) if verify_peaks else ()

    def steps(self, memory: Tensor) -> GreedySteps:
        key = ("greedy", id(self.target), memory.shape[1], self.layers, self.mode)
        return _reused(self.captured, key, lambda: GreedySteps(self.target, memory, self.layers, self.mode))

    def __call__(self, memory, valid_frames, origin=Origin(), reference=None, on_round=None) -> Decoded:
        with self.mode.running():
            steps = self.steps(memory)
            steps.load(memory, valid_frames)
            return steps.run(SegmentRows(self.target, origin, bool(self.layers), len(self.layers)))


@dataclass
class RoundState:
    """What a round reads and writes on the device: the catch-up's rows, and the tree the drafting step hands the
    verification step."""

    verified: Tensor  # (1,) transcript tokens the target has confirmed
    last: Tensor  # (1,) the row of `inputs` that holds the last of them
    features: Tensor  # (1, rows, taps x d_model) the target features the draft catches up on, real up to `last`
    inputs: Tensor  # (1, rows) the tokens x_{t+1} beside them
    tokens: Tensor  # (N,) the nodes' target token ids
    parents: Tensor  # (N + 1,) the block's parent rows
    depths: Tensor  # (N + 1,)
    sees: Tensor  # (N + 1, N + 1)
    probabilities: Tensor  # (N,) the draft's, of each node's token below its parent
    draft_peaks: Tensor  # (N,) frame of each node's draft attention peak (zeros without audio attention)
    centres: Tensor  # (K,) each depth's window centre
    attention: Tensor  # (N, frames) each node's head-averaged audio attention (zeros without audio attention)
    record: Tensor  # what the host reads (float64): `decode.RoundRecord` after the prompt's pass


class RoundSteps:
    """Static caches, window tables and state for one target, draft, audio length and loop options, and the three
    steps over them: the prompt's pass, a round's drafting (the catch-up on the last verified tokens and the tree) and
    its verification (the root and N nodes, the greedy choices, acceptance, the accepted path moved into place and the
    state for the next round). A round is two replays, so that the device times drafting and verification apart."""

    def __init__(self, target: Target, draft: Draft, memory: Tensor, options: LoopOptions, mode: StepMode = StepMode()):
        device, frames, k, n = memory.device, memory.shape[1], options.k, options.nodes
        self.target, self.draft, self.options, self.k = target, draft, options, k
        self.layers, self.readout = options.attention_layers, options.readout
        self.layout = RoundRecord(n, k, len(self.layers))
        rows = max(k + 1, len(target.prompt))  # a catch-up after the prompt's pass or after a verification
        capacity = target.max_length + max(rows, options.room)  # rows past the length limit pad a step
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
            tokens=torch.zeros(n, **on),
            parents=torch.zeros(n + 1, **on),
            depths=torch.zeros(n + 1, **on),
            sees=torch.zeros(n + 1, n + 1, dtype=torch.bool, device=device),
            probabilities=torch.zeros(n, device=device),
            draft_peaks=torch.zeros(n, **on),
            centres=torch.full((k,), NO_WINDOW, **on),
            attention=torch.zeros(n, frames, device=device),
            record=torch.zeros(
                max(2 + len(self.layers), sum(self.layout.sizes().values())), dtype=torch.float64, device=device
            ),
        )
        capture = mode.capture(device)
        self.first = CapturedStep(self._first, capture, mode.compile)
        self.propose = CapturedStep(self._propose, capture, mode.compile)
        self.verify = CapturedStep(self._verify, capture, mode.compile)

    def load(self, memory: Tensor, valid_frames: int, reference: list[int | None] | None) -> None:
        """A new segment, written into the same tensors."""
        capacity, frames = self.draft_cache.capacity, self.draft_cache.frames
        _copy_into(self.target_cache, self.target.new_cache(memory, capacity, static=True))
        _copy_into(self.draft_cache, self.draft.new_cache(memory, valid_frames, capacity, frames=frames))
        self.policy.reset(valid_frames, reference)

    def _peaks(self, out: DecoderOutput) -> Tensor:
        return verification_peaks(
            out.audio_attention if self.layers else None, self.policy.valid_frames, out.states[0, :, 0]
        )

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
        """The draft catches up on the rows the last pass verified and grows its tree; the N most probable nodes are
        the next verification's block."""
        draft, policy, state, k = self.draft, self.policy, self.state, self.k
        n_prompt, frames = self.prompt.shape[1], self.draft_cache.frames
        verified, last = state.verified, state.last
        position = n_prompt + verified - 1  # of the last verified token, which the target has not read yet
        first = position - 1 - last  # the draft's position at the first row; the one at t predicts token t + 2 - P
        rows = torch.arange(state.inputs.shape[1], device=last.device)
        caught_up = policy.centres(first + 2 - n_prompt, len(rows), verified)
        out = draft(state.features, state.inputs, self.draft_cache, policy.mask(caught_up, frames), first + rows)
        centres = torch.cat([caught_up.index_select(0, last), policy.centres(verified + 1, k - 1, verified)])
        attention = None if out.attention is None else out.attention.index_select(1, last)
        root = DraftOutput(out.hidden.index_select(1, last), out.state.index_select(1, last), attention)
        window = lambda centres: policy.mask(centres, frames)  # noqa: E731
        candidates = tree.grow(draft, root, self.draft_cache, position, centres, window, self.options.width, k)
        chosen = tree.choose(candidates, self.options.nodes)
        block = tree.block(candidates, chosen, k)
        for name in ("tokens", "probabilities", "parents", "depths", "sees"):
            getattr(state, name).copy_(getattr(block, name))
        state.centres.copy_(centres)
        if candidates.attention is not None:
            state.attention.copy_(candidates.attention.index_select(0, candidates.sources.index_select(0, chosen)))
            state.draft_peaks.copy_(state.attention.argmax(dim=-1))

    def _verify(self) -> None:
        """The target verifies the root and the N nodes in one pass; acceptance, the accepted path moved into place in
        its cache, the round's record and the next round's state follow on the device."""
        target, state, k = self.target, self.state, self.k
        n_prompt = self.prompt.shape[1]
        verified = state.verified.clone()
        position = n_prompt + verified - 1
        block = tree.Block(state.tokens, state.probabilities, state.parents, state.depths, state.sees)
        tokens = torch.cat([state.inputs.index_select(1, state.last), state.tokens[None]], dim=1)
        slots = position + torch.arange(tokens.shape[1], device=tokens.device)
        out = target.forward(
            tokens, self.target_cache, self.draft.config.taps, self.layers, slots, block.rows(position)
        )
        choices = target.greedy_tokens(out.states, 1)[0]
        budget = self.target.max_length - n_prompt - verified - 1
        limit = node_limit(block, self.options.threshold, budget, k)
        accepted, path = tree.accept(block, choices, target.eot, limit, k)
        peaks, depths = self._peaks(out), torch.arange(k + 1, device=tokens.device)
        new = choices.index_select(0, path)
        ends = (new == target.eot) & (depths <= accepted)  # the transcript takes the path's choices up to `accepted`
        finished = ends.any()
        taken = torch.where(finished, ends.long().argmax(), accepted + 1)  # tokens it takes, end-of-text excluded
        self._observe(verified, peaks.index_select(0, path))
        state.verified.add_(taken)
        if self.options.width > 1:  # a chain's path is in place already
            self.target_cache.move(position + path, position + depths)
        state.features[:, : k + 1].copy_(out.hidden.index_select(1, path))
        state.inputs[:, : k + 1].copy_(new[None])
        state.last.copy_(accepted)
        record = self.layout.pack(block, limit, accepted, path, choices, peaks, state.draft_peaks, state.centres)
        state.record.copy_(record)

    def run(self, rows: SegmentRows, on_round: Callable[[Round], None] | None = None) -> Decoded:
        """The segment's rounds: the host reads each round's record once, then starts the next round before it
        writes the trace rows of this one."""
        stopwatch, n_layers = Stopwatch(self.prompt.device), len(self.layers)
        self.first()
        done, token, *peaks = (int(v) for v in self.state.record[: 2 + n_layers].tolist())
        if rows.verified([token], peaks) or done:
            return rows.result
        marks = self._launch(stopwatch)
        while marks is not None:
            outcome = self.layout.unpack(self.state.record.tolist(), self.draft.config.audio)
            outcome.drafted = self.k  # a captured round drafts every depth
            if self.options.keep_attention and self.draft.config.audio:
                outcome.attention = (
                    self.state.attention[: len(outcome.tokens), : self.policy.frames].float().cpu().tolist()
                )
            seconds = stopwatch.seconds(marks[0], marks[1]), stopwatch.seconds(marks[1], marks[2])
            marks = None if self._ends(outcome, len(rows.tokens)) else self._launch(stopwatch)
            rows.round(outcome, seconds)
            if on_round is not None:
                on_round(rows.result.rounds[-1])
        return rows.result

    def _ends(self, outcome: Outcome, verified: int) -> bool:
        """Whether a round after `verified` transcript tokens ends the segment: an end-of-text, or a full window."""
        eot, new = self.target.eot, outcome.new
        taken = new.index(eot) if eot in new else len(new)
        return eot in new or len(self.target.prompt) + verified + taken >= self.target.max_length

    def _launch(self, stopwatch: Stopwatch) -> tuple:
        start = stopwatch.mark()
        self.propose()
        drafted = stopwatch.mark()
        self.verify()
        return start, drafted, stopwatch.mark()

    def costs(self, repeats: int = 50) -> dict[str, StepCost]:
        """A round's drafting and verification, from the state after the prompt's pass."""
        self.first()
        state = self.state
        inputs = [state.verified, state.last, state.features, state.inputs]
        return step_costs({"draft": self.propose, "verify": self.verify}, inputs, repeats)


class CapturedSpeculative:
    """The speculative loop as static steps, a Loop: the same tokens and rows as `decode.HostSpeculative`.
    captured: where the steps are kept between segments and clips; none: made anew for every segment."""

    def __init__(
        self,
        target: Target,
        draft: Draft,
        options: LoopOptions,
        captured: MutableMapping | None = None,
        mode: StepMode = StepMode(),
    ):
        self.target, self.draft, self.options, self.captured, self.mode = target, draft, options, captured, mode

    def steps(self, memory: Tensor) -> RoundSteps:
        key = ("round", id(self.target), id(self.draft), memory.shape[1], self.options, self.mode)
        return _reused(self.captured, key, lambda: RoundSteps(self.target, self.draft, memory, self.options, self.mode))

    def __call__(self, memory, valid_frames, origin=Origin(), reference=None, on_round=None) -> Decoded:
        with self.mode.running():
            steps = self.steps(memory)
            steps.load(memory, valid_frames, reference)
            peaks = self.options.verify_peaks
            rows = SegmentRows(self.target, origin, peaks, len(steps.layers), steps.policy, steps.readout)
            return steps.run(rows, on_round)
