"""Captured steps (specasr.graphs): positions, counts and choices kept on the device, static caches attended whole
under masks. On a CPU they run eagerly and must equal the loops run from the host, wait for the host nowhere and
serve segment after segment; where CUDA exists, the graphs' replays must equal the eager loops."""

from dataclasses import replace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from specasr import decode, graphs
from specasr.decode import LoopOptions, greedy_tokens
from specasr.draft import random_draft
from specasr.targets import WhisperTarget
from specasr.trace import WINDOWS, Settings
from tests.conftest import random_prefix_target, random_whisper_target, run_loop
from tests.test_speculative import always_propose


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a, b, rtol=1e-5, atol=1e-4)


def _target_and_draft(device: str = "cpu"):
    target = random_whisper_target(seed=3, layers=2, heads=2, vocab_size=24, max_length=40, init_std=0.5)
    if device != "cpu":  # a target keeps masks on its model's device: made anew there, as load_target does
        target = WhisperTarget(target.name, target.model.to(device), target.tokenizer, target.feature_extractor)
    draft = random_draft(target, seed=4)
    memory = torch.randn(1, 40, target.d_model, generator=torch.Generator().manual_seed(0)).to(device)
    return target, draft, memory


def test_static_steps_equal_the_plain_steps():
    target, draft, memory = _target_and_draft()
    tokens = torch.tensor([[2, 3, 7, 9, 11, 5, 6]])
    plain, static = target.new_cache(memory, 20), target.new_cache(memory, 20, static=True)
    for cache in (plain, static):
        target.forward(tokens[:, :3], cache)
    cache_positions = torch.arange(3, 7)
    a = target.forward(tokens[:, 3:], plain, taps=(1, 2), attention_layers=(0, 1))
    b = target.forward(tokens[:, 3:], static, taps=(1, 2), attention_layers=(0, 1), positions=cache_positions)
    assert _close(a.states, b.states) and _close(a.hidden, b.hidden)
    assert torch.allclose(a.audio_attention, b.audio_attention, atol=1e-6)
    assert plain.length == 7 and static.length == 3  # a step given its positions leaves the count to its caller

    features = torch.randn(1, 4, len(draft.config.taps) * target.d_model, generator=torch.Generator().manual_seed(1))
    plain, static = draft.new_cache(memory, 30, 20), draft.new_cache(memory, 30, 20, frames=40)
    a = draft(features, tokens[:, :4], plain)
    window = (torch.arange(40) < 30)[None, None]  # the padded audio frames are never attended
    b = draft(features, tokens[:, :4], static, window=window, positions=torch.arange(4))
    assert torch.allclose(a.hidden, b.hidden, atol=1e-5) and torch.allclose(
        a.attention, b.attention[..., :30], atol=1e-6
    )
    assert (b.attention[..., 30:] == 0).all()


@pytest.mark.parametrize("window", ["unrestricted", "runtime", "correct"])
def test_captured_steps_serve_the_segments_and_clips_that_follow(window):
    """One capture per loop, its caches, state and window tables refilled for each segment: the greedy transcript
    every time, whatever the segment's valid frames."""
    target, draft, _ = _target_and_draft()
    captured, settings = {}, Settings(draft="random", k=3, window=window)
    for seed, valid_frames in ((0, 40), (1, 17), (2, 33)):
        memory = torch.randn(1, 40, target.d_model, generator=torch.Generator().manual_seed(seed))
        expected = decode.greedy(target, memory, valid_frames, verify_peaks=True)
        reference = [min(2 * i, valid_frames - 1) for i in range(40)]
        result = run_loop(target, draft, memory, valid_frames, settings, reference, True, captured)
        assert result.tokens == expected.tokens and result.verified == expected.verified
        assert run_loop(target, None, memory, valid_frames, Settings(), None, True, captured) == expected
        assert all(s.draft_peak < valid_frames for s in result.steps)
    assert len(captured) == 2  # the rounds' steps and greedy's, each captured once


def test_captured_rounds_record_what_the_host_loop_records():
    """Round by round the same proposals, acceptance, window centres, draft peaks and kept attention rows."""
    target, draft, memory = _target_and_draft()
    always_propose(draft, token=7)
    for window in WINDOWS:
        settings = Settings(draft="random", k=4, window=window, threshold=0.2, keep_attention=True)
        reference = [min(3 * i, 29) for i in range(40)]
        host = run_loop(target, draft, memory, 30, settings, reference)
        device = run_loop(target, draft, memory, 30, settings, reference, captured=True)
        assert [(r.start, r.proposed, r.accepted, r.target_token) for r in device.rounds] == [
            (r.start, r.proposed, r.accepted, r.target_token) for r in host.rounds
        ]
        assert len(device.steps) == len(host.steps) and device.verified == host.verified, window
        for ours, theirs in zip(device.steps, host.steps, strict=True):
            assert torch.allclose(torch.tensor(ours.attention), torch.tensor(theirs.attention), atol=1e-6)
            ours.attention = theirs.attention = None
            assert ours == theirs, window


