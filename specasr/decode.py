"""Decoding loops: autoregressive greedy (the baseline) and speculative decoding with a draft.

Both are timed from the waveform. The speculative loop returns exactly the greedy tokens under
exact arithmetic: the target verifies each block of proposals in one pass and keeps the longest
prefix that matches its own greedy choice, plus its own next token.
"""

import time
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from specasr.draft import Draft, window_mask
from specasr.targets import FRAME_SECONDS, WhisperTarget
from specasr.trace import DraftStep, Round, Timings, Trace, VerifiedToken

WINDOWS = ("unrestricted", "correct", "shift", "random", "pointer", "runtime")
SHIFT_SECONDS = 0.5


class PhaseTimer:
    """Wall-clock seconds per phase; waits for the device so GPU work is charged to its phase."""

    def __init__(self, device: torch.device):
        self.device = device
        self.timings = Timings()

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @contextmanager
    def phase(self, name: str):
        self.sync()
        start = time.perf_counter()
        yield
        self.sync()
        setattr(self.timings, name, getattr(self.timings, name) + time.perf_counter() - start)


class Stopwatch:
    """Marks on the device's own timeline (CUDA events) or the host clock, read after a sync."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, start, end) -> float:
        if not self.cuda:
            return end - start
        end.synchronize()
        return start.elapsed_time(end) / 1000


@dataclass
class SpeculativeConfig:
    k: int = 4  # most proposals per round
    window: str = "unrestricted"
    half_width_ms: float = 400.0
    runtime_layer: int | None = None  # target decoder layer (0-based) for the runtime window; None: the target's
    threshold: float = 0.0  # stop proposing once the draft's top probability falls below this
    verify_peaks: bool = True  # record the verification attention peak of every target layer
    keep_attention: bool = False  # keep each draft step's full audio attention row

    def __post_init__(self):
        if self.window not in WINDOWS:
            raise ValueError(f"unknown window {self.window!r}; choose one of {', '.join(WINDOWS)}")
        if not 1 <= self.k <= 64:
            raise ValueError(f"K must be between 1 and 64, got {self.k}")


@torch.inference_mode()
def greedy_tokens(target: WhisperTarget, memory: Tensor) -> list[int]:
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


class WindowPolicy:
    """Chooses the centre of the draft's audio window for the step that predicts transcript token i."""

    def __init__(self, config: SpeculativeConfig, valid_frames: int, reference: list[int | None] | None):
        self.kind = config.window
        self.valid_frames = valid_frames
        self.half_width = round(config.half_width_ms / 1000 / FRAME_SECONDS)
        self.reference = reference or []
        self.rng = np.random.default_rng(0)
        self.runtime_centre = -1
        if self.kind in ("correct", "shift", "pointer") and reference is None:
            raise ValueError(f"the {self.kind!r} window needs reference frames for the transcript tokens")

    def _clip(self, frame: float) -> int:
        return int(min(max(round(frame), 0), self.valid_frames - 1))

    def reference_frame(self, i: int) -> int | None:
        return self.reference[i] if 0 <= i < len(self.reference) else None

    def centre(self, i: int, verified: int) -> int:
        """-1 means no window. `verified`: how many transcript tokens the target has confirmed."""
        if self.kind == "unrestricted":
            return -1
        if self.kind == "random":
            return int(self.rng.integers(self.valid_frames))
        if self.kind == "runtime":
            return self.runtime_centre
        if self.kind == "pointer":
            return self._pointer(i, verified)
        frame = self.reference_frame(i)
        if frame is None:
            return -1
        shift = SHIFT_SECONDS / FRAME_SECONDS if self.kind == "shift" else 0
        return self._clip(frame + shift)

    def _pointer(self, i: int, verified: int) -> int:
        """Extrapolate from the reference frames of tokens already verified, at their mean rate."""
        known = [(j, f) for j in range(min(verified, len(self.reference))) if (f := self.reference[j]) is not None]
        if not known:
            return -1
        (j0, f0), (j1, f1) = known[0], known[-1]
        rate = (f1 - f0) / (j1 - j0) if j1 > j0 else 0.0
        return self._clip(f1 + rate * (i - j1))

    def mask(self, centres: list[int], device: torch.device) -> Tensor:
        """Over the valid frames, the only ones the draft's cache holds."""
        frames = self.valid_frames
        return window_mask(frames, frames, torch.tensor([centres], device=device), self.half_width)


