"""A Whisper target: features, encoder, and a cached decoder step over transformers weights.

The decoder step is our own (as in openai/whisper's model.py) rather than transformers'
forward: it owns preallocated key/value caches, so rounds can roll back by length and later
be captured as CUDA graphs, and it can hand out per-layer hidden states and cross-attention.
"""

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration, WhisperTokenizer

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
from specasr.targets.head import VocabularyHead
from specasr.targets.packed import PackedLinears

HOP_LENGTH = 160  # samples per mel frame
ENCODER_STRIDE = 2  # mel frames per encoder frame
SAMPLES_PER_FRAME = HOP_LENGTH * ENCODER_STRIDE  # 20 ms per encoder frame
WINDOW_FRAMES = 1500  # encoder frames in one 30 s window


@dataclass
class KVCache:
    """Self-attention keys/values up to a fixed capacity, and one clip's cross-attention keys/values.

    Shapes: the self-attention's a tensor per layer (batch, heads, positions, head_dim), so that a compiled step writes
    a layer in place rather than copying a stacked cache whole; the cross-attention's (layers, batch, heads, frames,
    head_dim). Entries at or beyond `length` are stale; rolling back is just lowering `length`. A static cache is
    always attended whole, under a mask, so that a step's shapes never change (CUDA graphs).
    """

    self_keys: tuple[Tensor, ...]
    self_values: tuple[Tensor, ...]
    cross_keys: Tensor
    cross_values: Tensor
    length: int = 0
    static: bool = False

    @property
    def capacity(self) -> int:
        return self.self_keys[0].shape[2]

    def move(self, source: Tensor, destination: Tensor) -> None:
        move_rows((*self.self_keys, *self.self_values), source, destination, dim=2)


