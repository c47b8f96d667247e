"""The speculative loop returns exactly the greedy tokens, for any draft, K, draft tree and window."""

import itertools
import json
from collections import Counter
from dataclasses import replace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specasr import decode
from specasr.decode import LoopOptions, greedy, greedy_tokens
from specasr.draft import Draft, random_draft
from specasr.trace import RUNTIME_WINDOWS, WINDOWS, Settings, Trace, candidate_count
from specasr.windows import NO_WINDOW, WindowPolicy
from tests.conftest import random_prefix_target, random_whisper_target, run_loop


def always_propose(draft: Draft, token: int) -> Draft:
    """Make a draft (nearly) always propose `token`, so that repetitive targets accept long runs."""
    with torch.no_grad():
        draft.out_norm.weight.zero_()
        draft.out_norm.bias.copy_(8 * draft._frozen["lm_head"].weight[token])
    return draft


def random_target(family: str, seed: int, layers: int, heads: int, vocab_size: int, max_length: int, init_std: float):
    if family == "whisper":
        return random_whisper_target(seed, layers, heads, vocab_size, max_length, init_std)
    kv_heads = 1 + seed % heads if heads % (1 + seed % heads) == 0 else heads  # grouped and plain attention
    return random_prefix_target(family, seed, layers, heads, vocab_size, max_length, init_std, kv_heads)


DRAWN = {  # a random target, draft, K, tree and window for the lossless property
    "seed": st.integers(0, 2**16),
    "layers": st.integers(1, 3),
    "heads": st.sampled_from([1, 2, 4]),
    "vocab_size": st.integers(8, 24),
    "max_length": st.integers(6, 40),
    "init_std": st.sampled_from([0.02, 0.5]),
    "constant": st.one_of(st.none(), st.integers(0, 7)),
    "k": st.integers(1, 16),
    "window": st.sampled_from(WINDOWS),
    "audio": st.booleans(),
    "threshold": st.sampled_from([0.0, 0.0, 0.3]),
    "valid_frames": st.integers(1, 40),
    "data": st.data(),
}


@pytest.mark.parametrize("family", ["whisper", "qwen3_asr", "voxtral"])
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(captured=st.booleans(), **DRAWN)
def test_speculative_equals_greedy_on_random_models(family, captured, **drawn):
    check_lossless(family, captured, False, **drawn)


