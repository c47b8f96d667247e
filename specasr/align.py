"""Forced aligners: audio + transcript -> one `WordTime` per word of `normalize_for_alignment(text)`.

A word the aligner could not place is flagged (`aligned=False`, no times), never given invented times. Mapping
word times onto a target's tokens is specasr.reference's job.
"""

import functools
import importlib.util
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import numpy as np

from specasr.audio import SAMPLE_RATE
from specasr.espeak import espeak_phonemes
from specasr.words import WordTime, normalize_for_alignment


class AlignmentError(ValueError):
    """The input cannot be aligned at all (no words, no audio)."""


class AlignerUnavailableError(RuntimeError):
    """The aligner's dependencies or weights are not installed on this machine."""


class Aligner(Protocol):
    name: str

    def align(self, audio: np.ndarray, text: str) -> list[WordTime]:
        """One WordTime per word of normalize_for_alignment(text); audio is float32 16 kHz mono."""
        ...


def _validated_audio(audio: np.ndarray) -> np.ndarray:
    samples = np.asarray(audio, dtype=np.float32)
    if samples.ndim != 1 or samples.size == 0:
        raise AlignmentError(f"audio must be a non-empty 1-D float32 array at {SAMPLE_RATE} Hz, got {samples.shape}")
    if not np.isfinite(samples).all():
        raise AlignmentError("audio contains NaN or infinite samples")
    return samples


def _validated_words(text: str) -> list[str]:
    words = normalize_for_alignment(text)
    if not words:
        raise AlignmentError(f"no words to align in {text!r}")
    return words


def _unaligned(words: list[str]) -> list[WordTime]:
    return [WordTime(word, None, None, False) for word in words]


# espeak-ng phoneme mnemonics (English voices) -> CMU ARPAbet, the phone set of pocketsphinx's en-us model. On the
# 17k words of sentences.txt that the CMU dictionary also holds, this gives the dictionary's pronunciation for 73%
# of words and a 5.6% phone error rate (mostly reduced vowels, e.g. IH for AH): close enough to place a word.
_ESPEAK_TO_ARPABET = {
    "p": "P", "b": "B", "t": "T", "t#": "T", "t2": "T", "?": "T", "d": "D", "d#": "D", "k": "K", "x": "K", "g": "G",
    "f": "F", "v": "V", "T": "TH", "D": "DH", "s": "S", "z": "Z", "S": "SH", "Z": "ZH", "h": "HH", "tS": "CH",
    "dZ": "JH", "m": "M", "n": "N", "N": "NG", "l": "L", "r": "R", "r-": "R", "w": "W", "j": "Y",
    "@": "AH", "@2": "AH", "@-": "AH", "a#": "AH", "V": "AH", "@L": "AH L", "n-": "AH N",
    "a": "AE", "aa": "AE", "A:": "AA", "0": "AA", "A@": "AA R", "O": "AO", "O:": "AO", "O2": "AO", "O@": "AO R",
    "o@": "AO R", "E": "EH", "e@": "EH R", "eI": "EY", "I": "IH", "I#": "IH", "I2": "IH", "i": "IY", "i:": "IY",
    "i@": "IH", "i@3": "IH R", "3": "ER", "3:": "ER", "aI": "AY", "aI@": "AY AH", "aI3": "AY ER", "aU": "AW",
    "OI": "OY", "oU": "OW", "U": "UH", "U@": "UH R", "u:": "UW",
}  # fmt: skip


def arpabet_from_espeak(word: str) -> str | None:
    """A CMU ARPAbet pronunciation for `word` from espeak-ng's English rules; None if a phoneme has no mapping."""
    phones: list[str] = []
    for phoneme in espeak_phonemes(word):
        if phoneme not in _ESPEAK_TO_ARPABET:
            return None
        for phone in _ESPEAK_TO_ARPABET[phoneme].split():
            if not (phone == "R" and phones and phones[-1] in ("R", "ER")):  # r-coloured vowel followed by linking r
                phones.append(phone)
    return " ".join(phones) or None


class PocketSphinxAligner:
    """Forced alignment with pocketsphinx 5's bundled US-English acoustic model and CMU dictionary (offline).

    Words missing from the dictionary get a pronunciation from espeak-ng (`arpabet_from_espeak`); words that still
    have none are left out of the alignment and flagged. Times are on pocketsphinx's 10 ms frame grid.
    """

    name = "pocketsphinx"

    def __init__(self):
        self._unpronounceable: set[str] = set()
        self._lock = threading.Lock()  # the decoder is stateful

    @functools.cached_property
    def _decoder(self):
        """Loaded on first use, so that code paths that never align (a complete feature cache) never need it."""
        from pocketsphinx import Decoder

        # Synthetic speech needs wide beams: with the defaults most espeak clips end with no hypothesis.
        return Decoder(samprate=SAMPLE_RATE, bestpath=False, loglevel="FATAL", beam=1e-100, wbeam=1e-80, pbeam=1e-100)

    @property
    def _frame_seconds(self) -> float:
        return 1.0 / self._decoder.config["frate"]

    def align(self, audio: np.ndarray, text: str) -> list[WordTime]:
        words = _validated_words(text)
        samples = _validated_audio(audio)
        with self._lock:
            placeable = [word for word in words if self._ensure_pronunciation(word)]
            placed = self._force_align(samples, placeable) if placeable else []
        return _match_in_order(words, placed)

    def _ensure_pronunciation(self, word: str) -> bool:
        if self._decoder.lookup_word(word) is not None:
            return True
        if word in self._unpronounceable:
            return False
        phones = arpabet_from_espeak(word)
        if phones is not None:
            try:
                self._decoder.add_word(word, phones, False)  # no search update: set_align_text rebuilds it
                return True
            except RuntimeError:  # a phone the acoustic model does not know
                pass
        self._unpronounceable.add(word)
        return False

    def _force_align(self, samples: np.ndarray, words: list[str]) -> list[tuple[str, float, float]]:
        # A -80 dBFS noise floor: runs of exact zeros (digital silence, common in synthetic speech) give frames of
        # minus-infinite energy on which the search dies; seeded, so the result is deterministic.
        noise = np.random.default_rng(0).normal(0.0, 1e-4, samples.size).astype(np.float32)
        pcm = (np.clip(samples + noise, -1.0, 1.0) * 32767).astype(np.int16).tobytes()
        try:
            self._decoder.reinit_feat()  # noise removal adapts across utterances: start each one afresh
            self._decoder.set_align_text(" ".join(words))
            self._decoder.start_utt()
            self._decoder.process_raw(pcm, full_utt=True)
            self._decoder.end_utt()
        except RuntimeError:
            return []
        if self._decoder.hyp() is None:  # the search found no path through the text: nothing is placed
            return []
        return [
            (
                segment.word.split("(")[0],
                segment.start_frame * self._frame_seconds,
                (segment.end_frame + 1) * self._frame_seconds,
            )
            for segment in self._decoder.seg()
            if not segment.word.startswith(("<", "["))  # <s>, </s>, <sil>, [NOISE] and [SPEECH] are not words
        ]


