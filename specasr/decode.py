"""Decoding loops over one window's encoder output, step by step from the host: autoregressive greedy (the baseline)
and speculative decoding. `specasr.graphs` runs the same loops as captured steps on a CUDA device.

The speculative loop returns exactly the greedy tokens under exact arithmetic: the target verifies
each block of proposals in one pass and keeps the longest prefix that matches its own greedy
choice, plus its own next token. Rows are recorded in clip coordinates (`Origin`, `SegmentRows`); the pipeline
times the phases (`PhaseTimer`).
"""

import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import Tensor

from specasr.draft import Draft
from specasr.targets import Target
from specasr.targets.base import audio_peaks
from specasr.trace import DraftStep, Round, Settings, SettingsError, Timings, VerifiedToken
from specasr.windows import NO_WINDOW, RUNTIME_WINDOWS, WindowPolicy

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
    runtime_peaks: list[int] = field(default_factory=list)  # a runtime window's readout, a frame per token


class SegmentRows:
    """A segment's transcript and trace rows in clip coordinates, built from what a loop read back from the device."""

    def __init__(
        self,
        target: Target,
        origin: Origin,
        verify_peaks: bool,
        layers: int,
        policy: WindowPolicy | None = None,
        readout: int | None = None,
    ):
        """readout: which of the `layers` attention layers a runtime window reads (`readout_column`), or None."""
        self.eot, self.origin, self.policy = target.eot, origin, policy
        self.verify_peaks, self.layers, self.readout = verify_peaks, layers, readout
        self.result = Decoded([])
        self.tokens = self.result.tokens

    def verified(self, new: list[int], peaks: list[int]) -> bool:
        """Tokens `new` follow the transcript (the last may be end-of-text); `peaks` holds, row by row, the frame each
        attention layer peaked at while predicting them. Whether the transcript ended."""
        finished = new[-1] == self.eot
        taken = new[:-1] if finished else new
        start, n, frame = self.origin.token + len(self.tokens), self.layers, self.origin.frame
        if self.verify_peaks:
            self.result.verified += [
                VerifiedToken(start + i, token, [p + frame for p in peaks[i * n : (i + 1) * n]])
                for i, token in enumerate(taken)
            ]
        if self.readout is not None:
            self.result.runtime_peaks += [peaks[i * n + self.readout] + frame for i in range(len(taken))]
        self.tokens += taken
        return finished

    def round(
        self,
        proposed: list[int],
        accepted: int,
        choices: list[int],
        draft_peaks: list[int] | None,
        centres: list[int],
        peaks: list[int],
        seconds: tuple[float, float],
        attention: list[list[float]] | None = None,
    ) -> bool:
        """One round: its proposals, how many the target kept, the target's choice after each, where the draft
        attended (None without audio attention), each step's window centre, the verification peaks, the seconds of
        drafting and of verification, and, where kept, each step's attention row. Whether the transcript ended."""
        new = [*proposed[:accepted], choices[accepted]]
        if self.eot in new:
            new = new[: new.index(self.eot) + 1]
        index, start, origin = self.origin.round + len(self.result.rounds), len(self.tokens), self.origin
        self.result.rounds.append(
            Round(index, origin.segment, origin.token + start, proposed, accepted, choices[accepted], *seconds)
        )
        offset = origin.frame
        for depth, token in enumerate(proposed, start=1):
            centre, reference = centres[depth - 1], self.policy.reference_frame(start + depth - 1)
            self.result.steps.append(
                DraftStep(
                    round=index,
                    depth=depth,
                    token=token,
                    accepted=depth <= accepted,
                    draft_peak=None if draft_peaks is None else draft_peaks[depth - 1] + offset,
                    window_centre=None if centre == NO_WINDOW else centre + offset,
                    reference_frame=None if reference is None else reference + offset,
                    attention=None if attention is None else attention[depth - 1],
                )
            )
        return self.verified(new, peaks)