@settings(max_examples=3, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(**DRAWN)
def test_compiled_speculative_equals_greedy_on_random_models(**drawn):
    """The same property through steps torch.compile compiled (a few examples: each compiles its three steps)."""
    torch._dynamo.reset()
    check_lossless("whisper", True, True, **drawn)


def check_lossless(
    family,
    captured,
    compile,
    seed,
    layers,
    heads,
    vocab_size,
    max_length,
    init_std,
    constant,
    k,
    window,
    audio,
    threshold,
    valid_frames,
    data,
):
    target = random_target(family, seed, layers, heads, vocab_size, max_length, init_std)
    taps = tuple(sorted(data.draw(st.sets(st.integers(0, layers), min_size=1, max_size=3))))
    draft = random_draft(target, audio=audio, seed=seed + 1, taps=taps)
    if constant is not None:
        always_propose(draft, constant)
    memory = torch.randn(1, 40, target.d_model, generator=torch.Generator().manual_seed(seed))
    reference = data.draw(st.lists(st.one_of(st.none(), st.integers(0, valid_frames - 1)), max_size=max_length))
    runtime_layer = data.draw(st.integers(0, layers - 1))
    width = data.draw(st.sampled_from([1, 1, 2, 3, 4]))
    nodes = data.draw(st.integers(1, min(64, candidate_count(k, width)))) if width > 1 else None
    settings = Settings(
        draft="random",
        k=k,
        window=window,
        threshold=threshold if width == 1 else 0.0,
        runtime_layer=runtime_layer,
        tree_width=width,
        tree_nodes=nodes,
        compile=compile,
    )

    result = run_loop(target, draft, memory, valid_frames, settings, reference, captured)  # CUDA's, run eagerly
    tokens, rounds, steps, verified = result.tokens, result.rounds, result.steps, result.verified

    assert tokens == greedy_tokens(target, memory)
    if captured:
        greedy_settings = Settings(compile=compile)
        assert run_loop(target, None, memory, valid_frames, greedy_settings, captured=True).tokens == tokens
    assert len(target.prompt) + len(tokens) <= max_length
    assert len(tokens) <= 1 + sum(r.accepted + 1 for r in rounds)  # the first token comes from the prompt pass
    assert all(1 <= len(r.proposed) <= settings.nodes for r in rounds[:-1])
    assert all(max((s.depth for s in steps if s.round == r.index), default=0) <= k for r in rounds)
    assert [v.token for v in verified] == tokens
    readout = [v.verify_peaks[runtime_layer] for v in verified] if window in RUNTIME_WINDOWS else []
    assert result.runtime_peaks == readout
    paths = [[s.token for s in steps if s.round == r.index and s.accepted] for r in rounds]
    assert [len(path) for path in paths] == [r.accepted for r in rounds]
    assert all(target.eot not in path[:-1] for path in paths)  # nothing accepted after the end
    assert len(steps) == sum(len(r.proposed) for r in rounds)


@pytest.mark.parametrize("family", ["whisper", "qwen3_asr", "voxtral"])
def test_random_models_exercise_partial_and_full_acceptance(family):
    """The property above only means something if its drafts get runs of tokens accepted and rejected."""
    accepted = set()
    for seed, init_std in itertools.product(range(8), (0.005, 0.3)):
        target = random_target(family, seed, layers=2, heads=2, vocab_size=8, max_length=40, init_std=init_std)
        memory = torch.randn(1, 40, target.d_model, generator=torch.Generator().manual_seed(seed))
        common = Counter(greedy_tokens(target, memory)).most_common(1)
        draft = always_propose(random_draft(target, seed=seed), token=common[0][0] if common else 3)
        rounds = run_loop(target, draft, memory, 40, Settings(draft="random", k=4)).rounds
        accepted |= {r.accepted for r in rounds}
    assert {0, 4} <= accepted and accepted & {1, 2, 3}


def test_runtime_centre_moves_on_with_depth_at_the_recent_frames_per_token():
    runtime = WindowPolicy("runtime", 400.0, valid_frames=30, reference=None, frame_seconds=0.02)
    assert runtime.centres(0, 1, verified=0).tolist() == [NO_WINDOW]  # nothing verified yet
    runtime.observe_verified(0, torch.tensor([10]))
    assert runtime.centres(1, 1, verified=1).tolist() == [10]  # one peak: no pace yet
    runtime.observe_verified(1, torch.tensor([12, 14, 17]))  # tokens 0..3 at frames 10, 12, 14, 17: 7/3 per token
    # Depths 1..6 predict tokens 4..9: the last peak 17 + 7/3 x depth, rounded, clipped to the 30 valid frames.
    assert runtime.centres(4, 6, verified=4).tolist() == [19, 22, 24, 26, 29, 29]
    last = WindowPolicy("runtime-last", 400.0, valid_frames=30, reference=None, frame_seconds=0.02)
    last.observe_verified(0, torch.tensor([10, 12, 14, 17]))
    assert last.centres(4, 6, verified=4).tolist() == [17] * 6  # the ablation stays at the last peak


def test_runtime_reads_its_pace_from_the_last_eight_verified_tokens():
    runtime = WindowPolicy("runtime", 400.0, valid_frames=100, reference=None, frame_seconds=0.02)
    runtime.observe_verified(0, torch.tensor([50, 50, 50, 50]))
    runtime.observe_verified(4, torch.tensor([5, 6, 7, 8, 9, 10, 11, 12]))  # the last eight: one frame per token
    assert runtime.centres(12, 3, verified=12).tolist() == [13, 14, 15]


def test_loop_options_read_the_layers_each_window_needs():
    """Every layer to record verification peaks, the runtime layer for the runtime windows (the target's by default),
    none otherwise; the readout is the runtime layer's place among the layers read."""
    target = random_whisper_target(seed=1, layers=3, heads=2, vocab_size=8, max_length=20, init_std=0.5)
    target.runtime_layer = 2
    base = Settings(draft="random", k=3, threshold=0.2, verify_peaks=False)
    plain = LoopOptions(3, 0.2, "unrestricted", base.half_width_ms, False, False, (), None, width=1, nodes=3)
    assert LoopOptions.of(base, target) == plain
    runtime = replace(base, window="runtime")
    assert (LoopOptions.of(runtime, target).attention_layers, LoopOptions.of(runtime, target).readout) == ((2,), 0)
    chosen = LoopOptions.of(replace(runtime, runtime_layer=1, verify_peaks=True), target)
    assert (chosen.attention_layers, chosen.readout) == ((0, 1, 2), 1)
    assert LoopOptions.of(replace(base, verify_peaks=True), target).readout is None
    with pytest.raises(ValueError, match=r"runtime layer 3 is not one of the target's decoder layers 0\.\.2"):
        LoopOptions.of(replace(runtime, runtime_layer=3), target)


@pytest.mark.parametrize("captured", [False, True])
def test_runtime_centres_follow_the_verification_peaks_of_the_loop(captured):
    """Every draft step's recorded centre is the last verified peak + pace x depth, from the peaks the loop read at
    the runtime layer, which the loop keeps (`runtime_peaks`) beside every layer's."""
    target = random_whisper_target(seed=3, layers=2, heads=2, vocab_size=8, max_length=40, init_std=0.5)
    memory = torch.randn(1, 40, target.d_model, generator=torch.Generator().manual_seed(3))
    draft = always_propose(random_draft(target, seed=3), token=3)
    valid_frames, layer = 40, 1
    settings = Settings(draft="random", k=4, window="runtime", runtime_layer=layer)
    result = run_loop(target, draft, memory, valid_frames, settings, captured=captured)
    assert result.tokens == greedy_tokens(target, memory)

    peaks = [v.verify_peaks[layer] for v in result.verified]
    assert result.runtime_peaks == peaks
    moved = 0
    for step in result.steps:
        recent = peaks[: result.rounds[step.round].start][-8:]
        pace = (recent[-1] - recent[0]) / (len(recent) - 1) if len(recent) > 1 else 0.0
        assert step.window_centre == min(max(round(recent[-1] + pace * step.depth), 0), valid_frames - 1)
        moved += step.depth > 1 and step.window_centre != recent[-1]
    assert moved  # the case is only meaningful if some later step left the last peak


def test_runtime_peaks_are_kept_without_every_layers_peaks():
    """Without per-layer peaks the runtime windows still keep their own readout; other windows keep none."""
    target = random_whisper_target(seed=3, layers=2, heads=2, vocab_size=8, max_length=40, init_std=0.5)
    memory = torch.randn(1, 40, target.d_model, generator=torch.Generator().manual_seed(3))
    draft = always_propose(random_draft(target, seed=3), token=3)
    every_layer = run_loop(target, draft, memory, 40, Settings(draft="random", k=4, window="runtime"))
    for window in ("runtime", "runtime-last", "unrestricted"):
        settings = Settings(draft="random", k=4, window=window, verify_peaks=False)
        result = run_loop(target, draft, memory, 40, settings)
        assert result.verified == []
        assert result.runtime_peaks == (every_layer.runtime_peaks if window != "unrestricted" else [])


def _count_reads(monkeypatch) -> list[str]:
    """Every call that brings a tensor's values to the host, by name."""
    reads = []

    def counting(name):
        original = getattr(torch.Tensor, name)

        def counted(self, *args, **kwargs):
            reads.append(name)
            return original(self, *args, **kwargs)

        return counted

    for name in ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__"):
        monkeypatch.setattr(torch.Tensor, name, counting(name))
    return reads


@pytest.mark.parametrize("captured", [False, True])
@pytest.mark.parametrize("window", WINDOWS)
def test_a_round_waits_for_the_device_once(monkeypatch, window, captured):
    """Centres, masks, proposals, acceptance and trace rows stay on the device; one copy per round (and one for the
    prompt's pass) brings the round's integers to the host, with the round's steps run from the host or captured
    (CUDA's, run eagerly here), on a device where reads cost a wait (emulated)."""
    monkeypatch.setattr(decode, "FREE_READ_DEVICES", ())
    target = random_whisper_target(seed=3, layers=2, heads=2, vocab_size=8, max_length=40, init_std=0.5)
    memory = torch.randn(1, 40, target.d_model, generator=torch.Generator().manual_seed(3))
    draft = always_propose(random_draft(target, seed=3), token=3)
    settings = Settings(draft="random", k=4, window=window, threshold=0.3, runtime_layer=1)
    expected = greedy_tokens(target, memory)
    reads = _count_reads(monkeypatch)
    result = run_loop(target, draft, memory, 40, settings, list(range(0, 40, 2)), captured)
    assert len(result.rounds) > 3 and reads == ["tolist"] * (len(result.rounds) + 1)
    assert result.tokens == expected


@pytest.mark.parametrize("verify_peaks", [False, True])
@pytest.mark.parametrize(("vocab_size", "seed", "ends"), [(12, 5, True), (8, 0, False)])  # end-of-text, or the limit
def test_captured_greedy_reads_each_token_once(monkeypatch, verify_peaks, vocab_size, seed, ends):
    """The captured greedy loop copies each token (with its peaks) to the host once, and gives the tokens and rows
    of the loop run from the host."""
    target = random_whisper_target(seed=seed, layers=2, heads=2, vocab_size=vocab_size, max_length=40, init_std=0.5)
    memory = torch.randn(1, 40, target.d_model, generator=torch.Generator().manual_seed(seed))
    expected = greedy(target, memory, 30, verify_peaks)
    reads = _count_reads(monkeypatch)
    result = run_loop(target, None, memory, 30, Settings(verify_peaks=verify_peaks), captured=True)
    assert reads == ["tolist"] * (len(result.tokens) + ends)  # and one for the end-of-text
    assert result == expected and len(result.tokens) > 3
    assert (len(target.prompt) + len(result.tokens) < target.max_length) == ends


def test_a_cpu_round_stops_drafting_at_its_first_unsure_proposal(monkeypatch):
    """Where reads are free the draft computes only the proposals the round keeps; elsewhere it computes K and the
    round drops those past the stop. Both keep the same proposals and decode the greedy tokens."""
    target = random_whisper_target(seed=0, layers=2, heads=2, vocab_size=8, max_length=40, init_std=0.5)
    memory = torch.randn(1, 40, target.d_model, generator=torch.Generator().manual_seed(0))
    draft = random_draft(target, seed=1)
    settings = Settings(draft="random", k=4, threshold=0.5)
    forward, calls = draft.forward, []
    monkeypatch.setattr(draft, "forward", lambda *args, **kwargs: calls.append(1) or forward(*args, **kwargs))

    def decoded(free_read_devices):
        calls.clear()
        monkeypatch.setattr(decode, "FREE_READ_DEVICES", free_read_devices)
        return run_loop(target, draft, memory, 40, settings), len(calls)

    stopping, stopping_calls = decoded(("cpu",))
    dropping, dropping_calls = decoded(())
    kept = [len(r.proposed) for r in stopping.rounds]
    assert stopping.tokens == dropping.tokens == greedy_tokens(target, memory)
    assert [r.proposed for r in stopping.rounds] == [r.proposed for r in dropping.rounds]
    assert stopping_calls == sum(kept) < dropping_calls  # each round's first proposal comes with its catch-up
    assert {1, 4} <= set(kept[:-3])  # rounds that stopped at once and rounds that drafted all K, before the limit


def test_nothing_after_an_accepted_end_of_text_counts_as_accepted(monkeypatch):
    target = random_whisper_target(seed=0, layers=2, heads=2, vocab_size=8, max_length=30)
    greedy_choice = target.greedy_tokens

    def ends_after_two_tokens(states, first_index):  # and keeps choosing end-of-text after its end
        tokens = greedy_choice(states, first_index)
        return tokens.masked_fill(first_index + torch.arange(tokens.shape[1]) >= 2, target.eot)

    monkeypatch.setattr(target, "greedy_tokens", ends_after_two_tokens)
    draft = random_draft(target, seed=0)
    monkeypatch.setattr(draft, "vocab_to_target", lambda choice: torch.full_like(choice, target.eot))
    memory = torch.randn(1, 40, target.d_model, generator=torch.Generator().manual_seed(0))
    result = run_loop(target, draft, memory, 40, Settings(draft="random", k=4))
    assert result.tokens == greedy_tokens(target, memory) and len(result.tokens) == 2
    assert result.rounds[-1].proposed == [target.eot] * 4 and result.rounds[-1].accepted == 1


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
                result = run_loop(tiny_en, pipeline.draft(settings), memory, valid_frames, settings, reference)
                assert result.tokens == expected, (utterance.id, window, draft)


def test_trace_tables_and_json_round_trip_without_loss(pipeline, sample_clips):
    settings = Settings(draft="random", k=3, window="runtime", keep_attention=True, reference="always")
    trace = pipeline.decode(sample_clips[1].clip(), settings)
    assert trace.rounds and trace.steps and trace.verified and trace.reference_frames
    assert all(s.attention is not None and len(s.attention) == trace.segments[0].valid_frames for s in trace.steps)
    assert Trace.from_tables(trace.tables()) == trace
    assert Trace.from_dict(json.loads(json.dumps(trace.to_dict()))) == trace  # as ranks send it under torchrun


def test_verification_peaks_match_a_teacher_forced_pass(pipeline, tiny_en, sample_clips):
    clip = sample_clips[2].clip()
    trace = pipeline.decode(clip, Settings(draft="random", k=2))
    memory = tiny_en.encode(tiny_en.features(clip.audio))
    valid_frames = trace.segments[0].valid_frames
    forced = tiny_en.attention_peaks(memory, trace.tokens, valid_frames)
    assert [v.verify_peaks for v in trace.verified] == forced
    assert all(0 <= p < valid_frames for row in forced for p in row)
    assert greedy(tiny_en, memory, valid_frames, verify_peaks=True).verified == trace.verified
