"""Audio-prefix targets: an audio encoder whose projected output is spliced into a decoder-only LLM's input.

There is no cross-attention: the LLM reads the audio as a span of its own sequence (text before it, the audio
frames, then the prompt), so a new cache runs that prefix once and the "audio attention" of a step is its
self-attention over the audio span. The step is our own over the transformers weights (rotary positions,
grouped key/value heads, Qwen3's per-head norms), with preallocated caches that roll back by length, as
Whisper's. Families: Qwen3-ASR and Voxtral.
"""

from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import (
    AutoProcessor,
    FeatureExtractionMixin,
    GenerationConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    ProcessorMixin,
    Qwen3ASRForConditionalGeneration,
    VoxtralForConditionalGeneration,
)

from specasr.audio import SAMPLE_RATE
from specasr.targets.base import (
    DecoderOutput,
    FrozenHead,
    Target,
    TreeRows,
    attention_mask,
    move_rows,
    step_positions,
)
from specasr.targets.builtin import TargetUnavailableError
from specasr.targets.head import VocabularyHead

WINDOW_SECONDS = 30  # audio per encoder pass, as for Whisper: long clips are decoded in segments


@dataclass
class PrefixCache:
    """Keys/values, a tensor per layer (batch, kv_heads, positions, head_dim; written in place, as Whisper's), of the
    prefix (text before the audio, the audio) followed by the prompt and transcript; `length` counts the latter only,
    so the loops roll back as for Whisper."""

    keys: tuple[Tensor, ...]
    values: tuple[Tensor, ...]
    prefix: int  # positions before the prompt
    audio: slice  # positions of the audio frames
    length: int = 0
    static: bool = False

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2] - self.prefix

    def move(self, source: Tensor, destination: Tensor) -> None:
        move_rows((*self.keys, *self.values), self.prefix + source, self.prefix + destination, dim=2)


def _rotate_half(x: Tensor) -> Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


