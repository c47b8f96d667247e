"""The speculative loop returns exactly the greedy tokens, for any draft, K and window."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specasr.audio import load_audio
from specasr.decode import WINDOWS, SpeculativeConfig, greedy_tokens, speculative_rounds, speculative_transcribe
from specasr.draft import Draft, random_draft
from specasr.trace import Trace
from tests.conftest import random_whisper_target


def always_propose(draft: Draft, token: int) -> Draft:
    """Make a draft (nearly) always propose `token`, so that repetitive targets accept long runs."""
    with torch.no_grad():
        draft.out_norm.weight.zero_()
        draft.out_norm.bias.copy_(8 * draft._frozen["lm_head"][token])
    return draft


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**16),
    layers=st.integers(1, 3),
    heads=st.sampled_from([1, 2, 4]),
    vocab_size=st.integers(8, 24),
    max_length=st.integers(6, 40),
    init_std=st.sampled_from([0.02, 0.5]),
    constant=st.one_of(st.none(), st.integers(0, 7)),
    k=st.integers(1, 16),
    window=st.sampled_from(WINDOWS),
    audio=st.booleans(),
    threshold=st.sampled_from([0.0, 0.0, 0.3]),
    valid_frames=st.integers(1, 40),
    data=st.data(),
)
def test_speculative_equals_greedy_on_random_models(
    seed, layers, heads, vocab_size, max_length, init_std, constant, k, window, audio, threshold, valid_frames, data
):
    target = random_whisper_target(seed, layers, heads, vocab_size, max_length, init_std)
    taps = tuple(sorted(data.draw(st.sets(st.integers(0, layers), min_size=1, max_size=3))))
    draft = random_draft(target, audio=audio, seed=seed + 1, taps=taps)
    if constant is not None:
        always_propose(draft, constant)
    memory = torch.randn(1, 40, target.d_model, generator=torch.Generator().manual_seed(seed))
    reference = data.draw(st.lists(st.one_of(st.none(), st.integers(0, valid_frames - 1)), max_size=max_length))
    runtime_layer = data.draw(st.integers(0, layers - 1))
    config = SpeculativeConfig(k=k, window=window, threshold=threshold, runtime_layer=runtime_layer)

    tokens, rounds, steps, verified = speculative_rounds(target, draft, memory, valid_frames, config, reference)

    assert tokens == greedy_tokens(target, memory)
    assert len(target.prompt) + len(tokens) <= max_length
    assert len(tokens) <= 1 + sum(r.accepted + 1 for r in rounds)  # the first token comes from the prompt pass
    assert all(1 <= len(r.proposed) <= k for r in rounds[:-1])
    assert [v.token for v in verified] == tokens
    assert len(steps) == sum(len(r.proposed) for r in rounds)


def test_random_models_exercise_partial_and_full_acceptance():
    """The property above only means something if its drafts get runs of tokens accepted and rejected."""
    accepted = set()
    for seed in range(4):
        target = random_whisper_target(seed, layers=2, heads=2, vocab_size=8, max_length=40)
        memory = torch.randn(1, 40, target.d_model, generator=torch.Generator().manual_seed(seed))
        draft = always_propose(random_draft(target, seed=seed), token=3)
        _, rounds, _, _ = speculative_rounds(target, draft, memory, 40, SpeculativeConfig(k=4))
        accepted |= {r.accepted for r in rounds}
    assert {0, 4} <= accepted and accepted & {1, 2, 3}


@pytest.mark.parametrize("k", [1, 4, 16])
def test_speculative_equals_greedy_on_real_tiny_en(tiny_en, sample_clips, k):
    drafts = [random_draft(tiny_en, audio=True, seed=k), random_draft(tiny_en, audio=False, seed=k)]
    for clip in sample_clips[: 2 if k < 16 else 1]:
        audio = load_audio(clip.path)
        greedy = greedy_tokens(tiny_en, tiny_en.encode(tiny_en.features(audio)))
        reference = [min(3 * i, 100) for i in range(len(greedy))]
        for window in WINDOWS:
            for draft in drafts:
                config = SpeculativeConfig(k=k, window=window)
                trace = speculative_transcribe(tiny_en, draft, audio, config, clip.id, reference)
                assert trace.tokens == greedy, (clip.id, window, draft.config.audio)


def test_trace_tables_round_trip_without_loss(tiny_en, sample_clips):
    audio = load_audio(sample_clips[1].path)
    config = SpeculativeConfig(k=3, window="runtime", keep_attention=True)
    trace = speculative_transcribe(tiny_en, random_draft(tiny_en), audio, config, sample_clips[1].id)
    assert trace.rounds and trace.steps and trace.verified
    assert all(s.attention is not None and len(s.attention) == trace.valid_frames for s in trace.steps)
    assert Trace.from_tables(trace.tables()) == trace


def test_verification_peaks_match_a_teacher_forced_pass(tiny_en, sample_clips):
    audio = load_audio(sample_clips[2].path)
    trace = speculative_transcribe(tiny_en, random_draft(tiny_en), audio, SpeculativeConfig(k=2), sample_clips[2].id)
    memory = tiny_en.encode(tiny_en.features(audio))
    forced = tiny_en.attention_peaks(memory, trace.tokens, trace.valid_frames)
    assert [v.verify_peaks for v in trace.verified] == forced
    assert all(0 <= p < trace.valid_frames for row in forced for p in row)
