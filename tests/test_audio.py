import io

import av
import numpy as np
import pytest
import soundfile as sf
from hypothesis import given, settings
from hypothesis import strategies as st

from specasr import audio
from specasr.audio import (
    DEFAULT_MAX_SECONDS,
    SAMPLE_RATE,
    AudioError,
    AudioTooLongError,
    CancellingChannelsError,
    EmptyAudioError,
    NonFiniteAudioError,
    OverFullScaleError,
    SilentAudioError,
    TruncatedAudioError,
    UnreadableAudioError,
    load_audio,
    validate_samples,
)


def tone(seconds: float, rate: int, channels: int = 1) -> np.ndarray:
    """A 440 Hz sine plus a little noise, (samples,) or (samples, channels), float32 in [-1, 1]."""
    rng = np.random.default_rng(0)
    t = np.arange(round(seconds * rate)) / rate
    x = 0.3 * np.sin(2 * np.pi * 440 * t) + 0.01 * rng.standard_normal(t.size)
    x = x.astype(np.float32)
    return x if channels == 1 else np.stack([x * (0.5 + 0.5 * c) for c in range(channels)], axis=1)


def write_m4a(path, x: np.ndarray, rate: int) -> None:
    """AAC in an MP4 container, which libsndfile cannot read, so loading must go through PyAV."""
    layout = "mono" if x.ndim == 1 else "stereo"
    with av.open(str(path), "w", format="ipod") as out:
        stream = out.add_stream("aac", rate=rate, layout=layout)
        frame = av.AudioFrame.from_ndarray(np.atleast_2d(x.T).copy(), format="fltp", layout=layout)
        frame.sample_rate = rate
        frame.pts = 0  # lets the muxer record the encoder's priming, which the decoder then drops
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            out.mux(packet)


def assert_about(samples: np.ndarray, seconds: float, tolerance: float = 0.03) -> None:
    assert samples.dtype == np.float32 and samples.ndim == 1
    assert abs(samples.size / SAMPLE_RATE - seconds) < tolerance
    assert 0.1 < np.abs(samples).max() < 1.0


def test_constants():
    assert SAMPLE_RATE == 16000 and DEFAULT_MAX_SECONDS == 600.0
    errors = (UnreadableAudioError, EmptyAudioError, SilentAudioError, CancellingChannelsError, NonFiniteAudioError)
    for error in (*errors, OverFullScaleError, AudioTooLongError):
        assert issubclass(error, AudioError) and issubclass(error, ValueError)


def test_wav_16k_mono_int16_round_trip(tmp_path):
    x = tone(1.0, SAMPLE_RATE)
    pcm = np.round(x * 32767).astype(np.int16)
    sf.write(tmp_path / "a.wav", pcm, SAMPLE_RATE, subtype="PCM_16")
    out = load_audio(tmp_path / "a.wav")
    assert out.dtype == np.float32 and out.shape == x.shape
    np.testing.assert_allclose(out, pcm / 32768, atol=1e-7)
    np.testing.assert_allclose(out, x, atol=1e-4)


def test_wav_44k_stereo_is_downmixed_and_resampled(tmp_path):
    sf.write(tmp_path / "a.wav", tone(1.5, 44100, channels=2), 44100)
    out = load_audio(str(tmp_path / "a.wav"))
    assert abs(out.size - 1.5 * SAMPLE_RATE) <= 1
    assert_about(out, 1.5, tolerance=1e-3)


@pytest.mark.parametrize(
    ("suffix", "fmt", "subtype"),
    [("flac", "FLAC", "PCM_24"), ("ogg", "OGG", "VORBIS"), ("mp3", "MP3", "MPEG_LAYER_III")],
)
def test_soundfile_formats(tmp_path, suffix, fmt, subtype):
    path = tmp_path / f"a.{suffix}"
    sf.write(path, tone(1.0, 22050, channels=2), 22050, format=fmt, subtype=subtype)
    assert_about(load_audio(path), 1.0)


def test_m4a_aac_decodes_through_pyav_fallback(tmp_path):
    path = tmp_path / "a.m4a"
    write_m4a(path, tone(1.0, 44100, channels=2), 44100)
    with pytest.raises(sf.SoundFileError):
        sf.info(path)
    assert_about(load_audio(path), 1.0)  # AAC pads the end to a whole 1024-sample frame


