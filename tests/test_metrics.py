import math

import pytest

from specasr.intervals import Interval, paired_bootstrap
from specasr.metrics import (
    acceptance,
    anchor_error_by_depth,
    correction_pays,
    loop_costs,
    normalize_text,
    passes_per_round,
    predicted_round_speedup,
    predicted_speed_change,
    rho,
    speedup,
    verify_anchor_error,
    word_error_rate,
)
from specasr.trace import DraftStep, Round, Settings, Timings, Trace, VerifiedToken


def test_normalizer_is_whispers_english_normalizer():
    assert normalize_text("Mr. Smith's COLOUR, okay?") == "mister smith is color okay"
    assert normalize_text("twenty one dollars") == "$21"


def test_wer_ignores_casing_and_punctuation_but_counts_word_edits():
    assert word_error_rate(["THE CAT SAT ON THE MAT"], ["The cat sat on the mat."]) == 0.0
    assert word_error_rate(["the cat sat on the mat"], ["the cat sat on a hat"]) == pytest.approx(2 / 6)
    assert word_error_rate(["red green", "blue cyan pink gray"], ["red", "blue cyan pink gray"]) == pytest.approx(1 / 6)


def test_wer_needs_reference_words():
    with pytest.raises(ValueError, match="no reference words"):
        word_error_rate(["", "  "], ["hello", "world"])


def make_trace(clip_id: str, accepted: list[int], k: int = 3, proposed: list[int] | None = None, **fields) -> Trace:
    """A speculative trace whose rounds accepted these counts; each round advances 1 + accepted tokens."""
    proposed = proposed or [k] * len(accepted)
    rounds = [
        Round(i, 0, 0, proposed=[7] * p, accepted=a, target_token=7, draft_seconds=0.0, verify_seconds=0.0, drafted=p)
        for i, (a, p) in enumerate(zip(accepted, proposed, strict=True))
    ]
    chains = [
        [step(i, d, None, None, d <= a) for d in range(1, p + 1)]
        for i, (a, p) in enumerate(zip(accepted, proposed, strict=True))
    ]
    steps = fields.pop("steps", None) or [s for chain in chains for s in chain]
    tokens = [7] * (sum(1 + a for a in accepted) - 1)  # the last round's end-of-text is not a transcript token
    return Trace(clip_id, Settings(draft="random", k=k), tokens, "", rounds=rounds, steps=steps, **fields)


def test_acceptance_pools_rounds_over_traces():
    # Accepted counts [0, 1, 3, 2, 3] with K = 3; the round accepting 1 hit the length limit after 1 proposal.
    traces = [make_trace("a", [0, 1, 3], proposed=[3, 1, 3]), make_trace("b", [2, 3], k=2)]
    result = acceptance(traces)
    assert result.rounds == 5
    assert result.s == pytest.approx([1.0, 0.8, 0.6, 0.4])
    assert result.conditional == pytest.approx([0.8, 0.75, 2 / 3])
    assert math.isclose(result.L, 1.8)
    assert result.tokens_per_round == pytest.approx((6 + 6) / 5)
    assert result.a1 == pytest.approx(0.8)
    assert result.a2c == pytest.approx(0.75)


def test_the_cost_model_prices_the_draft_steps_rounds_took():
    # Rounds that stopped drafting early (2 and 1 proposals, K = 4): 1.5 steps a round, each 0.02 s, and a 0.1 s
    # pass; greedy at 0.1 s a step. With nothing outside the rounds, the model is the measured speedup.
    greedy = Trace("a", Settings(), [7] * 4, "", timings=Timings(decode=0.4))
    speculative = make_trace("a", [2, 0], k=4, proposed=[2, 1], timings=Timings(decode=0.26))
    for r in speculative.rounds:
        r.draft_seconds, r.verify_seconds = 0.02 * len(r.proposed), 0.1
    assert passes_per_round([speculative]) == 1.5
    model = predicted_round_speedup(L=1.0, k=passes_per_round([speculative]), rho=rho([speculative]))
    assert model == pytest.approx(0.4 / 0.26)
    assert loop_costs([speculative], [greedy]).accounted_speedup(model) == pytest.approx(model)
    with pytest.raises(ValueError, match="no rounds"):
        passes_per_round([greedy])


