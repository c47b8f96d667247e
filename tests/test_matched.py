"""Matched rounds: every window drafts from the same rounds; the rollout reproduces the loop's own rounds."""

from dataclasses import replace

import numpy as np
import pytest

from specasr.matched import (
    Condition,
    Rollouts,
    clip_columns,
    contrast_table,
    depth_table,
    outcome_table,
    read_clip,
    roll_out,
    summary_table,
)
from specasr.trace import Settings


def rollouts(accepted, peaks, reference, clip="c", frame_ms=20.0) -> Rollouts:
    accepted = np.array(accepted, dtype=bool)
    return Rollouts(
        clip_hash=clip,
        group="all",
        starts=np.arange(1, len(accepted) + 1),
        accepted=accepted,
        draft_peaks=np.array(peaks),
        centres=np.full(accepted.shape, -1),
        reference=np.array(reference),
        frame_ms=frame_ms,
    )


# Two clips of rounds with K = 3. Clip a: rounds accepting 3, 1 and 0 proposals; clip b: 2 and 0.
A = rollouts(
    [[1, 1, 1], [1, 0, 1], [0, 1, 1]],
    [[10, 20, 30], [10, 40, 50], [5, 0, 0]],
    [[10, 22, 30], [0, 20, -1], [5, 0, 0]],
    clip="a",
)
B = rollouts([[1, 1, 0], [0, 0, 0]], [[0, 0, 0], [30, 0, 0]], [[0, 15, 0], [10, 0, 0]], clip="b")


def test_a_proposal_after_a_rejection_is_never_reached():
    assert A.reached.tolist() == [[True, True, True], [True, True, False], [True, False, False]]


def test_clip_columns_count_survivors_and_the_errors_of_reached_proposals():
    columns = clip_columns([A, B])
    assert columns["survivors"].tolist() == [[3, 2, 1, 1], [2, 1, 1, 0]]
    # clip a, depth 1: |10-10|, |10-0|, |5-5|; depth 2: |20-22|, |40-20|; depth 3: |30-30|
    assert columns["error_sum"][0].tolist() == [10, 22, 0]
    assert columns["error_count"][0].tolist() == [3, 2, 1]
    # 200 ms = 10 frames of 20 ms: clip b's depth-1 rejection is 20 frames off (large), its acceptance 0 (small)
    assert columns["outcomes"][1, 0].tolist() == [1, 0, 0, 1]


def test_depth_table_pools_rounds_over_clips():
    table = depth_table([Condition("d", "unrestricted", [A, B])]).set_index("depth")
    # rounds 5; survivors 3, 2, 1
    assert table.s.tolist() == pytest.approx([3 / 5, 2 / 5, 1 / 5])
    assert table.a_c.tolist() == pytest.approx([3 / 5, 2 / 3, 1 / 2])
    assert table.reached.tolist() == [5, 3, 2]
    assert table.error_frames.tolist() == pytest.approx([(10 + 0 + 20) / 5, (2 + 20 + 15) / 3, 0 / 1])


def test_summary_reports_s2_s3_and_accepted_length():
    row = summary_table([Condition("d", "unrestricted", [A, B])]).iloc[0]
    assert (row.a1, row.a2c, row.s2, row.s3, row.L) == pytest.approx((3 / 5, 2 / 3, 2 / 5, 1 / 5, 6 / 5))
    assert row.L_low <= row.L <= row.L_high and row.rounds == 5


def test_contrasts_pair_the_same_rounds():
    better = replace(B, accepted=np.array([[1, 1, 1], [1, 0, 0]], dtype=bool))
    conditions = [Condition("d", "unrestricted", [A, B]), Condition("d", "correct", [A, better])]
    table = contrast_table(conditions).set_index("metric")
    assert set(table.contrast) == {"correct-unrestricted"}
    assert table.loc["s1", "estimate"] == pytest.approx(4 / 5 - 3 / 5)
    assert table.loc["a2c", "estimate"] == pytest.approx(2 / 4 - 2 / 3)
    assert table.loc["L", "estimate"] == pytest.approx((4 + 2 + 2) / 5 - 6 / 5)
    assert "a1c" not in table.index  # a1c is s1
    # clip a is the same in both arms, so the L contrast only moves with clip b's share of the resample
    assert table.loc["L", "low"] >= 0


