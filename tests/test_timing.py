"""Timing with its variance: speed intervals that resample repetitions within clips, and the A/A check."""

from dataclasses import replace

import numpy as np
import pytest
from test_experiments import BASE, hand_trace, peaks_trace

from specasr.experiments import COMMAND, GridRuns, stored_grid
from specasr.intervals import Interval, aa_table, aa_warning, pooled_bootstrap, pooled_estimate, timed_ratio
from specasr.report import repetition_note, tables
from specasr.store import Store


def test_repetitions_are_resampled_within_a_clip():
    # One clip, greedy 1 s in every repetition, speculative 1, 2 and 4 s. A draw's median of three repetitions is 1
    # or 4 with probability 7/27 each (at least two of three the same extreme) and 2 otherwise: the ratio is 1, 1/2
    # or 1/4, so the 2.5% and 97.5% quantiles fall on 1/4 and 1, and the 30% and 70% ones on 1/2.
    greedy, speculative = np.array([[1.0, 1.0, 1.0]]), np.array([[1.0, 2.0, 4.0]])
    assert timed_ratio(greedy, speculative, draws=4000) == Interval(0.5, 0.25, 1.0)
    assert timed_ratio(greedy, speculative, draws=4000, level=0.4) == Interval(0.5, 0.5, 0.5)


def test_repetitions_of_both_arms_are_paired():
    # Repetition r of both arms was timed side by side: the same repetitions are drawn from both, and arms that
    # drifted together (1, 2, 4 s alike) have a ratio of 1 in every draw.
    drifting = np.array([[1.0, 2.0, 4.0], [3.0, 3.0, 9.0]])
    assert timed_ratio(drifting, drifting, draws=2000) == Interval(1.0, 1.0, 1.0)


def test_the_estimate_is_total_over_total_of_each_clips_median():
    greedy = np.array([[1.0, 2.0, 4.0], [3.0, 3.0, 9.0]])  # medians 2 and 3
    speculative = np.array([[2.0, 2.0, 2.0], [1.0, 5.0, 1.0]])  # medians 2 and 1
    columns = [{"greedy": greedy, "speculative": speculative}]
    ratio = pooled_estimate(
        lambda sums: sums["greedy"] / sums["speculative"], columns, repeated={"greedy", "speculative"}
    )
    assert ratio == pytest.approx(5 / 3) and timed_ratio(greedy, speculative, draws=0).estimate == pytest.approx(5 / 3)


def test_clips_are_drawn_as_without_repetitions():
    # One repetition per clip: nothing to resample within a clip, and the clips drawn are those of the plain bootstrap.
    x, n = np.array([0.0, 1.0, 2.0, 5.0]), np.ones(4)
    plain = pooled_bootstrap(lambda sums: sums["x"] / sums["n"], [{"x": x, "n": n}], draws=500, seed=3)
    repeated = pooled_bootstrap(
        lambda sums: sums["x"] / sums["n"], [{"x": x[:, None], "n": n}], draws=500, seed=3, repeated={"x"}
    )
    assert repeated == plain and plain.low < plain.high


def test_repeated_columns_need_as_many_repetitions():
    with pytest.raises(ValueError, match="same non-zero number of repetitions"):
        timed_ratio(np.ones((2, 3)), np.ones((2, 2)))


def test_the_aa_check_warns_where_the_copies_disagree():
    # The second copy of greedy is 10% slower in every repetition of every clip: 1 / 1.1 in every draw.
    first = np.array([[1.0, 1.2, 0.9], [2.0, 2.1, 1.8]])
    table = aa_table({"decode": timed_ratio(first, 1.1 * first, draws=2000)})
    assert table.ratio.iloc[0] == pytest.approx(1 / 1.1) and table.disagrees.iloc[0]
    assert table.low.iloc[0] == pytest.approx(1 / 1.1) and table.high.iloc[0] == pytest.approx(1 / 1.1)
    warning = aa_warning(table)
    assert warning.startswith("A/A check: the same settings timed twice disagree (decode 0.909x [0.909, 0.909])")
    assert warning.endswith("speed differences of 9.1% or less are machine noise here")


def test_the_aa_check_is_quiet_where_the_copies_agree_within_their_noise():
    # The copies' repetitions are the same times in another order: the medians agree, the ratio is 1, and the
    # resampled repetitions spread it on both sides of 1.
    first = np.array([[1.0, 1.2, 0.9], [2.0, 2.1, 1.8]])
    second = first[:, ::-1]
    decode = timed_ratio(first, second, draws=2000)
    assert decode.estimate == pytest.approx(1.0) and decode.low < 1 < decode.high
    table = aa_table({"decode": decode, "total": Interval(1.02, 1.0, 1.05)})
    assert not table.disagrees.any() and aa_warning(table) is None
    assert aa_table({"total": Interval(1.02, 1.001, 1.05)}).disagrees.all()  # an interval above 1 excludes it


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
    assert aa.disagrees.all()
    assert "speed differences of 9.1% or less are machine noise" in aa_warning(found.aa)


def test_an_experiment_whose_copies_agree_has_no_aa_warning_and_speed_intervals_with_noise(tmp_path):
    store = Store(tmp_path / "runs.duckdb")
    # The copy took greedy's times in another order: the same medians, so a bootstrap of medians alone would give
    # an interval of zero width; resampling the repetitions spreads it around 1.
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
    assert aa.ratio["decode"] == pytest.approx(1.0) and aa.low["decode"] < 1 < aa.high["decode"]
    assert not aa.disagrees.any() and aa_warning(found.aa) is None
    cell = found.cells.iloc[0]  # control took 1 s every time: its spread is greedy's run-to-run noise
    assert cell.decode_speedup == pytest.approx(3.0 / 2.0)
    assert cell.decode_speedup_low < 1.5 < cell.decode_speedup_high


def test_an_experiment_stored_before_the_aa_check_has_none(tmp_path):
    store = Store(tmp_path / "runs.duckdb")
    store.write_run([peaks_trace("u", [10, 20, 30], [0])], COMMAND)
    store.write_runs(
        [([hand_trace(GREEDY, "u", [], 2.0)], None), ([hand_trace(CONTROL, "u", [2], 1.0)], None)], COMMAND
    )
    runs = stored_grid(store, BASE.target)
    assert runs.second_baseline is None and tables(store, runs).aa.empty


def test_too_few_repetitions_are_said():
    assert repetition_note(1) == "one timing repetition per clip: speed intervals hold no run-to-run noise"
    assert "under 5" in repetition_note(3) and repetition_note(5) is None
