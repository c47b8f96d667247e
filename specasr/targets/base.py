"""The target protocol: what the loops, the draft, training, alignment and the dashboard ask of a frozen recognizer.

An adapter (Whisper, or an audio-prefix LLM such as Qwen3-ASR and Voxtral) turns a window of audio into an
audio memory (frames of its own duration), owns a cached decoder step over blocks of tokens, and lends the
draft its frozen token embedding, positions (if any) and LM head.
"""

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor

from specasr.targets.head import VocabularyHead


@dataclass
class DecoderOutput:
    states: Tensor  # (batch, tokens, d_model): final decoder states, the LM head's input (`Target.logits`)
    hidden: Tensor | None  # (batch, tokens, len(taps) * d_model): outputs of the tapped layers, concatenated
    audio_attention: Tensor | None  # (attention_layers, batch, tokens, frames): over the audio, averaged over heads


@dataclass
class FrozenHead:
    """The target's pieces a draft borrows and never saves."""

    embedding: Tensor  # (vocab, d_model) token embedding
    positions: Tensor | None  # (max positions, d_model) learned positions; None where the target rotates them
    lm_head: Tensor  # (vocab, d_model)
    final_norm: Any  # the norm from the last decoder layer's output to the LM head's input (distillation reads it)


@dataclass(frozen=True)
class TreeRows:
    """The rows of a step that belong to a tree of candidates grown above the committed prefix: each row sits at its
    own position in the sequence and sees every slot before `base` and, of the tree's slots base, base + 1, ...,
    the ones `sees` marks (the row itself and its ancestors). A chain is the tree whose rows see every row before."""

    positions: Tensor  # (T,) the rows' positions in the sequence (position embeddings, rotations)
    base: int | Tensor  # the tree's first slot; a device tensor of one element in a captured step
    sees: Tensor  # (T, span) bool


def attention_mask(slots: Tensor, visible: int, tree: TreeRows | None, offset: int = 0) -> Tensor:
    """(T, visible) which of the cache's first `visible` slots each row attends: up to its own slot, or under a
    tree its committed prefix and the tree slots it sees. `offset`: slots before the cache's first step (a prefix)."""
    columns = torch.arange(visible, device=slots.device)
    if tree is None:
        return columns <= slots[:, None]
    inside = columns - offset - tree.base
    span = tree.sees.shape[1]
    in_tree = (inside >= 0) & (inside < span)
    return (inside < 0) | (in_tree & tree.sees[:, inside.clamp(0, span - 1)])


def move_rows(tensors: tuple[Tensor, ...], source: Tensor, destination: Tensor, dim: int) -> None:
    """Copy the cache rows at slots `source` to slots `destination` along `dim`, on the device."""
    for tensor in tensors:
        tensor.index_copy_(dim, destination, tensor.index_select(dim, source))


class DecoderCache(Protocol):
    """A target's key/value cache; the loops read its capacity, roll it back by lowering `length` and, after a tree's
    verification, move the accepted path's rows into place."""

    length: int

    @property
    def capacity(self) -> int: ...

    def move(self, source: Tensor, destination: Tensor) -> None:
        """The rows at slots `source` copied to slots `destination` (counted as `length` counts)."""


