"""Where a long clip is cut into windows: never so that its last window is too short for Whisper to read
(scripts/segment_losses.py measures what each cut costs)."""

from itertools import pairwise

import numpy as np
import pytest

from specasr.audio import MIN_LAST_WINDOW_SECONDS, SAMPLE_RATE, Clip, split_windows
from specasr.metrics import normalize_text
from specasr.trace import Settings

WINDOW = 30 * SAMPLE_RATE
# Nine developer-set clips, 30.29 s in all: the window's quietest point used to be the last clip's trailing silence,
# which left a last window of 0.39 s of silence that whisper-tiny.en read as "you".
JUST_OVER_ONE_WINDOW = (
    "cathy-arctic-b0331",
    "cathy-arctic-b0183",
    "cathy-arctic-a0359",
    "cathy-arctic-b0330",
    "cathy-arctic-b0373",
    "cathy-arctic-a0049",
    "cathy-arctic-b0045",
    "cathy-arctic-b0191",
    "cathy-arctic-b0533",
)


def noise(seconds: float, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 0.3, int(seconds * SAMPLE_RATE)).astype(np.float32)


def test_a_clip_just_over_one_window_is_not_cut_in_its_trailing_silence():
    audio = noise(30.4, seed=0)
    audio[int(29.9 * SAMPLE_RATE) :] *= 1e-3  # the clip's trailing silence: the quietest place of all
    pause = slice(26 * SAMPLE_RATE, int(26.3 * SAMPLE_RATE))
    audio[pause] *= 1e-2
    (first, cut), last = split_windows(audio, WINDOW, 320)
    assert first == 0 and pause.start <= cut <= pause.stop and last == (cut, len(audio))


@pytest.mark.parametrize("seconds", [30.02, 30.5, 34.9, 35.1, 59.7, 60.3, 64.0, 77.0, 90.4, 121.0])
@pytest.mark.parametrize("step", [320, 1280, SAMPLE_RATE])
def test_windows_cover_the_clip_and_the_last_one_is_never_short(seconds, step):
    audio = noise(seconds, seed=int(seconds * 10))
    audio[-int(0.4 * SAMPLE_RATE) :] = 0
    windows = split_windows(audio, WINDOW, step)
    assert windows[0][0] == 0 and windows[-1][1] == len(audio)
    assert all(end == next_start for (_, end), (next_start, _) in pairwise(windows))
    assert all(0 < end - start <= WINDOW and start % step == 0 for start, end in windows)
    assert windows[-1][1] - windows[-1][0] >= MIN_LAST_WINDOW_SECONDS * SAMPLE_RATE


def test_whisper_adds_nothing_after_the_last_clip_of_a_real_concatenation(pipeline, speech):
    by_id = {u.id: u for u in speech}
    parts = [by_id[i].clip() for i in JUST_OVER_ONE_WINDOW]
    clip = Clip("just over one window", np.concatenate([part.audio for part in parts]))
    settings = Settings(draft=None, verify_peaks=False)
    joined = normalize_text(pipeline.decode(clip, settings).text).split()
    last = normalize_text(pipeline.decode(parts[-1], settings).text).split()
    assert joined[-len(last) :] == last
