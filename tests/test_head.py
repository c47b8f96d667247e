import pytest
import torch

from specasr.targets.head import Float16Screen, VocabularyHead

needs_fbgemm = pytest.mark.skipif(
    "fbgemm" not in torch.backends.quantized.supported_engines, reason="no fbgemm float16 kernel in this torch build"
)


def _head(vocab: int = 3000, width: int = 64, seed: int = 0) -> tuple[VocabularyHead, torch.Generator]:
    generator = torch.Generator().manual_seed(seed)
    return VocabularyHead(torch.randn(vocab, width, generator=generator) * 0.1), generator


def _plain_choice(head: VocabularyHead, states: torch.Tensor, banned: torch.Tensor | None = None) -> torch.Tensor:
    scores = states.double() @ head.weight.double().T
    if banned is not None:
        scores = scores.masked_fill(banned, float("-inf"))
    return scores.argmax(dim=-1)


@needs_fbgemm
@pytest.mark.parametrize("shape", [(1, 1), (1, 5), (2, 3)])
def test_the_screened_choice_is_the_float32_argmax(shape):
    head, generator = _head()
    assert head.screen is not None
    for _ in range(20):
        states = torch.randn(*shape, 64, generator=generator) * 3
        assert torch.equal(head.choose(states), _plain_choice(head, states))


@needs_fbgemm
def test_tokens_the_float16_copy_cannot_tell_apart_are_told_apart_in_float32():
    head, _ = _head()
    weight = head.weight.clone()
    weight[:, 0] = 0  # only the three tokens below read the state's first element
    base = weight[3] * 2
    base[0] = 0.5
    nudge = torch.zeros(64)
    nudge[0] = 2.0**-14  # a quarter of float16's resolution at 0.5, a thousand times float32's
    weight[3], weight[7], weight[11] = base, base + nudge, base - nudge
    head = VocabularyHead(weight)
    rounded, _ = torch.ops.quantized.linear_unpack_fp16(head.screen.packed)
    assert torch.equal(rounded[3], rounded[7]) and torch.equal(rounded[3], rounded[11])
    for sign, expected in ((1.0, 7), (-1.0, 11)):
        states = base * 100  # scores token 3 and its nudged copies highest
        states[0] = sign * 50
        assert head.choose(states[None, None]).item() == expected
        assert _plain_choice(head, states[None, None]).item() == expected


@needs_fbgemm
def test_banned_tokens_are_never_chosen():
    head, generator = _head()
    states = torch.randn(1, 4, 64, generator=generator)
    best = _plain_choice(head, states)
    banned = torch.zeros(4, 3000, dtype=torch.bool)
    banned[torch.arange(4), best[0]] = True  # each row's best token, in that row only
    banned[0, :100] = True
    chosen = head.choose(states, banned)
    assert torch.equal(chosen, _plain_choice(head, states, banned))
    assert not banned[torch.arange(4), chosen[0]].any()


@needs_fbgemm
def test_a_row_gets_the_same_choice_in_any_block():
    """Greedy scores one row a step, verification K + 1: the lossless loop needs the same choice for a row in both."""
    head, generator = _head()
    states = torch.randn(1, 9, 64, generator=generator)
    block = head.choose(states)
    alone = torch.cat([head.choose(states[:, i : i + 1]) for i in range(9)], dim=1)
    assert torch.equal(block, alone)


@needs_fbgemm
def test_the_error_bound_holds_for_every_score():
    head, generator = _head(vocab=500, width=384)
    states = torch.randn(6, 384, generator=generator) * 10
    approx = torch.ops.quantized.linear_dynamic_fp16(states, head.screen.packed).double()
    exact = states.double() @ head.weight.double().T
    bound = states.norm(dim=1, keepdim=True).double() * head.screen.row_error.double()
    assert ((approx - exact).abs() <= bound).all()


@needs_fbgemm
def test_states_no_score_tells_apart_get_the_first_allowed_token():
    head, _ = _head()
    banned = torch.zeros(3000, dtype=torch.bool)
    banned[:5] = True
    for states in (torch.zeros(1, 2, 64), torch.full((1, 2, 64), float("nan"))):
        assert head.screen.candidates(states[0], banned.expand(2, -1)) is None
    assert head.choose(torch.zeros(1, 2, 64), banned).tolist() == [[5, 5]]


def test_heads_the_screen_cannot_serve_use_the_plain_product():
    weight = torch.randn(100, 16)
    assert not Float16Screen.applies_to(weight.half())
    assert not Float16Screen.applies_to(weight * 1e5)  # a float16 copy would saturate
    head = VocabularyHead(weight.double())
    states = torch.randn(1, 2, 16).double()
    banned = torch.zeros(100, dtype=torch.bool)
    banned[(states @ weight.double().T).argmax(dim=-1)] = True
    assert head.screen is None
    assert torch.equal(head.choose(states, banned), _plain_choice(head, states, banned))