class Target(ABC):
    """A frozen recognizer as the loops see it; adapters fill in the abstract parts."""

    name: str
    n_layers: int  # decoder layers
    n_heads: int
    d_model: int  # decoder width; the draft shares it
    vocab_size: int
    max_length: int  # prompt + transcript tokens one window may hold
    eot: int
    prompt: tuple[int, ...]  # the tokens the loops feed first; the transcript follows them
    special_ids: frozenset[int]
    runtime_layer: int  # decoder layer (0-based) whose audio attention the runtime window reads
    tokenizer: Any  # a transformers tokenizer: encode / decode / __call__
    lm_head: VocabularyHead
    frame_seconds: float  # duration of one audio-memory frame
    window_samples: int  # the longest audio one encoder pass hears
    cut_samples: int  # audio is cut into windows at multiples of this, so no frame is split

    @property
    @abstractmethod
    def device(self) -> torch.device: ...

    @property
    @abstractmethod
    def dtype(self) -> torch.dtype: ...

    @abstractmethod
    def frames(self, n_samples: int) -> int:
        """Audio-memory frames that cover `n_samples` of audio (no window limit)."""

    @property
    def folder_name(self) -> str:
        """The target's name as one folder name (a local path or hub id holds slashes)."""
        return self.name.replace("/", "_")

    def valid_frames(self, n_samples: int) -> int:
        """Frames of one window that cover real audio (a window holds at most `window_samples`)."""
        return self.frames(min(n_samples, self.window_samples))

    def samples(self, audio: np.ndarray) -> np.ndarray | Tensor:
        """A clip's 16 kHz audio as `features` reads it, window by window: the samples themselves here; a target that
        computes its features on its device moves the clip there, once."""
        return audio

    @abstractmethod
    def features(self, audio: np.ndarray | Tensor) -> Any:
        """The encoder's input for one window of 16 kHz audio (`samples` of a clip, or plain samples)."""

    @abstractmethod
    def encode(self, features: Any) -> Tensor:
        """The audio memory (1, frames, d_model) the decoder reads and the draft attends."""

    @abstractmethod
    def new_cache(self, memory: Tensor, capacity: int | None = None, static: bool = False) -> DecoderCache:
        """A cache for one window, ready for the prompt; capacity counts prompt and transcript tokens. A static cache
        is attended whole under a mask, so that a step's shapes never change (CUDA graphs)."""

    @abstractmethod
    def forward(
        self,
        tokens: Tensor,
        cache: DecoderCache,
        taps: tuple[int, ...] = (),
        attention_layers: tuple[int, ...] = (),
        positions: Tensor | None = None,
        tree: TreeRows | None = None,
    ) -> DecoderOutput:
        """Run `tokens` (batch, T) at slots cache.length.. and append them to the cache.

        taps: decoder layers (1-based; 0 is the embedding) whose outputs to return.
        attention_layers: decoder layers (0-based) whose head-averaged attention over the audio to return.
        positions: (T,) the tokens' slots as a device tensor (a CUDA graph's input); the caller then keeps
        cache.length, which a step without them advances itself. Without a tree each row sits at its slot and
        attends every slot up to its own.
        tree: the rows' own positions and what they see, where they are a tree of candidates.
        """

    @abstractmethod
    def greedy_tokens(self, states: Tensor, first_index: int) -> Tensor:
        """The target's greedy choice for each row of final states (batch, T, d_model), exact as from its float
        scores; `first_index` transcript tokens came before the first row. Every end-of-text id comes back as `eot`."""

    def logits(self, states: Tensor) -> Tensor:
        """Scores over the vocabulary for final states (batch, T, d_model)."""
        return self.lm_head.logits(states)

    @abstractmethod
    def frozen_head(self) -> FrozenHead: ...

    def decode_text(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True).strip()

    @torch.inference_mode()
    def attention_peaks(self, memory: Tensor, tokens: list[int], valid_frames: int) -> list[list[int]]:
        """For each transcript token, the audio frame where each decoder layer's head-averaged attention peaked
        while the target predicted it (one teacher-forced pass, as verification sees it; padding excluded)."""
        if not tokens:
            return []
        inputs = [*self.prompt, *tokens[:-1]]
        cache = self.new_cache(memory, capacity=len(inputs))
        layers = tuple(range(self.n_layers))
        out = self.forward(torch.tensor([inputs], device=memory.device), cache, attention_layers=layers)
        return audio_peaks(out.audio_attention[:, :, len(self.prompt) - 1 :], valid_frames).tolist()


def step_positions(
    cache: DecoderCache, n_new: int, positions: Tensor | None, device: torch.device
) -> tuple[Tensor, int]:
    """The positions of a step's `n_new` tokens and the cache's length after them. Without given positions the step
    takes the next ones and advances the cache itself; with them, its caller keeps the length (CUDA graphs)."""
    end = cache.length + n_new
    if end > cache.capacity:
        raise ValueError(f"cache holds {cache.capacity} positions; {end} requested")
    if positions is None:
        positions = torch.arange(cache.length, end, device=device)
        cache.length = end
    return positions, end


def audio_peaks(audio_attention: Tensor, valid_frames: int | Tensor) -> Tensor:
    """(rows, layers): per predicted row, the frame of each layer's head-averaged audio attention peak (padding
    excluded), from `DecoderOutput.audio_attention` of batch 1. `valid_frames` may be a device tensor."""
    padding = torch.arange(audio_attention.shape[-1], device=audio_attention.device) >= valid_frames
    return audio_attention[:, 0].masked_fill(padding, -1.0).argmax(dim=-1).T  # weights are >= 0