def test_bytes_and_file_like_match_path(tmp_path):
    path = tmp_path / "a.wav"
    sf.write(path, tone(1.0, 44100), 44100)
    expected = load_audio(path)
    np.testing.assert_array_equal(load_audio(path.read_bytes()), expected)
    np.testing.assert_array_equal(load_audio(io.BytesIO(path.read_bytes())), expected)
    with open(path, "rb") as f:
        np.testing.assert_array_equal(load_audio(f), expected)


def test_m4a_bytes_go_through_fallback(tmp_path):
    path = tmp_path / "a.m4a"
    write_m4a(path, tone(1.0, 16000), 16000)
    assert_about(load_audio(io.BytesIO(path.read_bytes())), 1.0)


def test_missing_path(tmp_path):
    with pytest.raises(UnreadableAudioError, match=r"no such file: .*nothing\.wav"):
        load_audio(tmp_path / "nothing.wav")


def test_a_folder_is_not_an_audio_file(tmp_path):
    (tmp_path / "clips.wav").mkdir()
    with pytest.raises(UnreadableAudioError, match=r"clips\.wav is a folder, not an audio file"):
        load_audio(tmp_path / "clips.wav")


def test_text_file_named_wav(tmp_path):
    path = tmp_path / "notes.wav"
    path.write_text("these are meeting notes, not audio\n" * 20)
    with pytest.raises(UnreadableAudioError, match=r"cannot decode .*notes\.wav"):
        load_audio(path)


def test_random_bytes():
    junk = np.random.default_rng(1).bytes(20000)
    with pytest.raises(UnreadableAudioError, match="cannot decode audio bytes"):
        load_audio(junk)


def test_upload_name_is_used_in_messages():
    upload = io.BytesIO(b"not audio at all")
    upload.name = "voice-memo.m4a"
    with pytest.raises(UnreadableAudioError, match=r"cannot decode voice-memo\.m4a"):
        load_audio(upload)


def test_zero_byte_file(tmp_path):
    (tmp_path / "a.wav").write_bytes(b"")
    with pytest.raises(EmptyAudioError, match="empty file"):
        load_audio(tmp_path / "a.wav")


def test_wav_with_no_samples(tmp_path):
    sf.write(tmp_path / "a.wav", np.zeros(0, np.int16), SAMPLE_RATE)
    with pytest.raises(EmptyAudioError, match="contains no samples"):
        load_audio(tmp_path / "a.wav")