class HostWaits(TorchDispatchMode):
    """Records the ops that make the host wait for the device or copy host data to it: none may run inside a
    captured step (a CUDA graph cannot hold them)."""

    WAITS = frozenset(
        {"aten.item.default", "aten.is_nonzero.default", "aten.nonzero.default", "aten.where.default"}
        | {"aten.masked_select.default", "aten.repeat_interleave.Tensor", "aten.lift_fresh.default"}
        | {"aten._local_scalar_dense.default", "aten.equal.default", "aten._unique2.default"}
    )

    def __init__(self):
        super().__init__()
        self.found = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        boolean_index = str(func) == "aten.index.Tensor" and any(
            i is not None and i.dtype == torch.bool for i in args[1]
        )
        if str(func) in self.WAITS or boolean_index:
            self.found.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("family", ["whisper", "qwen3_asr", "voxtral"])
@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("tree", [(1, None), (3, 7)])
def test_captured_steps_never_wait_for_the_host(family, window, tree):
    if family == "whisper":
        target = random_whisper_target(seed=1, layers=2, heads=2, vocab_size=12, max_length=30, init_std=0.5)
    else:
        target = random_prefix_target(family, seed=1, layers=2, heads=2, vocab_size=12, max_length=30, init_std=0.5)
    memory = torch.randn(1, 40, target.d_model, generator=torch.Generator().manual_seed(1))
    draft = random_draft(target, seed=2)
    width, nodes = tree
    threshold = 0.3 if width == 1 else 0.0
    settings = Settings(draft="random", k=3, window=window, threshold=threshold, runtime_layer=1, tree_width=width)
    settings = replace(settings, tree_nodes=nodes)
    with torch.inference_mode():
        rounds = graphs.CapturedSpeculative(target, draft, LoopOptions.of(settings, target)).steps(memory)
        rounds.load(memory, 30, [5] * 40)
        greedy = graphs.CapturedGreedy(target, verify_peaks=True).steps(memory)
        greedy.load(memory, 30)
        with HostWaits() as waits:
            for step in (rounds.first, rounds.propose, rounds.verify, rounds.propose, greedy.first, greedy.next):
                step.step()
    assert waits.found == []


def test_the_loops_stop_at_the_length_limit():
    """A window's transcript holds max_length - prompt tokens at most, captured or not."""
    target = random_whisper_target(seed=0, layers=1, heads=1, vocab_size=8, max_length=12, init_std=0.005)
    memory = torch.randn(1, 40, target.d_model, generator=torch.Generator().manual_seed(0))
    expected = greedy_tokens(target, memory)
    assert len(expected) == target.max_length - len(target.prompt)  # a repetitive target runs to the limit
    draft = always_propose(random_draft(target, seed=0), token=expected[-1])
    for k in (1, 4, 16):
        assert run_loop(target, draft, memory, 40, Settings(draft="random", k=k), captured=True).tokens == expected
    assert run_loop(target, None, memory, 40, Settings(), captured=True).tokens == expected


def test_step_costs_replay_from_a_restored_state():
    """Timing replays and counting kernels leave the state as the prompt's pass left it, and cost each step."""
    target, draft, memory = _target_and_draft()
    with torch.inference_mode():
        options = LoopOptions.of(Settings(draft="random", k=3), target)
        rounds = graphs.CapturedSpeculative(target, draft, options).steps(memory)
        rounds.load(memory, 30, None)
        costs = rounds.costs(repeats=3)
        assert list(costs) == ["draft", "verify"] and rounds.state.verified.tolist() == [1]
        greedy = graphs.CapturedGreedy(target, verify_peaks=False).steps(memory)
        greedy.load(memory, 30)
        (step,) = greedy.costs(repeats=3).values()
        assert greedy.position.tolist() == [len(target.prompt)]
        for cost in [*costs.values(), step]:
            assert cost.seconds > 0 and cost.kernels > 0
        assert costs["verify"].kernels > step.kernels  # the same target pass, with acceptance and the next state


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("tree", [(1, None), (3, 9)])
@pytest.mark.parametrize("window", WINDOWS)
def test_graph_replays_equal_the_eager_loops(window, tree):
    target, draft, memory = _target_and_draft("cuda")
    always_propose(draft, token=7)
    width, nodes = tree
    settings = Settings(
        draft="random", k=4, window=window, threshold=0.2 if width == 1 else 0.0, tree_width=width, tree_nodes=nodes
    )
    reference = [min(3 * i, 29) for i in range(40)]
    captured = {}
    for valid_frames in (30, 21):  # the second replays the first's capture
        host = run_loop(target, draft, memory, valid_frames, settings, reference)
        device = run_loop(target, draft, memory, valid_frames, settings, reference, True, captured)
        assert [(r.proposed, r.accepted) for r in device.rounds] == [(r.proposed, r.accepted) for r in host.rounds]
        assert device.tokens == host.tokens and device.verified == host.verified and device.steps == host.steps
        assert run_loop(target, None, memory, valid_frames, Settings(), None, True, captured) == decode.greedy(
            target, memory, valid_frames, True
        )
    assert len(captured) == 2
