"""Synthetic speech with exact word timings: espeak-ng (specasr.espeak) and hibari-tts.

While it synthesizes, espeak-ng reports the sample at which each word and each phoneme starts. Those positions
are the reference timings for synthesized audio; no aligner is involved.

Timing rules (all from espeak's own events, none estimated from the waveform):
- The text is normalized first (`normalize_for_alignment`: numbers spelled out, symbols dropped, clause
  punctuation kept for prosody), so the words spoken are exactly the words returned.
- A word starts at its WORD event. espeak fuses some unstressed words with a neighbour ("of the" -> one WORD
  event); the phonemes spoken under each event are divided among its words by each word's own phoneme count
  (espeak_TextToPhonemes). Where the counts do not add up, those words are flagged (`aligned=False`), not guessed.
- A word ends where the next word starts or where a pause phoneme after it starts, whichever is first; the last
  word ends at the trailing pause (or the end of the audio), so trailing silence is never part of a word.

hibari-tts reports nothing while it runs; its ONNX graph computes an integer duration per phoneme, exposed here
as an extra output. A word spans its phonemes' durations, less a constant lag calibrated once against
pocketsphinx (below); where the phonemizer's words do not pair one to one with the text's, none is timed.
"""

import bisect
import itertools
import re
import threading
from dataclasses import dataclass

import numpy as np
import soxr

from specasr import espeak
from specasr.audio import SAMPLE_RATE
from specasr.words import WordTime, normalize_for_alignment

_LINKING_R = "r-"  # spoken only before a following vowel, so absent from a word's own pronunciation
# Clause punctuation is spoken as a pause, so it is kept between the normalized words.
_CLAUSE_BREAK = re.compile(r"([,.;:!?]+)(?=\s|$)")


@dataclass
class SynthesizedSpeech:
    audio: np.ndarray  # float32, mono, at sample_rate
    sample_rate: int
    words: list[WordTime]  # one per word of normalize_for_alignment(text)


@dataclass
class _Phoneme:
    name: str
    start: int  # samples at espeak.SAMPLE_RATE
    end: int


_Span = tuple[int, int]  # (start, end) samples at espeak.SAMPLE_RATE


def _speakable(text: str) -> tuple[str, list[str], list[int]]:
    """The normalized words joined with clause punctuation, the words, and where each word ends in that string."""
    spoken, words, ends = "", [], []
    pieces = _CLAUSE_BREAK.split(text)
    for i, piece in enumerate(pieces):
        if i % 2:  # a captured clause break
            spoken += piece
            continue
        for word in normalize_for_alignment(piece):
            spoken += (" " if spoken else "") + word
            words.append(word)
            ends.append(len(spoken))
    return spoken, words, ends


def _word_groups(word_events: list[espeak.EspeakEvent], word_ends: list[int]) -> list[int]:
    """The index of the first word each WORD event speaks, increasing (espeak's text positions sometimes lag)."""
    firsts: list[int] = []
    for event in word_events:
        index = bisect.bisect_right(word_ends, event.text_position - 1)
        index = max(index, firsts[-1] + 1) if firsts else index
        if index >= len(word_ends):
            break
        firsts.append(index)
    return firsts


def _group_times(engine: espeak.Espeak, words: list[str], start: int, phonemes: list[_Phoneme]) -> list[_Span | None]:
    """(start, end) samples of the words spoken under one WORD event, or None for each if they cannot be told apart.

    The event's phonemes are divided among its words by each word's own phoneme count; when the counts do not add
    up (context changed a pronunciation, or the event belongs to other words) nothing is claimed.
    """
    counted = [p for p in phonemes if p.name != _LINKING_R]
    counts = [sum(p != _LINKING_R for p in engine.phonemes(word)) for word in words]
    if not counted or 0 in counts or sum(counts) != len(counted):
        return [None] * len(words)
    firsts = itertools.accumulate(counts[:-1], initial=0)
    spans = [
        (counted[first].start, counted[first + count - 1].end) for first, count in zip(firsts, counts, strict=True)
    ]
    spans[0] = (start, spans[0][1])  # the WORD event marks the onset more precisely than the first phoneme event
    spans[-1] = (spans[-1][0], phonemes[-1].end)  # a trailing linking r belongs to the last word
    return spans


def _word_times(
    engine: espeak.Espeak, capture: espeak.Capture, words: list[str], word_ends: list[int]
) -> list[WordTime]:
    total = sum(len(chunk) for chunk in capture.chunks)
    timed = [e for e in capture.events if e.kind in (espeak.EVENT_WORD, espeak.EVENT_PHONEME, espeak.EVENT_END)]
    ends = [e.sample for e in timed[1:]] + [total]  # an event lasts until the next one starts
    word_events = [i for i, e in enumerate(timed) if e.kind == espeak.EVENT_WORD and e.length > 0]  # the last is empty
    firsts = _word_groups([timed[i] for i in word_events], word_ends)
    spans: list[_Span | None] = [None] * len(words)
    for k, first in enumerate(firsts):
        last = firsts[k + 1] if k + 1 < len(firsts) else len(words)
        stop = word_events[k + 1] if k + 1 < len(word_events) else len(timed)
        phonemes = [
            _Phoneme(timed[i].phoneme, timed[i].sample, ends[i])
            for i in range(word_events[k] + 1, stop)
            if timed[i].kind == espeak.EVENT_PHONEME and espeak.is_sound(timed[i].phoneme)
        ]
        spans[first:last] = _group_times(engine, words[first:last], timed[word_events[k]].sample, phonemes)
    return [
        WordTime(word, span[0] / espeak.SAMPLE_RATE, span[1] / espeak.SAMPLE_RATE, True)
        if span
        else WordTime(word, None, None, False)
        for word, span in zip(words, spans, strict=True)
    ]


