"""Window conditions on the draft's audio cross-attention: where each step's window is centred, and its mask.

All restricted conditions share one half-width; only the centre moves. The runtime conditions' positions are
handed in by the loop (the target's verification attention peak of each verified token), never read here.
"""

from collections import deque

import numpy as np
import torch
from torch import Tensor

from specasr.targets import FRAME_SECONDS

WINDOWS = ("unrestricted", "correct", "shift", "random", "pointer", "runtime", "runtime-paced")
REFERENCE_WINDOWS = ("correct", "shift", "pointer")  # the ones centred from reference frames
RUNTIME_WINDOWS = ("runtime", "runtime-paced")  # the ones centred from verification attention
PACE_TOKENS = 8  # recent verified tokens whose peaks set runtime-paced's frames per token
SHIFT_SECONDS = 0.5
NO_WINDOW = -1


def window_mask(valid_frames: int, frames: int, centres: Tensor, half_width: int) -> Tensor:
    """Which audio frames each draft step may attend: (…, frames) from centres (…), -1 meaning no window.

    Padding frames (>= valid_frames) are never attended; a window is clipped to the valid frames.
    """
    frame = torch.arange(frames, device=centres.device)
    valid = frame < valid_frames
    inside = (frame - centres.unsqueeze(-1)).abs() <= half_width
    return valid & (inside | (centres.unsqueeze(-1) < 0))


class WindowPolicy:
    """Chooses the centre of the draft's audio window for the step that predicts transcript token i."""

    def __init__(self, window: str, half_width_ms: float, valid_frames: int, reference: list[int | None] | None):
        if window not in WINDOWS:
            raise ValueError(f"unknown window {window!r}; choose one of {', '.join(WINDOWS)}")
        if window in REFERENCE_WINDOWS and reference is None:
            raise ValueError(f"the {window!r} window needs reference frames for the transcript tokens")
        self.kind = window
        self.valid_frames = valid_frames
        self.half_width = round(half_width_ms / 1000 / FRAME_SECONDS)
        self.reference = reference or []
        self.rng = np.random.default_rng(0)
        self.verified_peaks: deque[tuple[int, int]] = deque(maxlen=PACE_TOKENS)  # (token index, frame)

    def _clip(self, frame: float) -> int:
        return int(min(max(round(frame), 0), self.valid_frames - 1))

    def observe_verified(self, first: int, peaks: list[int]) -> None:
        """The verification attention peaks (runtime layer) of transcript tokens first, first + 1, ..."""
        self.verified_peaks.extend(enumerate(peaks, start=first))

    def reference_frame(self, i: int) -> int | None:
        return self.reference[i] if 0 <= i < len(self.reference) else None

    def centre(self, i: int, verified: int) -> int:
        """NO_WINDOW or a frame. `verified`: how many transcript tokens the target has confirmed."""
        if self.kind == "unrestricted":
            return NO_WINDOW
        if self.kind == "random":
            return int(self.rng.integers(self.valid_frames))
        if self.kind == "runtime":
            return self.verified_peaks[-1][1] if self.verified_peaks else NO_WINDOW
        if self.kind == "runtime-paced":
            return self._extrapolate(list(self.verified_peaks), i)
        if self.kind == "pointer":
            return self._pointer(i, verified)
        frame = self.reference_frame(i)
        if frame is None:
            return NO_WINDOW
        shift = SHIFT_SECONDS / FRAME_SECONDS if self.kind == "shift" else 0
        return self._clip(frame + shift)

    def _pointer(self, i: int, verified: int) -> int:
        """Extrapolate from the reference frames of tokens already verified."""
        known = [(j, f) for j in range(min(verified, len(self.reference))) if (f := self.reference[j]) is not None]
        return self._extrapolate(known, i)

    def _extrapolate(self, known: list[tuple[int, int]], i: int) -> int:
        """Token i's frame from (token, frame) pairs: the last one moved on at their mean rate, first to last."""
        if not known:
            return NO_WINDOW
        (j0, f0), (j1, f1) = known[0], known[-1]
        rate = (f1 - f0) / (j1 - j0) if j1 > j0 else 0.0
        return self._clip(f1 + rate * (i - j1))

    def mask(self, centres: list[int], device: torch.device) -> Tensor:
        """Over the valid frames, the only ones the draft's cache holds."""
        frames = self.valid_frames
        return window_mask(frames, frames, torch.tensor([centres], device=device), self.half_width)
