"""Draft training (paper A.3, D.3): the objective, the unrolled draft, and the optimisation loop.

A training example is one utterance seen through the frozen target: its token sequence
(prompt + greedy transcript + end-of-text), the target's decoder states at every layer for each
input position, its encoder output over the real audio, and the reference frame of every token.
At depth 1 the draft reads the target's own features, as at a restart; at depth j > 1 it reads
the features it predicted at depth j - 1 and attends to its own earlier chain, exactly as on its
later steps at inference, so continuation is trained and not only the restart.
"""

import json
import math
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from specasr.cache import atomic_directory
from specasr.draft import (
    Draft,
    DraftConfig,
    DraftOutput,
    last_target_layer,
    load_draft,
    save_draft,
    start_from_target_layer,
)
from specasr.ranks import joined
from specasr.targets import Target
from specasr.trainset import SENTENCES, Example

VARIANTS = {"control": (True, 0.0), "anchordraft": (True, 0.1), "no-audio": (False, 0.0)}  # audio, default lambda
INITS = ("random", "target-layer")
TOKEN_LOSSES = ("ce", "kl")  # on the target's greedy token; from the target's whole next-token distribution


@dataclass
class Batch:
    """Padded examples. T = longest input sequence, F = longest real audio, in frames."""

    features: Tensor  # (B, T, len(taps) * d): clean target features f_t at the draft's taps, the regression targets
    input_features: Tensor  # (B, T, len(taps) * d): the features the draft reads at depth 1 (noised in training)
    inputs: Tensor  # (B, T) the token x_{t+1} read at position t
    targets: Tensor  # (B, T) the token x_{t+2} to predict at position t (-100: no loss)
    frames: Tensor  # (B, T) reference frame of x_{t+2} (-1: none, no anchor loss)
    memory: Tensor  # (B, F, d) encoder output over the real audio
    valid_frames: Tensor  # (B,)
    lengths: Tensor  # (B,) real positions per example
    next_top: Tensor | None = None  # (B, T, d) the target's last layer at t + 1, whose scores predict x_{t+2} (kl)


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
    total, count = anchor_terms(attention, frames, valid_frames, sigma)
    return total / count.clamp_min(1)


def anchor_terms(attention: Tensor, frames: Tensor, valid_frames: Tensor, sigma: float) -> tuple[Tensor, Tensor]:
    """The anchor cross-entropy summed over positions with a reference frame, and how many there are."""
    has_frame = frames >= 0
    q = gaussian_targets(frames.clamp_min(0), valid_frames, attention.shape[-1], sigma)
    cross_entropy = -(q * attention.clamp_min(1e-12).log()).sum(dim=-1)
    return cross_entropy[has_frame].sum(), has_frame.sum()


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


def with_feature_noise(batch: Batch, scale: Tensor, generators: Sequence[torch.Generator]) -> Batch:
    """The batch with Gaussian noise of width `scale` (per feature) on the features the draft reads; the features it
    regresses onto stay clean (paper C.1). Each example draws from its own generator, so its noise does not depend
    on which batch or process it lands in."""
    noise = torch.zeros_like(batch.features)
    for b, (length, generator) in enumerate(zip(batch.lengths.tolist(), generators, strict=True)):
        noise[b, :length] = torch.randn((length, noise.shape[-1]), generator=generator, device=noise.device)
    return replace(batch, input_features=batch.features + scale * noise)


def unroll(
    draft: Draft, batch: Batch, depths: int, audio_masks: Sequence[Tensor] | None = None
) -> Iterator[tuple[DraftOutput, Tensor]]:
    """The draft's outputs at depths 1..`depths`, every position at once, each with the target features it predicts
    from them: at depth j, position t is step j of the chain that restarted at position t - j + 1.

    Depth 1 reads `batch.input_features`; a later depth reads what the one before predicted at t - 1, with the
    token `batch.inputs` holds. audio_masks[j - 1]: (B | 1, T | 1, frames) the frames depth j may attend; the
    valid ones where not given.
    """
    length = batch.inputs.shape[1]
    device = batch.inputs.device
    positions = torch.arange(length, device=device)
    audio = draft.audio_memory(batch.memory) if draft.config.audio else None
    valid = (torch.arange(batch.memory.shape[1], device=device) < batch.valid_frames[:, None])[:, None, :]
    keys, values = [], []
    features = batch.input_features
    for depth in range(1, depths + 1):
        x = draft.embed(features, batch.inputs, positions)
        q, k, v = draft.self_qkv(x)
        keys.append(k)
        values.append(v)
        mask = _chain_mask(depth, length, device)
        audio_mask = valid if audio_masks is None else audio_masks[depth - 1]
        out = draft.block(x, q, torch.cat(keys, dim=2), torch.cat(values, dim=2), mask, audio, audio_mask)
        predicted = draft.predict_features(out.state)
        yield out, predicted
        features = torch.cat([torch.zeros_like(predicted[:, :1]), predicted[:, :-1]], dim=1)


