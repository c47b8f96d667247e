"""Timing with its variance: speed intervals over clips, each clip the median of its repetitions, checked against
simulated runs; and the A/A check, which marks speed figures unreliable."""

from dataclasses import replace

import numpy as np
import pytest
from test_experiments import BASE, hand_trace, peaks_trace

from specasr.experiments import COMMAND, GridRuns, stored_grid
from specasr.intervals import (
    Interval,
    aa_table,
    aa_verdict,
    aa_warning,
    pooled_bootstrap,
    pooled_estimate,
)
from specasr.pooled import METRICS, TIMINGS
from specasr.report import repetition_note, tables
from specasr.store import Store


def timed_ratio(baseline: np.ndarray, arm: np.ndarray, draws: int) -> Interval:
    """A speed interval as bench and experiments take it, from two arms' (clips, repetitions) seconds."""
    columns = {"greedy_decode": baseline, "decode": arm}
    return pooled_bootstrap(METRICS["decode_speedup"], [columns], draws, repeated=TIMINGS)


def clip_lengths(rng: np.random.Generator, clips: int = 40) -> np.ndarray:
    """Seconds a decode of each clip takes: clips of very different lengths."""
    return rng.lognormal(np.log(0.3), 0.6, size=clips)


def simulated_copies(rng: np.random.Generator, lengths: np.ndarray, bias: float = 1.0, repeats: int = 5) -> tuple:
    """Two arms' (clips, repetitions) seconds, timed side by side on a noisy machine: 5% jitter on every repetition,
    and 4% of repetitions five times slow (another process woke up). The second arm takes `bias` times as long."""

    def arm(factor: float) -> np.ndarray:
        jitter = rng.lognormal(0.0, 0.05, size=(len(lengths), repeats))
        stalls = np.where(rng.random((len(lengths), repeats)) < 0.04, 5.0, 1.0)
        return lengths[:, None] * factor * jitter * stalls

    return arm(1.0), arm(bias)


def test_a_speed_interval_is_as_wide_as_the_estimates_spread():
    # The same 40 clips timed again and again: the estimate's spread over the runs, against one run's interval.
    # Resampling each clip's repetitions and taking their median gave [0.82, 1.24] where the estimate spread over
    # [0.989, 1.013].
    rng = np.random.default_rng(7)
    lengths = clip_lengths(rng)
    runs = [simulated_copies(rng, lengths) for _ in range(400)]
    estimates = [timed_ratio(a, b, draws=0).estimate for a, b in runs]
    spread = np.diff(np.quantile(estimates, [0.025, 0.975]))[0]
    widths = [(lambda r: r.high - r.low)(timed_ratio(a, b, draws=1000)) for a, b in runs[:40]]
    assert 0.7 * spread < np.median(widths) < 1.4 * spread


def test_the_aa_check_flags_about_one_run_in_twenty_of_exchangeable_copies():
    rng = np.random.default_rng(11)
    intervals = [timed_ratio(*simulated_copies(rng, clip_lengths(rng)), draws=1000) for _ in range(300)]
    flagged = sum(not (r.low <= 1 <= r.high) for r in intervals)
    assert 5 <= flagged <= 27  # 15 expected: a binomial(300, 0.05) falls inside in over 99% of runs


def test_the_aa_check_flags_a_three_percent_bias_in_most_runs():
    rng = np.random.default_rng(13)
    ratios = [timed_ratio(*simulated_copies(rng, clip_lengths(rng), bias=1.03), draws=1000) for _ in range(100)]
    assert sum(not aa_table({"decode": ratio}).reliable.all() for ratio in ratios) >= 80


def test_the_estimate_is_total_over_total_of_each_clips_median():
    greedy = np.array([[1.0, 2.0, 4.0], [3.0, 3.0, 9.0]])  # medians 2 and 3
    speculative = np.array([[2.0, 2.0, 2.0], [1.0, 5.0, 1.0]])  # medians 2 and 1
    columns = [{"greedy": greedy, "speculative": speculative}]
    ratio = pooled_estimate(
        lambda sums: sums["greedy"] / sums["speculative"], columns, repeated={"greedy", "speculative"}
    )
    assert ratio == pytest.approx(5 / 3) and timed_ratio(greedy, speculative, draws=0).estimate == pytest.approx(5 / 3)


def test_one_clip_takes_its_interval_from_its_repetitions_paired():
    # Repetition r of both arms was timed side by side: arms that drifted together have a ratio of 1 in every draw.
    drifting = np.array([[1.0, 2.0, 4.0]])
    assert timed_ratio(drifting, drifting, draws=2000) == Interval(1.0, 1.0, 1.0)
    greedy, speculative = np.array([[1.0, 1.0, 1.0]]), np.array([[1.0, 2.0, 4.0]])
    assert timed_ratio(greedy, speculative, draws=4000) == Interval(0.5, 0.25, 1.0)  # medians of 1, 2 or 4 s


