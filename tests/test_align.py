import importlib.util
import itertools

import numpy as np
import pytest

from specasr.align import (
    AlignerUnavailableError,
    AlignmentError,
    MMSAligner,
    PocketSphinxAligner,
    WordTime,
    arpabet_from_espeak,
    char_times_from_words,
    get_aligner,
    normalize_for_alignment,
    token_frames,
)
from specasr.tts import ENGLISH_VOICES, synthesize_espeak, synthesize_hibari

SOT, EOT = 0, 1
PIECES = {SOT: "<|sot|>", EOT: "<|eot|>", 10: " The", 11: " cat", 12: ",", 13: " sat", 14: " un", 15: "tied", 16: "."}


def decode(ids: list[int]) -> str:
    return "".join(PIECES[i] for i in ids)


def tenth_seconds(count: int) -> list[float | None]:
    """Alphanumeric character i at (i + 1) / 10 s, i.e. frame 5 * (i + 1) on a 20 ms grid."""
    return [(i + 1) / 10 for i in range(count)]


# ---------------------------------------------------------------------------------------------------------------------
# The token-to-frame rule


def test_token_frames_rule_on_a_hand_made_sequence():
    ids = [SOT, 10, 11, 12, 13, 13, 14, 15, 16, EOT]  # " The cat, sat sat untied." -> "thecatsatsatuntied"
    frames = token_frames(ids, decode, tenth_seconds(18), {SOT, EOT}, valid_frames=1500, frame_seconds=0.02)
    # special -> None; each word token -> its last character; "," and "." reuse the latest time; the repeated
    # " sat" takes its own new characters; " un" + "tied" is one word, each token its own last character.
    assert frames == [None, 15, 30, 30, 45, 60, 70, 90, 90, None]
    on_80ms = token_frames(ids, decode, tenth_seconds(18), {SOT, EOT}, valid_frames=375, frame_seconds=0.08)
    assert on_80ms == [None, 4, 8, 8, 11, 15, 18, 23, 23, None]  # the same times on Voxtral's grid, rounded half up


def test_leading_punctuation_has_no_time_yet():
    frames = token_frames([SOT, 12, 10], decode, tenth_seconds(3), {SOT}, valid_frames=1500, frame_seconds=0.02)
    assert frames == [None, None, 15]


def test_frames_are_clipped_to_the_valid_audio():
    frames = token_frames([10, 11, 13], decode, tenth_seconds(9), set(), valid_frames=40, frame_seconds=0.02)
    assert frames == [15, 30, 39]


def test_unaligned_characters_stay_none_and_punctuation_reuses_the_latest_valid_time():
    times = tenth_seconds(9)
    times[3:6] = [None, None, None]  # "cat" could not be aligned
    frames = token_frames([10, 11, 12, 13], decode, times, set(), valid_frames=1500, frame_seconds=0.02)
    assert frames == [15, None, 15, 45]


def test_punctuation_after_only_unaligned_characters_has_no_time():
    times = tenth_seconds(6)
    times[0:3] = [None, None, None]  # "the" could not be aligned
    frames = token_frames([10, 12, 11], decode, times, set(), valid_frames=1500, frame_seconds=0.02)
    assert frames == [None, None, 30]


def test_partial_utf8_bytes_add_no_character_until_completed():
    pieces = {1: b" caf", 2: b"\xc3", 3: b"\xa9", 4: b" ok"}

    def decode_bytes(ids: list[int]) -> str:
        return b"".join(pieces[i] for i in ids).decode("utf-8", errors="replace")

    frames = token_frames([1, 2, 3, 4], decode_bytes, tenth_seconds(6), set(), valid_frames=1500, frame_seconds=0.02)
    assert frames == [15, 15, 20, 30]


def test_token_frames_rejects_char_times_shorter_than_the_transcript():
    with pytest.raises(ValueError):
        token_frames([10, 11], decode, tenth_seconds(4), set(), valid_frames=1500, frame_seconds=0.02)


# ---------------------------------------------------------------------------------------------------------------------
# Text normalization and character times


@pytest.mark.parametrize(
    ("text", "spoken"),
    [
        ("Hello, World!", "hello world"),
        ("Don't   STOP \u2014 it\u2019s fine.", "don't stop it's fine"),
        ("carving-knife; U.S.", "carving knife u s"),
        ("In 1963 he paid 1,250", "in nineteen sixty three he paid one thousand two hundred fifty"),
        ("3.5 or 1905 or 1900", "three point five or nineteen oh five or nineteen hundred"),
        ("the 1st, 22nd and 100th", "the first twenty second and one hundredth"),
        ("2005 or 7", "two thousand five or seven"),
        ("...!?", ""),
    ],
)
def test_normalize_for_alignment(text, spoken):
    assert normalize_for_alignment(text) == spoken.split()


def test_char_times_spread_each_word_over_its_characters():
    words = [WordTime("hi", 0.0, 0.2, True), WordTime("you", 0.4, 0.7, True), WordTime("there", None, None, False)]
    times = char_times_from_words("Hi, you there!", words)
    assert times[:5] == pytest.approx([0.05, 0.15, 0.45, 0.55, 0.65])
    assert times[5:] == [None] * 5


def test_char_times_give_a_rewritten_number_the_span_of_its_spoken_words():
    text = "In 19 days, don't"
    spoken = normalize_for_alignment(text)
    assert spoken == ["in", "nineteen", "days", "don't"]
    spans = [(0.0, 0.2), (0.2, 0.8), (0.8, 1.2), (1.3, 1.7)]
    words = [WordTime(word, start, end, True) for word, (start, end) in zip(spoken, spans, strict=True)]
    times = char_times_from_words(text, words)
    assert len(times) == sum(c.isalnum() for c in text.lower())
    assert times[2:4] == pytest.approx([0.35, 0.65])  # "19" spans "nineteen"
    assert times[-4:] == pytest.approx([1.35, 1.45, 1.55, 1.65])  # "don't" has four alphanumerics


def test_char_times_reject_words_of_another_text():
    with pytest.raises(ValueError):
        char_times_from_words("one two", [WordTime("one", 0.0, 0.1, True)])


# ---------------------------------------------------------------------------------------------------------------------
# espeak-ng synthesis and the pocketsphinx aligner

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
