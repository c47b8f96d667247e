"""The bench's baseline is the fastest greedy loop of ours, and it reports what each arm costs per token."""

import pytest

from specasr.bench import benchmark, summary
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
        assert result.device_seconds == {}  # no captured steps on a CPU
    # Arms in another precision are held against float32 greedy, which our float32 arms match exactly.
    assert rows.float32_token_agreement["greedy"] == 1.0 and rows.float32_same_clips["greedy"] == 2
    assert rows.float32_token_agreement["random"] == 1.0
    assert 0 < rows.float32_token_agreement["greedy bfloat16"] <= 1


def test_a_bench_needs_our_greedy_loop(pipeline, sample_clips):
    with pytest.raises(ValueError, match="baseline"):
        benchmark(pipeline, {"random": Settings(draft="random")}, [sample_clips[0].clip()], repeats=1)