def test_a_clip_counts_the_median_of_its_repetitions_and_draws_resample_clips_only():
    x, n = np.array([0.0, 1.0, 2.0, 5.0]), np.ones(4)
    plain = pooled_bootstrap(lambda sums: sums["x"] / sums["n"], [{"x": x, "n": n}], draws=500, seed=3)
    stalled = np.stack([x, x, 9 * x + 1], axis=1)  # one stalled repetition per clip: the medians are x
    repeated = pooled_bootstrap(
        lambda sums: sums["x"] / sums["n"], [{"x": stalled, "n": n}], draws=500, seed=3, repeated={"x"}
    )
    assert repeated == plain and plain.low < plain.high


def test_the_aa_check_warns_where_the_copies_disagree():
    # The second copy of greedy is 10% slower in every repetition of every clip: 1 / 1.1 in every draw.
    first = np.array([[1.0, 1.2, 0.9], [2.0, 2.1, 1.8]])
    table = aa_table({"decode": timed_ratio(first, 1.1 * first, draws=2000)})
    assert table.ratio.iloc[0] == pytest.approx(1 / 1.1) and not table.reliable.iloc[0]
    assert table.low.iloc[0] == pytest.approx(1 / 1.1) and table.high.iloc[0] == pytest.approx(1 / 1.1)
    warning = aa_warning(table)
    assert warning.startswith("UNRELIABLE speed figures: the same settings timed twice (decode 0.909x [0.909, 0.909]")
    assert "the copies disagree" in warning and warning.endswith("differences of 9.1% or less are this machine's noise")
    assert aa_verdict(table) == {
        "ratio": pytest.approx(1 / 1.1),
        "interval": [pytest.approx(1 / 1.1), pytest.approx(1 / 1.1)],
        "tolerance": 0.03,
        "reliable": False,
    }


def test_the_aa_check_passes_copies_that_agree_within_the_tolerance():
    first = np.array([[1.0, 1.2, 0.9], [2.0, 2.1, 1.8]])
    decode = timed_ratio(first, first[:, ::-1], draws=2000)  # the same times in another order: the same medians
    assert decode == Interval(1.0, 1.0, 1.0)
    table = aa_table({"decode": decode, "total": Interval(1.02, 0.99, 1.03)})
    assert table.reliable.all() and aa_warning(table) is None and aa_verdict(table)["reliable"]
    assert not aa_table({"total": Interval(1.02, 1.001, 1.02)}).reliable.any()  # an interval above 1 excludes it


def test_an_aa_interval_wider_than_the_tolerance_is_unreliable():
    table = aa_table({"decode": Interval(1.0, 0.95, 1.06)})
    assert not table.reliable.any()
    assert "wider than +-3%" in aa_warning(table) and "6.0% or less" in aa_warning(table)
    assert aa_table({"decode": Interval(1.0, 0.95, 1.06)}, tolerance=0.1).reliable.all()
    assert aa_verdict(aa_table({})) is None


GREEDY = replace(BASE, k=0, verify_peaks=False, reference="never")
CONTROL = replace(BASE, draft="control")
REPEATS = [0, 1, 2, 0, 1, 2]  # clips u and v, three repetitions each


def greedy_run(seconds: dict[str, list[float]]) -> tuple[list, list[int]]:
    return [hand_trace(GREEDY, c, [], s, [7] * (6 if c == "u" else 2)) for c, times in seconds.items() for s in times]


def timed_experiment(store: Store, second: dict[str, list[float]]) -> GridRuns:
    """Greedy (u: 2 s, v: 1 s in every repetition), control beside it and greedy's `second` copy, as one batch."""
    baseline = greedy_run({"u": [2.0, 2.0, 2.0], "v": [1.0, 1.0, 1.0]})
    control = [hand_trace(CONTROL, "u", [4, 1], s) for s in (1.0, 0.8, 1.5)]
    control += [hand_trace(CONTROL, "v", [2], s) for s in (0.5, 0.6, 0.4)]
    store.write_run([peaks_trace("u", [10, 20, 30], [0]), peaks_trace("v", [5, 25], [0])], COMMAND)
    store.write_runs([(baseline, REPEATS), (control, REPEATS), (greedy_run(second), REPEATS)], COMMAND)
    return stored_grid(store, BASE.target)