class WhisperTarget(Target):
    """A frozen Whisper model set up for English transcription without timestamps."""

    frame_seconds = SAMPLES_PER_FRAME / SAMPLE_RATE
    cut_samples = SAMPLES_PER_FRAME
    window_samples = WINDOW_FRAMES * SAMPLES_PER_FRAME  # what one encoder pass hears: 30 s

    def __init__(
        self,
        name: str,
        model: WhisperForConditionalGeneration,
        tokenizer: WhisperTokenizer,
        feature_extractor: WhisperFeatureExtractor,
    ):
        self.name = name
        self.model = model.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.feature_extractor = feature_extractor
        config, generation = model.config, model.generation_config
        self.n_layers = config.decoder_layers
        self.n_heads = config.decoder_attention_heads
        self.d_model = config.d_model
        self.head_dim = self.d_model // self.n_heads
        self.vocab_size = config.vocab_size
        self.max_length = generation.max_length or config.max_target_positions
        self.eot = generation.eos_token_id
        self.prompt = self._prompt(generation)
        self.suppress = self._vocab_mask(generation.suppress_tokens)
        self.begin_suppress = self._vocab_mask(generation.begin_suppress_tokens)
        self.special_ids = frozenset(tokenizer.all_special_ids) | frozenset(range(self.eot, self.vocab_size))
        self.runtime_layer = self.n_layers - 1  # read by the runtime window; built-ins set the one chosen on data
        self._encoder, self._decoder = model.model.encoder, model.model.decoder
        self.lm_head = VocabularyHead(self._decoder.embed_tokens.weight)
        self._linear = PackedLinears()
        self._mel_filters = torch.from_numpy(feature_extractor.mel_filters.T).float().to(self.device)

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    def _prompt(self, generation) -> tuple[int, ...]:
        prompt = [generation.decoder_start_token_id]
        if getattr(generation, "is_multilingual", False):
            prompt += [generation.lang_to_id["<|en|>"], generation.task_to_id["transcribe"]]
        return (*prompt, generation.no_timestamps_token_id)

    def _vocab_mask(self, token_ids: list[int] | None) -> Tensor:
        mask = torch.zeros(self.vocab_size, dtype=torch.bool)
        mask[list(token_ids or [])] = True
        return mask.to(self.model.device)

    # audio -> features -> encoder memory

    def samples(self, audio: np.ndarray) -> Tensor:
        return torch.from_numpy(audio).to(self.device)

    def features(self, audio: np.ndarray | Tensor) -> Tensor:
        """Log-mel features of 16 kHz audio padded to Whisper's 30 s window, (1, mels, 3000), on the target's device:
        the arithmetic of transformers' feature extractor (without its dither, which Whisper leaves off)."""
        extractor = self.feature_extractor
        audio = torch.as_tensor(audio, dtype=torch.float32, device=self.device)[: extractor.n_samples]
        audio = F.pad(audio, (0, extractor.n_samples - len(audio)))
        window = torch.hann_window(extractor.n_fft, device=audio.device)
        stft = torch.stft(audio, extractor.n_fft, extractor.hop_length, window=window, return_complex=True)
        power = (stft[..., :-1].abs() ** 2).contiguous()
        mel = (self._mel_filters.to(audio.device) @ power).clamp(min=1e-10).log10()
        mel = torch.maximum(mel, mel.max() - 8.0)
        return ((mel + 4.0) / 4.0)[None].to(self.dtype)

    def frames(self, n_samples: int) -> int:
        return -(-n_samples // SAMPLES_PER_FRAME)

    @torch.inference_mode()
    def encode(self, features: Tensor) -> Tensor:
        """transformers' encoder pass, its linear layers through `PackedLinears`."""
        encoder, linear = self._encoder, self._linear
        x = F.gelu(encoder.conv2(F.gelu(encoder.conv1(features)))).transpose(1, 2)
        x = x + encoder.embed_positions.weight
        for layer in encoder.layers:
            attn = layer.self_attn
            h = layer.self_attn_layer_norm(x)
            q, k, v = (self._heads(linear(proj, h)) for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
            x = x + linear(attn.out_proj, self._merge_heads(F.scaled_dot_product_attention(q, k, v)))
            h = layer.final_layer_norm(x)
            x = x + linear(layer.fc2, layer.activation_fn(linear(layer.fc1, h)))
            if x.dtype == torch.float16:  # as transformers does, against overflow
                limit = torch.finfo(x.dtype).max - 1000
                x = x.clamp(-limit, limit)
        return encoder.layer_norm(x)

    # the cached decoder

    @torch.no_grad()  # inference mode comes from the loop; compiled steps run without it
    def new_cache(self, memory: Tensor, capacity: int | None = None, static: bool = False) -> KVCache:
        """Empty self-attention cache, and cross-attention keys/values computed once for this clip."""
        batch, capacity = memory.shape[0], capacity or self.max_length
        shape = (batch, self.n_heads, capacity, self.head_dim)
        cross_keys, cross_values = [], []
        for layer in self._decoder.layers:
            attn = layer.encoder_attn
            cross_keys.append(self._heads(self._linear(attn.k_proj, memory)))
            cross_values.append(self._heads(self._linear(attn.v_proj, memory)))
        return KVCache(
            self_keys=tuple(memory.new_zeros(shape) for _ in range(self.n_layers)),
            self_values=tuple(memory.new_zeros(shape) for _ in range(self.n_layers)),
            cross_keys=torch.stack(cross_keys),
            cross_values=torch.stack(cross_values),
            static=static,
        )

    def _heads(self, x: Tensor) -> Tensor:
        return x.view(x.shape[0], x.shape[1], self.n_heads, self.head_dim).transpose(1, 2)

    def _merge_heads(self, x: Tensor) -> Tensor:
        return x.transpose(1, 2).reshape(x.shape[0], x.shape[2], self.d_model)

    @torch.no_grad()  # inference mode comes from the loop; compiled steps run without it
    def forward(
        self,
        tokens: Tensor,
        cache: KVCache,
        taps: tuple[int, ...] = (),
        attention_layers: tuple[int, ...] = (),
        positions: Tensor | None = None,
        tree: TreeRows | None = None,
    ) -> DecoderOutput:
        slots, end = step_positions(cache, tokens.shape[1], positions, tokens.device)
        decoder, linear = self._decoder, self._linear
        table = decoder.embed_positions.weight
        # Rows past the last position exist only as padding of a fixed-size verification block; their outputs are
        # never read.
        at = slots if tree is None else tree.positions
        x = decoder.embed_tokens(tokens) + table[at.clamp(max=table.shape[0] - 1)]
        visible = cache.capacity if cache.static else end
        mask = attention_mask(slots, visible, tree)
        tapped = [x] if 0 in taps else []
        attention_rows = []
        for i, layer in enumerate(decoder.layers):
            attn = layer.self_attn
            h = layer.self_attn_layer_norm(x)
            q = self._heads(linear(attn.q_proj, h) * attn.scaling)
            keys, values = cache.self_keys[i], cache.self_values[i]
            keys.index_copy_(2, slots, self._heads(linear(attn.k_proj, h)))
            values.index_copy_(2, slots, self._heads(linear(attn.v_proj, h)))
            out = F.scaled_dot_product_attention(
                q, keys[:, :, :visible], values[:, :, :visible], attn_mask=mask, scale=1.0
            )
            x = x + linear(attn.out_proj, self._merge_heads(out))

            attn = layer.encoder_attn
            q = self._heads(linear(attn.q_proj, layer.encoder_attn_layer_norm(x)) * attn.scaling)
            if i in attention_layers:
                weights = torch.softmax(q @ cache.cross_keys[i].transpose(-1, -2), dim=-1)
                out = weights @ cache.cross_values[i]
                attention_rows.append(weights.mean(dim=1))
            else:
                out = F.scaled_dot_product_attention(q, cache.cross_keys[i], cache.cross_values[i], scale=1.0)
            x = x + linear(attn.out_proj, self._merge_heads(out))

            h = layer.final_layer_norm(x)
            x = x + linear(layer.fc2, layer.activation_fn(linear(layer.fc1, h)))
            if i + 1 in taps:
                tapped.append(x)
        return DecoderOutput(
            states=decoder.layer_norm(x),
            hidden=torch.cat(tapped, dim=-1) if taps else None,
            audio_attention=torch.stack(attention_rows) if attention_layers else None,
        )

    def greedy_tokens(self, states: Tensor, first_index: int) -> Tensor:
        """Whisper's greedy choice for each row of final states (batch, T, d_model).

        first_index: how many tokens were generated before the first row; at 0 the tokens
        Whisper never starts with (blank, end-of-text) are suppressed too, as `generate` does.
        """
        banned = self.suppress.expand(states.shape[1], -1)
        if first_index == 0:
            banned = torch.cat([(self.suppress | self.begin_suppress)[None], banned[1:]])
        return self.lm_head.choose(states, banned)

    def frozen_head(self) -> FrozenHead:
        decoder = self._decoder
        weight = decoder.embed_tokens.weight
        return FrozenHead(weight, decoder.embed_positions.weight, weight, decoder.layer_norm)