class PrefixTarget(Target):
    """A frozen audio-prefix LLM. `head`: token ids before the audio; `prompt`: the ids after it, up to where the
    transcript begins. Subclasses say how audio becomes the projected memory and how long its frames are."""

    window_samples = WINDOW_SECONDS * SAMPLE_RATE
    model_class: type[PreTrainedModel]

    def __init__(
        self,
        name: str,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase | None,
        feature_extractor: FeatureExtractionMixin,
        head: Sequence[int],
        prompt: Sequence[int],
        eos_ids: Sequence[int],
        max_length: int = 448,
    ):
        self.name = name
        self.model = model.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.feature_extractor = feature_extractor
        self._llm = model.model.language_model
        config = self._llm.config
        if "sliding_attention" in (getattr(config, "layer_types", None) or []):
            raise ValueError(f"{name}: sliding-window attention layers are not supported")
        self.n_layers = config.num_hidden_layers
        self.n_heads = config.num_attention_heads
        self.n_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.d_model = config.hidden_size
        self.vocab_size = config.vocab_size
        self.max_length = max_length
        self.head = tuple(head)
        self.prompt = tuple(prompt)
        self.eos_ids = torch.tensor(sorted(eos_ids), device=model.device)
        self.eot = min(eos_ids)
        special = set(getattr(tokenizer, "all_special_ids", None) or [])
        self.special_ids = frozenset(special | set(eos_ids))
        self.runtime_layer = self.n_layers - 1
        self.lm_head = VocabularyHead(model.lm_head.weight)

    @classmethod
    def from_pretrained(cls, source: str, dtype: torch.dtype, device: torch.device) -> "PrefixTarget":
        """A local transformers folder or hub id; the prompt is the one its processor builds for transcription."""
        model = cls.model_class.from_pretrained(source, dtype=dtype).to(device)
        processor = AutoProcessor.from_pretrained(source)
        ids = cls.transcription_request(processor, source)
        audio = model.config.audio_token_id
        if audio not in ids:
            raise ValueError(f"the processor's transcription request holds no audio token {audio}")
        head, prompt = ids[: ids.index(audio)], ids[len(ids) - ids[::-1].index(audio) :]
        try:
            eos = GenerationConfig.from_pretrained(source).eos_token_id
        except OSError:
            eos = model.config.text_config.eos_token_id
        eos = list(eos) if isinstance(eos, (list, tuple)) else [eos]
        return cls(source, model, processor.tokenizer, processor.feature_extractor, head, prompt, eos)

    @staticmethod
    @abstractmethod
    def transcription_request(processor: ProcessorMixin, source: str) -> list[int]:
        """Token ids of the processor's English transcription request for one second of silence."""

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    def frozen_head(self) -> FrozenHead:
        return FrozenHead(self._llm.embed_tokens.weight, None, self.model.lm_head.weight, self._llm.norm)

    def greedy_tokens(self, states: Tensor, first_index: int) -> Tensor:
        choice = self.lm_head.choose(states)
        return torch.where(torch.isin(choice, self.eos_ids), self.eot, choice)

    # the cached decoder

    @torch.no_grad()  # inference mode comes from the loop; compiled steps run without it
    def new_cache(self, memory: Tensor, capacity: int | None = None, static: bool = False) -> PrefixCache:
        """Runs the text before the audio and the audio itself once; the prompt comes next."""
        head = self._llm.embed_tokens(torch.tensor([self.head], device=memory.device)).expand(memory.shape[0], -1, -1)
        prefix = torch.cat([head, memory.to(head.dtype)], dim=1)
        n_prefix = prefix.shape[1]
        shape = (memory.shape[0], self.n_kv_heads, n_prefix + (capacity or self.max_length), self.head_dim)
        keys, values = (tuple(head.new_zeros(shape) for _ in range(self.n_layers)) for _ in range(2))
        cache = PrefixCache(keys, values, prefix=0, audio=slice(len(self.head), n_prefix))
        steps = torch.arange(n_prefix, device=memory.device)
        self._layers(prefix, cache, steps, steps, attention_mask(steps, n_prefix, None), (), ())
        cache.prefix, cache.static = n_prefix, static
        return cache

    @torch.no_grad()  # inference mode comes from the loop; compiled steps run without it
    def forward(
        self,
        tokens: Tensor,
        cache: PrefixCache,
        taps: tuple[int, ...] = (),
        attention_layers: tuple[int, ...] = (),
        positions: Tensor | None = None,
        tree: TreeRows | None = None,
    ) -> DecoderOutput:
        slots, end = step_positions(cache, tokens.shape[1], positions, tokens.device)
        visible = cache.keys[0].shape[2] if cache.static else cache.prefix + end
        slots, at = cache.prefix + slots, cache.prefix + (slots if tree is None else tree.positions)
        mask = attention_mask(slots, visible, tree, offset=cache.prefix)
        x, tapped, rows = self._layers(self._llm.embed_tokens(tokens), cache, slots, at, mask, taps, attention_layers)
        return DecoderOutput(
            states=self._llm.norm(x),
            hidden=torch.cat(tapped, dim=-1) if taps else None,
            audio_attention=torch.stack(rows) if attention_layers else None,
        )

    def _layers(
        self,
        x: Tensor,
        cache: PrefixCache,
        slots: Tensor,
        positions: Tensor,
        mask: Tensor,
        taps: tuple[int, ...],
        attention_layers: tuple[int, ...],
    ) -> tuple[Tensor, list[Tensor], list[Tensor]]:
        """The decoder layers over `x` rotated to absolute `positions`, keys/values written into the cache at absolute
        `slots`; each row attends the cache's first positions as `mask` (rows, visible) says."""
        batch, n_new = x.shape[:2]
        visible = mask.shape[1]
        cos, sin = (t.unsqueeze(1) for t in self._llm.rotary_emb(x, positions[None].expand(batch, -1)))
        tapped = [x] if 0 in taps else []
        rows = []
        for i, layer in enumerate(self._llm.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q, k = (
                attn.q_proj(h).view(batch, n_new, -1, self.head_dim),
                attn.k_proj(h).view(batch, n_new, -1, self.head_dim),
            )
            if hasattr(attn, "q_norm"):
                q, k = attn.q_norm(q), attn.k_norm(k)
            q, k = q.transpose(1, 2), k.transpose(1, 2)
            q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
            cache.keys[i].index_copy_(2, slots, k)
            cache.values[i].index_copy_(2, slots, attn.v_proj(h).view(batch, n_new, -1, self.head_dim).transpose(1, 2))
            keys, values = cache.keys[i][:, :, :visible], cache.values[i][:, :, :visible]
            if i in attention_layers:
                groups = self.n_heads // self.n_kv_heads
                keys, values = keys.repeat_interleave(groups, dim=1), values.repeat_interleave(groups, dim=1)
                scores = (q @ keys.transpose(-1, -2)) * attn.scaling
                weights = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)
                out = weights @ values
                rows.append(weights[..., cache.audio].mean(dim=1))
            else:
                out = F.scaled_dot_product_attention(
                    q, keys, values, attn_mask=mask, scale=attn.scaling, enable_gqa=True
                )
            x = x + attn.o_proj(out.transpose(1, 2).reshape(batch, n_new, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
            if i + 1 in taps:
                tapped.append(x)
        return x, tapped, rows


@dataclass
class QwenFeatures:
    input_features: Tensor  # (1, mels, padded frames)
    mask: Tensor  # (1, padded frames): 1 on real audio


class Qwen3ASRTarget(PrefixTarget):
    """Qwen3-ASR: a chunked audio encoder (1 s chunks of 13 frames) projected into a Qwen3 LLM."""

    frame_seconds = 1 / 13  # three stride-2 convolutions turn a 100-frame (1 s) mel chunk into 13 frames
    cut_samples = SAMPLE_RATE  # one encoder chunk
    model_class = Qwen3ASRForConditionalGeneration

    @staticmethod
    def transcription_request(processor: ProcessorMixin, source: str) -> list[int]:
        request = processor.apply_transcription_request(np.zeros(SAMPLE_RATE, np.float32), language="English")
        return request["input_ids"][0].tolist()

    def frames(self, n_samples: int) -> int:
        mel = -(-n_samples // self.feature_extractor.hop_length)
        chunk = 2 * self.model.config.audio_config.n_window
        rest = mel % chunk
        for _ in range(3):
            rest = (rest - 1) // 2 + 1 if rest > 0 else 0
        return mel // chunk * 13 + rest

    def valid_frames(self, n_samples: int) -> int:
        # the feature extractor pads a short clip with silence that the encoder then treats as audio
        return super().valid_frames(max(n_samples, self.feature_extractor.min_length))

    def features(self, audio: np.ndarray) -> QwenFeatures:
        out = self.feature_extractor(audio, sampling_rate=SAMPLE_RATE, return_attention_mask=True)
        return QwenFeatures(out.input_features.to(self.device, self.dtype), out.attention_mask.to(self.device))

    @torch.inference_mode()
    def encode(self, features: QwenFeatures) -> Tensor:
        audio = self.model.model.get_audio_features(features.input_features, features.mask, return_dict=True)
        return audio.pooler_output[None]


class VoxtralTarget(PrefixTarget):
    """Voxtral: a Whisper encoder over 30 s windows, four 20 ms frames stacked into one 80 ms frame of a Llama LLM."""

    frame_seconds = 0.08
    cut_samples = 1280  # 80 ms
    model_class = VoxtralForConditionalGeneration

    @staticmethod
    def transcription_request(processor: ProcessorMixin, source: str) -> list[int]:
        silence = np.zeros(SAMPLE_RATE, np.float32)
        try:
            request = processor.apply_transcription_request(
                audio=silence, model_id=source, language="en", sampling_rate=SAMPLE_RATE, format=["wav"]
            )
        except ImportError as error:
            raise TargetUnavailableError(f"Voxtral's transcription prompt needs mistral-common: {error}") from error
        return request["input_ids"][0].tolist()

    def frames(self, n_samples: int) -> int:
        return -(-n_samples // self.cut_samples)

    def features(self, audio: np.ndarray) -> Tensor:
        mel = self.feature_extractor(audio, sampling_rate=SAMPLE_RATE, return_tensors="pt").input_features
        return mel.to(self.device, self.dtype)

    @torch.inference_mode()
    def encode(self, features: Tensor) -> Tensor:
        return self.model.model.get_audio_features(features, return_dict=True).pooler_output[None]
