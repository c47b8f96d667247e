"""Window conditions on the draft's audio cross-attention: where each step's window is centred, and its mask.

All restricted conditions share one half-width; only the centre moves. The runtime conditions' positions are
handed in by the loop (the target's verification attention peak of each verified token), never read here.
"""

from collections import deque

import torch
from torch import Tensor

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
    """Centres the draft's audio window for the steps that predict transcript tokens first, first + 1, ...

    Centres are computed on the device from what the host already knows (token indices, the reference frames, how
    many tokens are verified) and from the verification peaks the loop hands in as device tensors, so choosing a
    window never waits for the device.
    """

    def __init__(
        self,
        window: str,
        half_width_ms: float,
        valid_frames: int,
        reference: list[int | None] | None,
        frame_seconds: float,
        device: torch.device | str = "cpu",
    ):
        if window not in WINDOWS:
            raise ValueError(f"unknown window {window!r}; choose one of {', '.join(WINDOWS)}")
        if window in REFERENCE_WINDOWS and reference is None:
            raise ValueError(f"the {window!r} window needs reference frames for the transcript tokens")
        self.kind = window
        self.valid_frames = valid_frames
        self.device = device
        self.half_width = round(half_width_ms / 1000 / frame_seconds)
        self.reference = reference or []
        shift = round(SHIFT_SECONDS / frame_seconds) if window == "shift" else 0
        frames = [NO_WINDOW if f is None else self._clip(f + shift) for f in self.reference]
        self._reference_centres = torch.tensor(frames, dtype=torch.long, device=device)
        self._generator = torch.Generator(device).manual_seed(0)
        self._verified_tokens: deque[int] = deque(maxlen=PACE_TOKENS)  # indices of the recent verified tokens
        self._verified_frames = torch.empty(0, dtype=torch.long, device=device)  # and their peak frames

    def _clip(self, frame: float) -> int:
        return int(min(max(round(frame), 0), self.valid_frames - 1))

    def observe_verified(self, first: int, peaks: Tensor) -> None:
        """The verification attention peaks (runtime layer) of transcript tokens first, first + 1, ..."""
        self._verified_tokens.extend(range(first, first + len(peaks)))
        self._verified_frames = torch.cat([self._verified_frames, peaks.long()])[-PACE_TOKENS:]

    def reference_frame(self, i: int) -> int | None:
        return self.reference[i] if 0 <= i < len(self.reference) else None

    def centres(self, first: int, count: int, verified: int) -> Tensor:
        """(count,) centres, NO_WINDOW or a frame, for tokens first.. . `verified`: how many transcript tokens the
        target has confirmed."""
        tokens = torch.arange(first, first + count, device=self.device)
        none = torch.full((count,), NO_WINDOW, device=self.device)
        if self.kind == "unrestricted":
            return none
        if self.kind == "random":
            return torch.randint(self.valid_frames, (count,), generator=self._generator, device=self.device)
        if self.kind == "runtime":
            return self._verified_frames[-1].expand(count) if self._verified_tokens else none
        if self.kind == "runtime-paced":
            if not self._verified_tokens:
                return none
            frames = self._verified_frames.double()
            return self._extrapolate(self._verified_tokens[0], frames[0], self._verified_tokens[-1], frames[-1], tokens)
        if self.kind == "pointer":
            known = [(j, f) for j in range(min(verified, len(self.reference))) if (f := self.reference[j]) is not None]
            return self._extrapolate(*known[0], *known[-1], tokens) if known else none
        if not self.reference:
            return none
        inside = (tokens >= 0) & (tokens < len(self.reference))
        return torch.where(inside, self._reference_centres[tokens.clamp(0, len(self.reference) - 1)], none)

    def _extrapolate(self, j0: int, f0: float | Tensor, j1: int, f1: float | Tensor, tokens: Tensor) -> Tensor:
        """Each token's frame from two (token, frame) pairs: the last one moved on at their mean rate, first to
        last, in float64 and rounded half to even as Python rounds."""
        rate = (f1 - f0) / (j1 - j0) if j1 > j0 else 0.0
        frames = (tokens - j1).double() * rate + f1
        return frames.round().clamp(0, self.valid_frames - 1).long()

    def mask(self, centres: Tensor, frames: int | None = None) -> Tensor:
        """(1, steps, frames) over the draft cache's audio frames: the valid ones, unless it keeps padding too."""
        return window_mask(self.valid_frames, frames or self.valid_frames, centres[None], self.half_width)