def unrolled_sums(
    draft: Draft, batch: Batch, depths: int, sigma: float, anchor: bool, teacher: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """The token loss, feature smooth-L1 and anchor cross-entropy at each unrolled depth, each summed over the
    batch, and what each sum is averaged over: two (3, depths) tensors. Sums and counts stay apart so that processes
    sharing a batch can divide by the whole batch's counts.

    The token loss is the cross-entropy on the target's greedy token, or with `teacher` ((B, T, draft vocabulary)
    the target's log-probabilities of x_{t+2}) the KL divergence from the target's distribution, at the same
    positions. Every depth regresses onto the clean next features. sigma is in frames.
    """
    positions = torch.arange(batch.inputs.shape[1], device=batch.inputs.device)
    real = positions[None, :] < batch.lengths[:, None]
    next_features = batch.features[:, 1:]
    sums, counts = [], []
    for depth, (out, predicted) in enumerate(unroll(draft, batch, depths), start=1):
        # A depth-j step exists only from position j - 1 on; earlier rows see no keys of their own chain.
        early = positions[None, :] < depth - 1
        targets = batch.targets.masked_fill(early, -100)
        scores = draft.logits(out.hidden).float()
        if teacher is None:
            token = F.cross_entropy(scores.transpose(1, 2), targets, reduction="sum")
        else:
            divergence = F.kl_div(scores.log_softmax(dim=-1), teacher, reduction="none", log_target=True).sum(dim=-1)
            token = divergence[targets != -100].sum()
        has_next = (real[:, 1:] & ~early[:, 1:])[..., None]
        feature_error = F.smooth_l1_loss(predicted[:, :-1].float(), next_features.float(), reduction="none")
        anchor_sum, anchor_count = (
            anchor_terms(out.attention, batch.frames.masked_fill(early, -1), batch.valid_frames, sigma)
            if anchor and out.attention is not None
            else (token.new_zeros(()), targets.new_zeros(()))
        )
        sums.append(torch.stack([token, (feature_error * has_next).sum(), anchor_sum]))
        counts.append(torch.stack([(targets != -100).sum(), has_next.sum() * next_features.shape[-1], anchor_count]))
    return torch.stack(sums, dim=1), torch.stack(counts, dim=1).float()


def weighted_loss(sums: Tensor, counts: Tensor, anchor_weight: float, feature_weight: float) -> LossParts:
    """Each term averaged over its counts at each depth, then over the depths, and weighted."""
    token, feature, anchor = (sums / counts.clamp_min(1)).mean(dim=1)
    total = token + feature_weight * feature + anchor_weight * anchor
    return LossParts(total, token.item(), feature.item(), anchor.item())


def unrolled_loss(
    draft: Draft, batch: Batch, depths: int, anchor_weight: float, sigma: float, feature_weight: float = 0.5
) -> LossParts:
    """Token cross-entropy + feature smooth-L1 + anchor loss, averaged over the unrolled depths."""
    sums, counts = unrolled_sums(draft, batch, depths, sigma, anchor_weight > 0)
    return weighted_loss(sums, counts, anchor_weight, feature_weight)


def cosine_lr(step: int, total_steps: int, peak: float, warmup: int = 0) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total_steps - warmup)
    return 0.5 * peak * (1 + math.cos(math.pi * min(1.0, progress)))


