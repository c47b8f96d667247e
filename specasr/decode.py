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
from specasr.targets import WhisperTarget
from specasr.trace import DraftStep, Round, Settings, Timings, VerifiedToken
from specasr.windows import NO_WINDOW, RUNTIME_WINDOWS, WindowPolicy


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


def _peaks(cross_attention: Tensor, rows: slice, valid_frames: int, origin: Origin) -> list[list[int]]:
    """Per predicted row, the clip frame of each layer's head-averaged cross-attention peak (padding excluded)."""
    peaks = cross_attention[:, 0, rows, :valid_frames].argmax(dim=-1).T + origin.frame
    return peaks.tolist()


@torch.inference_mode()
def greedy(
    target: WhisperTarget, memory: Tensor, valid_frames: int, verify_peaks: bool = False, origin: Origin = Origin()
) -> Decoded:
    """Whisper's greedy transcript (prompt and end-of-text excluded), one cached step per token; with verify_peaks,
    where every decoder layer attended while predicting each token."""
    layers = tuple(range(target.n_layers)) if verify_peaks else ()
    cache = target.new_cache(memory)
    out = target.forward(torch.tensor([target.prompt], device=memory.device), cache, attention_layers=layers)
    row = slice(len(target.prompt) - 1, len(target.prompt))
    result = Decoded([])
    while len(target.prompt) + len(result.tokens) < target.max_length:
        token = target.greedy_tokens(out.logits[:, row], len(result.tokens))
        value = token.item()
        if value == target.eot:
            break
        if layers:
            peaks = _peaks(out.cross_attention, row, valid_frames, origin)[0]
            result.verified.append(VerifiedToken(origin.token + len(result.tokens), value, peaks))
        result.tokens.append(value)
        out = target.forward(token, cache, attention_layers=layers)
        row = slice(0, 1)
    return result


def greedy_tokens(target: WhisperTarget, memory: Tensor) -> list[int]:
    return greedy(target, memory, memory.shape[1]).tokens


def speculative(
    target: WhisperTarget,
    draft: Draft,
    memory: Tensor,
    valid_frames: int,
    settings: Settings,
    reference: list[int | None] | None = None,
    origin: Origin = Origin(),
    on_round: Callable[[Round], None] | None = None,
) -> Decoded:
    """The speculative loop for one segment (batch 1): the greedy transcript tokens and the rows of every round.

    reference: the segment's own frame for each of its transcript tokens, for the windows centred from them.
    on_round: called with every round as it ends (progress reports; its time counts in the decode phase).
    """
    with torch.inference_mode():
        loop = _SpeculativeLoop(target, draft, memory, valid_frames, settings, reference, origin)
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


