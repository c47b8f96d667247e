import pytest
import torch

from specasr.draft import random_draft
from specasr.train import Batch, _chain_mask, anchor_loss, gaussian_targets, unrolled_loss


def test_anchor_loss_equals_a_hand_computed_cross_entropy():
    # One position, 4 frames of which 3 are valid, reference frame 1, sigma 1.
    attention = torch.tensor([[[0.1, 0.6, 0.3, 0.0]]])
    frames, valid = torch.tensor([[1]]), torch.tensor([3])
    weights = torch.exp(-torch.tensor([1.0, 0.0, 1.0]) / 2)
    q = weights / weights.sum()
    expected = -(q * torch.log(torch.tensor([0.1, 0.6, 0.3]))).sum()
    assert anchor_loss(attention, frames, valid, sigma=1.0).item() == pytest.approx(expected.item(), rel=1e-6)


def test_gaussian_targets_exclude_padding_and_renormalise():
    q = gaussian_targets(torch.tensor([[2, 9]]), torch.tensor([5]), n_frames=12, sigma=5.0)
    assert torch.allclose(q.sum(-1), torch.ones(1, 2))
    assert (q[..., 5:] == 0).all() and (q[..., :5] > 0).all()


def test_positions_without_a_reference_frame_carry_no_anchor_loss():
    attention = torch.full((1, 3, 4), 0.25)
    with_unaligned = anchor_loss(attention, torch.tensor([[1, -1, -1]]), torch.tensor([4]), 1.0)
    alone = anchor_loss(attention[:, :1], torch.tensor([[1]]), torch.tensor([4]), 1.0)
    assert with_unaligned.item() == pytest.approx(alone.item())
    assert anchor_loss(attention, torch.full((1, 3), -1), torch.tensor([4]), 1.0).item() == 0.0


def test_chain_mask_sees_true_features_then_its_own_chain():
    mask = _chain_mask(depth=3, length=5, device=torch.device("cpu"))
    # Depth 3 at position 4: true keys up to position 2, depth-2 key at 3, depth-3 key at 4.
    assert mask[4].nonzero().flatten().tolist() == [0, 1, 2, 5 + 3, 10 + 4]


def _batch(target, length: int = 7, frames: int = 30) -> Batch:
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(1, length, 3 * target.d_model, generator=generator)
    inputs = torch.randint(0, 1000, (1, length), generator=generator)
    return Batch(
        features=features,
        inputs=inputs,
        targets=torch.cat([inputs[:, 1:], torch.full((1, 1), -100)], dim=1),
        frames=torch.tensor([[3, 5, 8, -1, 12, 15, -1]]),
        memory=torch.randn(1, frames, target.d_model, generator=generator),
        valid_frames=torch.tensor([frames - 5]),
        lengths=torch.tensor([length]),
    )


def test_unrolled_depth_two_matches_the_inference_chain(tiny_en):
    """Training at depth 2 sees what the cached loop sees on a draft's second step."""
    draft = random_draft(tiny_en, seed=1).requires_grad_(False)
    batch = _batch(tiny_en)
    t = 4  # compare the depth-2 step at position t
    cache = draft.new_cache(batch.memory, int(batch.valid_frames), capacity=8)
    restart = draft(batch.features[:, :t], batch.inputs[:, :t], cache)  # catch-up on true features 0..t-1
    second = draft(restart.features[:, -1:], batch.inputs[:, t : t + 1], cache)  # own feature for position t

    captured = []
    original = draft.block
    draft.block = lambda *args: captured.append(original(*args)) or captured[-1]
    unrolled_loss(draft, batch, depths=2, anchor_weight=0.1, sigma=5.0)
    assert torch.allclose(captured[1].hidden[:, t], second.hidden[:, 0], atol=1e-5)
    assert torch.allclose(captured[1].attention[:, t], second.attention[:, 0], atol=1e-6)


def test_one_training_step_reduces_the_loss(tiny_en):
    torch.manual_seed(0)
    draft = random_draft(tiny_en, seed=2).train()
    batch = _batch(tiny_en)
    optimizer = torch.optim.AdamW(draft.parameters(), lr=1e-3)
    before = unrolled_loss(draft, batch, depths=3, anchor_weight=0.1, sigma=5.0)
    before.total.backward()
    optimizer.step()
    after = unrolled_loss(draft, batch, depths=3, anchor_weight=0.1, sigma=5.0)
    assert after.total.item() < before.total.item()
    assert before.anchor > 0 and before.feature > 0