def speculative_rounds(
    target: WhisperTarget,
    draft: Draft,
    memory: Tensor,
    valid_frames: int,
    config: SpeculativeConfig,
    reference: list[int | None] | None = None,
) -> tuple[list[int], list[Round], list[DraftStep], list[VerifiedToken]]:
    """The speculative loop for one clip (batch 1): transcript tokens and the trace rows of every round."""
    with torch.inference_mode():
        return _SpeculativeLoop(target, draft, memory, valid_frames, config, reference).run()


class _SpeculativeLoop:
    def __init__(self, target, draft, memory, valid_frames, config, reference):
        self.target, self.draft, self.config = target, draft, config
        self.device = memory.device
        self.policy = WindowPolicy(config, valid_frames, reference)
        self.target_cache = target.new_cache(memory)
        self.draft_cache = draft.new_cache(memory, valid_frames, target.max_length)
        runtime_layer = config.runtime_layer if config.runtime_layer is not None else target.runtime_layer
        if not 0 <= runtime_layer < target.n_layers:
            raise ValueError(f"runtime layer {runtime_layer} outside the target's {target.n_layers} decoder layers")
        self.runtime_layer = runtime_layer
        all_layers = tuple(range(target.n_layers))
        self.attention_layers = all_layers if config.verify_peaks else ()
        if config.window == "runtime" and not config.verify_peaks:
            self.attention_layers = (runtime_layer,)
        self.stopwatch = Stopwatch(self.device)
        self.tokens: list[int] = []
        self.rounds: list[Round] = []
        self.steps: list[DraftStep] = []
        self.verified: list[VerifiedToken] = []

    def _verify(self, block: Tensor):
        return self.target.forward(
            block, self.target_cache, taps=self.draft.config.taps, attention_layers=self.attention_layers
        )

    def _record_verified(self, cross_attention: Tensor | None, first_row: int, new: list[int]) -> None:
        """Rows first_row.. of a verification pass predicted the tokens `new`; keep where each layer looked."""
        if cross_attention is None:
            return
        rows = cross_attention[:, 0, first_row : first_row + len(new), : self.policy.valid_frames]
        peaks = rows.argmax(dim=-1).T.tolist()  # (tokens, layers)
        if self.config.window == "runtime":
            self.policy.runtime_centre = peaks[len(new) - 1][self.attention_layers.index(self.runtime_layer)]
        if self.config.verify_peaks:
            start = len(self.tokens)
            self.verified += [VerifiedToken(start + i, t, peaks[i]) for i, t in enumerate(new) if t != self.target.eot]

    def run(self):
        target, prompt = self.target, self.target.prompt
        out = self._verify(torch.tensor([prompt], device=self.device))
        first = target.greedy_tokens(out.logits[:, -1:], 0).item()
        self._record_verified(out.cross_attention, len(prompt) - 1, [first])
        if first == target.eot:
            return self.tokens, self.rounds, self.steps, self.verified
        self.tokens.append(first)
        # The draft at position t reads (f_t, x_{t+1}); these are the positions it has yet to read.
        features, inputs = out.hidden, torch.tensor([[*prompt[1:], first]], device=self.device)
        while len(prompt) + len(self.tokens) < target.max_length:
            done, features, inputs = self._round(features, inputs)
            if done:
                break
        return self.tokens, self.rounds, self.steps, self.verified

    def _round(self, features: Tensor, inputs: Tensor) -> tuple[bool, Tensor, Tensor]:
        target, draft, config = self.target, self.draft, self.config
        n_prompt = len(target.prompt)
        position = n_prompt + len(self.tokens) - 1  # of the last token, which the target has not read yet
        k = min(config.k, target.max_length - n_prompt - len(self.tokens) - 1)
        index = len(self.rounds)

        start = self.stopwatch.mark()
        proposed, centres, rows = [], [], []
        if k > 0:
            first_position = position - inputs.shape[1]
            # The step at draft position t predicts transcript token t + 2 - n_prompt.
            predicts = [t + 2 - n_prompt for t in range(first_position, position)]
            step_centres = [self.policy.centre(i, len(self.tokens)) for i in predicts]
            out = draft(features, inputs, self.draft_cache, self._mask(step_centres))
            centres.append(step_centres[-1])
            for depth in range(1, k + 1):
                probs = draft.logits(out.hidden[:, -1]).softmax(dim=-1)
                top, choice = probs.max(dim=-1)
                token = draft.vocab_to_target(choice)
                proposed.append(token)
                if out.attention is not None:
                    rows.append(out.attention[0, -1, : self.policy.valid_frames])
                if depth == k or (config.threshold > 0 and top.item() < config.threshold):
                    break
                centre = self.policy.centre(len(self.tokens) + depth, len(self.tokens))
                centres.append(centre)
                out = draft(out.features[:, -1:], token[:, None], self.draft_cache, self._mask([centre]))
        drafted = self.stopwatch.mark()

        block = torch.cat([inputs[:, -1:], torch.stack(proposed, dim=1)], dim=1) if proposed else inputs[:, -1:]
        out = self._verify(block)
        choices = target.greedy_tokens(out.logits, len(self.tokens))[0]
        verified_at = self.stopwatch.mark()

        choices = choices.tolist()  # the round's one host synchronisation
        proposed = block[0, 1:].tolist()
        accepted = 0
        while accepted < len(proposed) and proposed[accepted] == choices[accepted]:
            accepted += 1
        new = [*proposed[:accepted], choices[accepted]]
        if target.eot in new:
            new = new[: new.index(target.eot) + 1]
        self.rounds.append(
            Round(
                index=index,
                start=len(self.tokens),
                proposed=proposed,
                accepted=accepted,
                target_token=choices[accepted],
                draft_seconds=self.stopwatch.seconds(start, drafted),
                verify_seconds=self.stopwatch.seconds(drafted, verified_at),
            )
        )
        self._record_steps(index, proposed, accepted, rows, centres)
        self._record_verified(out.cross_attention, 0, new)

        finished = new[-1] == target.eot
        self.tokens += new[:-1] if finished else new
        self.target_cache.length = position + 1 + accepted
        self.draft_cache.length = position
        return finished, out.hidden[:, : accepted + 1], torch.tensor([new], device=self.device)

    def _mask(self, centres: list[int]) -> Tensor | None:
        return self.policy.mask(centres, self.device) if self.draft.config.audio else None

    def _record_steps(self, index: int, proposed: list[int], accepted: int, rows: list[Tensor], centres: list[int]):
        start = len(self.tokens)
        peaks = torch.stack(rows).argmax(dim=-1).tolist() if rows else [None] * len(proposed)
        for depth, token in enumerate(proposed, start=1):
            row = rows[depth - 1].float().cpu().tolist() if rows and self.config.keep_attention else None
            self.steps.append(
                DraftStep(
                    round=index,
                    depth=depth,
                    token=token,
                    accepted=depth <= accepted,
                    draft_peak=peaks[depth - 1],
                    window_centre=centres[depth - 1] if centres[depth - 1] >= 0 else None,
                    reference_frame=self.policy.reference_frame(start + depth - 1),
                    attention=row,
                )
            )