class _SpeculativeLoop:
    def __init__(self, target, draft, memory, valid_frames, settings, reference, origin):
        self.target, self.draft, self.settings, self.origin = target, draft, settings, origin
        self.device = memory.device
        self.policy = WindowPolicy(settings.window, settings.half_width_ms, valid_frames, reference)
        self.target_cache = target.new_cache(memory)
        self.draft_cache = draft.new_cache(memory, valid_frames, target.max_length)
        runtime_layer = settings.runtime_layer if settings.runtime_layer is not None else target.runtime_layer
        if not 0 <= runtime_layer < target.n_layers:
            raise ValueError(f"runtime layer {runtime_layer} outside the target's {target.n_layers} decoder layers")
        self.runtime_layer = runtime_layer
        self.attention_layers = tuple(range(target.n_layers)) if settings.verify_peaks else ()
        if settings.window in RUNTIME_WINDOWS and not settings.verify_peaks:
            self.attention_layers = (runtime_layer,)
        self.stopwatch = Stopwatch(self.device)
        self.tokens: list[int] = []
        self.result = Decoded(self.tokens)

    def _verify(self, block: Tensor):
        return self.target.forward(
            block, self.target_cache, taps=self.draft.config.taps, attention_layers=self.attention_layers
        )

    def _read_peaks(self, cross_attention: Tensor | None, rows: slice) -> list[list[int]] | None:
        """Each row's peak frame per layer (segment frames); the runtime windows pay for this readout every round."""
        return None if cross_attention is None else _peaks(cross_attention, rows, self.policy.valid_frames, Origin())

    def _record_verified(self, peaks: list[list[int]] | None, new: list[int]) -> None:
        """The first rows of `peaks` predicted the tokens `new`; keep where each layer looked."""
        if peaks is None:
            return
        peaks = peaks[: len(new)]
        if self.settings.window in RUNTIME_WINDOWS:
            layer = self.attention_layers.index(self.runtime_layer)
            self.policy.observe_verified(len(self.tokens), [row[layer] for row in peaks])
        if self.settings.verify_peaks:
            start = self.origin.token + len(self.tokens)
            self.result.verified += [
                VerifiedToken(start + i, t, [p + self.origin.frame for p in peaks[i]])
                for i, t in enumerate(new)
                if t != self.target.eot
            ]

    def run(self, on_round: Callable[[Round], None] | None = None) -> Decoded:
        target, prompt = self.target, self.target.prompt
        out = self._verify(torch.tensor([prompt], device=self.device))
        first = target.greedy_tokens(out.logits[:, -1:], 0).item()
        self._record_verified(self._read_peaks(out.cross_attention, slice(len(prompt) - 1, len(prompt))), [first])
        if first == target.eot:
            return self.result
        self.tokens.append(first)
        # The draft at position t reads (f_t, x_{t+1}); these are the positions it has yet to read.
        features, inputs = out.hidden, torch.tensor([[*prompt[1:], first]], device=self.device)
        while len(prompt) + len(self.tokens) < target.max_length:
            done, features, inputs = self._round(features, inputs)
            if on_round is not None:
                on_round(self.result.rounds[-1])
            if done:
                break
        return self.result

    def _round(self, features: Tensor, inputs: Tensor) -> tuple[bool, Tensor, Tensor]:
        target, draft, settings = self.target, self.draft, self.settings
        n_prompt = len(target.prompt)
        position = n_prompt + len(self.tokens) - 1  # of the last token, which the target has not read yet
        k = min(settings.k, target.max_length - n_prompt - len(self.tokens) - 1)
        index = len(self.result.rounds)

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
                if depth == k or (settings.threshold > 0 and top.item() < settings.threshold):
                    break
                centre = self.policy.centre(len(self.tokens) + depth, len(self.tokens))
                centres.append(centre)
                out = draft(out.features[:, -1:], token[:, None], self.draft_cache, self._mask([centre]))
        drafted = self.stopwatch.mark()

        block = torch.cat([inputs[:, -1:], torch.stack(proposed, dim=1)], dim=1) if proposed else inputs[:, -1:]
        out = self._verify(block)
        choices = target.greedy_tokens(out.logits, len(self.tokens))[0]
        peaks = self._read_peaks(out.cross_attention, slice(None))
        verified_at = self.stopwatch.mark()

        choices = choices.tolist()  # the round's one host synchronisation
        proposed = block[0, 1:].tolist()
        accepted = accepted_length(proposed, choices, target.eot)
        new = [*proposed[:accepted], choices[accepted]]
        if target.eot in new:
            new = new[: new.index(target.eot) + 1]
        self.result.rounds.append(
            Round(
                index=self.origin.round + index,
                segment=self.origin.segment,
                start=self.origin.token + len(self.tokens),
                proposed=proposed,
                accepted=accepted,
                target_token=choices[accepted],
                draft_seconds=self.stopwatch.seconds(start, drafted),
                verify_seconds=self.stopwatch.seconds(drafted, verified_at),
            )
        )
        self._record_steps(self.origin.round + index, proposed, accepted, rows, centres)
        self._record_verified(peaks, new)

        finished = new[-1] == target.eot
        self.tokens += new[:-1] if finished else new
        self.target_cache.length = position + 1 + accepted
        self.draft_cache.length = position
        return finished, out.hidden[:, : accepted + 1], torch.tensor([new], device=self.device)

    def _mask(self, centres: list[int]) -> Tensor | None:
        return self.policy.mask(centres, self.device) if self.draft.config.audio else None

    def _record_steps(self, index: int, proposed: list[int], accepted: int, rows: list[Tensor], centres: list[int]):
        start, offset = len(self.tokens), self.origin.frame
        peaks = (torch.stack(rows).argmax(dim=-1) + offset).tolist() if rows else [None] * len(proposed)
        for depth, token in enumerate(proposed, start=1):
            row = rows[depth - 1].float().cpu().tolist() if rows and self.settings.keep_attention else None
            centre, reference = centres[depth - 1], self.policy.reference_frame(start + depth - 1)
            self.result.steps.append(
                DraftStep(
                    round=index,
                    depth=depth,
                    token=token,
                    accepted=depth <= accepted,
                    draft_peak=peaks[depth - 1],
                    window_centre=None if centre == NO_WINDOW else centre + offset,
                    reference_frame=None if reference is None else reference + offset,
                    attention=row,
                )
            )