def _match_in_order(words: list[str], placed: list[tuple[str, float, float]]) -> list[WordTime]:
    """Pair each word with the next placed word of the same spelling; words with no partner are flagged."""
    pending = iter(placed)
    current = next(pending, None)
    result = []
    for word in words:
        if current is not None and current[0] == word:
            result.append(WordTime(word, current[1], current[2], True))
            current = next(pending, None)
        else:
            result.append(WordTime(word, None, None, False))
    return result


_MMS_FA_URL = "https://dl.fbaipublicfiles.com/mms/torchaudio/ctc_alignment_mling_uroman/model.pt"


class MMSAligner:
    """CTC forced alignment with torchaudio's MMS_FA (Pratap et al. 2024), the paper's aligner; optional.

    Needs torchaudio (which loads only with a matching CUDA build of torch) and the MMS_FA weights already in
    torch hub's cache: nothing is downloaded here.
    """

    name = "mms"

    def __init__(self, device: str = "cpu"):
        if importlib.util.find_spec("torchaudio") is None:
            raise AlignerUnavailableError(
                "the MMS aligner needs torchaudio: `pip install torchaudio` together with a CUDA build of torch "
                "(the PyPI torchaudio wheel does not load on CPU-only torch), plus the MMS_FA weights in torch "
                "hub's cache. The offline default aligner is pocketsphinx."
            )
        try:
            import torch
            import torchaudio
        except (ImportError, OSError) as error:
            raise AlignerUnavailableError(f"torchaudio is installed but does not load ({error})") from error
        checkpoint = Path(torch.hub.get_dir()) / "checkpoints" / Path(_MMS_FA_URL).name
        if not checkpoint.is_file():
            raise AlignerUnavailableError(
                f"MMS_FA weights not found at {checkpoint}: torchaudio.pipelines.MMS_FA.get_model() downloads them "
                f"there from {_MMS_FA_URL} on a machine with internet access; copy the file to that path."
            )
        bundle = torchaudio.pipelines.MMS_FA
        self._torch = torch
        self._forced_align = torchaudio.functional.forced_align
        self._merge_tokens = torchaudio.functional.merge_tokens
        self._model = bundle.get_model(with_star=False).to(device)  # reads the cached checkpoint
        self._dictionary = bundle.get_dict(star=None)  # lowercase romanized characters; 0 is the CTC blank
        self._device = device

    def align(self, audio: np.ndarray, text: str) -> list[WordTime]:
        words = _validated_words(text)
        samples = _validated_audio(audio)
        tokens = [[self._dictionary[c] for c in word if c in self._dictionary] for word in words]
        targets = [token for word_tokens in tokens for token in word_tokens]
        if not targets:
            return _unaligned(words)
        torch = self._torch
        with torch.inference_mode():
            emission, _ = self._model(torch.from_numpy(samples)[None].to(self._device))
            try:
                path, scores = self._forced_align(
                    emission, torch.tensor([targets], dtype=torch.int32, device=self._device), blank=0
                )
            except RuntimeError:  # more characters than frames: the audio cannot hold this text
                return _unaligned(words)
        spans = self._merge_tokens(path[0], scores[0].exp())  # one span per target character, in order
        seconds_per_frame = samples.size / emission.shape[1] / SAMPLE_RATE
        result, first = [], 0
        for word, word_tokens in zip(words, tokens, strict=True):
            word_spans = spans[first : first + len(word_tokens)]
            first += len(word_tokens)
            if word_spans:
                start, end = word_spans[0].start * seconds_per_frame, word_spans[-1].end * seconds_per_frame
                result.append(WordTime(word, start, end, True))
            else:
                result.append(WordTime(word, None, None, False))
        return result


ALIGNERS: dict[str, Callable[[], Aligner]] = {"pocketsphinx": PocketSphinxAligner, "mms": MMSAligner}


def get_aligner(name: str = "pocketsphinx") -> Aligner:
    """The aligner called `name`: "pocketsphinx" (offline default) or "mms" (needs torchaudio and its weights)."""
    if name not in ALIGNERS:
        raise ValueError(f"unknown aligner {name!r}; choose from {', '.join(ALIGNERS)}")
    return ALIGNERS[name]()