def test_acceptance_conditional_is_none_after_survival_reaches_zero():
    result = acceptance([make_trace("a", [0, 0])])
    assert result.s == [1.0, 0.0, 0.0, 0.0]
    assert result.conditional == [0.0, None, None]
    assert (result.a1, result.a2c, result.L) == (0.0, None, 0.0)


def test_acceptance_continuation_needs_two_proposals():
    result = acceptance([make_trace("a", [1, 0], k=1)])
    assert result.s == [1.0, 0.5]
    assert (result.a1, result.a2c) == (0.5, None)


def test_acceptance_needs_rounds():
    greedy = Trace("a", Settings(), [1, 2, 3], "")
    with pytest.raises(ValueError, match="no speculative rounds"):
        acceptance([greedy])
    with pytest.raises(ValueError, match="no speculative rounds"):
        acceptance([])


def step(round: int, depth: int, peak: int | None, reference: int | None, accepted: bool = True) -> DraftStep:
    """A chain's proposal at this depth of its round."""
    parent = depth - 2 if depth > 1 else None
    return DraftStep(round, depth, 7, accepted, peak, None, reference, node=depth - 1, parent=parent)


def test_anchor_error_by_depth_skips_unknown_peaks_and_references():
    first = make_trace("a", [0], steps=[step(0, 1, 10, 12), step(0, 2, 20, 10), step(1, 1, 5, 5), step(1, 2, None, 3)])
    second = [step(0, 1, 0, 4), step(0, 2, 30, 24), step(0, 3, 1, None), step(1, 1, None, None), step(1, 2, 7, None)]
    second = make_trace("b", [0], steps=second)
    table = anchor_error_by_depth([first, second])
    assert list(table.columns) == ["depth", "n", "median", "mean", "p90"]
    assert table["depth"].tolist() == [1, 2]  # depth 3 has no reference frame
    assert table["n"].tolist() == [3, 2]
    assert table["median"].tolist() == pytest.approx([2.0, 8.0])  # errors [2, 0, 4] and [10, 6]
    assert table["mean"].tolist() == pytest.approx([2.0, 8.0])
    assert table["p90"].tolist() == pytest.approx([3.6, 9.6])  # linear interpolation
    assert anchor_error_by_depth([]).empty


def test_verify_anchor_error_uses_the_chosen_layer_and_skips_missing_references():
    verified = [VerifiedToken(0, 7, [3, 8]), VerifiedToken(1, 7, [9, 12]), VerifiedToken(2, 7, [20, 25])]
    trace = make_trace("a", [2], verified=verified)
    assert verify_anchor_error([trace], [[5, None, 21]], layer=0) == 1.5  # errors [2, 1]
    assert verify_anchor_error([trace], [[5, None, 21]], layer=-1) == 3.5  # errors [3, 4]
    with pytest.raises(ValueError, match="no verified tokens"):
        verify_anchor_error([trace], [[None, None, None]], layer=0)


def test_loop_costs_put_the_outside_work_back_into_the_cost_model():
    # Greedy: 6 tokens in 0.6 s (0.1 s a step). Speculative: 2 rounds of 4 proposals (0.02 s a draft step) and a
    # 0.07 s pass each, in 0.5 s of decode phase: 0.2 s outside draft steps and passes.
    greedy = Trace("a", Settings(), [7] * 6, "", timings=Timings(decode=0.6))
    speculative = make_trace("a", [3, 2], k=4, timings=Timings(decode=0.5))
    for r in speculative.rounds:
        r.draft_seconds, r.verify_seconds = 0.08, 0.07
    costs = loop_costs([speculative], [greedy])
    assert costs.verify_steps == pytest.approx(0.7)
    assert costs.outside_share == pytest.approx(0.4)
    model = predicted_round_speedup(L=2.5, k=4, rho=0.02 / 0.1, verification=costs.verify_steps)
    # Priced in greedy steps as the loop ran them, with every round drafting K, the accounting is exact: 1 + L tokens a
    # round at the greedy step's price.
    assert costs.accounted_speedup(model) == pytest.approx((1 + 2.5) * 0.1 * 2 / 0.5)
    with pytest.raises(ValueError, match="account"):
        loop_costs([speculative], [])


