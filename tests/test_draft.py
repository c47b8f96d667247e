import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specasr.audio import load_audio
from specasr.draft import (
    SHIPPED_DRAFTS,
    DraftMismatchError,
    load_draft,
    random_draft,
    save_draft,
    shipped_drafts,
    start_from_target_layer,
)
from specasr.targets import DTYPES
from specasr.targets.packed import FBGEMM
from specasr.trace import Settings, SettingsError
from specasr.windows import window_mask


@settings(max_examples=200, deadline=None)
@given(
    valid_frames=st.integers(1, 60),
    centres=st.lists(st.integers(-1, 59), min_size=1, max_size=8),
    half_width=st.integers(0, 30),
)
def test_window_mask_never_lets_attention_out(valid_frames, centres, half_width):
    mask = window_mask(valid_frames, 60, torch.tensor(centres), half_width)
    frame = torch.arange(60)
    for centre, row in zip(centres, mask, strict=True):
        assert not row[valid_frames:].any()  # padding is never visible
        if centre < 0:
            assert row[:valid_frames].all()
        else:
            assert torch.equal(row, (frame < valid_frames) & ((frame - centre).abs() <= half_width))


def _draft_inputs(target, steps: int):
    generator = torch.Generator().manual_seed(0)
    memory = torch.randn(1, 1500, target.d_model, generator=generator)
    features = torch.randn(1, steps, 3 * target.d_model, generator=generator)
    tokens = torch.randint(0, 50000, (1, steps), generator=generator)
    return memory, features, tokens


def test_restricted_draft_attends_only_inside_its_window_and_never_padding(tiny_en):
    draft = random_draft(tiny_en)
    memory, features, tokens = _draft_inputs(tiny_en, steps=3)
    valid_frames, half_width = 200, 20
    cache = draft.new_cache(memory, valid_frames, capacity=8)
    centres = torch.tensor([[30, 190, -1]])
    with torch.no_grad():
        window = window_mask(valid_frames, valid_frames, centres, half_width)
        attention = draft(features, tokens, cache, window).attention[0]
    assert attention.shape[-1] == valid_frames  # padding frames are not even in the cache
    assert torch.allclose(attention.sum(-1), torch.ones(3))
    assert attention[0, 10:51].sum().item() == pytest.approx(1.0) and attention[0, 51:].sum() == 0
    assert attention[1, 170:200].sum().item() == pytest.approx(1.0)


def test_cache_of_valid_frames_equals_attending_all_frames_with_padding_masked(tiny_en):
    draft = random_draft(tiny_en)
    memory, features, tokens = _draft_inputs(tiny_en, steps=3)
    valid_frames = 200
    full = draft.new_cache(memory, valid_frames, capacity=8, frames=memory.shape[1])  # padding kept, masked
    with torch.no_grad():
        padded = draft(features, tokens, full)
        trimmed = draft(features, tokens, draft.new_cache(memory, valid_frames, capacity=8))
    assert padded.attention[0, :, valid_frames:].sum() == 0
    torch.testing.assert_close(trimmed.attention, padded.attention[..., :valid_frames])
    torch.testing.assert_close(trimmed.hidden, padded.hidden)


def test_no_audio_draft_differs_only_by_cross_attention(tiny_en):
    audio, blind = random_draft(tiny_en, audio=True), random_draft(tiny_en, audio=False)
    extra = set(audio.state_dict()) - set(blind.state_dict())
    assert set(blind.state_dict()) < set(audio.state_dict())
    assert all(name.startswith(("audio_norm", "audio_q", "audio_kv", "audio_out")) for name in extra)
    memory, features, tokens = _draft_inputs(tiny_en, steps=2)
    assert blind(features, tokens, blind.new_cache(memory, 100, capacity=4)).attention is None


def test_draft_round_trips_through_safetensors_and_json(tiny_en, tmp_path):
    draft = random_draft(tiny_en, seed=3)
    save_draft(draft, tmp_path / "d", dtype=torch.float32)
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["config.json", "draft.safetensors"]
    loaded = load_draft(tmp_path / "d", tiny_en)
    assert loaded.config == draft.config and loaded.weights_hash() == draft.weights_hash()
    memory, features, tokens = _draft_inputs(tiny_en, steps=2)
    with torch.inference_mode():  # as they decode: both through the same kernels
        a = draft(features, tokens, draft.new_cache(memory, 300, capacity=4))
        b = loaded(features, tokens, loaded.new_cache(memory, 300, capacity=4))
        assert torch.equal(draft.logits(a.hidden), loaded.logits(b.hidden))
    assert "embed_tokens" not in json.dumps(list(loaded.state_dict()))  # the target's weights are not saved


def test_draft_for_another_target_fails_clearly(tiny_en, base, tmp_path):
    save_draft(random_draft(tiny_en), tmp_path / "tiny")
    with pytest.raises(DraftMismatchError, match="hidden size 384 vs the target's 512"):
        load_draft(tmp_path / "tiny", base)