@dataclass
class TrainConfig:
    variant: str = "anchordraft"  # control | anchordraft | no-audio
    epochs: int = 20
    batch_size: int = 12  # the global batch: under torchrun each of N processes takes 1/N of it
    lr: float = 1e-3
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    feature_noise: float = 0.6  # Gaussian noise on the draft's input features, in units of each feature's std
    feature_weight: float = 0.5
    anchor_weight: float | None = None  # lambda; None: the variant's (0.1 for anchordraft, 0 otherwise)
    sigma_ms: float = 400.0  # width of the anchor target: the paper's sigma = 5 on its ~80 ms grid
    unroll: int = 3  # draft depths trained per position
    taps: tuple[int, ...] | None = None  # target decoder layers the draft reads; None: low, middle and top
    ffn_dim: int | None = None  # the draft's feed-forward width; None: d_model (the layer's for target-layer)
    draft_vocab: int = 4096  # most frequent target tokens of the training transcripts; 0 keeps the full vocabulary
    init: str = "random"  # random | target-layer: the block starts as the target's last decoder layer
    token_loss: str = "ce"  # ce | kl (TOKEN_LOSSES)
    seed: int = 0

    def __post_init__(self):
        if self.variant not in VARIANTS:
            raise ValueError(f"unknown variant {self.variant!r}; choose one of {', '.join(VARIANTS)}")
        if self.anchor_weight is None:
            self.anchor_weight = VARIANTS[self.variant][1]  # resolved here, so the checkpoint records the number
        if self.anchor_weight < 0 or (self.anchor_weight > 0 and not self.audio):
            raise ValueError(f"anchor_weight must be >= 0, and 0 for no-audio (no attention); got {self.anchor_weight}")
        if self.init not in INITS:
            raise ValueError(f"unknown init {self.init!r}; choose one of {', '.join(INITS)}")
        if self.token_loss not in TOKEN_LOSSES:
            raise ValueError(f"unknown token loss {self.token_loss!r}; choose one of {', '.join(TOKEN_LOSSES)}")
        if self.sigma_ms <= 0 or self.feature_noise < 0:
            raise ValueError(f"need sigma_ms > 0 and feature_noise >= 0; got {self.sigma_ms}, {self.feature_noise}")

    @property
    def audio(self) -> bool:
        return VARIANTS[self.variant][0]


def draft_vocabulary(
    examples: list[Example], size: int, prompt_length: int, eot: int, backfill: Counter | None = None
) -> list[int] | None:
    """The `size` most frequent predicted tokens of the training transcripts (end-of-text always in), topped up
    from `backfill` counts when the transcripts hold fewer distinct tokens; None keeps the full vocabulary."""
    if size <= 0:
        return None
    counts = Counter(token for e in examples for token in e.tokens[prompt_length:])
    chosen = [eot] + [token for token, _ in counts.most_common() if token != eot]
    chosen += [token for token, _ in (backfill or Counter()).most_common() if token not in counts and token != eot]
    return sorted(chosen[:size])


def corpus_counts(target: Target, sentences: Path = SENTENCES) -> Counter:
    """Token frequencies of the training sentence corpus, as the target's tokenizer splits it."""
    lines = [" " + line.strip() for line in sentences.read_text().splitlines() if line.strip()]
    return Counter(token for ids in target.tokenizer(lines, add_special_tokens=False).input_ids for token in ids)


def collate(
    examples: list[Example], taps: tuple[int, ...], prompt_length: int, to_draft: Tensor, next_top: bool = False
) -> Batch:
    """Pad examples into a Batch: position t reads (f_t, x_{t+1}) and predicts x_{t+2}; with `next_top`, the
    target's last-layer output at t + 1 too (its distribution over x_{t+2})."""
    length = max(len(e.tokens) - 1 for e in examples)
    n_frames = max(e.memory.shape[0] for e in examples)
    d = examples[0].memory.shape[1]
    features = torch.zeros(len(examples), length, len(taps) * d)
    batch = Batch(
        features=features,
        input_features=features,
        inputs=torch.zeros(len(examples), length, dtype=torch.long),
        targets=torch.full((len(examples), length), -100),
        frames=torch.full((len(examples), length), -1),
        memory=torch.zeros(len(examples), n_frames, d),
        valid_frames=torch.tensor([e.memory.shape[0] for e in examples]),
        lengths=torch.tensor([len(e.tokens) - 1 for e in examples]),
        next_top=torch.zeros(len(examples), length, d) if next_top else None,
    )
    for b, e in enumerate(examples):
        n = len(e.tokens) - 1
        tokens = torch.tensor(e.tokens)
        batch.features[b, :n] = e.hidden[:, list(taps)].reshape(n, -1).float()
        batch.inputs[b, :n] = tokens[1:]
        predicted = torch.arange(2, n + 1)  # positions t = 0..n-2 predict tokens 2..n
        keep = predicted >= prompt_length
        batch.targets[b, : n - 1] = torch.where(keep, to_draft[tokens[predicted]], -100)
        frames = torch.tensor([-1 if f is None else f for f in e.frames])
        batch.frames[b, : n - 1] = torch.where(keep, frames[predicted], -1)
        batch.memory[b, : e.memory.shape[0]] = e.memory.float()
        if next_top:
            batch.next_top[b, : n - 1] = e.hidden[1:, -1].float()
    return batch


def feature_scale(examples: list[Example], taps: tuple[int, ...]) -> Tensor:
    """Per-feature standard deviation of the tapped target features over the training data."""
    rows = torch.cat([e.hidden[:, list(taps)].reshape(e.hidden.shape[0], -1).float() for e in examples])
    return rows.std(dim=0)


