"""Load a clip from a path, raw bytes or an upload, check it, and return what Whisper expects: 16 kHz float32 mono.
Long clips are cut into windows at quiet points (`split_windows`)."""

import hashlib
import io
import itertools
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import numpy as np
import soundfile as sf
import soxr

if TYPE_CHECKING:
    from specasr.words import WordTime

SAMPLE_RATE = 16000
DEFAULT_MAX_SECONDS = 600.0  # ten minutes; longer recordings are refused unless a higher limit is asked for
MIN_SECONDS = 0.1  # five encoder frames; anything shorter holds no word
SILENCE_PEAK = 1e-4  # about 3 LSB of 16-bit PCM, so dither and DC noise still count as silence
FLOAT_PEAK_LIMIT = 10.0  # 20 dB over full scale: beyond any float file's headroom, so the samples are scaled wrongly
CUT_SEARCH_SECONDS = 5.0  # a long clip is cut at the quietest point within this much before each window's end
QUIET_SMOOTHING = 5  # frames of energy averaged when looking for the quietest point
# No cut leaves less than this after it: Whisper reads a last window of trailing silence as "you" and mishears a last
# word heard alone (scripts/segment_losses.py). Under CUT_SEARCH_SECONDS, so that some of the search is left.
MIN_LAST_WINDOW_SECONDS = 2.0


@dataclass(frozen=True, eq=False)
class Clip:
    """A validated clip (16 kHz float32 mono) and what is known about it."""

    id: str
    audio: np.ndarray
    text: str = ""  # its reference transcript, where one exists
    dataset: str = ""
    words: "tuple[WordTime, ...] | None" = None  # exact times of the spoken words (synthesized speech)
    path: str = ""  # the file it was read from, where there is one

    @cached_property
    def hash(self) -> str:
        """Identifies the audio itself, whatever the clip is called."""
        return hashlib.sha256(self.audio.tobytes()).hexdigest()[:16]

    @property
    def seconds(self) -> float:
        return len(self.audio) / SAMPLE_RATE