def test_broken_checkpoints_fail_clearly(tiny_en, tmp_path):
    with pytest.raises(FileNotFoundError, match="not a draft checkpoint"):
        load_draft(tmp_path, tiny_en)
    save_draft(random_draft(tiny_en), tmp_path / "d")
    (tmp_path / "d" / "config.json").write_text("{not json")
    with pytest.raises(DraftMismatchError, match="not a valid draft config"):
        load_draft(tmp_path / "d", tiny_en)
    save_draft(random_draft(tiny_en), tmp_path / "e")
    save_draft(random_draft(tiny_en, audio=False), tmp_path / "f")
    (tmp_path / "f" / "draft.safetensors").replace(tmp_path / "e" / "draft.safetensors")
    with pytest.raises(DraftMismatchError, match="does not match its config"):
        load_draft(tmp_path / "e", tiny_en)
    (tmp_path / "e" / "draft.safetensors").write_bytes(b"garbage")
    with pytest.raises(DraftMismatchError, match="cannot read"):
        load_draft(tmp_path / "e", tiny_en)


@pytest.mark.parametrize("name", shipped_drafts())
def test_shipped_drafts_load_and_decode_losslessly(name, pipeline, sample_clips):
    target_name, variant = name.split("/")
    draft = pipeline.draft(Settings(target=target_name, draft=name))
    assert variant.startswith(draft.config.variant) and draft.config.training["data_hash"]
    clip = sample_clips[1].clip()
    trace = pipeline.decode(clip, Settings(target=target_name, draft=name, k=4))
    assert trace.tokens == pipeline.decode(clip, Settings(target=target_name)).tokens
    assert trace.draft_name.startswith(name + "@") and trace.draft_hash == draft.weights_hash()


@pytest.mark.parametrize(
    ("dtype", "computes_in"), [("float16", "float32"), ("int8", "float32"), ("bfloat16", "bfloat16")]
)
def test_a_narrower_draft_on_a_float32_target_stays_lossless_and_is_recorded(
    pipeline, tiny_en, sample_clips, dtype, computes_in
):
    """On a CPU float16 and int8 weights are packed for fbgemm, which computes in float32."""
    name = "whisper-tiny.en/anchordraft"
    full = pipeline.draft(Settings(draft=name))
    half = pipeline.draft(Settings(draft=name, draft_dtype=dtype))
    assert half.precision == dtype and half.dtype == DTYPES[computes_in]
    assert full.precision == "float32" and full.dtype == tiny_en.dtype == torch.float32
    if dtype == "float16":  # the checkpoint's own precision: the same weights, only computed differently
        assert half.weights_hash() == full.weights_hash()
    for utterance in sample_clips[:2]:
        clip = utterance.clip()
        trace = pipeline.decode(clip, Settings(draft=name, draft_dtype=dtype, k=4, keep_attention=True))
        assert trace.tokens == pipeline.decode(clip, Settings()).tokens
        assert trace.settings.draft_dtype == dtype and trace.settings.dtype == "float32"
        assert sum(r.accepted for r in trace.rounds) > 0  # still a working draft, not just a lossless one
        assert all(len(s.attention) == trace.segments[0].valid_frames for s in trace.steps)


def test_shipped_drafts_cover_both_targets_and_the_three_variants_and_stay_small():
    from specasr.targets.builtin import BUILTIN_TARGETS

    names = shipped_drafts()
    assert {n.split("/")[0] for n in names} == set(BUILTIN_TARGETS)
    for target in BUILTIN_TARGETS:
        assert {n.split("/")[1] for n in names if n.startswith(target + "/")} >= {"anchordraft", "control", "no-audio"}
    total = sum(p.stat().st_size for p in SHIPPED_DRAFTS.rglob("*") if p.is_file())
    assert total < 50e6  # the whole repository travels with every GPU call


def test_a_draft_started_from_the_targets_last_layer_is_that_layer(tiny_en, sample_clips):
    """Fed the states the target's last layer reads, the block returns what the target's last layer returns."""
    memory = tiny_en.encode(tiny_en.features(load_audio(sample_clips[0].path)))
    tokens = torch.tensor([[*tiny_en.prompt, *tiny_en.tokenizer(" The cat sat down.").input_ids]])
    target_out = tiny_en.forward(tokens, tiny_en.new_cache(memory), taps=(tiny_en.n_layers - 1,))
    before = target_out.hidden

    draft = random_draft(tiny_en, ffn_dim=tiny_en.model.config.decoder_ffn_dim)
    start_from_target_layer(draft, tiny_en)
    causal = torch.ones(tokens.shape[1], tokens.shape[1], dtype=torch.bool).tril()
    frames = torch.ones(1, 1, memory.shape[1], dtype=torch.bool)
    with torch.inference_mode():
        q, k, v = draft.self_qkv(before)
        out = draft.block(before, q, k, v, causal, draft.audio_memory(memory), frames)
    assert torch.allclose(draft.logits(out.hidden), tiny_en.logits(target_out.states), atol=1e-3)


