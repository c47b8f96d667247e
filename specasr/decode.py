"""Decoding loops: autoregressive greedy (the baseline every speedup is measured against)."""

import time
from contextlib import contextmanager

import numpy as np
import torch

from specasr.targets import WhisperTarget
from specasr.trace import Timings, Trace


class PhaseTimer:
    """Wall-clock seconds per phase; waits for the device so GPU work is charged to its phase."""

    def __init__(self, device: torch.device):
        self.device = device
        self.timings = Timings()

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @contextmanager
    def phase(self, name: str):
        self._sync()
        start = time.perf_counter()
        yield
        self._sync()
        setattr(self.timings, name, getattr(self.timings, name) + time.perf_counter() - start)


@torch.inference_mode()
def greedy_tokens(target: WhisperTarget, memory: torch.Tensor) -> list[int]:
    """Whisper's greedy transcript tokens (prompt and end-of-text excluded), one cached step per token."""
    cache = target.new_cache(memory)
    prompt = torch.tensor([target.prompt], device=memory.device)
    logits = target.forward(prompt, cache).logits[:, -1:]
    tokens: list[int] = []
    while len(target.prompt) + len(tokens) < target.max_length:
        token = target.greedy_tokens(logits, len(tokens))
        value = token.item()
        if value == target.eot:
            break
        tokens.append(value)
        logits = target.forward(token, cache).logits
    return tokens


def transcribe(target: WhisperTarget, audio: np.ndarray, clip_id: str = "") -> Trace:
    """Greedy transcription of a 16 kHz clip, timed from the waveform."""
    timer = PhaseTimer(target.device)
    with timer.phase("features"):
        features = target.features(audio)
    with timer.phase("encoder"):
        memory = target.encode(features)
    with timer.phase("decode"):
        tokens = greedy_tokens(target, memory)
    return Trace(
        clip_id=clip_id,
        target=target.name,
        device=str(target.device),
        dtype=str(target.dtype).removeprefix("torch."),
        tokens=tokens,
        text=target.decode_text(tokens),
        timings=timer.timings,
    )
