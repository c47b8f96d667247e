"""Audio-prefix targets (Qwen3-ASR, Voxtral) on tiny random configurations: no real weights exist offline here.

The lossless property over random models runs for them in test_speculative.py; here: their step against a plain
transformers forward, their frame counts, the draft's fit checks, save/load, and a training run.
"""

import numpy as np
import pytest
import torch

from specasr.audio import Clip, split_windows
from specasr.decode import greedy_tokens
from specasr.draft import DraftMismatchError, load_draft, random_draft, save_draft
from specasr.pipeline import Pipeline
from specasr.store import Store
from specasr.targets import TargetUnavailableError, load_target
from specasr.targets.head import VocabularyHead
from specasr.trace import Settings
from specasr.train import TrainConfig, train
from specasr.trainset import teacher_forced
from tests.conftest import random_prefix_target, run_loop

FAMILIES = ("qwen3_asr", "voxtral")


def _audio(seconds: float, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 0.1, int(seconds * 16000)).astype(np.float32)


def _model_inputs(target, features) -> dict:
    if hasattr(features, "mask"):
        return {"input_features": features.input_features, "input_features_mask": features.mask}
    return {"input_features": features}


@pytest.mark.parametrize("family", FAMILIES)
def test_step_equals_a_plain_transformers_forward(family):
    """Logits, tapped states and the audio attention of our cached step equal transformers' eager forward over the
    whole sequence (audio placeholders filled by the model itself), with attention outputs."""
    target = random_prefix_target(family, seed=0, layers=2, heads=4, vocab_size=16, max_length=30, init_std=0.5)
    target.model.set_attn_implementation("eager")
    features = target.features(_audio(2.0))
    memory = target.encode(features)
    text = [*target.prompt, 5, 7, 9, 4]
    ids = [*target.head, *[target.model.config.audio_token_id] * memory.shape[1], *text]
    with torch.no_grad():
        reference = target.model(
            input_ids=torch.tensor([ids]), output_attentions=True, output_hidden_states=True,
            **_model_inputs(target, features),
        )  # fmt: skip
    cache = target.new_cache(memory, capacity=20)
    out = target.forward(torch.tensor([text]), cache, taps=(0, 1, 2), attention_layers=(0, 1))

    start, d = cache.prefix, target.d_model
    assert torch.allclose(target.logits(out.states)[0], reference.logits[0, start:], atol=1e-4)
    for tap in (0, 1):  # transformers' last hidden state is after the final norm; our taps are the layer outputs
        assert torch.allclose(
            out.hidden[0, :, tap * d : (tap + 1) * d], reference.hidden_states[tap][0, start:], atol=1e-4
        )
    normed = target._llm.norm(out.hidden[0, :, 2 * d :])
    assert torch.allclose(normed, reference.hidden_states[2][0, start:], atol=1e-4)
    for layer in (0, 1):
        expected = reference.attentions[layer][0, :, start:, cache.audio].mean(dim=0)
        assert torch.allclose(out.audio_attention[layer, 0], expected, atol=1e-5)
    assert cache.audio == slice(len(target.head), len(target.head) + memory.shape[1])


