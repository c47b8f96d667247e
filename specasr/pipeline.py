"""Clip + settings -> trace: the one place the decoding chain is assembled.

audio -> 30 s windows cut at quiet points -> features -> encoder (once per window) -> [greedy pass and forced
alignment, only when the settings need reference frames, and once per clip and target] -> greedy or speculative
loop, or a peer decoder (specasr.peers) in their place -> one complete trace. Targets, drafts, peers, aligners and
reference frames are kept for the next decode.

One pipeline serves many decodes at once (the dashboard shares one between its sessions, each in a thread of its own):
each model and reference is made once, by the first decode that asks for it while the others asking wait for it, and
the loops' static steps are lent to one decode at a time (steppool.StepPool).
"""

import threading
import warnings
from collections.abc import Callable, Hashable
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

import torch
from torch import Tensor

from specasr import graphs
from specasr.align import Aligner, AlignmentError, get_aligner
from specasr.audio import SAMPLE_RATE, AudioTooLongError, Clip, split_windows
from specasr.decode import LoopOptions, PhaseTimer, greedy
from specasr.draft import Draft, resolve_draft
from specasr.loops import loop_for
from specasr.peers import Peer, load_peer
from specasr.profiling import pass_costs
from specasr.records import Decoded, Origin
from specasr.reference import ClipReference, align_tokens, check_reference_length, read_reference_file
from specasr.steppool import StepPool
from specasr.store import Store, StoreError
from specasr.targets import Target, load_target
from specasr.trace import (
    REFERENCE_SOURCES,
    RUNTIME_WINDOWS,
    Round,
    Segment,
    Settings,
    SettingsError,
    Trace,
    code_version,
)
from specasr.words import normalize_for_alignment

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)


