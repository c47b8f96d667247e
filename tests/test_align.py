"""The aligners and the synthesizers whose exact word times test them."""

import importlib.util
import itertools
from dataclasses import replace

import numpy as np
import pytest

from specasr.align import (
    AlignerUnavailableError,
    AlignmentError,
    MMSAligner,
    PocketSphinxAligner,
    arpabet_from_espeak,
    get_aligner,
)
from specasr.espeak import ENGLISH_VOICES
from specasr.tts import synthesize_espeak, synthesize_hibari
from specasr.words import normalize_for_alignment

SENTENCE = "The old man walked slowly along the quiet river bank"


@pytest.fixture(scope="module")
def clip():
    return synthesize_espeak(SENTENCE)


@pytest.fixture(scope="module")
def aligner():
    return PocketSphinxAligner()


def test_espeak_returns_16khz_audio_with_increasing_word_starts(clip):
    duration = clip.audio.size / clip.sample_rate
    assert clip.sample_rate == 16000 and clip.audio.dtype == np.float32
    assert 2.0 < duration < 6.0  # ten words at 160 words per minute
    assert [word.word for word in clip.words] == normalize_for_alignment(SENTENCE)
    assert all(word.aligned for word in clip.words)
    starts = [word.start for word in clip.words]
    assert all(a < b for a, b in itertools.pairwise(starts))
    assert all(word.start < word.end <= duration for word in clip.words)


@pytest.mark.parametrize("voice", ENGLISH_VOICES)
def test_every_listed_voice_speaks(voice):
    assert synthesize_espeak("hello world", voice=voice, rate_wpm=190, pitch=60).audio.size > 8000


def test_espeak_rejects_text_without_words_unknown_voices_and_odd_rates():
    with pytest.raises(ValueError):
        synthesize_espeak(" ... !")
    with pytest.raises(ValueError):
        synthesize_espeak("hello", voice="no-such-voice")
    with pytest.raises(ValueError):
        synthesize_espeak("hello", rate_wpm=10)


def test_pocketsphinx_matches_espeak_word_starts(clip, aligner):
    found = aligner.align(clip.audio, SENTENCE)
    assert all(word.aligned for word in found)
    errors = [abs(a.start - b.start) for a, b in zip(clip.words, found, strict=True)]
    assert max(errors) < 0.1
    assert np.median(errors) < 0.04


def test_hibari_times_every_word_and_pocketsphinx_agrees(aligner):
    speech = synthesize_hibari(SENTENCE, speed=1.1, seed=1)
    assert speech.sample_rate == 16000 and speech.audio.dtype == np.float32
    assert [w.word for w in speech.words] == normalize_for_alignment(SENTENCE)
    starts = [w.start for w in speech.words]
    assert all(w.aligned for w in speech.words) and starts == sorted(starts)
    assert all(w.start < w.end <= speech.audio.size / 16000 for w in speech.words)
    found = aligner.align(speech.audio, SENTENCE)
    errors = [abs(a.start - b.start) for a, b in zip(found, speech.words, strict=True) if a.aligned]
    assert len(errors) == len(found) and np.median(errors) < 0.05


def test_hibari_is_repeatable_for_a_seed_and_rejects_odd_speeds():
    first, again = synthesize_hibari("hello world", seed=4), synthesize_hibari("hello world", seed=4)
    assert np.array_equal(first.audio, again.audio)
    with pytest.raises(ValueError, match="speed"):
        synthesize_hibari("hello", speed=3.0)
    with pytest.raises(ValueError, match="no words"):
        synthesize_hibari(" ... !")


def test_espeak_gives_arpabet_for_words_missing_from_the_dictionary():
    assert arpabet_from_espeak("helstone") == "HH EH L S T OW N"
    assert arpabet_from_espeak("churchyards") == "CH ER CH Y AA R D Z"


def test_pocketsphinx_places_words_missing_from_its_dictionary(aligner):
    text = "The churchyards near Helstone had wooden palings"
    clip = synthesize_espeak(text)
    found = aligner.align(clip.audio, text)
    assert all(word.aligned for word in found)
    assert max(abs(a.start - b.start) for a, b in zip(clip.words, found, strict=True)) < 0.1


def test_aligner_rejects_empty_text_and_audio(aligner, clip):
    with pytest.raises(AlignmentError):
        aligner.align(clip.audio, "")
    with pytest.raises(AlignmentError):
        aligner.align(clip.audio, "?!")
    with pytest.raises(AlignmentError):
        aligner.align(np.zeros(0, np.float32), "hello")


@pytest.mark.parametrize("source", ["noise", "other sentence", "too short"])
def test_mismatched_audio_is_flagged_or_placed_inside_the_clip(aligner, clip, source):
    audio = {
        "noise": np.random.default_rng(0).normal(0.0, 0.1, 32000).astype(np.float32),
        "other sentence": clip.audio,
        "too short": clip.audio[:800],
    }[source]
    text = "banana" if source == "other sentence" else SENTENCE
    found = aligner.align(audio, text)
    assert [word.word for word in found] == normalize_for_alignment(text)
    duration = audio.size / 16000
    for word in found:
        assert (word.start is None and word.end is None) if not word.aligned else 0 <= word.start < word.end <= duration


@pytest.mark.skipif(importlib.util.find_spec("torchaudio") is not None, reason="torchaudio is installed here")
def test_mms_aligner_explains_what_it_needs():
    with pytest.raises(AlignerUnavailableError, match="torchaudio"):
        MMSAligner()
    with pytest.raises(AlignerUnavailableError):
        get_aligner("mms")


def test_get_aligner_names():
    assert get_aligner("pocketsphinx").name == "pocketsphinx"
    with pytest.raises(ValueError):
        get_aligner("whisperx")


def test_the_aligner_floor_is_the_token_frame_error_against_the_synthesizers_times(clip, aligner, tiny_en):
    from scripts.validate_aligner import floor, token_frame_errors

    exact = token_frame_errors(tiny_en, clip, clip.words, SENTENCE)
    assert len(exact) >= len(SENTENCE.split()) and set(exact) == {0}
    later = [replace(w, start=w.start + 0.1, end=w.end + 0.1) for w in clip.words]
    moved = token_frame_errors(tiny_en, clip, later, SENTENCE)  # 100 ms on 20 ms frames, but frames end with the clip
    assert max(moved) == 5 and sorted(moved)[len(moved) // 2] == 5
    found = token_frame_errors(tiny_en, clip, aligner.align(clip.audio, SENTENCE), SENTENCE)
    assert len(found) == len(exact) and max(found) <= 10  # pocketsphinx within 200 ms of espeak's times
    summary = floor("espeak", "whisper-tiny.en", [0, 1, 2, 5], 1, tiny_en.frame_seconds)
    assert (summary.mean_frames, summary.median_frames, summary.within_one_frame) == (2.0, 1.5, 0.5)