def synthesize_espeak(
    text: str, voice: str = "en-us", rate_wpm: int = espeak.DEFAULT_RATE_WPM, pitch: int | None = None
) -> SynthesizedSpeech:
    """Speak `text` with espeak-ng; returns 16 kHz float32 audio and each word's time from espeak's own events.

    `voice` is an espeak voice name, optionally with a variant ("en-us+f3"); `pitch` is 0..100 (default 50).
    """
    spoken, words, word_ends = _speakable(text)
    if not words:
        raise ValueError(f"no words to speak in {text!r}")
    slowest, fastest = espeak.RATE_RANGE_WPM
    if not slowest <= rate_wpm <= fastest or not (pitch is None or 0 <= pitch <= 100):
        raise ValueError(f"rate_wpm must be in {espeak.RATE_RANGE_WPM} and pitch in 0..100, got {rate_wpm} and {pitch}")
    with espeak.voice(voice, rate_wpm, espeak.DEFAULT_PITCH if pitch is None else pitch) as engine:
        capture = engine.synthesize(spoken)
        word_times = _word_times(engine, capture, words, word_ends)
    audio = np.concatenate(capture.chunks).astype(np.float32) / 32768.0
    audio = soxr.resample(audio, espeak.SAMPLE_RATE, SAMPLE_RATE)
    return SynthesizedSpeech(audio=audio, sample_rate=SAMPLE_RATE, words=word_times)


HIBARI_SAMPLE_RATE = 24000
_HIBARI_DURATION_UNIT = 600  # samples per unit of the model's integer phoneme durations
_HIBARI_DURATIONS = "/Clip_output_0"  # the graph's rounded, clipped per-phoneme durations
_HIBARI_PAUSES = frozenset(';:,.!?—…"()“”')
# The durations run behind the audio: pocketsphinx, unbiased on espeak-ng speech (median signed error -0.5 ms),
# puts hibari's word starts a median 85 ms earlier (`python -m scripts.validate_aligner --tts hibari`).
_HIBARI_LAG = int(0.085 * HIBARI_SAMPLE_RATE)


class _Hibari:
    """hibari-tts with its phoneme durations exposed as an extra graph output (the public API hides them)."""

    def __init__(self):
        import onnx
        import onnxruntime
        from hibari import Hibari

        self.tts = Hibari(threads=1)
        model = onnx.load(self.tts.model_path)
        model.graph.output.append(onnx.helper.make_tensor_value_info(_HIBARI_DURATIONS, onnx.TensorProto.FLOAT, None))
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        options.log_severity_level = 3
        self.session = onnxruntime.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])

    def synthesize(self, phonemes: str, speed: float, rng: np.random.Generator) -> tuple[np.ndarray, list[_Span]]:
        """24 kHz audio of one phoneme string and the (start, end) samples of each of its space-separated words."""
        from hibari import dsp

        chars = [c for c in phonemes if c in self.tts.vocab]
        ids = [0, *(self.tts.vocab[c] for c in chars), 0]
        *outputs, durations = self.session.run(None, {"ids": np.array([ids]), "speed": np.array([speed], np.float32)})
        audio = dsp.synth(*(o[0] for o in outputs), rng)
        ends = np.maximum(np.cumsum(durations.reshape(-1).astype(np.int64)) * _HIBARI_DURATION_UNIT - _HIBARI_LAG, 0)
        spans, start, end = [], None, None
        for k, char in enumerate(chars, start=1):  # ids[k] is chars[k - 1]
            if char == " ":
                if start is not None:
                    spans.append((start, end))
                start = None
            elif char not in _HIBARI_PAUSES:
                start = ends[k - 1] if start is None else start
                end = ends[k]
        if start is not None:
            spans.append((start, end))
        return audio, spans


_hibari: _Hibari | None = None
_hibari_lock = threading.Lock()


def synthesize_hibari(text: str, speed: float = 1.0, seed: int = 0) -> SynthesizedSpeech:
    """Speak `text` with hibari-tts's bundled voice; returns 16 kHz float32 audio and each word's time from the
    model's own phoneme durations. Words are flagged unaligned where the phonemizer's word count differs from the
    normalized text's (it merged or split a word), rather than guessed."""
    global _hibari
    spoken, words, _ = _speakable(text)
    if not words:
        raise ValueError(f"no words to speak in {text!r}")
    if not 0.5 <= speed <= 2.0:
        raise ValueError(f"speed must be in 0.5..2.0, got {speed}")
    with _hibari_lock:
        _hibari = _hibari or _Hibari()
        rng = np.random.default_rng(seed)
        pieces, spans, offset = [], [], 0
        for phonemes in _hibari.tts.phonemize(spoken):
            audio, chunk_spans = _hibari.synthesize(phonemes, speed, rng)
            spans += [(offset + start, offset + end) for start, end in chunk_spans]
            pieces.append(audio)
            offset += audio.size
    if len(spans) == len(words):
        rate = HIBARI_SAMPLE_RATE
        times = [WordTime(w, s / rate, e / rate, True) for w, (s, e) in zip(words, spans, strict=True)]
    else:
        times = [WordTime(word, None, None, False) for word in words]
    audio = soxr.resample(np.concatenate(pieces).astype(np.float32), HIBARI_SAMPLE_RATE, SAMPLE_RATE)
    return SynthesizedSpeech(audio=audio, sample_rate=SAMPLE_RATE, words=times)