class Pipeline:
    """Decodes clips under any settings; loads each target, draft and aligner once, and makes a clip's reference
    frames once per target (kept in memory, and in the store when there is one)."""

    def __init__(self, store: Store | None = None):
        self.store = store
        self._targets: dict[tuple, Target] = {}
        self._drafts: dict[tuple, tuple[Draft, str, str]] = {}  # the draft, its name and its weights hash
        self._aligners: dict[str, Aligner] = {}
        self._peers: dict[tuple, Peer] = {}
        self._references: dict[tuple, ClipReference] = {}
        self._reference_cache_failed = False
        self._steps = StepPool()  # the loops' static steps (captured, compiled), kept across segments and clips
        self._making: dict[tuple, threading.Lock] = {}  # one per thing made, held while it is made
        self._lock = threading.Lock()

    def _once(self, kept: dict[K, T], key: K, make: Callable[[], T]) -> T:
        """kept[key], made by the first caller: callers of the same key meanwhile wait for it, other keys are made
        beside it (another clip's reference need not wait for this one's)."""
        if key not in kept:
            with self._lock:
                making = self._making.setdefault((id(kept), key), threading.Lock())
            with making:
                if key not in kept:
                    kept[key] = make()
        return kept[key]

    def target(self, settings: Settings) -> Target:
        key = (settings.target, settings.device, settings.dtype)
        return self._once(self._targets, key, lambda: load_target(*key))

    def draft(self, settings: Settings) -> Draft | None:
        return self._draft(settings)[0] if settings.draft is not None else None

    def _draft(self, settings: Settings) -> tuple[Draft, str, str]:
        key = (settings.target, settings.device, settings.dtype, settings.draft, settings.draft_dtype)

        def make() -> tuple[Draft, str, str]:
            draft = resolve_draft(settings.draft, self.target(settings), settings.draft_dtype)
            return draft, draft.name, draft.weights_hash()  # hashing the weights takes a while

        return self._once(self._drafts, key, make)

    def peer(self, settings: Settings) -> Peer:
        key = (settings.decoder, settings.target, settings.device, settings.dtype, settings.assistant)

        def make() -> Peer:
            target = self.target(settings)
            return load_peer(settings.decoder, target, settings.device, settings.dtype, settings.assistant)

        return self._once(self._peers, key, make)

    def aligner(self, name: str) -> Aligner:
        return self._once(self._aligners, name, lambda: get_aligner(name))

    def resolved(self, settings: Settings) -> Settings:
        """The settings as a decode runs them: a greedy decode carries no draft settings, a speculative one names
        its draft's precision and, with a runtime window, its layer (none with the others, which read none); captured
        steps only where our loops run on a device that replays them, and compiled ones where asked or where the
        device's default says so."""
        ours, device = settings.decoder == "specasr", torch.device(settings.device).type
        compile = graphs.COMPILED_BY_DEFAULT.get(device, False) if settings.compile is None else settings.compile
        settings = replace(
            settings, graphs=settings.graphs and ours and device in graphs.GRAPH_DEVICES, compile=compile and ours
        )
        if settings.draft is None:
            peaks = settings.verify_peaks and settings.decoder == "specasr"  # peers record no attention
            return replace(
                settings,
                k=0,
                window="unrestricted",
                half_width_ms=0.0,
                runtime_layer=None,
                threshold=0.0,
                verify_peaks=peaks,
                tree_width=1,
                tree_nodes=None,
            )
        layer = None  # the other windows read no layer: one given is ignored
        if settings.window in RUNTIME_WINDOWS:
            layer = LoopOptions.of(settings, self.target(settings)).runtime_layer
        return replace(
            settings, runtime_layer=layer, draft_dtype=settings.draft_dtype or settings.dtype, tree_nodes=settings.nodes
        )

    def decode(self, clip: Clip, settings: Settings, on_round: Callable[[Round], None] | None = None) -> Trace:
        """Transcribe `clip` under `settings`, timed from the waveform, and return its complete trace: the clip's 30 s
        windows encoded, its reference frames where the settings need them, each window decoded, the trace.

        on_round: called with every speculative round as it ends (a progress report; its time counts as decode).
        """
        settings = self.resolved(settings)
        if clip.seconds > settings.max_seconds:
            raise AudioTooLongError(
                f"{clip.id} is {clip.seconds:.2f} s long, over the {settings.max_seconds:g} s limit"
            )
        target = self.target(settings)
        peer = self.peer(settings) if settings.decoder != "specasr" else None
        windows = split_windows(clip.audio, target.window_samples, target.cut_samples)
        timer = PhaseTimer(target.device)
        memories = _encode(peer or target, clip, windows, timer)
        reference = None
        if settings.needs_reference:
            with timer.phase("reference"):
                reference = self.reference(clip, settings, windows, memories)
        segments, decoded = self._decode_windows(settings, peer, windows, memories, reference, timer, on_round)
        if reference is not None and reference.source == "file":  # only now is the transcript known
            check_reference_length(settings.reference, reference.frames, len(decoded.tokens))
        return self._trace(clip, settings, segments, decoded, reference, timer)

    def _decode_windows(
        self,
        settings: Settings,
        peer: Peer | None,
        windows: list[tuple[int, int]],
        memories: list[Tensor],
        reference: ClipReference | None,
        timer: PhaseTimer,
        on_round: Callable[[Round], None] | None,
    ) -> tuple[list[Segment], Decoded]:
        """Each window decoded in turn, its tokens and rows following the previous window's: the segments, and
        what the loop made of them all."""
        target = self.target(settings)
        draft = self.draft(settings)
        segments, decoded = [], Decoded([])
        with self._steps.lend() as captured:
            loop = loop_for(target, draft, settings, captured) if peer is None else None
            for index, ((start, end), memory) in enumerate(zip(windows, memories, strict=True)):
                origin = Origin(index, target.frames(start), len(decoded.tokens), len(decoded.rounds))
                valid_frames = target.valid_frames(end - start)
                frames = reference.window_frames(index, origin.frame) if reference else None
                with timer.phase("decode"):
                    if peer is not None:
                        result = Decoded(peer.decode(memory))
                    else:
                        result = loop(memory, valid_frames, origin, frames, on_round)
                segments.append(Segment(index, origin.frame, valid_frames, len(decoded.tokens), len(result.tokens)))
                decoded.tokens += result.tokens
                decoded.rounds += result.rounds
                decoded.steps += result.steps
                decoded.verified += result.verified
                decoded.runtime_peaks += result.runtime_peaks
        return segments, decoded

    def _trace(
        self,
        clip: Clip,
        settings: Settings,
        segments: list[Segment],
        decoded: Decoded,
        reference: ClipReference | None,
        timer: PhaseTimer,
    ) -> Trace:
        """The decode's trace: its text window by window, each token's text, and what it was decoded with."""
        target = self.target(settings)
        _, draft_name, draft_hash = self._draft(settings) if settings.draft is not None else (None, "none", None)
        tokens, steps = decoded.tokens, decoded.steps
        texts = [target.decode_text(tokens[s.first_token : s.first_token + s.tokens]) for s in segments]
        pieces = {token: target.tokenizer.decode([token]) for token in {*tokens, *(s.token for s in steps)}}
        return Trace(
            clip_id=clip.id,
            settings=settings,
            tokens=tokens,
            text=" ".join(text for text in texts if text),
            clip_hash=clip.hash,
            clip_seconds=clip.seconds,
            audio_path=clip.path,
            dataset=clip.dataset,
            reference_text=clip.text,
            frame_seconds=target.frame_seconds,
            code=code_version(),
            token_texts=[pieces[token] for token in tokens],
            target_runtime_layer=settings.readout_layer(target.runtime_layer),
            draft_name=draft_name,
            draft_hash=draft_hash,
            segments=segments,
            reference_frames=reference and reference.frames,
            reference_source=reference and reference.source,
            runtime_peaks=decoded.runtime_peaks if settings.window in RUNTIME_WINDOWS else None,
            timings=timer.timings,
            rounds=decoded.rounds,
            steps=[replace(step, text=pieces[step.token]) for step in steps],
            verified=decoded.verified,
        )

    def compile_seconds(self) -> float:
        """Seconds torch.compile has spent on the static steps this pipeline keeps."""
        return graphs.compile_seconds(self._steps.made())

    def step_costs(
        self, clip: Clip, settings: Settings, repeats: int = 50, compiled: bool | None = None
    ) -> dict[str, graphs.StepCost]:
        """The static steps `settings` decode with, on the clip's first window, each one's device time replayed back
        to back and the kernels it launches (graphs.step_costs): a greedy step, or a round's drafting and
        verification. compiled: the same steps compiled or not whatever the settings say (static steps either way,
        captured where the device replays them). Empty where the settings decode with no static steps."""
        settings = self.resolved(settings)
        if compiled is not None:
            static = settings.graphs or settings.compile
            settings = replace(settings, graphs=static, compile=compiled and settings.decoder == "specasr")
        if not (settings.graphs or settings.compile):
            return {}
        target = self.target(settings)
        memory, valid_frames = self._first_window(clip, target)
        with self._steps.lend() as captured:
            loop = loop_for(target, self.draft(settings), settings, captured)
            with loop.mode.running():
                steps = loop.steps(memory)
                if settings.draft is None:
                    steps.load(memory, valid_frames)
                else:
                    steps.load(memory, valid_frames, [])  # no window needs its reference frames to be timed
                return steps.costs(repeats)

    def pass_costs(self, clip: Clip, settings: Settings, repeats: int = 20) -> tuple[float, float]:
        """The cost model's v(N) and rho(W) for a speculative decode's tree (profiling.pass_costs), on the clip's first
        window: its verification and a draft pass over its frontier, each in target steps of one row."""
        settings = self.resolved(settings)
        target = self.target(settings)
        memory, valid_frames = self._first_window(clip, target)
        draft = self.draft(settings)
        return pass_costs(target, draft, memory, valid_frames, settings.nodes, settings.tree_width, repeats)

    def _first_window(self, clip: Clip, target: Target) -> tuple[Tensor, int]:
        start, end = split_windows(clip.audio, target.window_samples, target.cut_samples)[0]
        memory = target.encode(target.features(target.samples(clip.audio)[start:end]))
        return memory, target.valid_frames(end - start)

    def reference(
        self,
        clip: Clip,
        settings: Settings,
        windows: list[tuple[int, int]] | None = None,
        memories: list[Tensor] | None = None,
    ) -> ClipReference:
        """The clip's greedy transcript, force-aligned window by window (or frames from the settings' file).

        Made once per clip, target and aligner; `memories` are the windows' encoder outputs where a decode already
        has them.
        """
        if settings.reference not in REFERENCE_SOURCES:
            return _reference_file(Path(settings.reference), clip, self.target(settings))
        key = (clip.hash, settings.target, settings.device, settings.dtype, settings.aligner)

        def make() -> ClipReference:
            found = self._reference_cache(lambda store: store.reference(*key))
            if found is None:
                found = self._align(clip, settings, windows, memories)
                self._reference_cache(lambda store: store.save_reference(*key, found))
            return found

        return self._once(self._references, key, make)

    def _reference_cache(self, use: Callable[[Store], T]) -> T | None:
        """`use(store)` on the store's reference frames; a store that fails is warned of once and not asked again (the
        frames are made anew: a cache is never worth a decode)."""
        if self.store is None or self._reference_cache_failed:
            return None
        try:
            return use(self.store)
        except StoreError as error:
            self._reference_cache_failed = True
            # warned at the line that asked for the reference: under this, _once and its make, then reference
            warnings.warn(f"reference frames not cached in {self.store.path}: {error}", stacklevel=5)
            return None

    def _align(self, clip: Clip, settings: Settings, windows, memories) -> ClipReference:
        target, aligner = self.target(settings), self.aligner(settings.aligner)
        windows = windows or split_windows(clip.audio, target.window_samples, target.cut_samples)
        window_tokens, frames, words = [], [], []
        for index, (start, end) in enumerate(windows):
            memory = memories[index] if memories else target.encode(target.features(clip.audio[start:end]))
            tokens = greedy(target, memory, target.valid_frames(end - start)).tokens
            aligned = align_tokens(aligner, target, clip.audio[start:end], tokens)
            first_frame, offset = target.frames(start), start / SAMPLE_RATE
            window_tokens.append(tokens)
            frames += [None if f is None else f + first_frame for f in aligned.frames]
            words += [replace(w, start=w.start + offset, end=w.end + offset) if w.aligned else w for w in aligned.words]
        return ClipReference(aligner.name, window_tokens, frames, words)

    def align_text(self, clip: Clip, settings: Settings, text: str) -> ClipReference:
        """Force-align a given transcript to a clip of one window."""
        target = self.target(settings)
        if len(clip.audio) > target.window_samples:
            raise AudioTooLongError(
                f"{clip.id} is {clip.seconds:.1f} s long: a given text is aligned to one 30 s window at most; "
                "without a text the target's transcript is aligned window by window"
            )
        if not normalize_for_alignment(text):
            raise AlignmentError(f"no words to align in {text!r}")
        tokens = target.tokenizer.encode(" " + text.strip(), add_special_tokens=False)
        aligner = self.aligner(settings.aligner)
        aligned = align_tokens(aligner, target, clip.audio, tokens)
        return ClipReference(aligner.name, [tokens], aligned.frames, aligned.words)


def _reference_file(path: Path, clip: Clip, target: Target) -> ClipReference:
    """Frames a user supplied: a JSON list with one clip frame (or null) per transcript token, inside the clip."""
    if len(clip.audio) > target.window_samples:
        raise SettingsError(
            f"--reference {path} serves clips of one {target.window_samples / SAMPLE_RATE:g} s window; {clip.id} is "
            f"{clip.seconds:.1f} s long: leave --reference out to have it aligned window by window"
        )
    return ClipReference("file", [[]], read_reference_file(path, target.valid_frames(len(clip.audio))))


def _encode(frontend: Target | Peer, clip: Clip, windows: list[tuple[int, int]], timer: PhaseTimer) -> list[Tensor]:
    """Each window's encoder output (the encoder's memory the decoder attends), timed as features and encoder."""
    with timer.phase("features"):
        samples = frontend.samples(clip.audio)
    memories = []
    for start, end in windows:
        with timer.phase("features"):
            features = frontend.features(samples[start:end])
        with timer.phase("encoder"):
            memories.append(frontend.encode(features))
    return memories