def check_global_batch(batch_size: int, examples: int, world: int) -> None:
    """Refuse a global batch, or a training set, too small to give each of `world` processes an example: a process
    without one would have no batch (epoch_batches), and the draft would be saved untrained."""
    if batch_size < world:
        raise ValueError(f"the batch size is the global batch: it needs an example for each of {world} processes")
    if examples < world:
        raise ValueError(f"{examples} training examples cannot give each of {world} processes one")


def epoch_batches(n_examples: int, batch_size: int, seed: int, epoch: int, rank: int, world: int) -> list[Tensor]:
    """This process's share of each global batch of an epoch (example indices).

    Every process draws the same order and deals each batch of `batch_size` out in turn, so the shares are disjoint
    and differ in size by at most one. A last batch smaller than `world` is left out: a process would get nothing.
    """
    order = torch.randperm(n_examples, generator=torch.Generator().manual_seed(seed * 1000 + epoch))
    return [batch[rank::world] for batch in order.split(batch_size) if len(batch) >= world]


def noise_generators(
    indices: Tensor, n_examples: int, seed: int, epoch: int, device: torch.device
) -> list[torch.Generator]:
    """One generator per example and epoch, the same in every process."""
    return [torch.Generator(device=device).manual_seed((seed * 1000 + epoch) * n_examples + int(i)) for i in indices]


