"""The speculative loop returns exactly the greedy tokens, for any draft, K and window."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specasr.decode import greedy, greedy_tokens, speculative
from specasr.draft import Draft, random_draft
from specasr.trace import Settings, Trace
from specasr.windows import WINDOWS
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
    settings = Settings(draft="random", k=k, window=window, threshold=threshold, runtime_layer=runtime_layer)

    result = speculative(target, draft, memory, valid_frames, settings, reference)
    tokens, rounds, steps, verified = result.tokens, result.rounds, result.steps, result.verified

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
        rounds = speculative(target, draft, memory, 40, Settings(draft="random", k=4)).rounds
        accepted |= {r.accepted for r in rounds}
    assert {0, 4} <= accepted and accepted & {1, 2, 3}


@pytest.mark.parametrize("k", [1, 4, 16])
def test_speculative_equals_greedy_on_real_tiny_en(pipeline, tiny_en, sample_clips, k):
    for utterance in sample_clips[: 2 if k < 16 else 1]:
        audio = utterance.clip().audio
        memory, valid_frames = tiny_en.encode(tiny_en.features(audio)), tiny_en.valid_frames(len(audio))
        expected = greedy_tokens(tiny_en, memory)
        reference = [min(3 * i, 100) for i in range(len(expected))]
        for window in WINDOWS:
            for draft in ("random", "random-no-audio"):
                settings = Settings(draft=draft, k=k, window=window)
                result = speculative(tiny_en, pipeline.draft(settings), memory, valid_frames, settings, reference)
                assert result.tokens == expected, (utterance.id, window, draft)


def test_trace_tables_round_trip_without_loss(pipeline, sample_clips):
    settings = Settings(draft="random", k=3, window="runtime", keep_attention=True, reference="always")
    trace = pipeline.decode(sample_clips[1].clip(), settings)
    assert trace.rounds and trace.steps and trace.verified and trace.reference_frames
    assert all(s.attention is not None and len(s.attention) == trace.segments[0].valid_frames for s in trace.steps)
    assert Trace.from_tables(trace.tables()) == trace


def test_verification_peaks_match_a_teacher_forced_pass(pipeline, tiny_en, sample_clips):
    clip = sample_clips[2].clip()
    trace = pipeline.decode(clip, Settings(draft="random", k=2))
    memory = tiny_en.encode(tiny_en.features(clip.audio))
    valid_frames = trace.segments[0].valid_frames
    forced = tiny_en.attention_peaks(memory, trace.tokens, valid_frames)
    assert [v.verify_peaks for v in trace.verified] == forced
    assert all(0 <= p < valid_frames for row in forced for p in row)
    assert greedy(tiny_en, memory, valid_frames, verify_peaks=True).verified == trace.verified
