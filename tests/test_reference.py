"""The token-to-frame rule, and reference frames a user supplies in a file (--reference FILE)."""

import json
import re
from dataclasses import replace

import pytest

from specasr.reference import check_reference_length, read_reference_file, token_frames
from specasr.trace import Settings

SOT, EOT = 0, 1
PIECES = {SOT: "<|sot|>", EOT: "<|eot|>", 10: " The", 11: " cat", 12: ",", 13: " sat", 14: " un", 15: "tied", 16: "."}


def decode(ids: list[int]) -> str:
    return "".join(PIECES[i] for i in ids)


def tenth_seconds(count: int) -> list[float | None]:
    """Alphanumeric character i at (i + 1) / 10 s, i.e. frame 5 * (i + 1) on a 20 ms grid."""
    return [(i + 1) / 10 for i in range(count)]


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
# --reference FILE

VALID_FRAMES = 250  # a 5 s clip on Whisper's 20 ms grid


def write(tmp_path, content: str):
    path = tmp_path / "frames.json"
    path.write_text(content)
    return path


def test_a_reference_file_holds_one_frame_or_null_per_token(tmp_path):
    path = write(tmp_path, "[0, null, 17, 249]")
    assert read_reference_file(path, VALID_FRAMES) == [0, None, 17, 249]


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("[3, 99999]", "frame 99999 is outside the clip's frames 0..249"),
        ("[250]", "frame 250 is outside the clip's frames 0..249"),
        ("[-1, 4]", "frame -1 is outside the clip's frames 0..249"),
        ("[1.0, 2]", "a JSON list of frame numbers (whole numbers, or null)"),
        ("[true, 2]", "a JSON list of frame numbers (whole numbers, or null)"),
        ("[[1, 2], 3]", "a JSON list of frame numbers (whole numbers, or null)"),
        ('{"frames": [1]}', "a JSON list of frame numbers (whole numbers, or null)"),
        ("[1, 2", "is not JSON"),
        ("", "is not JSON"),
    ],
)
def test_a_bad_reference_file_is_refused_naming_the_option_the_file_and_what_is_allowed(tmp_path, content, says):
    path = write(tmp_path, content)
    with pytest.raises(ValueError, match="--reference") as refused:
        read_reference_file(path, VALID_FRAMES)
    assert str(path) in str(refused.value) and says in str(refused.value)
    assert "\n" not in str(refused.value)


def test_a_reference_file_that_is_a_folder_or_missing_is_refused(tmp_path):
    for path in (tmp_path, tmp_path / "missing.json"):
        with pytest.raises(ValueError, match=re.escape(f"--reference {path}: cannot read")):
            read_reference_file(path, VALID_FRAMES)


def test_a_reference_file_must_have_one_frame_per_transcript_token():
    check_reference_length("frames.json", [1, None, 3], 3)
    for frames in ([1, 2], [1, 2, 3, 4]):
        with pytest.raises(
            ValueError,
            match=re.escape(f"--reference frames.json holds {len(frames)} frames; the transcript has 3 tokens"),
        ):
            check_reference_length("frames.json", frames, 3)


def test_a_decode_refuses_a_reference_file_of_the_wrong_length_and_keeps_one_that_fits(
    pipeline, sample_clips, tmp_path
):
    clip = sample_clips[0].clip()
    greedy = pipeline.decode(clip, Settings())
    settings = Settings(draft="whisper-tiny.en/anchordraft", window="correct", k=4)
    frames = [min(5 * i, 40) for i in range(len(greedy.tokens))]
    for wrong in (frames[:-1], [*frames, 7]):
        path = write(tmp_path, json.dumps(wrong))
        with pytest.raises(
            ValueError, match=re.escape(f"--reference {path} holds {len(wrong)} frames; the transcript has")
        ):
            pipeline.decode(clip, replace(settings, reference=str(path)))
    path = write(tmp_path, json.dumps(frames))
    trace = pipeline.decode(clip, replace(settings, reference=str(path)))
    assert trace.tokens == greedy.tokens
    assert (trace.reference_source, trace.reference_frames) == ("file", frames)


def test_a_decode_refuses_a_frame_past_the_clip(pipeline, sample_clips, tmp_path):
    path = write(tmp_path, "[3, 99999]")
    with pytest.raises(ValueError, match=r"frame 99999 is outside the clip's frames 0\.\.\d+"):
        pipeline.decode(sample_clips[0].clip(), Settings(reference=str(path)))
