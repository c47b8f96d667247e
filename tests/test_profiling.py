"""The profile of a round: every op gets a kind by its input sizes, and each pass's shares add up."""

import pytest
import torch

from specasr.draft import random_draft
from specasr.profiling import KINDS, Shapes, count_kernels, op_kind, pass_costs, profile_round
from tests.conftest import random_whisper_target

SHAPES = Shapes(vocabularies=frozenset({51864, 4096}), frames=frozenset({1500, 170}))


@pytest.mark.parametrize(
    ("name", "input_shapes", "kind"),
    [
        ("aten::mm", [[51864, 384], [384, 2]], "lm head"),  # the target's head, vocabulary on the left
        ("aten::mm", [[1, 384], [384, 4096]], "lm head"),  # the draft's reduced head
        ("aten::scaled_dot_product_attention", [[1, 6, 5, 64], [1, 6, 1500, 64], [1, 6, 1500, 64]], "cross-attention"),
        ("aten::scaled_dot_product_attention", [[1, 6, 5, 64], [1, 6, 30, 64], [1, 6, 30, 64]], "self-attention"),
        ("aten::bmm", [[6, 5, 64], [6, 64, 1500]], "cross-attention"),  # the explicit path of the runtime layer
        ("aten::_softmax", [[1, 8, 1, 170], [], []], "cross-attention"),  # the draft over the valid frames
        ("aten::addmm", [[384], [5, 384], [384, 1536]], "linear"),
        ("mkldnn::_linear_pointwise", [[1, 5, 384], [1536, 384], [1536], [], [], []], "linear"),  # packed weights
        ("aten::layer_norm", [[1, 5, 384], [], [384], [384], [], []], "other"),
    ],
)
def test_op_kinds_follow_the_input_sizes(name, input_shapes, kind):
    assert op_kind(name, input_shapes, SHAPES) == kind


def test_kernels_are_the_ops_that_move_data_and_compiling_fuses_them():
    x = torch.randn(4, 8)

    def step() -> torch.Tensor:
        return (x.view(8, 4).t() * 2 + 1).relu()  # a view and a transpose, then three element-wise ops

    assert count_kernels(step) == 3
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, options={"cpp.enable_kernel_profile": True})
    assert torch.equal(compiled(), step())
    assert count_kernels(compiled) == 1  # one fused loop
    torch._dynamo.reset()


def test_profile_of_a_round_on_a_random_target():
    target = random_whisper_target(seed=0, layers=2, heads=3, vocab_size=50, max_length=40, init_std=0.5)
    memory = torch.randn(1, 40, target.d_model, generator=torch.Generator().manual_seed(0))
    table = profile_round(target, random_draft(target), memory, valid_frames=30, nodes=4, repeats=3)
    assert table["pass"].tolist() == ["target step (1 row)", "verification (5 rows)", "draft step (1 row)"]
    assert table.target_steps.iloc[0] == 1 and (table.ms > 0).all()
    assert table[list(KINDS)].sum(axis=1).tolist() == pytest.approx([1, 1, 1])
    assert (table[["cross-attention", "linear", "lm head"]] > 0).all().all()


def test_pass_costs_of_a_tree_are_its_passes_in_target_steps():
    target = random_whisper_target(seed=0, layers=2, heads=3, vocab_size=50, max_length=40, init_std=0.5)
    memory = torch.randn(1, 40, target.d_model, generator=torch.Generator().manual_seed(0))
    table = profile_round(target, random_draft(target), memory, valid_frames=30, nodes=12, width=3, repeats=3)
    assert table["pass"].tolist() == ["target step (1 row)", "verification (13 rows)", "draft step (3 rows)"]
    verification, draft_step = pass_costs(target, random_draft(target), memory, 30, nodes=12, width=3, repeats=3)
    assert verification > 0 and draft_step > 0
