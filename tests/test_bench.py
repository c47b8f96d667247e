"""The bench's baseline is the fastest greedy loop of ours, it reports what each arm costs per token, and it times
greedy twice: the A/A check."""

import pytest
from test_experiments import hand_trace

from specasr.bench import ArmResult, aa_check, benchmark, summary
from specasr.intervals import aa_warning
from specasr.trace import Settings


def test_the_fastest_greedy_arm_is_the_baseline_of_every_ratio(pipeline, sample_clips):
    clips = [u.clip() for u in sample_clips[:2]]
    arms = {
        "greedy": Settings(),
        "greedy bfloat16": Settings(dtype="bfloat16"),
        "random": Settings(draft="random", k=2),
    }
    table, results = benchmark(pipeline, arms, clips, repeats=1)
    decode = {name: sum(t.timings.decode for t in results[name].traces) for name in ("greedy", "greedy bfloat16")}
    baseline = min(decode, key=decode.get)
    rows = summary(table, results).set_index("arm")
    assert rows.baseline[baseline] and rows.baseline.sum() == 1 and (table.baseline == baseline).all()
    assert rows.decode_speedup_pooled[baseline] == pytest.approx(1.0)
    for name, result in results.items():
        runs = table[table.arm == name]  # one repetition: its medians are its times
        assert rows.ms_per_token[name] == pytest.approx(1000 * runs.decode.sum() / runs.tokens.sum())
        assert runs.decode.sum() == pytest.approx(sum(t.timings.decode for t in result.traces))
        assert result.steps == {} == result.plain_steps  # the host loop on a CPU: no static steps
    # Arms in another precision are held against float32 greedy, which our float32 arms match exactly.
    assert rows.float32_token_agreement["greedy"] == 1.0 and rows.float32_same_clips["greedy"] == 2
    assert rows.float32_token_agreement["random"] == 1.0
    assert 0 < rows.float32_token_agreement["greedy bfloat16"] <= 1
    # Pooled speedups come with their interval; the first greedy arm is timed again, and is never the baseline.
    assert (rows.decode_speedup_low <= rows.decode_speedup_pooled + 1e-12).all()
    assert (rows.decode_speedup_pooled <= rows.decode_speedup_high + 1e-12).all()
    copy = results["greedy (A/A)"]
    assert copy.copy_of == "greedy" and copy.settings == results["greedy"].settings and len(copy.traces) == 2
    assert not rows.baseline["greedy (A/A)"] and list(results)[-1] == "greedy (A/A)"  # timed last in every turn
    aa = aa_check(results)
    assert aa.phase.tolist() == ["decode", "total"] and set(aa.arm) == {"greedy"}
    greedy, again = (sum(t.timings.decode for t in results[name].traces) for name in ("greedy", "greedy (A/A)"))
    assert aa.ratio.iloc[0] == pytest.approx(greedy / again)  # one repetition: its times are the medians


def test_a_bench_needs_our_greedy_loop(pipeline, sample_clips):
    with pytest.raises(ValueError, match="baseline"):
        benchmark(pipeline, {"random": Settings(draft="random")}, [sample_clips[0].clip()], repeats=1)


def greedy_arm(u: tuple[float, ...], v: tuple[float, ...], copy_of: str | None = None) -> ArmResult:
    """Greedy on clips u and v, repetition by repetition (decode seconds; features and encoder add 1 s)."""
    traces = [hand_trace(Settings(), clip, [], s) for clip, times in (("u", u), ("v", v)) for s in times]
    return ArmResult(Settings(), traces, copy_of=copy_of)


def test_the_aa_check_against_a_hand_computation():
    # The copy is 20% slower on u in every repetition, as fast on v.
    greedy = greedy_arm((1, 2, 3), (1, 1, 1))
    results = {"greedy": greedy, "greedy (A/A)": greedy_arm((1.2, 2.4, 3.6), (1, 1, 1), copy_of="greedy")}
    aa = aa_check(results).set_index("phase")
    # Medians: u 2 against 2.4 s, v 1 against 1 s.
    assert aa.ratio["decode"] == pytest.approx(3 / 3.4) and aa.ratio["total"] == pytest.approx(5 / 5.4)
    # A draw of v alone gives 1, of u alone 1 / 1.2: the interval holds both, and 1, but reaches past -3%.
    assert aa.low["decode"] == pytest.approx(1 / 1.2) and aa.high["decode"] == pytest.approx(1.0)
    assert not aa.reliable["decode"] and "wider than +-3%" in aa_warning(aa.reset_index())
    results["greedy (A/A)"] = greedy_arm((0.5, 1, 1.5), (0.5, 0.5, 0.5), copy_of="greedy")  # twice as fast
    aa = aa_check(results)
    assert aa.ratio.iloc[0] == pytest.approx(2.0) and not aa.reliable.any()
    assert aa_warning(aa).startswith("UNRELIABLE speed figures: the same settings timed twice (decode 2.000x [2.000,")
