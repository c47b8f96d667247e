"""Decoding loops over one window's encoder output: autoregressive greedy (the baseline) and speculative decoding.

The speculative loop returns exactly the greedy tokens under exact arithmetic: the target verifies
each block of proposals in one pass and keeps the longest prefix that matches its own greedy
choice, plus its own next token. Rows are recorded in clip coordinates (`Origin`); the pipeline
times the phases (`PhaseTimer`).
"""

import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import Tensor

from specasr.draft import Draft
from specasr.graphs import round_steps
from specasr.targets import Target
from specasr.targets.base import audio_peaks
from specasr.trace import DraftStep, Round, Settings, Timings, VerifiedToken
from specasr.windows import NO_WINDOW, RUNTIME_WINDOWS, WindowPolicy

FIXED_SHAPE_DEVICES = ("cuda",)  # rounds replay captured steps there (CUDA graphs); on a CPU padding only costs
FREE_READ_DEVICES = ("cpu",)  # reading a proposal's confidence there costs no wait, so a round stops drafting at it


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


@dataclass(frozen=True)
class Origin:
    """Where a segment starts in its clip; the loops record rows in clip coordinates."""

    segment: int = 0
    frame: int = 0
    token: int = 0
    round: int = 0


@dataclass
class Decoded:
    """What a loop produced for one segment: its transcript tokens and its trace rows."""

    tokens: list[int]
    rounds: list[Round] = field(default_factory=list)
    steps: list[DraftStep] = field(default_factory=list)
    verified: list[VerifiedToken] = field(default_factory=list)


@torch.inference_mode()
def greedy(
    target: Target, memory: Tensor, valid_frames: int, verify_peaks: bool = False, origin: Origin = Origin()
) -> Decoded:
    """The target's greedy transcript (prompt and end-of-text excluded), one cached step per token; with
    verify_peaks, where every decoder layer attended while predicting each token."""
    layers = tuple(range(target.n_layers)) if verify_peaks else ()
    cache = target.new_cache(memory)
    out = target.forward(torch.tensor([target.prompt], device=memory.device), cache, attention_layers=layers)
    row = slice(len(target.prompt) - 1, len(target.prompt))
    result = Decoded([])
    while len(target.prompt) + len(result.tokens) < target.max_length:
        token = target.greedy_tokens(out.states[:, row], len(result.tokens))
        value = token.item()
        if value == target.eot:
            break
        if layers:
            peaks = (audio_peaks(out.audio_attention[:, :, row], valid_frames)[0] + origin.frame).tolist()
            result.verified.append(VerifiedToken(origin.token + len(result.tokens), value, peaks))
        result.tokens.append(value)
        out = target.forward(token, cache, attention_layers=layers)
        row = slice(0, 1)
    return result


def greedy_tokens(target: Target, memory: Tensor) -> list[int]:
    return greedy(target, memory, memory.shape[1]).tokens


def speculative(
    target: Target,
    draft: Draft,
    memory: Tensor,
    valid_frames: int,
    settings: Settings,
    reference: list[int | None] | None = None,
    origin: Origin = Origin(),
    on_round: Callable[[Round], None] | None = None,
    captured: dict | None = None,
) -> Decoded:
    """The speculative loop for one segment (batch 1): the greedy transcript tokens and the rows of every round.

    reference: the segment's own frame for each of its transcript tokens, for the windows centred from them.
    on_round: called with every round as it ends (progress reports; its time counts in the decode phase).
    captured: where the round's captured steps are kept between segments (CUDA graphs); none: captured anew.
    """
    with torch.inference_mode():
        loop = _SpeculativeLoop(target, draft, memory, valid_frames, settings, reference, origin, captured)
        return loop.run(on_round)


def accepted_length(proposed: list[int], choices: list[int], eot: int) -> int:
    """How many proposals the target keeps: the longest prefix matching its choices (one more than the proposals),
    up to an end-of-text; nothing after one belongs to the transcript, so nothing after it counts as accepted."""
    for depth, (proposal, choice) in enumerate(zip(proposed, choices[:-1], strict=True)):
        if proposal != choice:
            return depth
        if proposal == eot:
            return depth + 1
    return len(proposed)


def _read(tensors: list[Tensor]) -> list[list[int]]:
    """Several small integer tensors copied to the host at once: a round's one wait for the device."""
    flat = torch.cat([t.reshape(-1).long() for t in tensors]).tolist()
    sizes = [t.numel() for t in tensors]
    return [flat[sum(sizes[:i]) : sum(sizes[: i + 1])] for i in range(len(tensors))]