def test_a_narrower_draft_keeps_the_strongest_units_of_the_targets_layer(tiny_en):
    layer = tiny_en.model.model.decoder.layers[-1]
    draft = random_draft(tiny_en, ffn_dim=100)
    start_from_target_layer(draft, tiny_en)
    strength = layer.fc1.weight.norm(dim=1) * layer.fc2.weight.norm(dim=0)
    kept = strength.topk(100).indices.sort().values
    kept_fc1 = layer.fc1.weight[kept]
    assert torch.equal(draft.ffn[0].weight, kept_fc1)
    assert torch.equal(draft.ffn[2].weight, layer.fc2.weight[:, kept])
    assert torch.equal(draft.ffn[2].bias, layer.fc2.bias)
    without_audio = random_draft(tiny_en, audio=False, ffn_dim=100)
    start_from_target_layer(without_audio, tiny_en)  # the same start without the cross-attention
    assert torch.equal(without_audio.qkv.weight, draft.qkv.weight)
    assert torch.equal(without_audio.ffn[0].weight, kept_fc1)
    with pytest.raises(DraftMismatchError, match="feed-forward width 2000 is more than the layer's 1536"):
        start_from_target_layer(random_draft(tiny_en, ffn_dim=2000), tiny_en)


def test_positions_past_the_table_take_its_last_row(tiny_en):
    """A rollout near the length limit runs past the position table; those rows can never be accepted, but must
    not index out of it."""
    draft = random_draft(tiny_en)
    rows = draft._frozen["positions"].shape[0]
    features = torch.randn(1, 3, len(draft.config.taps) * tiny_en.d_model)
    tokens = torch.tensor([[11, 12, 13]])
    past = draft.embed(features, tokens, torch.tensor([rows - 1, rows, rows + 5]))
    last = draft.embed(features, tokens, torch.tensor([rows - 1, rows - 1, rows - 1]))
    assert torch.equal(past, last)


@pytest.mark.parametrize("carried", [False, True])
def test_folded_inputs_compute_the_feature_head_fusion_and_combination(tiny_en, carried):
    """Without gradients a step reads its inputs through the one linear layer its input layers make together; with
    them, through the layers themselves. Both are the same map."""
    draft = random_draft(tiny_en, seed=5)
    for layer in (draft.fuse, draft.combine, draft.feature_head):
        layer.bias.data.normal_()  # a bias in every layer, so that the folded bias is tested too
    width = tiny_en.d_model if carried else len(draft.config.taps) * tiny_en.d_model
    inputs, tokens, positions = torch.randn(1, 4, width), torch.tensor([[5, 6, 7, 8]]), torch.arange(4)
    layered = draft.embed(inputs, tokens, positions, carried)  # gradients recorded: the layers one by one
    assert layered.requires_grad
    with torch.inference_mode():
        folded = draft.embed(inputs, tokens, positions, carried)
        features = draft.feature_head(inputs) if carried else inputs
        embedded = draft._frozen["embedding"][tokens] + draft._frozen["positions"][positions]
        by_hand = draft.combine(torch.cat([draft.fuse(features), embedded], dim=-1))
    assert torch.allclose(folded, by_hand, atol=1e-4) and torch.allclose(layered.detach(), by_hand, atol=1e-5)


def test_a_changed_weight_is_folded_again(tiny_en):
    draft = random_draft(tiny_en, seed=5).requires_grad_(False)
    inputs = torch.randn(1, 1, len(draft.config.taps) * tiny_en.d_model)
    tokens, positions = torch.tensor([[5]]), torch.tensor([0])
    before = draft.embed(inputs, tokens, positions)
    draft.combine.bias.add_(1.0)
    assert torch.allclose(draft.embed(inputs, tokens, positions), before + 1.0, atol=1e-5)


def test_int8_weights_are_refused_where_fbgemm_does_not_run(tiny_en):
    with pytest.raises(SettingsError, match="int8 draft weights run through fbgemm, on a CPU only, not on cuda"):
        Settings(draft="random", draft_dtype="int8", device="cuda")
    with pytest.raises(SettingsError, match="unknown draft precision 'int4'"):
        Settings(draft="random", draft_dtype="int4")
    with pytest.raises(DraftMismatchError, match="unknown draft precision 'int4'"):
        random_draft(tiny_en, precision="int4")


@pytest.mark.skipif(not FBGEMM, reason="fbgemm is not in this torch build")
def test_an_int8_draft_keeps_float16_weights_in_its_block_and_int8_in_its_head(tiny_en):
    """int8 goes to the head alone: the states the draft carries are those of its float16 weights."""
    half, narrow = (random_draft(tiny_en, seed=5, precision=p) for p in ("float16", "int8"))
    memory = torch.randn(1, 40, tiny_en.d_model)
    features = torch.randn(1, 3, len(half.config.taps) * tiny_en.d_model)
    tokens = torch.tensor([[5, 6, 7]])
    with torch.inference_mode():
        outs = [d(features, tokens, d.new_cache(memory, 40, capacity=8)) for d in (half, narrow)]
        assert torch.equal(outs[0].state, outs[1].state) and torch.equal(outs[0].hidden, outs[1].hidden)
        scores = [d.logits(out.hidden) for d, out in zip((half, narrow), outs, strict=True)]
    assert not torch.equal(*scores)
    assert torch.allclose(*scores, atol=0.1 * scores[0].abs().max().item())  # 8 bits: a few percent of the largest
