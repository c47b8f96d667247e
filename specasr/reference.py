"""The token-to-frame rule: a target's transcript tokens -> one reference frame each, from word times.

Frames come from an aligner's word times (`align_tokens`), from exact times of synthesized speech
(`frames_from_words`), or from a file the user supplied (`read_reference_file`, checked here against the clip).
"""

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from specasr.trace import SettingsError
from specasr.words import WordTime, alphanumerics, char_times_from_words, normalize_for_alignment

if TYPE_CHECKING:
    from specasr.align import Aligner
    from specasr.targets import Target


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


def align_tokens(aligner: "Aligner", target: "Target", audio: np.ndarray, tokens: list[int]) -> TokenAlignment:
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
        count = len(alphanumerics(decode(prefix)))
        time = latest_valid
        if count > covered:
            if count > len(char_times):
                raise ValueError(f"the tokens decode to more alphanumerics than char_times holds ({len(char_times)})")
            covered = count
            time = char_times[count - 1]
            latest_valid = latest_valid if time is None else time
        frames.append(None if time is None else _frame(time, frame_seconds, valid_frames))
    return frames


def read_reference_file(path: Path, valid_frames: int) -> list[int | None]:
    """The frames of a --reference file: a JSON list of whole frame numbers in [0, valid_frames), or null."""
    try:
        frames = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as error:
        raise SettingsError(f"--reference {path}: cannot read it ({error})") from error
    except json.JSONDecodeError as error:
        raise SettingsError(f"--reference {path} is not JSON ({error})") from error
    # bool is a subclass of int, and true is no frame number
    if not isinstance(frames, list) or not all(f is None or type(f) is int for f in frames):
        raise SettingsError(
            f"--reference {path} must hold a JSON list of frame numbers (whole numbers, or null), "
            "one per transcript token"
        )
    outside = next((f for f in frames if f is not None and not 0 <= f < valid_frames), None)
    if outside is not None:
        raise SettingsError(f"--reference {path}: frame {outside} is outside the clip's frames 0..{valid_frames - 1}")
    return frames


def check_reference_length(path: str | Path, frames: list[int | None], transcript_tokens: int) -> None:
    """A --reference file has one frame (or null) per token of the transcript it is decoded with."""
    if len(frames) != transcript_tokens:
        raise SettingsError(
            f"--reference {path} holds {len(frames)} frames; the transcript has {transcript_tokens} tokens, "
            "and the file needs one frame (or null) for each"
        )
