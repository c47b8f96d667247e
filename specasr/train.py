"""Draft training (paper A.3, D.3): the objective, the unrolled draft, and the optimisation loop.

A training example is one utterance seen through the frozen target: its token sequence
(prompt + greedy transcript + end-of-text), the target's decoder states at every layer for each
input position, its encoder output over the real audio, and the reference frame of every token.
At depth 1 the draft reads the target's own features, as at a restart; at depth j > 1 it reads
the features it predicted at depth j - 1 and attends to its own earlier chain, exactly as on its
later steps at inference, so continuation is trained and not only the restart.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from specasr.draft import Draft

VARIANTS = {"control": (True, 0.0), "anchordraft": (True, 0.1), "no-audio": (False, 0.0)}  # audio, lambda


@dataclass
class Batch:
    """Padded examples. T = longest input sequence, F = longest real audio, in frames."""

    features: Tensor  # (B, T, len(taps) * d): target features f_t at the draft's taps
    inputs: Tensor  # (B, T) the token x_{t+1} read at position t
    targets: Tensor  # (B, T) the token x_{t+2} to predict at position t (-100: no loss)
    frames: Tensor  # (B, T) reference frame of x_{t+2} (-1: none, no anchor loss)
    memory: Tensor  # (B, F, d) encoder output over the real audio
    valid_frames: Tensor  # (B,)
    lengths: Tensor  # (B,) real positions per example


@dataclass
class LossParts:
    total: Tensor
    token: float
    feature: float
    anchor: float


def gaussian_targets(frames: Tensor, valid_frames: Tensor, n_frames: int, sigma: float) -> Tensor:
    """q_t(j) proportional to exp(-(j - c_t)^2 / (2 sigma^2)) over each example's valid frames, zero elsewhere."""
    j = torch.arange(n_frames, device=frames.device, dtype=torch.float32)
    logits = -((j - frames[..., None].float()) ** 2) / (2 * sigma**2)
    valid = j < valid_frames[:, None, None]
    return logits.masked_fill(~valid, float("-inf")).softmax(dim=-1)


def anchor_loss(attention: Tensor, frames: Tensor, valid_frames: Tensor, sigma: float) -> Tensor:
    """Cross-entropy -Σ_j q_t(j) log Ā_t(j), averaged over positions with a reference frame (paper eq. 6).

    attention: (B, T, n_frames) head-averaged audio attention; frames: (B, T), -1 where there is no frame.
    """
    has_frame = frames >= 0
    if not has_frame.any():
        return attention.new_zeros(())
    q = gaussian_targets(frames.clamp_min(0), valid_frames, attention.shape[-1], sigma)
    cross_entropy = -(q * attention.clamp_min(1e-12).log()).sum(dim=-1)
    return cross_entropy[has_frame].mean()


def _chain_mask(depth: int, length: int, device: torch.device) -> Tensor:
    """Which keys a depth-`depth` step at position t sees, over the keys of depths 1..depth stacked.

    Depth 1 keys (true features) up to position t - depth + 1, then one key per later depth d at
    position t - (depth - d): the draft's own chain since the last verification.
    """
    t = torch.arange(length, device=device)[:, None]
    s = torch.arange(length, device=device)[None, :]
    blocks = [s <= t - (depth - 1)] + [s == t - (depth - d) for d in range(2, depth + 1)]
    # Positions before depth - 1 have no chain yet; let them see themselves so that nothing turns NaN.
    blocks[0] = blocks[0] | ((s == t) & (t < depth - 1))
    return torch.cat(blocks, dim=1)


def unrolled_loss(
    draft: Draft, batch: Batch, depths: int, anchor_weight: float, sigma: float, feature_weight: float = 0.5
) -> LossParts:
    """Token cross-entropy + feature smooth-L1 + anchor loss, averaged over the unrolled depths."""
    length = batch.inputs.shape[1]
    device = batch.inputs.device
    positions = torch.arange(length, device=device)
    real = positions[None, :] < batch.lengths[:, None]
    audio = draft.audio_memory(batch.memory) if draft.config.audio else None
    audio_mask = (torch.arange(batch.memory.shape[1], device=device) < batch.valid_frames[:, None])[:, None, :]
    keys, values = [], []
    features = batch.features
    token_losses, feature_losses, anchor_losses = [], [], []
    for depth in range(1, depths + 1):
        x = draft.embed(features, batch.inputs, positions)
        q, k, v = draft.self_qkv(x)
        keys.append(k)
        values.append(v)
        mask = _chain_mask(depth, length, device)
        out = draft.block(x, q, torch.cat(keys, dim=2), torch.cat(values, dim=2), mask, audio, audio_mask)
        # A depth-j step exists only from position j - 1 on; earlier rows see no keys of their own chain.
        targets = batch.targets.masked_fill(positions[None, :] < depth - 1, -100)
        token_losses.append(F.cross_entropy(draft.logits(out.hidden).transpose(1, 2).float(), targets))
        next_features = batch.features[:, 1:]
        has_next = (real[:, 1:] & (positions[None, 1:] >= depth - 1))[..., None]
        feature_error = F.smooth_l1_loss(out.features[:, :-1].float(), next_features.float(), reduction="none")
        feature_losses.append(
            (feature_error * has_next).sum() / (has_next.sum() * next_features.shape[-1]).clamp_min(1)
        )
        if out.attention is not None and anchor_weight > 0:
            frames = batch.frames.masked_fill(positions[None, :] < depth - 1, -1)
            anchor_losses.append(anchor_loss(out.attention, frames, batch.valid_frames, sigma))
        # The next depth reads at position t what this depth predicted at t - 1.
        features = torch.cat([torch.zeros_like(out.features[:, :1]), out.features[:, :-1]], dim=1)
    token = torch.stack(token_losses).mean()
    feature = torch.stack(feature_losses).mean()
    anchor = torch.stack(anchor_losses).mean() if anchor_losses else token.new_zeros(())
    total = token + feature_weight * feature + anchor_weight * anchor
    return LossParts(total, token.item(), feature.item(), anchor.item())


def cosine_lr(step: int, total_steps: int, peak: float, warmup: int = 0) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total_steps - warmup)
    return 0.5 * peak * (1 + math.cos(math.pi * min(1.0, progress)))