@pytest.mark.parametrize("family", FAMILIES)
def test_frames_count_the_audio_memory(family):
    target = random_prefix_target(family, seed=0, layers=1, heads=2, vocab_size=16, max_length=20)
    for seconds in (0.3, 1.0, 2.37, 4.0):
        audio = _audio(seconds)
        memory = target.encode(target.features(audio))
        if family == "qwen3_asr":  # the encoder keeps real audio only
            assert memory.shape[1] == target.valid_frames(len(audio))
        else:  # a 30 s Whisper window of 80 ms frames, the tail of it padding
            assert memory.shape[1] == 375 and target.valid_frames(len(audio)) == -(-len(audio) // 1280)
        if seconds >= 0.5:  # Qwen3-ASR pads shorter clips with silence it then hears as audio
            assert abs(target.valid_frames(len(audio)) * target.frame_seconds - seconds) < 0.1


@pytest.mark.parametrize("family", FAMILIES)
def test_every_end_id_ends_the_text(family):
    target = random_prefix_target(family, seed=0, layers=1, heads=2, vocab_size=16, max_length=20)
    target.lm_head = VocabularyHead(torch.eye(16, target.d_model))  # state i scores token i highest
    states = torch.eye(16, target.d_model)[[6, 1, 5]][None]
    expected = [1, 1, 5] if family == "qwen3_asr" else [6, 1, 5]  # Qwen3-ASR ends on 1 or 6; Voxtral on 1 only
    assert target.greedy_tokens(states, 0)[0].tolist() == expected


def test_a_draft_fits_only_its_own_target(tmp_path, tiny_en):
    qwen = random_prefix_target("qwen3_asr", seed=0, layers=2, heads=4, vocab_size=16, max_length=20)
    save_draft(random_draft(qwen), tmp_path / "qwen")
    with pytest.raises(DraftMismatchError, match="hidden size 32 vs the target's 384"):
        load_draft(tmp_path / "qwen", tiny_en)
    save_draft(random_draft(tiny_en), tmp_path / "tiny")
    with pytest.raises(DraftMismatchError, match="does not fit target 'random-qwen3_asr'"):
        load_draft(tmp_path / "tiny", qwen)
    with pytest.raises(DraftMismatchError, match="layer taps"):
        random_draft(qwen, taps=(1, 3))


@pytest.mark.parametrize("family", FAMILIES)
def test_a_trained_draft_saves_loads_and_stays_lossless(tmp_path, family):
    """One short training run on examples made by the target itself, then the saved draft decodes losslessly."""
    target = random_prefix_target(family, seed=1, layers=2, heads=4, vocab_size=16, max_length=24, init_std=0.5)
    examples = []
    for seed in range(4):
        memory = target.encode(target.features(_audio(1.5, seed)))
        valid = target.valid_frames(24000)
        transcript = greedy_tokens(target, memory)[:12] or [5]
        frames = [min(i * 2, valid - 1) for i in range(len(transcript))]
        examples.append(teacher_forced(target, f"clip-{seed}", memory, valid, transcript, frames))
    config = TrainConfig(epochs=2, batch_size=2, draft_vocab=0, sigma_ms=160.0)
    trained = train(target, examples, config, tmp_path / "draft", data_hash="test")
    loaded = load_draft(tmp_path / "draft", target, precision="float32")
    assert loaded.config.target == target.name and loaded.config.training["examples"] == 4
    saved, read = trained.state_dict(), loaded.state_dict()
    assert saved.keys() == read.keys() and all(torch.equal(saved[k].half(), read[k].half()) for k in saved)
    memory = target.encode(target.features(_audio(1.5, 0)))
    valid = target.valid_frames(24000)
    for window in ("unrestricted", "runtime"):
        decoded = run_loop(target, loaded, memory, valid, Settings(draft="x", k=4, window=window))
        assert decoded.tokens == greedy_tokens(target, memory)


def test_a_target_named_by_its_path_gets_one_folder_name():
    target = random_prefix_target("voxtral", seed=0, layers=1, heads=2, vocab_size=16, max_length=20)
    target.name = "/home/user/models/voxtral-mini"
    assert target.folder_name == "_home_user_models_voxtral-mini"  # drafts and features never land in its folder


def test_a_folder_of_another_model_type_is_refused_clearly(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(TargetUnavailableError, match="'bert' model; specasr reads these families: whisper"):
        load_target(str(tmp_path))


def test_a_checkpoint_folder_without_its_processor_is_refused_clearly(tmp_path):
    target = random_prefix_target("qwen3_asr", seed=0, layers=1, heads=2, vocab_size=16, max_length=20)
    target.model.save_pretrained(tmp_path)
    with pytest.raises(TargetUnavailableError, match=f"could not load qwen3_asr target '{tmp_path}'"):
        load_target(str(tmp_path))


@pytest.mark.parametrize("family", FAMILIES)
def test_the_pipeline_decodes_long_audio_on_the_targets_own_frames(tmp_path, family):
    """A 40 s clip through the pipeline: two windows, segment frames on the target's grid, greedy == speculative,
    and the trace's frame duration kept in the store."""
    target = random_prefix_target(family, seed=2, layers=2, heads=2, vocab_size=16, max_length=24, init_std=0.5)
    pipeline = Pipeline(Store(tmp_path / "runs.duckdb"))
    pipeline._targets[(target.name, "cpu", "float32")] = target  # as load_target would hand it over
    clip = Clip("long", _audio(40.0))
    greedy = pipeline.decode(clip, Settings(target=target.name))
    runtime = Settings(target=target.name, draft="random", k=3, window="runtime", reference="never")
    trace = pipeline.decode(clip, runtime)

    assert trace.tokens == greedy.tokens and trace.text == greedy.text
    assert trace.frame_seconds == target.frame_seconds
    windows = split_windows(clip.audio, target.window_samples, target.cut_samples)
    assert len(windows) == 2 and windows[1][0] % target.cut_samples == 0
    assert [s.start_frame for s in trace.segments] == [0, target.frames(windows[1][0])]
    assert [s.valid_frames for s in trace.segments] == [target.valid_frames(end - start) for start, end in windows]
    second = [v for v in greedy.verified if v.position >= trace.segments[1].first_token]
    assert all(trace.segments[1].start_frame <= p for v in second for p in v.verify_peaks)  # clip frames
    run = pipeline.store.write_run([trace], command="test")
    assert pipeline.store.traces(run)[0].frame_seconds == target.frame_seconds