def test_an_experiment_reports_its_aa_check_and_warns_where_the_copies_disagree(tmp_path):
    store = Store(tmp_path / "runs.duckdb")
    runs = timed_experiment(store, {"u": [2.2, 2.2, 2.2], "v": [1.1, 1.1, 1.1]})  # the copy 10% slower throughout
    baseline, control, second = store.runs().sort_values("created").run_id.iloc[1:].tolist()
    assert (runs.baseline, runs.cells[CONTROL], runs.second_baseline) == (baseline, control, second)
    found = tables(store, runs)
    # Speed is total over total of each clip's median: greedy 2 + 1 s, control 1.0 + 0.5 s.
    assert found.cells.decode_speedup.iloc[0] == pytest.approx(3.0 / 1.5)
    aa = found.aa.set_index("phase")
    assert aa.ratio["decode"] == pytest.approx(3.0 / 3.3)
    assert (aa.low["decode"], aa.high["decode"]) == pytest.approx((1 / 1.1, 1 / 1.1))  # every clip, every draw
    # End to end each decode adds 1 s: u 3 / 3.2, v 2 / 2.1, and any resample of them lies between.
    assert aa.ratio["total"] == pytest.approx(5.0 / 5.3) and 3 / 3.2 <= aa.low["total"] <= aa.high["total"] <= 2 / 2.1
    assert not aa.reliable.any()
    assert "differences of 9.1% or less are this machine's noise" in aa_warning(found.aa)


def test_an_experiment_whose_copies_agree_has_no_aa_warning_and_speed_intervals_over_clips(tmp_path):
    store = Store(tmp_path / "runs.duckdb")
    # The copy took greedy's times: the same medians, ratio 1 in every draw.
    runs = timed_experiment(store, {"u": [2.0, 2.0, 2.0], "v": [1.0, 1.0, 1.0]})
    assert aa_warning(tables(store, runs).aa) is None
    store = Store(tmp_path / "shuffled.duckdb")
    baseline = greedy_run({"u": [1.8, 2.0, 2.4], "v": [0.9, 1.0, 1.3]})
    second = greedy_run({"u": [2.4, 1.8, 2.0], "v": [1.0, 1.3, 0.9]})
    control = [hand_trace(CONTROL, c, [2], 1.0) for c in "uuuvvv"]
    store.write_run([peaks_trace("u", [10, 20, 30], [0]), peaks_trace("v", [5, 25], [0])], COMMAND)
    store.write_runs([(baseline, REPEATS), (control, REPEATS), (second, REPEATS)], COMMAND)
    found = tables(store, stored_grid(store, BASE.target))
    aa = found.aa.set_index("phase")
    assert (aa.ratio["decode"], aa.low["decode"], aa.high["decode"]) == pytest.approx((1.0, 1.0, 1.0))
    assert aa.reliable.all() and aa_warning(found.aa) is None
    cell = found.cells.iloc[0]  # control took 1 s every time; greedy's medians are 2 and 1 s
    assert cell.decode_speedup == pytest.approx(3.0 / 2.0)
    assert (cell.decode_speedup_low, cell.decode_speedup_high) == pytest.approx((1.0, 2.0))  # v twice, u twice


def test_an_experiment_stored_before_the_aa_check_has_none(tmp_path):
    store = Store(tmp_path / "runs.duckdb")
    store.write_run([peaks_trace("u", [10, 20, 30], [0])], COMMAND)
    store.write_runs(
        [([hand_trace(GREEDY, "u", [], 2.0)], None), ([hand_trace(CONTROL, "u", [2], 1.0)], None)], COMMAND
    )
    runs = stored_grid(store, BASE.target)
    assert runs.second_baseline is None and tables(store, runs).aa.empty


def test_too_few_repetitions_are_said():
    assert repetition_note(1) == "one timing repetition per clip: a clip's time is one run, stalls included"
    assert "under 5" in repetition_note(3) and repetition_note(5) is None


def test_one_clip_of_a_pooled_metric_takes_its_interval_from_its_repetitions_paired():
    """The experiments' path (columns of a cell, evaluation sets, acceptance columns beside the timings) gives one
    clip the interval of its repetitions too, not the point it would be if the one clip were resampled."""
    columns = {"greedy": np.array([[1.0, 1.0, 1.0]]), "decode": np.array([[1.0, 2.0, 4.0]]), "rounds": np.ones(1)}
    found = pooled_bootstrap(
        lambda sums: sums["greedy"] / sums["decode"],
        [columns],
        draws=4000,
        strata=["a set"],
        resample_strata=True,
        repeated={"greedy", "decode"},
    )
    assert found == Interval(0.5, 0.25, 1.0)
