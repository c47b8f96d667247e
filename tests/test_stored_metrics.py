"""Queries of stored runs against hand-computed numbers: their metrics and the run history."""

from dataclasses import replace
from datetime import datetime

import pandas as pd
import pytest

from specasr.stored_metrics import run_summary, stored_anchor_error_by_depth, survival
from tests.test_store import greedy_trace, speculative_trace


@pytest.fixture
def hand_runs(store):
    """A speculative run of one trace (accepted 3, 1, 0, 2 of K = 3; one step without a reference) and a greedy run."""
    trace = speculative_trace("c1", [3, 1, 0, 2])
    trace.steps[-1] = replace(trace.steps[-1], reference_frame=None)
    return store.write_run([trace], "decode"), store.write_run([greedy_trace()], "decode")


def test_survival_pools_the_rounds_of_each_speculative_run(store, hand_runs):
    speculative, greedy = hand_runs
    table = survival(store, [speculative, greedy])
    assert table.run_id.tolist() == [speculative] * 4  # a greedy run has no rounds to score
    assert table.depth.tolist() == [0, 1, 2, 3]
    assert table.s.tolist() == [1.0, 0.75, 0.5, 0.25]
    assert table.conditional.tolist()[1:] == pytest.approx([0.75, 2 / 3, 0.5])
    assert pd.isna(table.conditional[0])


def test_anchor_error_by_depth_skips_steps_without_a_reference(store, hand_runs):
    speculative, greedy = hand_runs
    table = stored_anchor_error_by_depth(store, [speculative, greedy])
    # Errors are depth * round: depth 1 -> 0 1 2 3, depth 2 -> 0 2 4 6, depth 3 -> 0 3 6 (round 3 has no reference).
    assert table.run_id.tolist() == [speculative] * 3
    assert table.depth.tolist() == [1, 2, 3]
    assert table.n.tolist() == [4, 4, 3]
    assert table["median"].tolist() == [1.5, 3.0, 3.0]
    assert table["mean"].tolist() == [1.5, 3.0, 3.0]
    assert table.p90.tolist() == pytest.approx([2.7, 5.4, 5.4])


def test_run_summary_counts_rows_and_scores_acceptance(store, hand_runs):
    speculative, greedy = hand_runs
    summary = run_summary(store, [speculative, greedy]).set_index("run_id")
    first = summary.loc[speculative]
    assert (first.draft_name, first.window, first.k) == ("tiny-draft@abcd", "unrestricted", 3)
    assert (first.clips, first.decodes, first.rounds, first.draft_steps, first.tokens) == (1, 1, 4, 12, 9)
    assert (first.a1, first.L) == (0.75, 1.5)
    assert first.a2c == pytest.approx(2 / 3)
    assert first.seconds == 1.375  # features + encoder + decode; the reference pass is not the decode's time
    assert first.median_wer == 0.25
    second = summary.loc[greedy]
    assert (second.draft_name, second.rounds, second.draft_steps, second.tokens) == ("none", 0, 0, 3)
    assert second.seconds == 1.0
    assert pd.isna(second.a1) and pd.isna(second.a2c) and pd.isna(second.L)
    assert pd.isna(second.median_wer)  # no reference text


def test_runs_lists_history_newest_first_and_filters(store, hand_runs):
    speculative, greedy = hand_runs
    history = store.runs()
    assert history.run_id.tolist() == [greedy, speculative]
    assert history.command.tolist() == ["decode", "decode"]
    assert set(history.columns) >= {"created", "draft_name", "clips", "decodes", "rounds", "draft_steps", "git_commit"}
    assert history.set_index("run_id").loc[speculative, "runtime_layer"] == 2
    assert store.runs(draft="tiny").run_id.tolist() == [speculative]
    assert store.runs(draft="tiny-draft").run_id.tolist() == [speculative]
    assert store.runs(draft="none").run_id.tolist() == [greedy]
    assert store.runs(k=3, window="unrestricted").run_id.tolist() == [speculative]
    assert store.runs(dataset="other").run_id.tolist() == [greedy]
    assert store.runs(target="whisper-base").empty
    assert len(store.runs(since=datetime(2000, 1, 1), until="2999-01-01")) == 2
    assert store.runs(until=datetime(2000, 1, 1)).empty


# ---------------------------------------------------------------------------------------------------------------------
# Round trips