@torch.inference_mode()
def greedy(
    target: Target, memory: Tensor, valid_frames: int, verify_peaks: bool = False, origin: Origin = Origin()
) -> Decoded:
    """The target's greedy transcript (prompt and end-of-text excluded), one cached step per token; with
    verify_peaks, where every decoder layer attended while predicting each token."""
    layers = tuple(range(target.n_layers)) if verify_peaks else ()
    cache = target.new_cache(memory)
    out = target.forward(torch.tensor([target.prompt], device=memory.device), cache, attention_layers=layers)
    rows = SegmentRows(target, origin, verify_peaks, len(layers))
    while len(target.prompt) + len(rows.tokens) < target.max_length:
        token = target.greedy_tokens(out.states[:, -1:], len(rows.tokens))
        peaks = audio_peaks(out.audio_attention[:, :, -1:], valid_frames) if layers else token[:0]
        (value,), peaks = _read([token, peaks])
        if rows.verified([value], peaks):
            break
        out = target.forward(token, cache, attention_layers=layers)
    return rows.result


def greedy_tokens(target: Target, memory: Tensor) -> list[int]:
    return greedy(target, memory, memory.shape[1]).tokens


def runtime_layer(settings: Settings, target: Target) -> int:
    """The decoder layer the runtime windows read: the settings' where they name one, else the target's."""
    layer = settings.runtime_layer if settings.runtime_layer is not None else target.runtime_layer
    if not 0 <= layer < target.n_layers:
        raise SettingsError(f"runtime layer {layer} is not one of the target's decoder layers 0..{target.n_layers - 1}")
    return layer


@dataclass(frozen=True)
class LoopOptions:
    """What a speculative loop reads of its settings, resolved against its target once."""

    k: int
    threshold: float
    window: str
    half_width_ms: float
    verify_peaks: bool  # record every decoder layer's verification peak
    keep_attention: bool  # keep each draft step's attention row in the trace
    attention_layers: tuple[int, ...]  # the decoder layers whose audio attention a verification pass reads
    readout: int | None  # where the runtime layer sits among them: the runtime windows' readout; None for the others

    @classmethod
    def of(cls, settings: Settings, target: Target) -> "LoopOptions":
        """The runtime layer is the settings' (the target's by default); a verification pass reads every layer to
        record verification peaks, else the runtime layer for the runtime windows, else none."""
        layer = runtime_layer(settings, target)
        runtime = settings.window in RUNTIME_WINDOWS
        layers = tuple(range(target.n_layers)) if settings.verify_peaks else (layer,) if runtime else ()
        return cls(
            k=settings.k,
            threshold=settings.threshold,
            window=settings.window,
            half_width_ms=settings.half_width_ms,
            verify_peaks=settings.verify_peaks,
            keep_attention=settings.keep_attention,
            attention_layers=layers,
            readout=layers.index(layer) if runtime else None,
        )


