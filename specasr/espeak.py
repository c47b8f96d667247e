"""espeak-ng through ctypes (PyPI `espeakng-loader`): speech with its word and phoneme events, and pronunciations.

The library keeps global state, so there is one engine per process, used only inside `voice(...)`, which holds
its lock. Both synthesis (specasr.tts) and the aligner's pronunciations for unknown words (specasr.align) use it.
"""

import ctypes
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import espeakng_loader
import numpy as np

SAMPLE_RATE = 22050
# Checked to load and speak with the bundled espeak-ng 1.52 data ("+f3"/"+m3" are voice variants).
ENGLISH_VOICES = ("en-us", "en-us+f3", "en-us+m3", "en", "en-gb-x-rp", "en-gb-scotland", "en-029")
DEFAULT_RATE_WPM = 160
DEFAULT_PITCH = 50  # espeak's pitch parameter, 0..100, relative to the voice's own base pitch
RATE_RANGE_WPM = (80, 450)  # what espeak-ng accepts
EVENT_WORD, EVENT_END, EVENT_PHONEME = 1, 5, 7

_AUDIO_OUTPUT_SYNCHRONOUS = 2
_INITIALIZE_PHONEME_EVENTS = 1
_POS_CHARACTER = 1
_CHARS_UTF8 = 1
_PARAMETER_RATE, _PARAMETER_PITCH = 1, 3
_EVENT_LIST_TERMINATED = 0
_PHONEMES_SPACE_SEPARATED = ord(" ") << 8  # espeak_TextToPhonemes mode: ascii names, bits 8-23 = separator


class _Event(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_int),
        ("unique_identifier", ctypes.c_uint),
        ("text_position", ctypes.c_int),  # 1-based character index in the synthesized text
        ("length", ctypes.c_int),
        ("audio_position", ctypes.c_int),
        ("sample", ctypes.c_int),  # absolute sample index at SAMPLE_RATE
        ("user_data", ctypes.c_void_p),
        ("id", ctypes.c_char * 8),  # union; for phoneme events, the phoneme mnemonic
    ]


_SynthCallback = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.POINTER(_Event))


@dataclass
class EspeakEvent:
    kind: int
    text_position: int
    length: int
    sample: int
    phoneme: str


@dataclass
class Capture:
    """What one synthesis produced: int16 audio chunks at SAMPLE_RATE and the events, in order."""

    chunks: list[np.ndarray] = field(default_factory=list)
    events: list[EspeakEvent] = field(default_factory=list)


def is_sound(phoneme: str) -> bool:
    """Pauses ("_", "_:") and the linking marker ";" are reported as phonemes but are not part of a word."""
    return bool(phoneme) and not phoneme.startswith("_") and phoneme != ";"


class Espeak:
    """The process's espeak-ng instance; use it through `voice(...)`."""

    def __init__(self):
        lib = ctypes.CDLL(espeakng_loader.get_library_path())
        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.espeak_Synth.argtypes = [
            ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int, ctypes.c_uint, ctypes.c_uint,
            ctypes.c_void_p, ctypes.c_void_p,
        ]  # fmt: skip
        lib.espeak_TextToPhonemes.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_int]
        lib.espeak_TextToPhonemes.restype = ctypes.c_char_p
        data_path = espeakng_loader.get_data_path().encode()
        sample_rate = lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, data_path, _INITIALIZE_PHONEME_EVENTS)
        if sample_rate != SAMPLE_RATE:
            raise RuntimeError(f"espeak-ng initialisation failed or changed rate (returned {sample_rate})")
        self._lib = lib
        self._capture = Capture()
        self._callback = _SynthCallback(self._receive)  # kept referenced: espeak calls it during espeak_Synth
        lib.espeak_SetSynthCallback(self._callback)

    def _receive(self, wav, num_samples, events) -> int:
        if num_samples > 0:
            self._capture.chunks.append(np.ctypeslib.as_array(wav, (num_samples,)).copy())
        i = 0
        while events[i].type != _EVENT_LIST_TERMINATED:
            event = events[i]
            phoneme = event.id.decode("ascii", "replace") if event.type == EVENT_PHONEME else ""
            self._capture.events.append(
                EspeakEvent(event.type, event.text_position, event.length, event.sample, phoneme)
            )
            i += 1
        return 0

    def set_voice(self, voice: str, rate_wpm: int, pitch: int) -> None:
        if self._lib.espeak_SetVoiceByName(voice.encode()) != 0:
            raise ValueError(f"espeak-ng has no voice {voice!r}; English voices: {', '.join(ENGLISH_VOICES)}")
        self._lib.espeak_SetParameter(_PARAMETER_RATE, rate_wpm, 0)
        self._lib.espeak_SetParameter(_PARAMETER_PITCH, pitch, 0)

    def synthesize(self, text: str) -> Capture:
        self._capture = Capture()
        encoded = text.encode()
        self._lib.espeak_Synth(encoded, len(encoded) + 1, 0, _POS_CHARACTER, 0, _CHARS_UTF8, None, None)
        self._lib.espeak_Synchronize()
        return self._capture

    def phonemes(self, text: str) -> list[str]:
        """espeak's phoneme mnemonics for `text` in the current voice, stress marks removed."""
        buffer = ctypes.create_string_buffer(text.encode())
        pointer = ctypes.c_void_p(ctypes.addressof(buffer))
        phonemes = []
        while pointer.value:  # one clause per call; espeak advances the pointer
            clause = self._lib.espeak_TextToPhonemes(ctypes.byref(pointer), _CHARS_UTF8, _PHONEMES_SPACE_SEPARATED)
            phonemes += [p.lstrip("',%=") for p in (clause or b"").decode().split()]
        return [p for p in phonemes if is_sound(p)]


_lock = threading.Lock()
_engine: Espeak | None = None


@contextmanager
def voice(name: str, rate_wpm: int = DEFAULT_RATE_WPM, pitch: int = DEFAULT_PITCH) -> Iterator[Espeak]:
    """The engine, created on first use, set to a voice and held by this thread until the block ends."""
    global _engine
    with _lock:
        _engine = _engine or Espeak()
        _engine.set_voice(name, rate_wpm, pitch)
        yield _engine


def espeak_phonemes(word: str) -> list[str]:
    """espeak-ng's American pronunciation of `word` as phoneme mnemonics ("tS", "'3:" -> "3:"), for G2P fallbacks."""
    with voice("en-us") as engine:
        return engine.phonemes(word)
