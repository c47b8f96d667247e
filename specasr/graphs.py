"""CUDA graphs for the round's fixed-shape steps: one capture, then replays with new inputs (as gpt-fast does).

A step is captured with buffers of its own for its tensor inputs; a replay copies the new inputs into them and
returns the graph's own output tensors, which the next replay overwrites. Steps give their positions as a device
tensor and read static caches (attended whole under masks), so a replay never depends on host state.
"""

from collections.abc import Callable
from typing import Generic, TypeVar

import torch
from torch import Tensor

Output = TypeVar("Output")


class GraphedStep(Generic[Output]):
    def __init__(self, step: Callable[..., Output], *example: Tensor, warmup: int = 3):
        self.inputs = [t.clone() for t in example]
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
        self.graph.replay()
        return self.outputs