@pytest.mark.parametrize("subtype", ["PCM_16", "FLOAT"])
def test_a_wav_cut_short_is_refused_with_what_it_lacks(tmp_path, subtype):
    whole = tmp_path / "whole.wav"
    sf.write(whole, tone(7.1, SAMPLE_RATE), SAMPLE_RATE, subtype=subtype)
    data = whole.read_bytes()
    cut = tmp_path / "cut.wav"
    cut.write_bytes(data[: len(data) * 3 // 7])
    message = r"cut\.wav is cut short: its header declares 7\.10 s of audio and the file holds 3\.0\d s"
    with pytest.raises(TruncatedAudioError, match=message):
        load_audio(cut)
    with pytest.raises(TruncatedAudioError, match=r"declares 7\.10 s"):  # an upload too
        load_audio(io.BytesIO(cut.read_bytes()))
    assert load_audio(whole).size == round(7.1 * SAMPLE_RATE)  # a whole file passes


def test_too_short(tmp_path):
    sf.write(tmp_path / "a.wav", tone(0.05, SAMPLE_RATE), SAMPLE_RATE)
    with pytest.raises(EmptyAudioError, match=r"0\.050 s long; at least 0\.1 s"):
        load_audio(tmp_path / "a.wav")


def test_silent(tmp_path):
    sf.write(tmp_path / "a.wav", np.zeros(SAMPLE_RATE, np.int16), SAMPLE_RATE)
    with pytest.raises(SilentAudioError, match="is silent"):
        load_audio(tmp_path / "a.wav")


def test_channels_that_cancel_say_so_and_not_silent(tmp_path):
    x = tone(1.0, SAMPLE_RATE)
    sf.write(tmp_path / "a.wav", np.stack([x, -x], axis=1), SAMPLE_RATE, subtype="FLOAT")
    with pytest.raises(CancellingChannelsError, match=r"a\.wav: its 2 channels cancel .*out of phase.*one channel"):
        load_audio(tmp_path / "a.wav")
    assert not issubclass(CancellingChannelsError, SilentAudioError)


def test_quiet_stereo_is_still_silent():
    with pytest.raises(SilentAudioError, match="is silent"):
        validate_samples(np.full((SAMPLE_RATE, 2), 1e-5, np.float32))


@pytest.mark.parametrize("scale", [1e4, 32768.0, -1e7])
def test_float_samples_far_above_full_scale_are_refused(tmp_path, scale):
    sf.write(tmp_path / "a.wav", tone(1.0, SAMPLE_RATE) * scale, SAMPLE_RATE, subtype="FLOAT")
    with pytest.raises(OverFullScaleError, match=r"a\.wav has float samples up to \d.* full scale is 1\.0.*rescale"):
        load_audio(tmp_path / "a.wav")


def test_float_samples_a_little_over_full_scale_pass():
    x = tone(1.0, SAMPLE_RATE) * 5  # peaks near 1.7: headroom a float file may keep
    np.testing.assert_array_equal(validate_samples(x), x)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite(bad):
    x = tone(1.0, SAMPLE_RATE)
    x[100] = bad
    with pytest.raises(NonFiniteAudioError, match="1 NaN or infinite"):
        validate_samples(x)


def test_too_long(tmp_path):
    sf.write(tmp_path / "a.wav", tone(2.0, 44100), 44100)
    with pytest.raises(AudioTooLongError, match=r"2\.00 s long, over the 1 s limit$"):
        load_audio(tmp_path / "a.wav", max_seconds=1.0)


def test_too_long_through_pyav(tmp_path):
    write_m4a(tmp_path / "a.m4a", tone(2.0, 16000), 16000)
    with pytest.raises(AudioTooLongError, match=r"2\.\d\d s long, over the 1 s limit"):
        load_audio(tmp_path / "a.m4a", max_seconds=1.0)


def test_too_long_is_refused_before_resampling(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("resampled a clip that was going to be refused")

    monkeypatch.setattr(audio.soxr, "resample", fail)
    with pytest.raises(AudioTooLongError, match=r"31\.00 s long, over the 30 s limit"):
        validate_samples(np.ones(31 * 48000, np.float32), 48000, max_seconds=30)


@pytest.mark.parametrize("rate", [0, -16000])
def test_bad_sample_rate(rate):
    with pytest.raises(AudioError, match="sample rate must be positive"):
        validate_samples(tone(1.0, SAMPLE_RATE), rate)


def test_bad_shape_and_dtype():
    with pytest.raises(AudioError, match="shape"):
        validate_samples(np.ones((2, 2, 16000), np.float32))
    with pytest.raises(AudioError, match="unsupported sample type"):
        validate_samples(np.ones(16000, np.uint8))


def test_16k_float32_mono_passes_through_unchanged():
    x = tone(1.0, SAMPLE_RATE)
    out = validate_samples(x)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, x)


@pytest.mark.parametrize("dtype", [np.int16, np.int32])
def test_integer_samples_are_scaled(dtype):
    full_scale = -np.iinfo(dtype).min
    x = np.round(tone(1.0, SAMPLE_RATE) * full_scale).astype(dtype)
    out = validate_samples(x)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, tone(1.0, SAMPLE_RATE), atol=1e-4)


def test_array_at_other_rate_is_downmixed_and_resampled():
    out = validate_samples(tone(2.0, 8000, channels=2), 8000)
    assert out.shape == (2 * SAMPLE_RATE,) and out.dtype == np.float32


def encoded(fmt: str) -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, tone(0.3, SAMPLE_RATE, channels=2), SAMPLE_RATE, format=fmt)
    return buffer.getvalue()


VALID = (encoded("WAV"), encoded("FLAC"))


def damaged(data: bytes, length: int, flips: list[tuple[int, int]]) -> bytes:
    """A real file cut short and with some of its header bytes changed."""
    damaged = bytearray(data[:length])
    for index, mask in flips:
        if index < len(damaged):
            damaged[index] ^= mask
    return bytes(damaged)


FILES = st.one_of(
    st.binary(max_size=2048),
    st.builds(
        damaged,
        st.sampled_from(VALID),
        st.integers(0, 12000),
        st.lists(st.tuples(st.integers(0, 120), st.integers(1, 255)), max_size=4),
    ),
)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(data=FILES, extension=st.sampled_from(["wav", "flac", "mp3", "ogg", "m4a"]))
def test_any_bytes_give_a_clip_or_an_audio_error(tmp_path_factory, data, extension):
    path = tmp_path_factory.mktemp("fuzz") / f"clip.{extension}"
    path.write_bytes(data)
    try:
        samples = load_audio(path)
    except AudioError:
        return
    assert samples.dtype == np.float32 and samples.ndim == 1 and np.isfinite(samples).all()
