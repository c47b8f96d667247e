import copy
import struct

import ctranslate2
import numpy as np
import pytest
import torch
from transformers import WhisperForConditionalGeneration

from specasr.audio import load_audio
from specasr.decode import greedy_tokens
from specasr.targets import TargetUnavailableError, builtin, load_target
from specasr.targets.ct2 import CT2FormatError, load_ct2_whisper, read_ct2_variables
from specasr.targets.head import vocabulary_logits


def test_converted_state_dict_fills_every_transformers_weight():
    bundle = builtin.BUILTIN_TARGETS["whisper-tiny.en"]
    config, state_dict = load_ct2_whisper(builtin._model_bin(bundle))
    expected = WhisperForConditionalGeneration(config).state_dict()
    expected.pop("proj_out.weight")  # tied to the token embedding
    assert set(state_dict) == set(expected)
    for name, array in state_dict.items():
        assert tuple(array.shape) == tuple(expected[name].shape), name
    assert (config.vocab_size, config.d_model, config.decoder_layers) == (51864, 384, 4)


def _ct2_header(version: int, spec: str) -> bytes:
    name = spec.encode() + b"\0"
    return struct.pack("<I", version) + struct.pack("<H", len(name)) + name + struct.pack("<II", 3, 1)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (_ct2_header(5, "WhisperSpec"), "version 5"),
        (_ct2_header(6, "TransformerSpec"), "not a Whisper model"),
        (_ct2_header(6, "WhisperSpec"), "truncated"),
        (b"RIFF\x00\x00", "version"),
        (b"\x06\x00", "truncated"),
    ],
)
def test_ct2_reader_rejects_foreign_or_broken_files(data, message):
    with pytest.raises(CT2FormatError, match=message):
        read_ct2_variables(data)


def test_conversion_is_cached_and_not_repeated(monkeypatch):
    first = builtin.builtin_model_dir("whisper-tiny.en")
    monkeypatch.setattr(builtin, "_convert", lambda *a: pytest.fail("converted twice"))
    assert builtin.builtin_model_dir("whisper-tiny.en") == first


def test_failed_conversion_leaves_nothing_behind(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECASR_CACHE", str(tmp_path))

    def crash_midway(bundle, out):
        (out / "model.safetensors").write_bytes(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(builtin, "_convert", crash_midway)
    with pytest.raises(KeyboardInterrupt):
        builtin.builtin_model_dir("whisper-tiny.en")
    assert list((tmp_path / "targets").iterdir()) == []


def test_unknown_target_and_missing_device_are_clear_errors():
    with pytest.raises(TargetUnavailableError, match="no target 'whisper-huge': it is not a local folder"):
        load_target("whisper-huge")
    with pytest.raises(TargetUnavailableError, match="no target '/no/such/model': it is not a local folder"):
        load_target("/no/such/model")  # a path, never taken for a hub id
    if not torch.cuda.is_available():
        with pytest.raises(TargetUnavailableError, match="no CUDA device"):
            load_target("whisper-tiny.en", device="cuda")
    with pytest.raises(ValueError, match="unknown dtype"):
        load_target("whisper-tiny.en", dtype="float64")


def test_local_transformers_folder_loads_like_a_builtin(tiny_en):
    folder = load_target(str(builtin.builtin_model_dir("whisper-tiny.en")))
    assert folder.prompt == tiny_en.prompt == (50257, 50362)


@pytest.mark.parametrize("target_name", ["tiny_en", "base"])
def test_greedy_loop_matches_transformers_generate(request, target_name, sample_clips):
    target = request.getfixturevalue(target_name)
    language = {} if target.name.endswith(".en") else {"language": "en", "task": "transcribe"}
    for clip in sample_clips:
        features = target.features(load_audio(clip.path))
        expected = target.model.generate(features, do_sample=False, num_beams=1, **language)[0].tolist()
        assert greedy_tokens(target, target.encode(features)) == expected, clip.id


@pytest.mark.parametrize("target_name", ["tiny_en", "base"])
def test_converted_weights_match_ctranslate2_on_the_same_features(request, target_name, sample_clips):
    target = request.getfixturevalue(target_name)
    peer = ctranslate2.models.Whisper(
        str(builtin.bundled_ct2_dir(target.name)), device="cpu", compute_type="float32", intra_threads=2
    )
    for clip in sample_clips:
        features = target.features(load_audio(clip.path))
        mel = ctranslate2.StorageView.from_array(np.ascontiguousarray(features.numpy()))
        expected = peer.generate(mel, [list(target.prompt)], beam_size=1)[0].sequences_ids[0]
        assert greedy_tokens(target, target.encode(features)) == expected, clip.id


def test_greedy_stops_at_the_length_limit(tiny_en, sample_clips):
    memory = tiny_en.encode(tiny_en.features(load_audio(sample_clips[0].path)))
    full = greedy_tokens(tiny_en, memory)
    tiny_en.max_length, limit = len(tiny_en.prompt) + 3, tiny_en.max_length
    try:
        assert greedy_tokens(tiny_en, memory) == full[:3]
    finally:
        tiny_en.max_length = limit


@pytest.mark.parametrize("shape", [(1, 1, 8), (1, 3, 8), (2, 5, 8)])
def test_vocabulary_logits_equal_the_plain_product(shape):
    generator = torch.Generator().manual_seed(0)
    hidden, embedding = torch.randn(shape, generator=generator), torch.randn(50, 8, generator=generator)
    logits = vocabulary_logits(hidden, embedding)
    assert logits.shape == (*shape[:-1], 50)
    torch.testing.assert_close(logits, hidden @ embedding.T)


@pytest.mark.parametrize("target_name", ["tiny_en", "base"])
def test_the_encoder_pass_is_transformers_encoder_in_float32(request, target_name, sample_clips):
    """Both within float32 rounding of transformers' encoder run in float64 (ours sums in another order)."""
    target = request.getfixturevalue(target_name)
    features = target.features(load_audio(sample_clips[0].path))
    with torch.inference_mode():
        exact = copy.deepcopy(target.model.model.encoder).double()(features.double()).last_hidden_state
        tolerance = 1e-4 * exact.abs().max()
        assert (target.encode(features) - exact).abs().max() < tolerance
        assert (target.model.model.encoder(features).last_hidden_state - exact).abs().max() < tolerance


def test_log_mel_features_are_the_feature_extractors(tiny_en, sample_clips):
    """Computed with torch on the target's device, from a tensor (a clip moved once) or from samples: on a CPU the
    feature extractor's own numbers, for a short clip, one of exactly 30 s and one cut to 30 s."""
    audio = load_audio(sample_clips[1].path)
    for samples in (audio, np.resize(audio, 16000 * 30), np.resize(audio, 16000 * 45)):
        expected = tiny_en.feature_extractor(samples, sampling_rate=16000, return_tensors="pt").input_features
        assert torch.equal(tiny_en.features(samples), expected)
        assert torch.equal(tiny_en.features(tiny_en.samples(samples)), expected)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_log_mel_features_on_cuda_are_within_rounding_of_the_feature_extractors(sample_clips):
    target = load_target("whisper-tiny.en", device="cuda")
    audio = load_audio(sample_clips[1].path)
    expected = target.feature_extractor(audio, sampling_rate=16000, return_tensors="pt").input_features
    assert (target.features(target.samples(audio)).cpu() - expected).abs().max() < 1e-4