def _timed_trace(target: WhisperTarget, audio: np.ndarray, clip_id: str, decode) -> tuple[Trace, tuple]:
    timer = PhaseTimer(target.device)
    with timer.phase("features"):
        features = target.features(audio)
    with timer.phase("encoder"):
        memory = target.encode(features)
    valid_frames = target.valid_frames(len(audio))
    with timer.phase("decode"):
        result = decode(memory, valid_frames)
    trace = Trace(
        clip_id=clip_id,
        target=target.name,
        device=str(target.device),
        dtype=str(target.dtype).removeprefix("torch."),
        tokens=result[0],
        text=target.decode_text(result[0]),
        timings=timer.timings,
        valid_frames=valid_frames,
    )
    return trace, result


def transcribe(target: WhisperTarget, audio: np.ndarray, clip_id: str = "") -> Trace:
    """Greedy transcription of a 16 kHz clip, timed from the waveform."""
    trace, _ = _timed_trace(target, audio, clip_id, lambda memory, _: (greedy_tokens(target, memory),))
    return trace


def speculative_transcribe(
    target: WhisperTarget,
    draft: Draft,
    audio: np.ndarray,
    config: SpeculativeConfig,
    clip_id: str = "",
    reference: list[int | None] | None = None,
) -> Trace:
    """Speculative transcription of a 16 kHz clip: the same tokens as `transcribe`, and the full trace."""

    def decode(memory, valid_frames):
        return speculative_rounds(target, draft, memory, valid_frames, config, reference)

    trace, (_, rounds, steps, verified) = _timed_trace(target, audio, clip_id, decode)
    trace.draft, trace.draft_dtype, trace.k = draft.name, str(draft.dtype).removeprefix("torch."), config.k
    trace.window, trace.half_width_ms = config.window, config.half_width_ms
    if config.window == "runtime":
        trace.runtime_layer = target.runtime_layer if config.runtime_layer is None else config.runtime_layer
    trace.rounds, trace.steps, trace.verified = rounds, steps, verified
    trace.timings.draft = sum(r.draft_seconds for r in rounds)
    trace.timings.verify = sum(r.verify_seconds for r in rounds)
    return trace
