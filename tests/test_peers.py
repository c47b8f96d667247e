"""Peers: faster-whisper, transformers `generate` and its assisted generation decode what they decode on their own,
through the pipeline."""

import numpy as np
import pytest
from faster_whisper import WhisperModel
from transformers import WhisperConfig, WhisperForCausalLM

from specasr.audio import load_audio
from specasr.decode import greedy_tokens
from specasr.draft import DraftMismatchError
from specasr.peers import TARGET_LAYERS, FasterWhisper, TransformersGenerate, load_assistant
from specasr.store import Store
from specasr.targets import builtin
from specasr.trace import Settings


@pytest.mark.parametrize("target_name", ["tiny_en", "base"])
def test_peers_decode_our_greedy_tokens_from_the_same_features(request, target_name, sample_clips):
    target = request.getfixturevalue(target_name)
    generate = TransformersGenerate(target)
    faster_whisper = FasterWhisper(target.name, target.prompt, target.max_length, "cpu", "float32")
    for clip in sample_clips:
        features = target.features(load_audio(clip.path))
        expected = greedy_tokens(target, target.encode(features))
        assert generate.decode(target.encode(features)) == expected, clip.id
        assert faster_whisper.decode(faster_whisper.encode(features.numpy())) == expected, clip.id


def test_faster_whisper_peer_equals_its_transcribe(pipeline, sample_clips):
    model = WhisperModel(str(builtin.bundled_ct2_dir("whisper-tiny.en")), device="cpu", compute_type="float32")
    settings = Settings(target="whisper-tiny.en", decoder="faster-whisper")
    for clip in sample_clips:
        audio = load_audio(clip.path)
        segments, _ = model.transcribe(
            audio,
            beam_size=1,
            temperature=0.0,
            without_timestamps=True,
            vad_filter=False,
            condition_on_previous_text=False,
            language="en",
        )
        expected = [token for segment in segments for token in segment.tokens]
        assert pipeline.decode(clip.clip(), settings).tokens == expected, clip.id


def test_a_peer_decode_is_a_stored_greedy_trace(pipeline, sample_clips, tmp_path):
    trace = pipeline.decode(sample_clips[0].clip(), Settings(target="whisper-tiny.en", decoder="transformers"))
    assert trace.settings.decoder == "transformers" and not trace.settings.verify_peaks
    assert trace.tokens and not trace.rounds and not trace.verified
    assert trace.timings.encoder > 0 and trace.timings.decode > 0
    store = Store(tmp_path / "runs.duckdb")
    assert store.traces(store.write_run([trace], "bench")) == [trace]


@pytest.mark.parametrize(
    "asked",
    [{"draft": "random"}, {"reference": "always"}, {"decoder": "whisper.cpp"}, {"assistant": TARGET_LAYERS}],
)
def test_peers_refuse_what_they_cannot_do(asked):
    with pytest.raises(ValueError, match="decoder"):
        Settings(**({"decoder": "faster-whisper"} | asked))


def test_assisted_generation_needs_an_assistant():
    with pytest.raises(ValueError, match="needs one"):
        Settings(decoder="transformers-assisted")


@pytest.mark.parametrize("target_name", ["tiny_en", "base"])
def test_assisted_generation_decodes_our_greedy_tokens(request, target_name, sample_clips):
    target = request.getfixturevalue(target_name)
    assisted = TransformersGenerate(target, load_assistant(TARGET_LAYERS, target))
    for clip in sample_clips[:2]:
        memory = target.encode(target.features(load_audio(clip.path)))
        assert assisted.decode(memory) == greedy_tokens(target, memory), clip.id


def test_the_target_layers_assistant_is_the_targets_first_and_last_layers(tiny_en):
    assistant = load_assistant(TARGET_LAYERS, tiny_en)
    ours, theirs = assistant.model.decoder, tiny_en.model.model.decoder
    assert len(ours.layers) == 2
    for kept, source in zip(ours.layers, (theirs.layers[0], theirs.layers[-1]), strict=True):
        assert kept.fc1.weight.data_ptr() == source.fc1.weight.data_ptr()  # shared, not copied
    assert assistant.proj_out.weight.data_ptr() == theirs.embed_tokens.weight.data_ptr()


def test_an_assistant_folder_decodes_and_a_misfit_one_is_refused(tmp_path, tiny_en, sample_clips):
    load_assistant(TARGET_LAYERS, tiny_en).save_pretrained(tmp_path / "layers")
    assisted = TransformersGenerate(tiny_en, load_assistant(str(tmp_path / "layers"), tiny_en))
    memory = tiny_en.encode(tiny_en.features(load_audio(sample_clips[0].path)))
    assert assisted.decode(memory) == greedy_tokens(tiny_en, memory)
    small = {"decoder_layers": 1, "decoder_attention_heads": 2, "decoder_ffn_dim": 64, "pad_token_id": 0}
    other = WhisperConfig(vocab_size=100, d_model=64, **small)
    WhisperForCausalLM(other).save_pretrained(tmp_path / "other")
    with pytest.raises(DraftMismatchError, match="width 64 vs the target's encoder output 384; vocabulary 100"):
        load_assistant(str(tmp_path / "other"), tiny_en)
    with pytest.raises(DraftMismatchError, match="cannot load"):
        load_assistant(str(tmp_path / "missing"), tiny_en)


def test_faster_whisper_runs_in_a_process_of_its_own(pipeline, tiny_en, sample_clips):
    import os

    from specasr.peers import PeerProcess

    peer = pipeline.peer(Settings(target="whisper-tiny.en", decoder="faster-whisper"))
    assert isinstance(peer, PeerProcess) and peer._process.pid != os.getpid()
    with pytest.raises(KeyError):  # an error in the peer's process is raised here, and the peer goes on serving
        peer.decode(12345)
    audio = load_audio(sample_clips[0].path)
    here = FasterWhisper(tiny_en.name, tiny_en.prompt, tiny_en.max_length, "cpu", "float32")
    assert peer.decode(peer.encode(peer.features(audio))) == here.decode(here.encode(here.features(audio)))


def test_a_peer_process_that_dies_is_an_error_not_a_hang(tiny_en):
    from specasr.peers import PeerProcess

    peer = PeerProcess(tiny_en, "cpu", "float32")
    peer._process.kill()
    peer._process.join()
    with pytest.raises(RuntimeError, match="faster-whisper process ended"):
        peer.features(np.zeros(16000, dtype=np.float32))
