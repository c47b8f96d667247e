"""Steps shaped for CUDA graphs: positions handed in as a device tensor, the whole preallocated cache attended
under a mask. On a CPU they must equal the plain steps; where CUDA exists, a graph's replay must equal eager."""

import pytest
import torch

from specasr import decode
from specasr.decode import greedy_tokens, speculative
from specasr.draft import random_draft
from specasr.graphs import GraphedStep
from specasr.trace import Settings
from tests.conftest import random_whisper_target


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a, b, rtol=1e-5, atol=1e-4)


def _target_and_draft():
    target = random_whisper_target(seed=3, layers=2, heads=2, vocab_size=24, max_length=40, init_std=0.5)
    draft = random_draft(target, seed=4)
    memory = torch.randn(1, 40, target.d_model, generator=torch.Generator().manual_seed(0))
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


@pytest.mark.parametrize("window", ["unrestricted", "runtime"])
def test_captured_steps_serve_the_segments_that_follow(monkeypatch, window):
    """Off CUDA the captured steps are emulated with the same buffers: one capture, refilled caches per segment,
    the greedy transcript every time."""
    monkeypatch.setattr(decode, "FIXED_SHAPE_DEVICES", ("cpu",))
    target, draft, _ = _target_and_draft()
    captured, settings = {}, Settings(draft="random", k=3, window=window)
    for seed in range(3):
        memory = torch.randn(1, 40, target.d_model, generator=torch.Generator().manual_seed(seed))
        assert speculative(target, draft, memory, 30, settings, captured=captured).tokens == greedy_tokens(
            target, memory
        )
    assert len(captured) == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_a_graph_replay_equals_the_eager_step():
    target, _, memory = _target_and_draft()
    target.model.cuda()
    memory = memory.cuda()
    eager_cache, graph_cache = target.new_cache(memory, 20, static=True), target.new_cache(memory, 20, static=True)
    prompt = torch.tensor([[2, 3]], device="cuda")
    target.forward(prompt, eager_cache)
    target.forward(prompt, graph_cache)
    step = GraphedStep(
        lambda tokens, positions: target.forward(tokens, graph_cache, taps=(1, 2), positions=positions),
        torch.zeros(1, 5, dtype=torch.long, device="cuda"),
        torch.arange(2, 7, device="cuda"),
    )
    for start, block in ((2, [7, 9, 11, 5, 6]), (4, [8, 8, 1, 3, 2])):  # the second rolls back two positions
        tokens, positions = torch.tensor([block], device="cuda"), torch.arange(start, start + 5, device="cuda")
        eager_cache.length = start
        eager = target.forward(tokens, eager_cache, taps=(1, 2), positions=positions)
        replayed = step(tokens, positions)
        assert torch.equal(eager.states, replayed.states) and torch.equal(eager.hidden, replayed.hidden)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_a_graph_replay_of_a_draft_step_equals_the_eager_step():
    target, _, memory = _target_and_draft()
    target.model.cuda()
    draft, memory = random_draft(target, seed=4), memory.cuda()
    eager_cache, graph_cache = (draft.new_cache(memory, 30, 20, frames=40) for _ in range(2))
    width = len(draft.config.taps) * target.d_model
    inputs = (torch.zeros(1, 1, width, device="cuda"), torch.zeros(1, 1, dtype=torch.long, device="cuda"))
    window = torch.zeros(1, 1, 40, dtype=torch.bool, device="cuda")
    step = GraphedStep(
        lambda features, tokens, window, positions: draft(features, tokens, graph_cache, window, positions),
        *inputs, window, torch.zeros(1, dtype=torch.long, device="cuda"),
    )  # fmt: skip
    generator = torch.Generator(device="cuda").manual_seed(0)
    for position, centre in ((0, 5), (1, 12), (1, 20)):  # the last one rolls back a position
        features = torch.randn(1, 1, width, device="cuda", generator=generator)
        tokens = torch.tensor([[position + 3]], device="cuda")
        window = ((torch.arange(40, device="cuda") - centre).abs() <= 4)[None, None]
        positions = torch.tensor([position], device="cuda")
        eager = draft(features, tokens, eager_cache, window, positions)
        replayed = step(features, tokens, window, positions)
        assert torch.equal(eager.hidden, replayed.hidden) and torch.equal(eager.attention, replayed.attention)