def train(
    target: Target,
    examples: list[Example],
    config: TrainConfig,
    out: Path,
    data_hash: str,
    sources: dict | None = None,
    every_epoch: bool = False,
) -> Draft:
    """Train one draft on cached examples and save it (and a resumable state) in `out` after every epoch, and with
    `every_epoch` each epoch's draft in out/epoch-N too. `data_hash` and `sources` (each data source's settings) are
    recorded in the checkpoint with the config. Under torchrun each process trains on its share of every batch
    (epoch_batches) and only the first writes."""
    ranks = joined()
    rank, world = ranks.rank, ranks.size
    check_global_batch(config.batch_size, len(examples), world)
    device = target.device
    torch.manual_seed(config.seed)
    shape = {"taps": tuple(config.taps)} if config.taps else {}
    if config.ffn_dim or config.init == "target-layer":
        shape["ffn_dim"] = config.ffn_dim or last_target_layer(target).fc1.out_features
    taps = DraftConfig.for_target(target, **shape).taps
    backfill = corpus_counts(target) if config.draft_vocab else None
    vocab = draft_vocabulary(examples, config.draft_vocab, len(target.prompt), target.eot, backfill)
    settings = {**asdict(config), "data_hash": data_hash, "examples": len(examples), "sources": sources}
    settings = json.loads(json.dumps(settings))  # as the checkpoint's JSON will hold it, for the resume check
    draft_config = DraftConfig.for_target(
        target, audio=config.audio, vocab_ids=vocab, variant=config.variant, training=settings, **shape
    )
    draft = Draft(draft_config).attach(target).train()
    if config.init == "target-layer":
        start_from_target_layer(draft, target)
    optimizer = torch.optim.AdamW(draft.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    start_epoch = _resume(draft, optimizer, out / "resume", target, settings)
    objective = Objective(draft, config, target.frame_seconds, target.frozen_head().final_norm)
    model = DistributedDataParallel(objective) if world > 1 else objective

    draft_ids = torch.tensor(vocab) if vocab else torch.arange(target.vocab_size)
    to_draft = torch.full((target.vocab_size,), -100, dtype=torch.long)  # target id -> draft vocabulary index
    to_draft[draft_ids] = torch.arange(len(draft_ids))
    noise_scale = config.feature_noise * feature_scale(examples, taps).to(device)
    batches_per_epoch = len(epoch_batches(len(examples), config.batch_size, config.seed, 0, rank, world))
    total_steps = config.epochs * batches_per_epoch
    distil = config.token_loss == "kl"  # the batches carry what the target's distribution is scored from
    for epoch in range(start_epoch, config.epochs):
        batches = epoch_batches(len(examples), config.batch_size, config.seed, epoch, rank, world)
        progress = tqdm(batches, desc=f"{config.variant} epoch {epoch + 1}/{config.epochs}", disable=rank != 0)
        for i, indices in enumerate(progress):
            step = epoch * batches_per_epoch + i
            for group in optimizer.param_groups:
                group["lr"] = cosine_lr(step, total_steps, config.lr)
            batch = _to(collate([examples[j] for j in indices], taps, len(target.prompt), to_draft, distil), device)
            noise = noise_generators(indices, len(examples), config.seed, epoch, device)
            batch = with_feature_noise(batch, noise_scale, noise)
            parts = model(batch)
            optimizer.zero_grad(set_to_none=True)
            parts.total.backward()
            torch.nn.utils.clip_grad_norm_(draft.parameters(), config.grad_clip)
            optimizer.step()
            progress.set_postfix(
                loss=f"{parts.total.item():.3f}", tok=f"{parts.token:.3f}", feat=f"{parts.feature:.3f}",
                anchor=f"{parts.anchor:.3f}", utt_s=f"{(progress.format_dict['rate'] or 0) * config.batch_size:.1f}",
            )  # fmt: skip
        if rank == 0:
            with atomic_directory(out / "resume") as scratch:
                save_draft(draft, scratch, dtype=torch.float32)
                save_optimizer(optimizer, epoch + 1, scratch / "optimizer.safetensors")
            if every_epoch:
                stopped = replace(draft.config, training={**settings, "stopped_after": epoch + 1})
                save_draft(draft, out / f"epoch-{epoch + 1}", config=stopped)
    if rank == 0:
        save_draft(draft, out)  # float16: the draft's own weights only
    return draft.eval()


class Objective(nn.Module):
    """The training loss as a module, so that DistributedDataParallel sees the draft's forward pass."""

    def __init__(self, draft: Draft, config: TrainConfig, frame_seconds: float, final_norm: nn.Module | None = None):
        super().__init__()
        self.draft, self.config = draft, config
        self.sigma_frames = config.sigma_ms / 1000 / frame_seconds  # the anchor target's width on the audio grid
        self.final_norm = [final_norm]  # the target's, frozen: in a list, so that it is no submodule to train

    def forward(self, batch: Batch) -> LossParts:
        """The loss over this process's share of the batch. Under torchrun each term is divided by its count over
        the whole global batch (shares hold different numbers of tokens and frames) and scaled by the number of
        processes, which DistributedDataParallel's gradient average divides out again: the gradient is that of one
        process's loss over the global batch. The parts it reports are this process's share, so scaled."""
        c = self.config
        teacher = self.teacher(batch) if c.token_loss == "kl" else None
        sums, counts = unrolled_sums(self.draft, batch, c.unroll, self.sigma_frames, c.anchor_weight > 0, teacher)
        if dist.is_initialized():
            dist.all_reduce(counts)
            sums = sums * dist.get_world_size()
        return weighted_loss(sums, counts, c.anchor_weight, c.feature_weight)

    @torch.no_grad()
    def teacher(self, batch: Batch) -> Tensor:
        """(B, T, draft vocabulary) the target's log-probabilities of x_{t+2}, over the tokens the draft scores."""
        states = self.final_norm[0](batch.next_top.to(self.draft.dtype))
        return self.draft.logits(states).float().log_softmax(dim=-1)


def _to(batch: Batch, device: torch.device) -> Batch:
    return Batch(**{f.name: None if (x := getattr(batch, f.name)) is None else x.to(device) for f in fields(batch)})


def save_optimizer(optimizer: torch.optim.Optimizer, epoch: int, path: Path) -> None:
    """The optimizer's state as safetensors (never pickle), its settings and the epochs done as JSON metadata."""
    state = optimizer.state_dict()
    tensors = {f"{index}.{name}": value for index, slots in state["state"].items() for name, value in slots.items()}
    save_file(tensors, path, metadata={"epoch": str(epoch), "param_groups": json.dumps(state["param_groups"])})


def load_optimizer(optimizer: torch.optim.Optimizer, path: Path) -> int:
    """Restore what save_optimizer wrote; the epochs it had done."""
    with safe_open(path, "pt") as f:
        metadata = f.metadata()
    state = {}
    for key, value in load_file(path).items():
        index, name = key.split(".", 1)
        state.setdefault(int(index), {})[name] = value
    optimizer.load_state_dict({"state": state, "param_groups": json.loads(metadata["param_groups"])})
    return int(metadata["epoch"])


def _resume(draft: Draft, optimizer: torch.optim.Optimizer, folder: Path, target, settings: dict) -> int:
    """Continue from the last finished epoch of an identical run; 0 when there is none."""
    if not (folder / "optimizer.safetensors").is_file():
        return 0
    saved = load_draft(folder, target)
    if saved.config.training != settings:
        raise ValueError(f"{folder} holds a run with other settings; remove it or train into another folder")
    draft.load_state_dict(saved.state_dict())
    return load_optimizer(optimizer, folder / "optimizer.safetensors")
