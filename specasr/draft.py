"""The draft: one causal block attached to a frozen target (EAGLE-3 style, with audio cross-attention).

At position t the draft reads the target's fused hidden states f_t (or, on its own later steps,
its prediction of them) and the token x_{t+1}, and predicts x_{t+2} through the target's frozen
LM head, plus the target features f_{t+1} for its next step. Its cross-attention reads the
target's encoder output at every step, optionally through a window; the `no-audio` variant has
no cross-attention and is otherwise identical.
"""

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from specasr.targets import DTYPES, Target
from specasr.targets.base import TreeRows, attention_mask, step_positions
from specasr.targets.packed import FBGEMM, PackedLinears, version_stamp
from specasr.trace import DRAFT_PRECISIONS

PACKED_ON_CPU = ("float16", "int8")  # weights fbgemm computes with in float32 on a CPU


@dataclass
class DraftConfig:
    target: str  # the target it was built for
    d_model: int  # the target's width, which the draft shares
    n_heads: int
    ffn_dim: int
    vocab_size: int  # the target's vocabulary
    taps: tuple[int, ...]  # target decoder layers whose outputs are fused (0 = embeddings)
    audio: bool = True
    vocab_ids: list[int] | None = None  # a reduced draft vocabulary, or None for the target's
    variant: str = "random"
    training: dict = field(default_factory=dict)  # settings, data hash and seed of the run that made it

    @classmethod
    def for_target(cls, target: Target, audio: bool = True, **overrides) -> "DraftConfig":
        """Low, middle and top decoder layers, the target's width and heads, a feed-forward as wide as the model."""
        n = target.n_layers
        defaults = {
            "target": target.name,
            "d_model": target.d_model,
            "n_heads": target.n_heads,
            "ffn_dim": target.d_model,
            "vocab_size": target.vocab_size,
            "taps": tuple(sorted({1, (n + 1) // 2, n})),
            "audio": audio,
            "variant": "random" if audio else "no-audio",
        }
        return cls(**{**defaults, **overrides})


class DraftMismatchError(ValueError):
    """A draft that does not fit the target it is attached to."""


@dataclass
class DraftCache:
    """The draft's own self-attention keys/values (batch, heads, positions, head_dim) and its audio keys/values."""

    keys: Tensor
    values: Tensor
    audio_keys: Tensor | None
    audio_values: Tensor | None
    valid_frames: int
    frames: int  # audio frames it holds: the valid ones, or padded to a fixed count
    length: int = 0
    static: bool = False  # attended whole under masks, audio padded: fixed shapes for CUDA graphs

    @property
    def capacity(self) -> int:
        return self.keys.shape[2]


@dataclass
class DraftOutput:
    hidden: Tensor  # (batch, T, d_model): the normed output; `Draft.logits` turns rows of it into token scores
    state: Tensor  # (batch, T, d_model): the block's output before the norm, which the draft's next step reads back
    attention: Tensor | None  # (batch, T, frames): audio attention averaged over heads


class Draft(nn.Module):
    def __init__(self, config: DraftConfig):
        super().__init__()
        self.config = config
        d, n_features = config.d_model, len(config.taps) * config.d_model
        self.fuse = nn.Linear(n_features, d)
        self.combine = nn.Linear(2 * d, d)
        self.self_norm = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.self_out = nn.Linear(d, d)
        if config.audio:
            self.audio_norm = nn.LayerNorm(d)
            self.audio_q = nn.Linear(d, d)
            self.audio_kv = nn.Linear(d, 2 * d)
            self.audio_out = nn.Linear(d, d)
        self.ffn_norm = nn.LayerNorm(d)
        self.ffn = nn.Sequential(nn.Linear(d, config.ffn_dim), nn.GELU(), nn.Linear(config.ffn_dim, d))
        self.out_norm = nn.LayerNorm(d)
        self.feature_head = nn.Linear(d, n_features)
        self.head_dim = d // config.n_heads
        self.precision = "float32"
        self._frozen: dict[str, Tensor | nn.Linear] = {}
        self._folded: dict[bool, tuple[tuple, nn.Linear]] = {}
        self._linear = self._head_linear = PackedLinears()

    def attach(self, target: Target, precision: str | None = None) -> "Draft":
        """Borrow the target's frozen token embedding, positions (if it has learned ones) and LM head (never saved
        with the draft).

        precision: the draft's weights (`DRAFT_PRECISIONS`), the target's dtype by default. On a CPU, float16 and
        int8 weights are packed for fbgemm, which computes in float32 (specasr.targets.packed): a step then reads a
        half or a quarter of float32's bytes. int8 goes to the head alone, the block keeping float16: the head's
        rounding only reorders near-tied tokens, while the block's compounds through the states the draft carries
        from step to step (tiny.en's control, 48 speech clips: L 1.554 with an int8 head as with float16, 1.397
        with every layer in int8). Elsewhere the draft runs in the dtype named, and int8 is refused. Inputs are cast
        where they enter, so the draft's precision may differ from the target's.
        """
        check_fits(self.config, target)
        if precision not in (None, *DRAFT_PRECISIONS):
            choices = ", ".join(DRAFT_PRECISIONS)
            raise DraftMismatchError(f"unknown draft precision {precision!r}; choose one of {choices}")
        head = target.frozen_head()
        packed = precision in PACKED_ON_CPU and head.embedding.device.type == "cpu" and FBGEMM
        if precision == "int8" and not packed:
            raise DraftMismatchError("int8 draft weights run through fbgemm, on a CPU only")
        dtype = torch.float32 if packed else DTYPES[precision] if precision else target.dtype
        self.precision = precision or str(dtype).removeprefix("torch.")
        self._linear = PackedLinears(("float16" if precision == "int8" else precision) if packed else "float32")
        self._head_linear = PackedLinears(precision if packed else "float32")
        vocab = self.config.vocab_ids
        draft_ids = torch.arange(self.config.vocab_size) if vocab is None else torch.tensor(vocab)
        draft_ids = draft_ids.to(head.embedding.device)
        lm_head = (head.lm_head if vocab is None else head.lm_head[draft_ids]).to(dtype)
        self._frozen = {
            "embedding": head.embedding,
            "vocab_ids": draft_ids,  # draft vocabulary index -> target token id
            "lm_head": frozen_linear(lm_head),
        }
        if head.positions is not None:  # a rotary target's positions live in its features and the draft's order
            self._frozen["positions"] = head.positions
        return self.to(head.embedding.device, dtype)

    @property
    def dtype(self) -> torch.dtype:
        return self.fuse.weight.dtype

    @property
    def name(self) -> str:
        return f"{self.config.target}/{self.config.variant}@{self.weights_hash()[:10]}"

    def weights_hash(self) -> str:
        digest = hashlib.sha256()
        for key, tensor in sorted(self.state_dict().items()):
            digest.update(key.encode())
            digest.update(tensor.detach().to(torch.float32).cpu().numpy().tobytes())
        return digest.hexdigest()

    def vocab_to_target(self, draft_tokens: Tensor) -> Tensor:
        return self._frozen["vocab_ids"][draft_tokens]

    def new_cache(self, memory: Tensor, valid_frames: int, capacity: int, frames: int | None = None) -> DraftCache:
        """An empty cache for one clip; the audio keys/values are projected once here, for the valid frames only
        (the draft never attends padding, so it need not keep it). With `frames`, a static cache: the audio is
        padded to that many frames and every step attends the whole cache under masks (CUDA graphs)."""
        memory = memory[:, :valid_frames]
        if frames is not None:
            memory = F.pad(memory, (0, 0, 0, frames - valid_frames))
        shape = (memory.shape[0], self.config.n_heads, capacity, self.head_dim)
        audio_keys, audio_values = self.audio_memory(memory) if self.config.audio else (None, None)
        keys, values = memory.new_zeros(shape, dtype=self.dtype), memory.new_zeros(shape, dtype=self.dtype)
        static = frames is not None
        return DraftCache(keys, values, audio_keys, audio_values, valid_frames, memory.shape[1], static=static)

    def audio_memory(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """The encoder output (batch, frames, d_model) projected to audio keys and values in the draft's precision,
        split into heads. A float16 draft projects a float32 target's output in float32: on a CPU, float16 products
        of many rows are slower (tiny.en, a 2.3 s clip: 2.1 ms against 0.9)."""
        if memory.dtype == self.dtype:
            projected = self._linear(self.audio_kv, memory)
        else:
            weight, bias = self.audio_kv.weight.to(memory.dtype), self.audio_kv.bias.to(memory.dtype)
            projected = F.linear(memory, weight, bias).to(self.dtype)
        keys, values = projected.split(self.config.d_model, dim=-1)
        return self._heads(keys), self._heads(values)

    def _heads(self, x: Tensor) -> Tensor:
        return x.view(x.shape[0], x.shape[1], self.config.n_heads, self.head_dim).transpose(1, 2)

    def _merge(self, x: Tensor) -> Tensor:
        return x.transpose(1, 2).reshape(x.shape[0], x.shape[2], self.config.d_model)

    def embed(self, features: Tensor, tokens: Tensor, positions: Tensor, carried: bool = False) -> Tensor:
        """The block's input from target features (batch, T, F), tokens x_{t+1} (batch, T) and positions t (T,).

        carried: `features` are the states of the draft's own last steps (`DraftOutput.state`), whose target
        features it predicts with its feature head first. Where no gradients are recorded (and torch.compile does
        not trace), the feature head, fusion and combination run as the one linear layer they make together
        (`_folded_inputs`).
        """
        embedded = self._frozen["embedding"][tokens]
        if "positions" in self._frozen:  # rows past the table only pad a block or run past the length limit
            table = self._frozen["positions"]
            embedded = embedded + table[positions.clamp(max=table.shape[0] - 1)]
        inputs = torch.cat([features.to(self.dtype), embedded.to(self.dtype)], dim=-1)
        recording = torch.is_grad_enabled() and self.fuse.weight.requires_grad
        if not (recording or torch.compiler.is_compiling()):  # inductor folds what it traces itself
            return self._linear(self._folded_inputs(carried), inputs)
        features, embedded = inputs.split([features.shape[-1], self.config.d_model], dim=-1)
        if carried:
            features = self.predict_features(features)
        return self._linear(self.combine, torch.cat([self._linear(self.fuse, features), embedded], dim=-1))

    def predict_features(self, state: Tensor) -> Tensor:
        """(…, len(taps) * d_model): the target features the draft predicts for the next position from its state."""
        return self._linear(self.feature_head, state)

    def _folded_inputs(self, carried: bool) -> nn.Linear:
        """fuse then combine (after the feature head, for carried states) as one linear layer over the features and
        the token embedding side by side: a product of linear maps is a linear map, so a step runs one product
        where it ran two or three (the same step, but for rounding). Folded again once a weight has changed."""
        sources = [self.fuse, self.combine, *([self.feature_head] if carried else [])]
        stamp = tuple(version_stamp(t) for layer in sources for t in (layer.weight, layer.bias))
        kept = self._folded.get(carried)
        if kept is None or kept[0] != stamp:
            kept = self._folded[carried] = (stamp, self._fold(carried))
        return kept[1]

    @torch.no_grad()
    def _fold(self, carried: bool) -> nn.Linear:
        fuse, fuse_bias = self.fuse.weight.double(), self.fuse.bias.double()
        if carried:
            head = self.feature_head
            fuse, fuse_bias = fuse @ head.weight.double(), fuse @ head.bias.double() + fuse_bias
        from_fused, from_token = self.combine.weight.double().split(self.config.d_model, dim=1)
        weight = torch.cat([from_fused @ fuse, from_token], dim=1)
        bias = from_fused @ fuse_bias + self.combine.bias.double()
        layer = nn.Linear(weight.shape[1], weight.shape[0], device="meta")
        layer.weight = nn.Parameter(weight.to(self.dtype), requires_grad=False)
        layer.bias = nn.Parameter(bias.to(self.dtype), requires_grad=False)
        return layer

    def self_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        projected = self._linear(self.qkv, self.self_norm(x))
        return tuple(self._heads(p) for p in projected.split(self.config.d_model, dim=-1))

    def block(
        self,
        x: Tensor,
        q: Tensor,
        keys: Tensor,
        values: Tensor,
        self_mask: Tensor,
        audio: tuple[Tensor, Tensor] | None,
        audio_mask: Tensor | None,
    ) -> DraftOutput:
        """The rest of the block once queries and the visible keys/values are known.

        self_mask: (…, T, keys) which keys each step sees, None for all; audio_mask: (batch | 1, T | 1, frames) which
        frames, None for all.
        """
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=self_mask)
        x = x + self._linear(self.self_out, self._merge(out))
        attention = None
        if self.config.audio:
            audio_keys, audio_values = audio
            q = self._heads(self._linear(self.audio_q, self.audio_norm(x)))
            scores = (q @ audio_keys.transpose(-1, -2)) * self.head_dim**-0.5
            if audio_mask is not None:
                scores = scores.masked_fill(~audio_mask.unsqueeze(1), float("-inf"))
            weights = scores.softmax(dim=-1)
            x = x + self._linear(self.audio_out, self._merge(weights @ audio_values))
            attention = weights.mean(dim=1)
        inner, activation, outer = self.ffn
        x = x + self._linear(outer, activation(self._linear(inner, self.ffn_norm(x))))
        return DraftOutput(hidden=self.out_norm(x), state=x, attention=attention)

    def forward(
        self,
        features: Tensor,
        tokens: Tensor,
        cache: DraftCache,
        window: Tensor | None = None,
        positions: Tensor | None = None,
        tree: TreeRows | None = None,
        carried: bool = False,
    ) -> DraftOutput:
        """Steps at slots cache.length.. for target features (batch, T, F) and tokens x_{t+1} (batch, T), or with
        `carried` for the states of the draft's own last steps (`DraftOutput.state`, (batch, T, d_model)).

        window: (batch, T, frames) boolean over the cache's audio frames, the ones each step may attend; None
        allows every valid frame.
        positions: (T,) the steps' slots as a device tensor (a CUDA graph's input); the caller then keeps
        cache.length, which a step without them advances itself. Without a tree a step sits at its slot and sees
        every slot up to its own.
        tree: the steps' own positions and what they see, where they expand a tree of candidates.
        """
        slots, end = step_positions(cache, tokens.shape[1], positions, tokens.device)
        x = self.embed(features, tokens, slots if tree is None else tree.positions, carried)
        q, k, v = self.self_qkv(x)
        cache.keys.index_copy_(2, slots, k)
        cache.values.index_copy_(2, slots, v)
        visible = cache.capacity if cache.static else end
        last_row = tree is None and not cache.static and tokens.shape[1] == 1  # sees every key: no mask to build
        mask = None if last_row else attention_mask(slots, visible, tree)
        audio = (cache.audio_keys, cache.audio_values) if self.config.audio else None
        if window is None and cache.static:  # a static cache holds padding frames too
            window = (torch.arange(cache.frames, device=x.device) < cache.valid_frames)[None, None]
        return self.block(x, q, cache.keys[:, :, :visible], cache.values[:, :, :visible], mask, audio, window)

    def logits(self, hidden: Tensor) -> Tensor:
        """Scores over the draft vocabulary through the target's frozen LM head; only for the rows that need them."""
        return self._head_linear(self._frozen["lm_head"], hidden)


def frozen_linear(weight: Tensor) -> nn.Linear:
    """A bias-free linear layer over a frozen weight (the target's LM head rows the draft scores)."""
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
    layer.weight = nn.Parameter(weight, requires_grad=False)
    return layer


def check_fits(config: DraftConfig, target: Target) -> None:
    problems = []
    if config.d_model != target.d_model:
        problems.append(f"hidden size {config.d_model} vs the target's {target.d_model}")
    if config.vocab_size != target.vocab_size:
        problems.append(f"vocabulary {config.vocab_size} vs the target's {target.vocab_size}")
    taps = list(config.taps)
    if not taps or taps != sorted(set(taps)) or not 0 <= taps[0] <= taps[-1] <= target.n_layers:
        problems.append(f"layer taps {config.taps} are not increasing layers of the target's {target.n_layers}")
    if config.vocab_ids is not None and not all(0 <= i < target.vocab_size for i in config.vocab_ids):
        problems.append(f"draft vocabulary ids outside the target's {target.vocab_size} tokens")
    if problems:
        raise DraftMismatchError(
            f"draft for {config.target!r} does not fit target {target.name!r}: " + "; ".join(problems)
        )


def last_target_layer(target: Target) -> nn.Module:
    """The target's last decoder layer, for a draft to start from; Whisper targets only, whose layers have the
    draft's shape (self-attention, audio cross-attention, feed-forward)."""
    from specasr.targets.whisper import WhisperTarget

    if not isinstance(target, WhisperTarget):
        raise DraftMismatchError(f"only a Whisper target lends the draft a layer of its shape, not {target.name!r}")
    return target.model.model.decoder.layers[-1]


@torch.no_grad()
def start_from_target_layer(draft: Draft, target: Target) -> None:
    """Start the draft's block as a copy of the target's last decoder layer and the decoder's final norm: a trained
    reader of the audio, where a random block must learn to read it from a few thousand clips. The fusion starts as
    the top tap plus the token embedding, the residual stream the layer is used to. A draft with a narrower
    feed-forward keeps the layer's units whose input and output weights have the largest norms; a no-audio draft
    takes all but the cross-attention."""
    layer = last_target_layer(target)
    width = layer.fc1.out_features
    if draft.config.ffn_dim > width:
        raise DraftMismatchError(f"feed-forward width {draft.config.ffn_dim} is more than the layer's {width}")
    strength = layer.fc1.weight.norm(dim=1) * layer.fc2.weight.norm(dim=0)
    units = strength.topk(draft.config.ffn_dim).indices.sort().values

    def copy(weights: list[Tensor], biases: list[Tensor | None], into: nn.Linear) -> None:
        into.weight.copy_(torch.cat(weights))
        into.bias.copy_(
            torch.cat([b if b is not None else torch.zeros_like(w[:, 0]) for w, b in zip(weights, biases, strict=True)])
        )

    def linear(*modules: nn.Linear, into: nn.Linear) -> None:
        copy([m.weight for m in modules], [m.bias for m in modules], into)

    attn = layer.self_attn
    linear(attn.q_proj, attn.k_proj, attn.v_proj, into=draft.qkv)
    linear(attn.out_proj, into=draft.self_out)
    copy([layer.fc1.weight[units]], [layer.fc1.bias[units]], draft.ffn[0])
    copy([layer.fc2.weight[:, units]], [layer.fc2.bias], draft.ffn[2])
    norms = [(layer.self_attn_layer_norm, draft.self_norm), (layer.final_layer_norm, draft.ffn_norm)]
    norms.append((target.model.model.decoder.layer_norm, draft.out_norm))
    if draft.config.audio:
        cross = layer.encoder_attn
        linear(cross.q_proj, into=draft.audio_q)
        linear(cross.k_proj, cross.v_proj, into=draft.audio_kv)
        linear(cross.out_proj, into=draft.audio_out)
        norms.append((layer.encoder_attn_layer_norm, draft.audio_norm))
    for source, norm in norms:
        norm.load_state_dict(source.state_dict())
    d = draft.config.d_model
    identity = torch.eye(d, device=draft.fuse.weight.device)
    draft.fuse.weight.zero_()
    draft.fuse.weight[:, -d:] = identity  # the last tap
    draft.combine.weight.copy_(torch.cat([identity, identity], dim=1))
    draft.fuse.bias.zero_()
    draft.combine.bias.zero_()


def random_draft(target: Target, audio: bool = True, seed: int = 0, precision: str | None = None, **overrides) -> Draft:
    """An untrained draft with seeded weights: valid for lossless checks, useless for speed."""
    torch.manual_seed(seed)
    return Draft(DraftConfig.for_target(target, audio=audio, **overrides)).attach(target, precision).eval()


def save_draft(draft: Draft, path: Path, dtype: torch.dtype = torch.float16, config: DraftConfig | None = None) -> None:
    """The draft's own weights as safetensors plus its config (or `config`) as JSON (never the target's weights)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.detach().to(dtype).cpu().contiguous() for k, v in draft.state_dict().items()}, path / "draft.safetensors"
    )
    (path / "config.json").write_text(json.dumps(asdict(config or draft.config), indent=2))


def load_draft(path: Path, target: Target, precision: str | None = None) -> Draft:
    """A saved draft attached to `target` (in `precision`, the target's dtype by default); fails clearly when it was
    made for a different target."""
    path = Path(path)
    config_file, weights_file = path / "config.json", path / "draft.safetensors"
    if not (config_file.is_file() and weights_file.is_file()):
        raise FileNotFoundError(f"{path} is not a draft checkpoint (expected config.json and draft.safetensors)")
    try:
        raw = json.loads(config_file.read_text())
        config = DraftConfig(**{**raw, "taps": tuple(raw["taps"])})
    except (json.JSONDecodeError, TypeError, KeyError) as error:
        raise DraftMismatchError(f"{config_file} is not a valid draft config: {error}") from error
    check_fits(config, target)
    draft = Draft(config)
    try:
        weights = load_file(weights_file)
    except SafetensorError as error:
        raise DraftMismatchError(f"cannot read {weights_file}: {error}") from error
    try:
        draft.load_state_dict(weights)
    except RuntimeError as error:
        raise DraftMismatchError(f"{weights_file} does not match its config: {error}") from error
    return draft.attach(target, precision).eval().requires_grad_(False)


SHIPPED_DRAFTS = Path(__file__).resolve().parents[1] / "drafts"


def shipped_drafts(target: str | None = None) -> list[str]:
    """Names of the drafts that come with specasr ("whisper-tiny.en/anchordraft", ...), for one target or all."""
    names = sorted(str(p.parent.relative_to(SHIPPED_DRAFTS)) for p in SHIPPED_DRAFTS.glob("*/*/config.json"))
    return [n for n in names if target is None or n.startswith(f"{target}/")]


def resolve_draft(name: str, target: Target, precision: str | None = None) -> Draft:
    """A draft by name: `random` / `random-no-audio`, a shipped name, or a checkpoint folder."""
    if name in ("random", "random-no-audio"):
        return random_draft(target, audio=name == "random", precision=precision)
    shipped = SHIPPED_DRAFTS / name
    return load_draft(shipped if (shipped / "config.json").is_file() else Path(name), target, precision)
