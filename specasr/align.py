"""Forced alignment and the token-to-frame rule: audio + transcript -> word times -> one reference frame per token.

Aligners return one `WordTime` per word of `normalize_for_alignment(text)`. A word the aligner could not place is
flagged (`aligned=False`, no times), never given invented times. `char_times_from_words` spreads word times over
the transcript's alphanumeric characters and `token_frames` applies the paper's rule (A.3) on a target's
encoder grid.
"""

import functools
import importlib.util
import math
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from specasr.audio import SAMPLE_RATE

if TYPE_CHECKING:
    from specasr.targets import Target


class AlignmentError(ValueError):
    """The input cannot be aligned at all (no words, no audio)."""


class AlignerUnavailableError(RuntimeError):
    """The aligner's dependencies or weights are not installed on this machine."""


@dataclass(frozen=True)
class WordTime:
    word: str
    start: float | None  # seconds; None when the word could not be placed
    end: float | None
    aligned: bool


# ---------------------------------------------------------------------------------------------------------------------
# Text normalization

_ONES = (
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
    "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen",
)  # fmt: skip
_TENS = ("", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
_SCALES = ((10**9, "billion"), (10**6, "million"), (1000, "thousand"), (100, "hundred"))
_IRREGULAR_ORDINALS = {
    "one": "first",
    "two": "second",
    "three": "third",
    "five": "fifth",
    "eight": "eighth",
    "nine": "ninth",
    "twelve": "twelfth",
}
# A number (with optional thousands commas, decimals and ordinal suffix) or a word with inner apostrophes. Every
# alphanumeric character of a text falls inside exactly one match ([^\W\d_] is "alphanumeric but not a digit").
_TOKEN = re.compile(r"(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d+))?(st|nd|rd|th)?|[^\W\d_]+(?:'[^\W\d_]+)*")


def number_to_words(n: int) -> list[str]:
    """American cardinal reading without "and": 1205 -> one thousand two hundred five."""
    if n < 20:
        return [_ONES[n]]
    if n < 100:
        return [_TENS[n // 10], _ONES[n % 10]] if n % 10 else [_TENS[n // 10]]
    for scale, name in _SCALES:
        if n >= scale:
            head, rest = divmod(n, scale)
            return number_to_words(head) + [name] + (number_to_words(rest) if rest else [])
    raise AssertionError("unreachable")


def _year_to_words(n: int) -> list[str]:
    """Years are read in pairs: 1963 -> nineteen sixty three, 1905 -> nineteen oh five, 1900 -> nineteen hundred."""
    century, rest = divmod(n, 100)
    if rest == 0:
        return [*number_to_words(century), "hundred"]
    return number_to_words(century) + (["oh", _ONES[rest]] if rest < 10 else number_to_words(rest))


def _ordinal(word: str) -> str:
    if word in _IRREGULAR_ORDINALS:
        return _IRREGULAR_ORDINALS[word]
    return word[:-1] + "ieth" if word.endswith("y") else word + "th"


def _number_token_words(integer: str, decimals: str | None, ordinal: str | None) -> list[str]:
    n = int(integer.replace(",", ""))
    plain_integer = decimals is None and ordinal is None and "," not in integer
    words = _year_to_words(n) if plain_integer and 1100 <= n <= 1999 else number_to_words(n)
    if decimals is not None:
        words += ["point"] + [_ONES[int(digit)] for digit in decimals]
    if ordinal is not None:
        words[-1] = _ordinal(words[-1])
    return words


def _spoken_tokens(text: str) -> list[tuple[str, list[str]]]:
    """(written token, its spoken words) for every token of the lowercased text, in order."""
    tokens = []
    for match in _TOKEN.finditer(text.lower().replace("\u2019", "'")):
        integer, decimals, ordinal = match.groups()
        words = _number_token_words(integer, decimals, ordinal) if integer else [match.group()]
        tokens.append((match.group(), words))
    return tokens


def normalize_for_alignment(text: str) -> list[str]:
    """Lowercase spoken words: numbers spelled out, punctuation dropped, apostrophes inside words kept.

    Hyphenated and dotted forms split into words ("carving-knife" -> carving knife, "U.S." -> u s).
    """
    return [word for _, words in _spoken_tokens(text) for word in words]


def _alphanumerics(text: str) -> str:
    return "".join(c for c in text.lower() if c.isalnum())


# ---------------------------------------------------------------------------------------------------------------------
# Aligners


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
    from specasr.tts import espeak_phonemes  # imported here: tts imports this module

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


# ---------------------------------------------------------------------------------------------------------------------
# From word times to one reference frame per token


def _spread(word: WordTime, count: int) -> list[float | None]:
    """Times for `count` characters sharing a word: each sits at the centre of an equal slice of [start, end]."""
    if not word.aligned or word.start is None or word.end is None:
        return [None] * count
    return [word.start + (i + 0.5) / count * (word.end - word.start) for i in range(count)]


def char_times_from_words(text: str, words: list[WordTime]) -> list[float | None]:
    """One time per alphanumeric character of `text.lower()`, from word times of normalize_for_alignment(text).

    A written token whose letters are its spoken word ("don't") spreads that word's span over its characters. A
    token that was rewritten ("19" -> nineteen, "1st" -> first) spreads the span from its first spoken word's start
    to its last one's end over its own characters. Characters of unaligned words get None.
    """
    tokens = _spoken_tokens(text)
    expected = [word for _, spoken in tokens for word in spoken]
    if [word.word for word in words] != expected:
        raise ValueError("words must be one WordTime per word of normalize_for_alignment(text), in order")
    times: list[float | None] = []
    remaining = iter(words)
    for written, spoken in tokens:
        group = [next(remaining) for _ in spoken]
        characters = _alphanumerics(written)
        if characters == _alphanumerics("".join(spoken)):
            for word in group:
                times += _spread(word, len(_alphanumerics(word.word)))
        elif all(word.aligned for word in group):
            times += _spread(WordTime(written, group[0].start, group[-1].end, True), len(characters))
        else:
            times += [None] * len(characters)
    return times


@dataclass(frozen=True)
class ClipReference:
    """A clip's transcript tokens, window by window, with each token's reference frame and each word's times, all
    counted from the clip's start."""

    source: str  # the aligner, or "file" for frames a user supplied
    window_tokens: list[list[int]]
    frames: list[int | None]  # one per token, in transcript order
    words: list[WordTime] = field(default_factory=list)

    def window_frames(self, index: int, start_frame: int) -> list[int | None]:
        """The frames of window `index`'s tokens, counted from the window's start."""
        frames = self.frames
        if len(self.window_tokens) > 1:
            first = sum(len(tokens) for tokens in self.window_tokens[:index])
            frames = frames[first : first + len(self.window_tokens[index])]
        return [None if f is None else f - start_frame for f in frames]


@dataclass
class TokenAlignment:
    """Word times from an aligner and the reference frame of every transcript token (None: no valid time)."""

    text: str
    words: list[WordTime]
    frames: list[int | None]


def align_tokens(aligner: Aligner, target: "Target", audio: np.ndarray, tokens: list[int]) -> TokenAlignment:
    """Force-align a target's transcript tokens to the audio and map them onto its encoder frames; tokens that hold
    no word (punctuation only, or none) get no frames."""
    text = target.decode_text(tokens)
    if not normalize_for_alignment(text):
        return TokenAlignment(text, [], [None] * len(tokens))
    words = aligner.align(audio, text)
    return TokenAlignment(text, words, frames_from_words(target, tokens, words, len(audio)))


def frames_from_words(target: "Target", tokens: list[int], words: list[WordTime], n_samples: int) -> list[int | None]:
    """The reference frame of each transcript token on the target's encoder grid, from the times of its words."""
    return token_frames(
        tokens,
        target.tokenizer.decode,
        char_times_from_words(target.decode_text(tokens), words),
        set(target.special_ids),
        valid_frames=target.valid_frames(n_samples),
        frame_seconds=target.frame_seconds,
    )


def _frame(seconds: float, frame_seconds: float, valid_frames: int) -> int:
    frame = math.floor(seconds / frame_seconds + 0.5)  # round half up; Python's round() goes to even
    return min(max(frame, 0), valid_frames - 1)


def token_frames(
    token_ids: list[int],
    decode: Callable[[list[int]], str],
    char_times: list[float | None],
    special_ids: set[int],
    *,
    valid_frames: int,
    frame_seconds: float,
) -> list[int | None]:
    """The token-to-frame rule (paper A.3): one reference frame per token, None where there is no valid time.

    The cumulative prefix of non-special tokens is decoded; a token takes the time of its last newly added
    alphanumeric character, counted by position in the lowercase alphanumeric string (so byte-level merges that
    rewrite earlier characters do not shift the count); None if that character has no time. A token adding none
    (punctuation, a partial UTF-8 byte) reuses the latest valid time an earlier token took, skipping unaligned
    ones; None if there was none yet. Special tokens get None. `char_times[i]` is the time of the i-th alphanumeric
    character of the decoded transcript (see char_times_from_words). Frames are rounded to `frame_seconds` and
    clipped to the valid (non-padding) frames; for Whisper, 0.02 s and ceil(samples / 320) (the target says).
    """
    if valid_frames < 1:
        raise ValueError(f"valid_frames must be positive, got {valid_frames}")
    frames: list[int | None] = []
    prefix: list[int] = []
    covered = 0  # alphanumeric characters decoded so far
    latest_valid: float | None = None
    for token in token_ids:
        if token in special_ids:
            frames.append(None)
            continue
        prefix.append(token)
        count = len(_alphanumerics(decode(prefix)))
        time = latest_valid
        if count > covered:
            if count > len(char_times):
                raise ValueError(f"the tokens decode to more alphanumerics than char_times holds ({len(char_times)})")
            covered = count
            time = char_times[count - 1]
            latest_valid = latest_valid if time is None else time
        frames.append(None if time is None else _frame(time, frame_seconds, valid_frames))
    return frames
