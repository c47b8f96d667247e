"""Where a round's time goes: a target step of one row, a verification pass over a chain's or a tree's nodes and a
draft step over its frontier, each timed on its own and profiled op by op, the ops' own time summed by kind over all
layers; and the same passes' costs for the cost model (1 + L) / (v(N) + K rho(W))."""

import statistics
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from specasr import tree
from specasr.decode import Stopwatch, greedy_tokens
from specasr.draft import Draft
from specasr.targets import Target

KINDS = ("self-attention", "cross-attention", "linear", "lm head", "other")
MATRIX_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear", "mkldnn::_linear_pointwise"}
HEAD_OPS = {"quantized::linear_dynamic_fp16"}  # only the target's float16 screen (specasr.targets.head) runs these
# Leaf ops that move no data: views, allocations and the conjugate's bookkeeping
NO_KERNEL_OPS = {
    "aten::alias",
    "aten::as_strided",
    "aten::empty",
    "aten::empty_strided",
    "aten::expand",
    "aten::permute",
    "aten::resolve_conj",
    "aten::resolve_neg",
    "aten::select",
    "aten::slice",
    "aten::t",
    "aten::transpose",
    "aten::unsqueeze",
    "aten::view",
}
ATTENTION_OPS = {"aten::softmax", "aten::_softmax", "aten::bmm", "aten::matmul"}


@dataclass(frozen=True)
class Shapes:
    """The sizes that tell an op's kind apart: the vocabularies (LM heads) and the audio frames (cross-attention:
    the target attends all of a window's frames, the draft the valid ones)."""

    vocabularies: frozenset[int]
    frames: frozenset[int]


def op_kind(name: str, input_shapes: list, shapes: Shapes) -> str:
    """The kind of one profiled op from its name and the sizes of its inputs."""
    sizes = {size for shape in input_shapes if isinstance(shape, list) for size in shape}
    if name in HEAD_OPS or (name in MATRIX_OPS and sizes & shapes.vocabularies):
        return "lm head"
    if "attention" in name or (name in ATTENTION_OPS and sizes & shapes.frames):
        return "cross-attention" if sizes & shapes.frames else "self-attention"
    return "linear" if name in MATRIX_OPS else "other"


def count_kernels(run: Callable[[], None]) -> int:
    """The kernels one call of `run` launches: on CUDA, the device's kernels, copies and fills; on a CPU, the ops and
    torch.compile's fused loops (where compiled with kernel profiling) that the profiler records without children,
    except ops that move no data."""
    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as profiler:
        run()
        if cuda:
            torch.cuda.synchronize()
    events = profiler.events()
    if any(event.device_type == DeviceType.CUDA for event in events):
        return sum(event.device_type == DeviceType.CUDA for event in events)
    leaves = [event.name for event in events if not event.cpu_children]
    return sum(("::" in name or "cpp_fused" in name) and name not in NO_KERNEL_OPS for name in leaves)


def _median_ms(run: Callable[[], None], repeats: int, device: torch.device) -> float:
    stopwatch = Stopwatch(device)
    times = []
    for _ in range(repeats):
        start = stopwatch.mark()
        run()
        times.append(stopwatch.seconds(start, stopwatch.mark()))
    return 1000 * statistics.median(times)


def _shares(run: Callable[[], None], repeats: int, shapes: Shapes, device: torch.device) -> dict[str, float]:
    """Each kind's share of the ops' own time (device time on CUDA, CPU time elsewhere)."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities, record_shapes=True) as profiler:
        for _ in range(repeats):
            run()
    totals = dict.fromkeys(KINDS, 0.0)
    for event in profiler.key_averages(group_by_input_shape=True):
        own = event.self_device_time_total if device.type == "cuda" else event.self_cpu_time_total
        totals[op_kind(event.key, event.input_shapes, shapes)] += own
    spent = sum(totals.values()) or 1.0
    return {kind: total / spent for kind, total in totals.items()}


def _passes(
    target: Target, draft: Draft, memory: torch.Tensor, valid_frames: int, nodes: int, width: int
) -> dict[str, Callable[[], None]]:
    """A round's passes, halfway through the clip's greedy transcript, each with what follows it in the loop: a
    target step of one row and a verification of the root and `nodes` nodes, each with its greedy choice, and a draft
    step over `width` rows (a tree's frontier; a chain's one) reading the state its catch-up left, with its top-`width`
    scoring."""
    tokens = greedy_tokens(target, memory)
    inputs = torch.tensor([[*target.prompt, *tokens[: len(tokens) // 2]]], device=memory.device)
    position = inputs.shape[1] - 1
    cache = target.new_cache(memory, target.max_length + nodes + 1)
    hidden = target.forward(inputs[:, :-1], cache, taps=draft.config.taps).hidden
    draft_cache = draft.new_cache(memory, valid_frames, target.max_length + width)
    caught_up = draft(hidden[:, :-1], inputs[:, 1:-1], draft_cache)
    step_states, step_tokens = caught_up.state[:, -1:].expand(1, width, -1), inputs[:, -1:].expand(1, width)

    def target_rows(rows: int) -> Callable[[], None]:
        block = inputs[:, -1:].repeat(1, rows)

        def run() -> None:
            cache.length = position
            target.greedy_tokens(target.forward(block, cache, taps=draft.config.taps).states, 1)

        return run

    def draft_step() -> None:
        draft_cache.length = position - 1
        tree.top(draft, draft(step_states, step_tokens, draft_cache, carried=True).hidden[0], width)

    return {
        "target step (1 row)": target_rows(1),
        f"verification ({nodes + 1} rows)": target_rows(nodes + 1),
        f"draft step ({width} row{'s' if width > 1 else ''})": draft_step,
    }


@torch.inference_mode()
def pass_costs(
    target: Target, draft: Draft, memory: torch.Tensor, valid_frames: int, nodes: int, width: int, repeats: int = 20
) -> tuple[float, float]:
    """The cost model's v(N) and rho(W): a verification of the root and N nodes, and a draft step over W rows, each
    in target steps of one row (median times, unprofiled)."""
    passes = _passes(target, draft, memory, valid_frames, nodes, width)
    for run in passes.values():  # warm-up
        run()
    step, verification, draft_step = (_median_ms(run, repeats, memory.device) for run in passes.values())
    return verification / step, draft_step / step


@torch.inference_mode()
def profile_round(
    target: Target,
    draft: Draft,
    memory: torch.Tensor,
    valid_frames: int,
    nodes: int,
    width: int = 1,
    repeats: int = 50,
) -> pd.DataFrame:
    """One row per pass (`_passes`): its median time (ms, unprofiled; CUDA events on a GPU), its cost in target steps
    of one row, and each kind's share of its ops' time."""
    device = memory.device
    vocabularies = frozenset({target.vocab_size, len(draft.config.vocab_ids or ()) or target.vocab_size})
    shapes = Shapes(vocabularies, frozenset({memory.shape[1], valid_frames}))
    rows = []
    for name, run in _passes(target, draft, memory, valid_frames, nodes, width).items():
        for _ in range(3):  # warm-up
            run()
        rows.append({"pass": name, "ms": _median_ms(run, repeats, device)} | _shares(run, repeats, shapes, device))
    table = pd.DataFrame(rows)
    table.insert(2, "target_steps", table.ms / table.ms.iloc[0])
    return table