def split_windows(audio: np.ndarray, window: int, step: int) -> list[tuple[int, int]]:
    """(start, end) sample ranges of consecutive windows of at most `window` samples covering the clip.

    Each cut falls on a multiple of `step` samples (one encoder frame, so frames stay whole) at the quietest
    point within the last CUT_SEARCH_SECONDS before the window would end, and never within the clip's last
    MIN_LAST_WINDOW_SECONDS.
    """
    n_samples = len(audio)
    energy = np.square(audio[: n_samples // step * step].reshape(-1, step)).mean(axis=1)
    quiet = np.convolve(energy, np.ones(QUIET_SMOOTHING) / QUIET_SMOOTHING, mode="same")
    search = int(CUT_SEARCH_SECONDS * SAMPLE_RATE) // step
    shortest_last = int(MIN_LAST_WINDOW_SECONDS * SAMPLE_RATE)
    windows, start = [], 0
    while n_samples - start > window:
        first = max((start + window) // step - search, start // step + 1)
        last = min(start + window, n_samples - shortest_last) // step  # the last frame boundary the cut may take
        cut = (first + int(np.argmin(quiet[first:last]))) * step
        windows.append((start, cut))
        start = cut
    return [*windows, (start, n_samples)]


class AudioError(ValueError):
    """A clip specasr cannot use; the message says why in plain words."""


class UnreadableAudioError(AudioError):
    """A missing file, or bytes that no decoder understands."""


class EmptyAudioError(AudioError):
    """No samples, or fewer than MIN_SECONDS of them."""


class SilentAudioError(AudioError):
    """Every sample is (near) zero."""


class CancellingChannelsError(AudioError):
    """Channels that are heard but cancel when mixed to mono (one is the other inverted)."""


class OverFullScaleError(AudioError):
    """Float samples far above full scale (1.0): integer PCM values saved as float, most likely."""


class NonFiniteAudioError(AudioError):
    """Some samples are NaN or infinite."""


class TruncatedAudioError(AudioError):
    """The file holds less audio than its header declares: an interrupted copy or download."""


class AudioTooLongError(AudioError):
    """Longer than the length limit (DEFAULT_MAX_SECONDS unless a caller asks for another)."""


def load_audio(source: str | os.PathLike | bytes | BinaryIO, max_seconds: float = DEFAULT_MAX_SECONDS) -> np.ndarray:
    """Decode a path, raw file bytes or a binary file-like object into validated float32 mono samples at 16 kHz."""
    data, name = _read_source(source)
    if not (os.path.getsize(data) if isinstance(data, str) else data):
        raise EmptyAudioError(f"{name} is an empty file (0 bytes)")
    decoded = _decode_soundfile(data, name, max_seconds) or _decode_av(data, name, max_seconds)
    if decoded is None:
        raise UnreadableAudioError(f"cannot decode {name}: it is not audio in any format soundfile or FFmpeg can read")
    samples, sample_rate = decoded
    return _validate(samples, sample_rate, max_seconds, name)


def load_clip(path: str | os.PathLike, max_seconds: float = DEFAULT_MAX_SECONDS) -> Clip:
    """The clip in a file, named by its whole file name (as the dashboard names an upload: clip.mp3 and clip.ogg stay
    apart)."""
    return Clip(Path(path).name, load_audio(path, max_seconds), path=str(Path(path).resolve()))


def validate_samples(
    samples: np.ndarray, sample_rate: int = SAMPLE_RATE, max_seconds: float = DEFAULT_MAX_SECONDS
) -> np.ndarray:
    """Check a 1-D or (samples, channels) array at any rate; return it as float32 mono at 16 kHz."""
    return _validate(samples, sample_rate, max_seconds, "audio")


def _read_source(source: str | os.PathLike | bytes | BinaryIO) -> tuple[str | bytes, str]:
    """What the decoders read (a path, or the whole file as bytes) and a name for error messages."""
    if isinstance(source, str | os.PathLike):
        path = os.fsdecode(source)
        if os.path.isdir(path):
            raise UnreadableAudioError(f"{path} is a folder, not an audio file; give one clip's file")
        if not os.path.isfile(path):
            raise UnreadableAudioError(f"no such file: {path}")
        return path, path
    if isinstance(source, bytes | bytearray):
        return bytes(source), "audio bytes"
    # Read an upload once: each decoder needs its own seekable copy from the start.
    return source.read(), str(getattr(source, "name", "uploaded audio"))


def _decode_soundfile(data: str | bytes, name: str, max_seconds: float) -> tuple[np.ndarray, int] | None:
    try:
        with sf.SoundFile(data if isinstance(data, str) else io.BytesIO(data)) as f:
            _check_length(f.frames / f.samplerate, max_seconds, name)  # the header knows the length; skip decoding
            declared = _declared_wav_frames(data)
            if declared is not None and declared > f.frames:
                raise TruncatedAudioError(
                    f"{name} is cut short: its header declares {declared / f.samplerate:.2f} s of audio and the file "
                    f"holds {f.frames / f.samplerate:.2f} s (an interrupted copy or download?); give the whole file"
                )
            return f.read(dtype="float32", always_2d=True), f.samplerate
    except sf.SoundFileError:
        return None


def _declared_wav_frames(data: str | bytes) -> int | None:
    """The frames a WAV file's data chunk declares, from its header; None for other files and for streamed WAVs
    that declare no length. libsndfile reads what is there and says nothing of what is missing."""
    if isinstance(data, str):
        with open(data, "rb") as file:
            data = file.read(1 << 16)
    if data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        return None
    block, at = None, 12
    while at + 8 <= len(data):
        chunk, size = data[at : at + 4], int.from_bytes(data[at + 4 : at + 8], "little")
        if chunk == b"fmt ":
            block = int.from_bytes(data[at + 20 : at + 22], "little")
        elif chunk == b"data":
            return size // block if block and size not in (0, 0xFFFFFFFF) else None
        at += 8 + size + size % 2
    return None


def _decode_av(data: str | bytes, name: str, max_seconds: float) -> tuple[np.ndarray, int] | None:
    import av  # FFmpeg is the fallback decoder; loading it costs start-up time most clips never need

    chunks, count = [], 0
    try:
        with av.open(data if isinstance(data, str) else io.BytesIO(data)) as container:
            stream = container.streams.audio[0]
            header_seconds = (container.duration or 0) / av.time_base
            resampler = av.AudioResampler(format="fltp")  # same rate and channels, one sample format
            for frame in itertools.chain(container.decode(stream), [None]):  # None flushes the resampler
                for out in resampler.resample(frame):
                    chunks.append(out.to_ndarray())
                    count += out.samples
                # Stop at the limit rather than decode hours of audio into memory; the header says how long it is.
                if count > max_seconds * stream.rate:
                    _check_length(max(count / stream.rate, header_seconds), max_seconds, name)
    except (av.FFmpegError, IndexError):  # IndexError: a container with no audio stream
        return None
    samples = np.concatenate(chunks, axis=1).T if chunks else np.zeros((0, 1), np.float32)
    return samples, stream.rate


def _check_length(seconds: float, max_seconds: float, name: str) -> None:
    if seconds > max_seconds:
        raise AudioTooLongError(f"{name} is {seconds:.2f} s long, over the {max_seconds:g} s limit")


def _validate(samples: np.ndarray, sample_rate: int, max_seconds: float, name: str) -> np.ndarray:
    if sample_rate <= 0:
        raise AudioError(f"{name}: sample rate must be positive, got {sample_rate}")
    samples = np.asarray(samples)
    if samples.ndim not in (1, 2):
        raise AudioError(f"{name} must be 1-D or (samples, channels), got shape {samples.shape}")
    if samples.size == 0:
        raise EmptyAudioError(f"{name} contains no samples")
    seconds = samples.shape[0] / sample_rate
    if seconds < MIN_SECONDS:
        raise EmptyAudioError(f"{name} is {seconds:.3f} s long; at least {MIN_SECONDS:g} s is needed")
    _check_length(seconds, max_seconds, name)  # before resampling, which is the costly step

    if np.issubdtype(samples.dtype, np.signedinteger):
        samples = samples / -float(np.iinfo(samples.dtype).min)  # full-scale PCM maps to [-1, 1)
    elif not np.issubdtype(samples.dtype, np.floating):
        raise AudioError(f"{name} has unsupported sample type {samples.dtype}")
    samples = samples.astype(np.float32, copy=False)
    bad = int(np.count_nonzero(~np.isfinite(samples)))
    if bad:
        raise NonFiniteAudioError(f"{name} has {bad} NaN or infinite samples")
    loudest = float(np.abs(samples).max())
    if loudest > FLOAT_PEAK_LIMIT:
        raise OverFullScaleError(
            f"{name} has float samples up to {loudest:.4g}, where full scale is 1.0: rescale it into [-1, 1] "
            "(16-bit values saved as float: divide by 32768)"
        )

    mono = samples.mean(axis=1) if samples.ndim == 2 else samples
    peak = float(np.abs(mono).max())
    if peak < SILENCE_PEAK <= loudest:
        raise CancellingChannelsError(
            f"{name}: its {samples.shape[1]} channels cancel when mixed to mono (out of phase); "
            "save one channel on its own and decode that"
        )
    if peak < SILENCE_PEAK:
        raise SilentAudioError(f"{name} is silent: peak amplitude {peak:.2g} is below {SILENCE_PEAK:g}")
    if sample_rate != SAMPLE_RATE:
        mono = soxr.resample(np.ascontiguousarray(mono), sample_rate, SAMPLE_RATE, quality="VHQ")
    return mono