def test_outcome_table_splits_reached_proposals_by_outcome():
    table = outcome_table([Condition("d", "unrestricted", [A, B])]).set_index("depth")
    # depth 1: accepted errors 0, 10 (a) and 0 (b); rejected 0 (a) and 20 (b)
    assert table.loc[1, ["accepted", "rejected"]].tolist() == [3, 2]
    assert table.loc[1, "accepted_error_frames"] == 0 and table.loc[1, "rejected_error_frames"] == 10
    # large (> 10 frames): rejected 1 of 2, accepted 0 of 3: the odds ratio divides by zero
    assert np.isinf(table.loc[1, "odds_ratio"]) or np.isnan(table.loc[1, "odds_ratio"])


@pytest.mark.parametrize("window", ["unrestricted", "correct", "runtime"])
def test_rollouts_from_the_loops_own_rounds_are_the_loops_rounds(pipeline, tiny_en, sample_clips, window):
    """The invariant: started where the real loop started its rounds, the rollout accepts what the loop accepted
    and its draft attends where the loop's draft attended, at every proposal the loop made while its round stood."""
    settings = Settings(target="whisper-tiny.en", draft="whisper-tiny.en/anchordraft", k=4)
    clip = sample_clips[0].clip()
    view = read_clip(pipeline, settings, clip, "all")
    settings = replace(settings, window=window, reference="always")
    trace = pipeline.decode(clip, settings)
    found = roll_out(tiny_en, pipeline.draft(settings), view, settings, [r.start for r in trace.rounds])
    assert roll_out(tiny_en, pipeline.draft(settings), view, settings, []).accepted.shape == (0, 4)
    assert np.cumprod(found.accepted, axis=1).sum(axis=1).tolist() == [r.accepted for r in trace.rounds]
    made = {(s.round, s.depth): s for s in trace.steps}
    for i, r in enumerate(trace.rounds):
        for depth in range(1, len(r.proposed) + 1):
            step = made[r.index, depth]
            assert found.centres[i, depth - 1] == (-1 if step.window_centre is None else step.window_centre)
            if depth <= r.accepted + 1:  # past a rejection the loop reads its own wrong token, the rollout the truth
                assert found.draft_peaks[i, depth - 1] == step.draft_peak


def test_draft_contrasts_pair_drafts_at_equal_window():
    better = replace(B, accepted=np.array([[1, 1, 1], [1, 0, 0]], dtype=bool))
    conditions = [Condition("control", "unrestricted", [A, B]), Condition("anchordraft", "unrestricted", [A, better])]
    table = contrast_table(conditions, (("control", "anchordraft"),), by="draft").set_index("metric")
    assert set(table.contrast) == {"anchordraft-control"} and set(table.window) == {"unrestricted"}
    assert table.loc["L", "estimate"] == pytest.approx(8 / 5 - 6 / 5)


def test_windows_are_not_contrasted_for_a_draft_without_audio_attention():
    deaf = [replace(r, draft_peaks=np.full(r.accepted.shape, -1)) for r in (A, B)]
    conditions = [Condition("no-audio", "unrestricted", deaf), Condition("no-audio", "correct", deaf)]
    assert contrast_table(conditions).empty


def test_matched_command_prints_every_table_with_its_protocol(capsys, sample_clips, tmp_path):
    import json

    from specasr.cli import main

    command = ["matched", "--clips", "2", "--draft", "random", "--k", "2", "--db", str(tmp_path / "runs.duckdb")]
    assert main([*command, "--window", "unrestricted,shift", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["protocol"].startswith("matched rounds: every window starts from the same rounds (the round starts")
    assert {(row["draft"], row["window"]) for row in record["summary"]} == {
        ("random", "unrestricted"),
        ("random", "shift"),
    }
    assert {row["depth"] for row in record["depths"]} == {1, 2}
    assert {row["contrast"] for row in record["contrasts"]} == {"shift-unrestricted"}
    with pytest.raises(SystemExit):  # argparse refuses it, before any work
        main([*command, "--window", "sideways"])
    assert "unknown sideways" in capsys.readouterr().err