def test_speedup_is_a_ratio_of_total_wall_clock():
    assert speedup([3.0, 3.0], [1.0, 2.0]) == pytest.approx(2.0)  # not the mean per-utterance ratio (2.25)
    with pytest.raises(ValueError, match="matched"):
        speedup([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="matched"):
        speedup([], [])
    with pytest.raises(ValueError, match="positive"):
        speedup([1.0], [0.0])


def test_rho_pools_draft_seconds_per_step_over_mean_verification():
    first = make_trace("a", [2, 0], proposed=[3, 0])
    first.rounds[0].draft_seconds, first.rounds[0].verify_seconds = 0.03, 0.1
    first.rounds[1].draft_seconds, first.rounds[1].verify_seconds = 0.01, 0.1  # catch-up only, no proposals
    second = make_trace("b", [0], proposed=[1])
    second.rounds[0].draft_seconds, second.rounds[0].verify_seconds = 0.01, 0.1
    assert rho([first, second]) == pytest.approx((0.05 / 4) / 0.1)
    with pytest.raises(ValueError, match="rho"):
        rho([])


def test_cost_rule_and_predicted_speedup():
    # L = 1.8, K = 3, rho = 0.1: a round costs 1.3 passes and advances 2.8 tokens; the correction costs 0.05.
    assert correction_pays(delta_L=0.14, L=1.8, delta_cost=0.05, k=3, rho=0.1)  # 0.14 / 2.8 = 0.05 > 0.05 / 1.3
    assert not correction_pays(delta_L=0.1, L=1.8, delta_cost=0.05, k=3, rho=0.1)  # 0.0357 < 0.0385
    assert predicted_round_speedup(L=1.8, k=3, rho=0.1) == pytest.approx(2.8 / 1.3)
    assert predicted_round_speedup(L=0.0, k=3, rho=0.0) == 1.0
    assert predicted_round_speedup(L=2.0, k=4, rho=0.2, verification=1.5) == pytest.approx(3 / 2.3)  # a tree


def test_predicted_speed_change_of_a_correction():
    # Tokens per pass 2.8 / 1.3 before; after, 2.94 / 1.35: 3.822 / 3.78 = 1 + 1/90. With dL = 0.1: 3.77 / 3.78.
    assert predicted_speed_change(delta_L=0.14, L=1.8, delta_cost=0.05, k=3, rho=0.1) == pytest.approx(1 / 90)
    assert predicted_speed_change(delta_L=0.1, L=1.8, delta_cost=0.05, k=3, rho=0.1) == pytest.approx(-1 / 378)
    assert predicted_speed_change(delta_L=0.0, L=1.8, delta_cost=0.0, k=3, rho=0.1) == 0.0


def mean_L(traces: list[Trace]) -> float:
    return acceptance(traces).L


def test_paired_bootstrap_of_identical_arms_is_zero():
    arm = [make_trace(f"u{i}", [i % 4, 3 - i % 4, 1]) for i in range(12)]
    assert paired_bootstrap(arm, arm, mean_L, draws=300) == Interval(0.0, 0.0, 0.0)


def test_paired_bootstrap_recovers_a_constant_shift_and_is_reproducible():
    counts = [[0, 1, 3], [2], [0, 0, 0, 1], [3, 3], [1, 2, 0]]
    arm_a = [make_trace(f"u{i}", c, k=4) for i, c in enumerate(counts)]
    arm_b = [make_trace(f"u{i}", [a + 1 for a in c], k=4) for i, c in enumerate(counts)]
    result = paired_bootstrap(arm_a, arm_b, mean_L, draws=300)
    assert (result.estimate, result.low, result.high) == pytest.approx((1.0, 1.0, 1.0))
    varied = [make_trace(f"u{i}", c, k=4) for i, c in enumerate(reversed(counts))]
    first = paired_bootstrap(arm_a, varied, mean_L, draws=300, seed=3)
    assert first == paired_bootstrap(arm_a, varied, mean_L, draws=300, seed=3)
    assert first != paired_bootstrap(arm_a, varied, mean_L, draws=300, seed=4)


def test_paired_bootstrap_applies_the_same_indices_to_both_arms():
    # Utterance values span 1..100000 s but every pair differs by exactly 0.1 s: only paired resampling is tight.
    def mean_decode(traces: list[Trace]) -> float:
        return sum(t.timings.decode for t in traces) / len(traces)

    values = [10.0**p for p in range(6)] * 4
    arm_a = [make_trace(f"u{i}", [0], timings=Timings(decode=v)) for i, v in enumerate(values)]
    arm_b = [make_trace(f"u{i}", [0], timings=Timings(decode=v + 0.1)) for i, v in enumerate(values)]
    result = paired_bootstrap(arm_a, arm_b, mean_decode, draws=500)
    assert (result.estimate, result.low, result.high) == pytest.approx((0.1, 0.1, 0.1), abs=1e-6)


def test_paired_bootstrap_needs_matched_arms():
    arm = [make_trace("u0", [1]), make_trace("u1", [2])]
    with pytest.raises(ValueError, match="differ at utterance 1"):
        paired_bootstrap(arm, [arm[0], make_trace("other", [2])], mean_L)
    with pytest.raises(ValueError, match="matched"):
        paired_bootstrap(arm, arm[:1], mean_L)


def test_paired_bootstrap_skips_undefined_draws_unless_most_are():
    # A draw of two greedy traces has no rounds (undefined); that happens in a quarter of draws.
    def arm(shift: int) -> list[Trace]:
        return [make_trace("u0", [shift]), Trace("u1", Settings(), [1], "")]

    assert paired_bootstrap(arm(0), arm(2), mean_L, draws=400) == Interval(2.0, 2.0, 2.0)

    # Undefined (NaN) whenever an utterance is drawn twice: almost every draw of five.
    def distinct_only(traces: list[Trace]) -> float:
        return 1.0 if len({t.clip_id for t in traces}) == len(traces) else math.nan

    five = [make_trace(f"u{i}", [0]) for i in range(5)]
    with pytest.raises(ValueError, match="undefined in"):
        paired_bootstrap(five, five, distinct_only, draws=400)


def test_peak_agreement_and_the_runtime_layer_rule():
    from specasr.metrics import choose_runtime_layer, peak_agreement

    frames = [[10, 20, 30, None, 40], [5, 15, 25]]
    # layer 0 follows the frames closely, layer 1 is offset by 30 frames, layer 2 is flat
    layers = [
        [[f or 0 for f in u] for u in frames],
        [[(f or 0) + 30 for f in u] for u in frames],
        [[7, 7, 7, 7, 7], [7] * 3],
    ]
    exact, offset, flat = (
        peak_agreement(f"layer {i}", peaks, frames, half_width=20, frame_ms=20.0) for i, peaks in enumerate(layers)
    )
    assert exact.tokens == 7 and exact.pooled_r == pytest.approx(1.0) and exact.within_r == pytest.approx(1.0)
    assert exact.median_error_ms == 0 and exact.inside_window == 1.0 and exact.source == "layer 0"
    assert offset.within_r == pytest.approx(1.0) and offset.median_error_ms == 600 and offset.inside_window == 0.0
    assert flat.tokens == 7 and flat.inside_window == pytest.approx(5 / 7)
    assert math.isnan(flat.pooled_r) and math.isnan(flat.within_r)  # a constant track has no correlation
    missing = peak_agreement("draft", [[None, 20, 30, 1, 40], [5, 15, 25]], frames, half_width=20, frame_ms=20.0)
    assert missing.tokens == 6  # a token without a peak (a draft that did not propose there) is left out
    assert choose_runtime_layer([1.0, 0.0, 5 / 7]) == 0
    assert choose_runtime_layer([0.0, 0.99, 1.0]) == 1  # earliest within 0.02 of the best


def test_outcome_error_and_its_odds_ratio():
    from specasr.metrics import outcome_error

    # accepted: 20, 40, 300 ms (1 of 3 large); rejected: 100, 250, 400, 500 ms (3 of 4 large)
    found = outcome_error([20, 40, 300, 100, 250, 400, 500], [True] * 3 + [False] * 4, large_ms=200)
    assert (found.accepted, found.rejected) == (3, 4)
    assert (found.accepted_median_ms, found.rejected_median_ms) == (40, 325)
    assert (found.large_at_accept, found.large_at_reject) == (pytest.approx(1 / 3), 0.75)
    assert found.odds_ratio == pytest.approx((3.5 / 1.5) / (1.5 / 2.5))  # each cell plus a half
    with pytest.raises(ValueError, match="both accepted and rejected"):
        outcome_error([20, 40], [True, True])