def speculative(
    target: Target,
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
    options = LoopOptions.of(settings, target)
    with torch.inference_mode():
        return _SpeculativeLoop(target, draft, memory, valid_frames, options, reference, origin).run(on_round)


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


@dataclass
class Proposal:
    """A round's drafting, on the device: its proposals, the draft's confidence in each, each step's window centre
    and, with audio attention, where each step attended."""

    tokens: Tensor  # (n,) target token ids
    confidences: Tensor  # (n,)
    centres: Tensor  # (K,)
    attention: Tensor | None  # (n, frames) head-averaged audio attention


@dataclass
class Verification:
    """The target's pass over the last verified token and the proposals, on the device."""

    choices: Tensor  # (n + 1,) its greedy choice after each
    peaks: Tensor  # (n + 1, attention layers) the frame each layer peaked at
    hidden: Tensor  # the features the draft catches up on next


@dataclass
class Outcome:
    """A round read back on the host: the proposals kept (K, fewer at the length limit or past the first one below
    the confidence threshold), how many the target accepted, and what the trace rows need."""

    proposed: list[int]
    accepted: int  # the target's choice after them is the correction token
    choices: list[int]
    draft_peaks: list[int] | None  # None without audio attention
    centres: list[int]
    peaks: list[int]
    attention: list[list[float]] | None  # each kept step's attention row, where the trace keeps them


class _SpeculativeLoop:
    """One segment's rounds, step by step from the host, each in four phases: propose (the draft catches up on the
    tokens the last verification accepted and takes single steps, no further than the length limit and, where reading
    the device is free, than its first proposal below the confidence threshold; elsewhere the round drops such
    proposals), verify (the target's pass over the block), accept (the longest agreeing prefix and the target's next
    token) and record (the trace rows). Window centres and masks are computed on the device; but for those confidences
    on a CPU, the host reads the device once per round."""

    def __init__(self, target, draft, memory, valid_frames, options: LoopOptions, reference, origin):
        self.target, self.draft, self.options = target, draft, options
        self.device = memory.device
        capacity = target.max_length + options.k + 1  # the last block may run past the length limit
        self.policy = WindowPolicy(
            options.window,
            options.half_width_ms,
            valid_frames,
            reference,
            target.frame_seconds,
            self.device,
            capacity + options.k,
        )
        layers = len(options.attention_layers)
        self.rows = SegmentRows(target, origin, options.verify_peaks, layers, self.policy, options.readout)
        self.stopwatch = Stopwatch(self.device)
        self.stops_early = options.threshold > 0 and self.device.type in FREE_READ_DEVICES
        self.target_cache = target.new_cache(memory, capacity)
        self.draft_cache = draft.new_cache(memory, valid_frames, capacity)

    def _pass(self, block: Tensor):
        return self.target.forward(
            block, self.target_cache, taps=self.draft.config.taps, attention_layers=self.options.attention_layers
        )

    def _verification_peaks(self, audio_attention: Tensor | None) -> Tensor:
        """(rows, attention layers) peak frame of each row; the runtime windows pay for this readout every round."""
        if audio_attention is None:
            return torch.empty(0, 0, dtype=torch.long, device=self.device)
        return audio_peaks(audio_attention, self.policy.valid_frames)

    def _observe(self, peaks: Tensor, verified: int, new: int) -> None:
        """The runtime windows' centres follow the verification peaks of the `new` tokens after `verified`."""
        if self.options.readout is not None:
            self.policy.observe_verified(verified, peaks[:new, self.options.readout])

    def run(self, on_round: Callable[[Round], None] | None = None) -> Decoded:
        target, tokens = self.target, self.rows.tokens
        prompt = torch.tensor([target.prompt], device=self.device)
        out = self._pass(prompt)
        first = target.greedy_tokens(out.states[:, -1:], 0)[0]
        peaks = self._verification_peaks(out.audio_attention)[-1:]
        (value,), rows = _read([first, peaks])
        self._observe(peaks, 0, 1)
        if self.rows.verified([value], rows):
            return self.rows.result
        # The draft at position t reads (f_t, x_{t+1}); these are the positions it has yet to read, the last one
        # real at row `last`.
        features, inputs, last = out.hidden, torch.cat([prompt[:, 1:], first[None]], dim=1), prompt.shape[1] - 1
        while len(target.prompt) + len(tokens) < target.max_length:
            done, features, inputs, last = self._round(features, inputs, last)
            if on_round is not None:
                on_round(self.rows.result.rounds[-1])
            if done:
                break
        return self.rows.result

    def _round(self, features: Tensor, inputs: Tensor, last: int) -> tuple[bool, Tensor, Tensor, int]:
        """Propose, verify, accept, record; then the caches keep what was accepted. Returns whether the transcript
        ended and what the next catch-up reads: the verified features and the target's choices, real up to row
        `accepted`."""
        verified = len(self.rows.tokens)
        position = len(self.target.prompt) + verified - 1  # of the last token, which the target has not read yet
        budget = self.target.max_length - len(self.target.prompt) - verified - 1
        start = self.stopwatch.mark()
        proposal = self._propose(features, inputs, last, verified, budget)
        drafted = self.stopwatch.mark()
        verification = self._verify(inputs[0, last : last + 1], proposal.tokens, verified)
        verified_at = self.stopwatch.mark()
        outcome = self._accept(proposal, verification, verified, budget)
        seconds = self.stopwatch.seconds(start, drafted), self.stopwatch.seconds(drafted, verified_at)
        finished = self._record(outcome, seconds)
        self.target_cache.length = position + 1 + outcome.accepted
        self.draft_cache.length = position
        return finished, verification.hidden, verification.choices[None], outcome.accepted

    def _propose(self, features: Tensor, inputs: Tensor, last: int, verified: int, budget: int) -> Proposal:
        """The draft catches up on rows up to `last` and proposes up to K tokens."""
        draft, n_prompt, k = self.draft, len(self.target.prompt), self.options.k
        # The step at draft position t predicts transcript token t + 2 - n_prompt.
        first = self.draft_cache.length
        caught_up = self.policy.centres(first + 2 - n_prompt, last + 1, verified)
        out = draft(features[:, : last + 1], inputs[:, : last + 1], self.draft_cache, self._mask(caught_up))
        centres = torch.cat([caught_up[last : last + 1], self.policy.centres(verified + 1, k - 1, verified)])
        hidden, next_features = out.hidden[:, last], out.features[:, last : last + 1]
        attention = [] if out.attention is None else [out.attention[0, last]]
        depths = max(1, min(k, budget))
        proposals, confidences = [], []
        for depth in range(1, depths + 1):
            confidence, choice = draft.logits(hidden).softmax(dim=-1).max(dim=-1)
            proposals.append(draft.vocab_to_target(choice))
            confidences.append(confidence)
            if depth == depths or (self.stops_early and confidence.item() < self.options.threshold):
                break
            out = draft(next_features, proposals[-1][:, None], self.draft_cache, self._mask(centres[depth : depth + 1]))
            hidden, next_features = out.hidden[:, -1], out.features[:, -1:]
            if out.attention is not None:
                attention.append(out.attention[0, -1])
        return Proposal(
            torch.cat(proposals), torch.stack(confidences)[:, 0], centres, torch.stack(attention) if attention else None
        )

    def _verify(self, last_token: Tensor, proposals: Tensor, verified: int) -> Verification:
        """The target reads the last verified token and the proposals in one pass."""
        out = self._pass(torch.cat([last_token, proposals])[None])
        choices = self.target.greedy_tokens(out.states, verified)[0]
        return Verification(choices, self._verification_peaks(out.audio_attention), out.hidden)

    def _accept(self, proposal: Proposal, verification: Verification, verified: int, budget: int) -> Outcome:
        """The round's one read of the device: the proposals kept, the longest prefix the target agrees with, and the
        runtime windows told where the accepted tokens and the correction token attended."""
        k, threshold, attention = self.options.k, self.options.threshold, proposal.attention
        draft_peaks = attention.argmax(dim=-1) if attention is not None else proposal.tokens[:0]
        stops = proposal.confidences < threshold
        choices, proposed, stop_list, draft_peak_list, centres, peaks = _read(
            [verification.choices, proposal.tokens, stops, draft_peaks, proposal.centres, verification.peaks]
        )
        n = min(k, budget, *(d + 1 for d, stop in enumerate(stop_list) if stop))
        accepted = accepted_length(proposed[:n], choices[: n + 1], self.target.eot)
        kept = attention[:n].float().cpu().tolist() if attention is not None and self.options.keep_attention else None
        self._observe(verification.peaks, verified, accepted + 1)
        draft_peaks = draft_peak_list if attention is not None else None
        return Outcome(proposed[:n], accepted, choices, draft_peaks, centres, peaks, kept)

    def _record(self, outcome: Outcome, seconds: tuple[float, float]) -> bool:
        """The round's trace rows; whether the transcript ended."""
        return self.rows.round(
            outcome.proposed,
            outcome.accepted,
            outcome.choices,
            outcome.draft_peaks,
            outcome.centres,
            outcome.peaks,
            seconds,
            outcome.attention,
        )

    def _mask(self, centres: Tensor) -> Tensor | None:
        """Which of the valid audio frames the draft may attend."""
        return self.policy.mask(centres) if self.draft.config.audio else None