class _SpeculativeLoop:
    """One segment's rounds, each of fixed shapes after the first on CUDA: the draft catches up over K + 1 positions
    (the ones the last verification accepted, then padding; on a CPU only the accepted ones) and takes K - 1 single
    steps; the target verifies K + 1 tokens; there these three steps replay CUDA graphs over static caches.
    Eager rounds draft no further than the length limit and, on a CPU, than their first proposal below the
    confidence threshold; captured ones compute such proposals and drop them. Window centres and masks are computed
    on the device; but for those confidences on a CPU, the host reads the device once per round."""

    def __init__(self, target, draft, memory, valid_frames, settings, reference, origin, captured):
        self.target, self.draft, self.settings, self.origin = target, draft, settings, origin
        self.device = memory.device
        self.policy = WindowPolicy(
            settings.window, settings.half_width_ms, valid_frames, reference, target.frame_seconds, self.device
        )
        runtime_layer = settings.runtime_layer if settings.runtime_layer is not None else target.runtime_layer
        if not 0 <= runtime_layer < target.n_layers:
            raise ValueError(f"runtime layer {runtime_layer} outside the target's {target.n_layers} decoder layers")
        self.runtime_layer = runtime_layer
        self.attention_layers = tuple(range(target.n_layers)) if settings.verify_peaks else ()
        if settings.window in RUNTIME_WINDOWS and not settings.verify_peaks:
            self.attention_layers = (runtime_layer,)
        self.stopwatch = Stopwatch(self.device)
        self.fixed_shapes = self.device.type in FIXED_SHAPE_DEVICES
        self.stops_early = settings.threshold > 0 and self.device.type in FREE_READ_DEVICES and not self.fixed_shapes
        capacity = target.max_length + settings.k + 1  # the last block's padding runs past the length limit
        self.steps = None
        if self.fixed_shapes:
            captured = {} if captured is None else captured
            key = (id(target), id(draft), settings.k, capacity, memory.shape[1], self.attention_layers)
            if key not in captured:
                captured[key] = round_steps(target, draft, memory, settings.k, capacity, self.attention_layers)
            self.steps = captured[key]
            self.steps.load(target, draft, memory, valid_frames)
            self.target_cache, self.draft_cache = self.steps.target_cache, self.steps.draft_cache
        else:
            self.target_cache = target.new_cache(memory, capacity)
            self.draft_cache = draft.new_cache(memory, valid_frames, capacity)
        self.tokens: list[int] = []
        self.result = Decoded(self.tokens)

    def _verify(self, block: Tensor):
        return self.target.forward(
            block, self.target_cache, taps=self.draft.config.taps, attention_layers=self.attention_layers
        )

    def _verification_peaks(self, audio_attention: Tensor | None) -> Tensor:
        """(rows, attention layers) peak frame of each row; the runtime windows pay for this readout every round."""
        if audio_attention is None:
            return torch.empty(0, 0, dtype=torch.long, device=self.device)
        return audio_peaks(audio_attention, self.policy.valid_frames)

    def _record_verified(self, peaks: Tensor, rows: list[int], new: list[int]) -> None:
        """The first rows of `peaks` (on the device; `rows` the same on the host) predicted the tokens `new`."""
        if not self.attention_layers:
            return
        if self.settings.window in RUNTIME_WINDOWS:
            layer = self.attention_layers.index(self.runtime_layer)
            self.policy.observe_verified(len(self.tokens), peaks[: len(new), layer])
        if self.settings.verify_peaks:
            n_layers, start = len(self.attention_layers), self.origin.token + len(self.tokens)
            self.result.verified += [
                VerifiedToken(start + i, t, [p + self.origin.frame for p in rows[i * n_layers : (i + 1) * n_layers]])
                for i, t in enumerate(new)
                if t != self.target.eot
            ]

    def run(self, on_round: Callable[[Round], None] | None = None) -> Decoded:
        target = self.target
        prompt = torch.tensor([target.prompt], device=self.device)
        out = self._verify(prompt)
        first = target.greedy_tokens(out.states[:, -1:], 0)[0]
        peaks = self._verification_peaks(out.audio_attention)[-1:]
        (value,), rows = _read([first, peaks])
        self._record_verified(peaks, rows, [value])
        if value == target.eot:
            return self.result
        self.tokens.append(value)
        # The draft at position t reads (f_t, x_{t+1}); these are the positions it has yet to read, the last one
        # real at row `last`.
        features, inputs, last = out.hidden, torch.cat([prompt[:, 1:], first[None]], dim=1), prompt.shape[1] - 1
        while len(target.prompt) + len(self.tokens) < target.max_length:
            done, features, inputs, last = self._round(features, inputs, last)
            if on_round is not None:
                on_round(self.result.rounds[-1])
            if done:
                break
        return self.result

    def _round(self, features: Tensor, inputs: Tensor, last: int) -> tuple[bool, Tensor, Tensor, int]:
        target, draft, settings, k = self.target, self.draft, self.settings, self.settings.k
        n_prompt, verified = len(target.prompt), len(self.tokens)
        position = n_prompt + verified - 1  # of the last token, which the target has not read yet
        index = len(self.result.rounds)

        start = self.stopwatch.mark()
        # The step at draft position t predicts transcript token t + 2 - n_prompt.
        rows = inputs.shape[1] if self.fixed_shapes else last + 1
        first = self.draft_cache.length
        caught_up = self.policy.centres(first + 2 - n_prompt, rows, verified)
        if self.steps is not None and rows == k + 1:
            positions = torch.arange(first, first + rows, device=self.device)
            out = self.steps.catch_up(features[:, :rows], inputs[:, :rows], self._mask(caught_up), positions)
        else:
            out = draft(features[:, :rows], inputs[:, :rows], self.draft_cache, self._mask(caught_up))
        self.draft_cache.length = position
        centres = torch.cat([caught_up[last : last + 1], self.policy.centres(verified + 1, k - 1, verified)])
        hidden, next_features = out.hidden[:, last], out.features[:, last : last + 1]
        attention = [] if out.attention is None else [out.attention[0, last]]
        budget = target.max_length - n_prompt - verified - 1
        depths = k if self.fixed_shapes else max(1, min(k, budget))
        proposals, confidences = [], []
        for depth in range(1, depths + 1):
            confidence, choice = draft.logits(hidden).softmax(dim=-1).max(dim=-1)
            proposals.append(draft.vocab_to_target(choice))
            confidences.append(confidence)
            if depth == depths or (self.stops_early and confidence.item() < settings.threshold):
                break
            out = self._draft_step(next_features, proposals[-1][:, None], centres[depth : depth + 1])
            hidden, next_features = out.hidden[:, -1], out.features[:, -1:]
            if out.attention is not None:
                attention.append(out.attention[0, -1].clone())  # a replay overwrites its outputs
        drafted = self.stopwatch.mark()

        proposed = torch.cat(proposals)
        block = torch.cat([inputs[0, last : last + 1], proposed])[None]
        if self.steps is not None:
            out = self.steps.verify(block, torch.arange(position, position + k + 1, device=self.device))
        else:
            out = self._verify(block)
        choices = target.greedy_tokens(out.states, verified)[0]
        peaks = self._verification_peaks(out.audio_attention)
        verified_at = self.stopwatch.mark()

        attention = torch.stack(attention) if attention else None
        draft_peaks = attention.argmax(dim=-1) if attention is not None else proposed[:0]
        stops = torch.stack(confidences)[:, 0] < settings.threshold
        choice_list, proposed_list, stop_list, draft_peak_list, centre_list, peak_rows = _read(
            [choices, proposed, stops, draft_peaks, centres, peaks]
        )
        n = min(k, budget, *(d + 1 for d, stop in enumerate(stop_list) if stop))
        proposed_list = proposed_list[:n]
        accepted = accepted_length(proposed_list, choice_list[: n + 1], target.eot)
        new = [*proposed_list[:accepted], choice_list[accepted]]
        if target.eot in new:
            new = new[: new.index(target.eot) + 1]
        self.result.rounds.append(
            Round(
                index=self.origin.round + index,
                segment=self.origin.segment,
                start=self.origin.token + verified,
                proposed=proposed_list,
                accepted=accepted,
                target_token=choice_list[accepted],
                draft_seconds=self.stopwatch.seconds(start, drafted),
                verify_seconds=self.stopwatch.seconds(drafted, verified_at),
            )
        )
        kept = attention[:n].float().cpu().tolist() if attention is not None and settings.keep_attention else None
        self._record_steps(self.origin.round + index, proposed_list, accepted, draft_peak_list, centre_list, kept)
        self._record_verified(peaks, peak_rows, new)

        finished = new[-1] == target.eot
        self.tokens += new[:-1] if finished else new
        self.target_cache.length = position + 1 + accepted
        self.draft_cache.length = position
        # The next catch-up reads the verified features and the target's choices, real up to row `accepted`.
        return finished, out.hidden, choices[None], accepted

    def _draft_step(self, features: Tensor, token: Tensor, centres: Tensor):
        if self.steps is None:
            return self.draft(features, token, self.draft_cache, self._mask(centres))
        position = self.draft_cache.length
        self.draft_cache.length += 1
        return self.steps.step(features, token, self._mask(centres), torch.tensor([position], device=self.device))

    def _mask(self, centres: Tensor) -> Tensor | None:
        """Which audio frames the draft may attend; captured steps read a mask over the padded audio even without
        audio attention, as their input shapes are fixed."""
        if self.steps is not None:
            return self.policy.mask(centres, self.draft_cache.frames)
        return self.policy.mask(centres) if self.draft.config.audio else None

    def _record_steps(
        self,
        index: int,
        proposed: list[int],
        accepted: int,
        draft_peaks: list[int],
        centres: list[int],
        attention: list[list[float]] | None,
    ) -> None:
        start, offset = len(self.tokens), self.origin.frame
        for depth, token in enumerate(proposed, start=1):
            centre, reference = centres[depth - 1], self.policy.reference_frame(start + depth - 1)
            self.result.steps.append(
                DraftStep(
                    round=index,
                    depth=depth,
                    token=token,
                    accepted=depth <= accepted,
                    draft_peak=draft_peaks[depth - 1] + offset if draft_peaks else None,
                    window_centre=None if centre == NO_WINDOW else centre + offset,
                    reference_frame=None if reference is None else reference + offset,
                    attention=None if attention is None else attention[depth - 1],
                )
            )
