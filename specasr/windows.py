"""Window conditions on the draft's audio cross-attention: where each step's window is centred, and its mask.

All restricted conditions share one half-width; only the centre moves. The runtime conditions' positions are
handed in by the loop (the target's verification attention peak of each verified token), never read here: `runtime`
(paper D.2) moves the last verified token's peak on with depth at the pace of the recent peaks; `runtime-last`, an
ablation, holds it still, so its centre lags the words further at every depth.
"""

import torch
from torch import Tensor

from specasr.trace import REFERENCE_WINDOWS, WINDOWS

TABLE_WINDOWS = ("correct", "shift", "random")  # a centre per transcript token, known before decoding
PACE_TOKENS = 8  # recent verified tokens whose peaks set the runtime window's frames per token
SHIFT_SECONDS = 0.5
NO_WINDOW = -1
TOKENS = 1024  # transcript tokens a policy holds centres and peaks for, unless told


def window_mask(valid_frames: int | Tensor, frames: int, centres: Tensor, half_width: int) -> Tensor:
    """Which audio frames each draft step may attend: (…, frames) from centres (…), -1 meaning no window.

    Padding frames (>= valid_frames) are never attended; a window is clipped to the valid frames.
    """
    frame = torch.arange(frames, device=centres.device)
    valid = frame < valid_frames
    inside = (frame - centres.unsqueeze(-1)).abs() <= half_width
    return valid & (inside | (centres.unsqueeze(-1) < 0))


class WindowPolicy:
    """Centres the draft's audio window for the steps that predict transcript tokens first, first + 1, ...

    Everything a centre depends on lives in device tensors of fixed size: a centre per token (reference windows, and
    random centres drawn once per segment with seed 0), the last reference frame known before each count of verified
    tokens (pointer), and the verification peak of each verified token (runtime). So centres and masks are computed
    on the device from a count of verified tokens that may itself be a device tensor, and captured steps keep
    reading the same tensors from segment to segment (`reset`).
    """

    def __init__(
        self,
        window: str,
        half_width_ms: float,
        valid_frames: int,
        reference: list[int | None] | None,
        frame_seconds: float,
        device: torch.device | str = "cpu",
        tokens: int = TOKENS,
    ):
        if window not in WINDOWS:
            raise ValueError(f"unknown window {window!r}; choose one of {', '.join(WINDOWS)}")
        self.kind = window
        self.device = device
        self.tokens = tokens
        self.half_width = round(half_width_ms / 1000 / frame_seconds)
        self.shift = round(SHIFT_SECONDS / frame_seconds) if window == "shift" else 0
        on = {"dtype": torch.long, "device": device}
        self.valid_frames = torch.zeros((), **on)
        self._table = torch.full((tokens,), NO_WINDOW, **on)
        self._first_known = torch.full((2,), NO_WINDOW, **on)  # (token, frame) of the first reference frame
        self._last_known = torch.full((2, tokens + 1), NO_WINDOW, **on)  # the last one before each verified count
        self._peaks = torch.zeros(tokens, **on)
        self.reset(valid_frames, reference)

    def reset(self, valid_frames: int, reference: list[int | None] | None) -> None:
        """A new segment: its valid frames and its tokens' reference frames, written into the same tensors."""
        if self.kind in REFERENCE_WINDOWS and reference is None:
            raise ValueError(f"the {self.kind!r} window needs reference frames for the transcript tokens")
        self.reference = list(reference or [])[: self.tokens]
        self.frames = valid_frames
        self.valid_frames.fill_(valid_frames)
        self._peaks.zero_()
        if self.kind == "random":
            generator = torch.Generator(self.device).manual_seed(0)
            self._table.copy_(torch.randint(valid_frames, (self.tokens,), generator=generator, device=self.device))
        elif self.kind in TABLE_WINDOWS:
            table = [NO_WINDOW if f is None else self._clip(f + self.shift) for f in self.reference]
            self._table.copy_(torch.tensor(table + [NO_WINDOW] * (self.tokens - len(table))))
        elif self.kind == "pointer":  # the other windows read none of these tables
            known = [(j, f) for j, f in enumerate(self.reference) if f is not None]
            self._first_known.copy_(torch.tensor(known[0] if known else (NO_WINDOW, NO_WINDOW)))
            last, before = [], (NO_WINDOW, NO_WINDOW)
            for count in range(self.tokens + 1):
                last.append(before)
                if count < len(self.reference) and self.reference[count] is not None:
                    before = (count, self.reference[count])
            self._last_known.copy_(torch.tensor(last).T)

    def _clip(self, frame: float) -> int:
        return int(min(max(round(frame), 0), self.frames - 1))

    def observe_verified(self, first: int | Tensor, peaks: Tensor) -> None:
        """The verification attention peaks (runtime layer) of transcript tokens first, first + 1, ..."""
        tokens = torch.arange(len(peaks), device=peaks.device) + first
        self._peaks.index_copy_(0, tokens, peaks.long())

    def reference_frame(self, i: int) -> int | None:
        return self.reference[i] if 0 <= i < len(self.reference) else None

    def centres(self, first: int | Tensor, count: int, verified: int | Tensor) -> Tensor:
        """(count,) centres, NO_WINDOW or a frame, for tokens first.. . `verified`: how many transcript tokens the
        target has confirmed. Either may be a device tensor of one element."""
        tokens = torch.arange(count, device=self.device) + first
        verified = torch.as_tensor(verified, device=self.device).view(-1)[:1]
        none = torch.full((count,), NO_WINDOW, device=self.device)
        if self.kind == "unrestricted":
            return none
        if self.kind in TABLE_WINDOWS:
            inside = (tokens >= 0) & (tokens < self.tokens)
            return torch.where(inside, self._table[tokens.clamp(0, self.tokens - 1)], none)
        if self.kind == "pointer":
            last_token, last_frame = self._last_known[:, verified.clamp(0, self.tokens)]
            first_token, first_frame = self._first_known
            found = self._extrapolate(first_token, first_frame, last_token, last_frame, tokens)
            return torch.where(last_token >= 0, found, none)
        last = (verified - 1).clamp(min=0)
        if self.kind == "runtime-last":
            return torch.where(verified > 0, self._peaks[last], none)
        start = (verified - PACE_TOKENS).clamp(min=0)  # runtime: the pace of the last eight verified tokens
        found = self._extrapolate(start, self._peaks[start], last, self._peaks[last], tokens)
        return torch.where(verified > 0, found, none)

    def _extrapolate(self, j0: Tensor, f0: Tensor, j1: Tensor, f1: Tensor, tokens: Tensor) -> Tensor:
        """Each token's frame from two (token, frame) pairs: the last one moved on at their mean rate, first to
        last, in float64 and rounded half to even as Python rounds."""
        rate = torch.where(j1 > j0, (f1 - f0).double() / (j1 - j0).clamp(min=1).double(), 0.0)
        frames = (tokens - j1).double() * rate + f1
        return torch.minimum(frames.round().clamp(min=0).long(), self.valid_frames - 1)

    def mask(self, centres: Tensor, frames: int | None = None) -> Tensor:
        """(1, steps, frames) over the draft cache's audio frames: the valid ones, unless it keeps padding too."""
        return window_mask(self.valid_frames, frames or self.frames, centres[None], self.half_width)
