"""CUDA graphs for the round's fixed-shape steps: one capture, then replays with new inputs (as gpt-fast does).

A step is captured with buffers of its own for its tensor inputs; a replay copies the new inputs into them and
returns the graph's own output tensors, which the next replay overwrites. Steps give their positions as a device
tensor and read static caches (attended whole under masks), so a replay never depends on host state. Off CUDA the
same buffers are filled by running the step eagerly, so the loop's use of them is tested on any machine.
"""

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Generic, TypeVar

import torch
from torch import Tensor

from specasr.draft import Draft, DraftCache
from specasr.targets import Target
from specasr.targets.base import DecoderCache

Output = TypeVar("Output")


class GraphedStep(Generic[Output]):
    def __init__(self, step: Callable[..., Output], *example: Tensor, capture: bool = True, warmup: int = 3):
        self.step, self.graph = step, None
        self.inputs = [t.clone() for t in example]
        if not capture:
            self.outputs = step(*self.inputs)
            return
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up outside the graph: kernels choose their algorithms once
            for _ in range(warmup):
                step(*self.inputs)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.outputs = step(*self.inputs)

    def __call__(self, *inputs: Tensor) -> Output:
        for buffer, value in zip(self.inputs, inputs, strict=True):
            buffer.copy_(value)
        if self.graph is not None:
            self.graph.replay()
        else:
            _copy_into(self.outputs, self.step(*self.inputs))
        return self.outputs


def _copy_into(buffers, values) -> None:
    """Every tensor field of a dataclass copied into the same field of another; other fields assigned."""
    for field in fields(buffers):
        buffer, value = getattr(buffers, field.name), getattr(values, field.name)
        if isinstance(buffer, Tensor):
            buffer.copy_(value)
        else:
            setattr(buffers, field.name, value)


@dataclass
class RoundSteps:
    """Static caches for one target, draft, K and audio length, and the round's three fixed-shape steps over them:
    verification of K + 1 tokens, the draft's catch-up over K + 1 positions and a single draft step."""

    target_cache: DecoderCache
    draft_cache: DraftCache
    verify: GraphedStep
    catch_up: GraphedStep
    step: GraphedStep

    def load(self, target: Target, draft: Draft, memory: Tensor, valid_frames: int) -> None:
        """Fill the caches for a new segment, in place: the captured steps keep reading the same tensors."""
        capacity, frames = self.draft_cache.capacity, self.draft_cache.frames
        _copy_into(self.target_cache, target.new_cache(memory, capacity, static=True))
        _copy_into(self.draft_cache, draft.new_cache(memory, valid_frames, capacity, frames=frames))


def round_steps(
    target: Target, draft: Draft, memory: Tensor, k: int, capacity: int, attention_layers: tuple[int, ...]
) -> RoundSteps:
    """Capture the round's steps on CUDA (emulated elsewhere) over caches shaped for `memory`'s frames."""
    device, frames = memory.device, memory.shape[1]
    target_cache = target.new_cache(memory, capacity, static=True)
    draft_cache = draft.new_cache(memory, frames, capacity, frames=frames)
    width = len(draft.config.taps) * target.d_model
    capture = device.type == "cuda"

    def verify(tokens: Tensor, positions: Tensor):
        return target.forward(tokens, target_cache, draft.config.taps, attention_layers, positions)

    def draft_step(features: Tensor, tokens: Tensor, window: Tensor, positions: Tensor):
        return draft(features, tokens, draft_cache, window, positions)

    def example(rows: int) -> tuple[Tensor, ...]:
        return (
            torch.zeros(1, rows, width, device=device, dtype=target.dtype),
            torch.zeros(1, rows, dtype=torch.long, device=device),
            torch.ones(1, rows, frames, dtype=torch.bool, device=device),
            torch.arange(rows, device=device),
        )

    tokens, positions = torch.zeros(1, k + 1, dtype=torch.long, device=device), torch.arange(k + 1, device=device)
    return RoundSteps(
        target_cache,
        draft_cache,
        GraphedStep(verify, tokens, positions, capture=capture),
        GraphedStep(draft_step, *example(k + 1), capture=capture),
        GraphedStep(draft_step, *example(1), capture=capture),
    )
