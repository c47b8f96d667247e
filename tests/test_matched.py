"""Matched rounds: every window drafts from the same rounds; the rollout reproduces the loop's own rounds."""

import json
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from specasr.audio import Clip
from specasr.cli import main
from specasr.decode import greedy
from specasr.draft import random_draft
from specasr.matched import read_clip, roll_out, teacher_forced
from specasr.matched_tables import (
    Condition,
    Rollouts,
    clip_columns,
    contrast_table,
    depth_table,
    outcome_table,
    restart_table,
    summary_table,
)
from specasr.trace import Settings, spine
from tests.conftest import run_loop
from tests.test_tree import chain_cases, float64_case

MATCHED_ROWS = Path(__file__).parent / "data" / "matched_rows.json"


def rollouts(accepted, peaks, reference, restarts=None, clip="c", frame_ms=20.0) -> Rollouts:
    accepted = np.array(accepted, dtype=bool)
    return Rollouts(
        clip_hash=clip,
        group="all",
        starts=np.arange(1, len(accepted) + 1),
        tokens=np.zeros(accepted.shape, dtype=int),
        accepted=accepted,
        draft_peaks=np.array(peaks),
        centres=np.full(accepted.shape, -1),
        reference=np.array(reference),
        restarts=accepted[:, :1] if restarts is None else np.array(restarts, dtype=bool),
        frame_ms=frame_ms,
    )


def condition(window: str, found: list[Rollouts], draft: str = "d", width: int = 1, nodes: int = 3) -> Condition:
    return Condition(draft, window, width, nodes, found)


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


def test_a_depth_the_spine_does_not_reach_is_not_reached():
    short = replace(A, tokens=np.array([[0, 0, 0], [0, -1, -1], [0, 0, 0]]))
    assert short.reached.tolist() == [[True, True, True], [True, False, False], [True, False, False]]


def test_clip_columns_count_survivors_and_the_errors_of_reached_proposals():
    columns = clip_columns([A, B])
    assert columns["survivors"].tolist() == [[3, 2, 1, 1], [2, 1, 1, 0]]
    assert columns["reached"].tolist() == [[3, 2, 1], [2, 1, 1]]
    # clip a, depth 1: |10-10|, |10-0|, |5-5|; depth 2: |20-22|, |40-20|; depth 3: |30-30|
    assert columns["error_sum"][0].tolist() == [10, 22, 0]
    assert columns["error_count"][0].tolist() == [3, 2, 1]
    # 200 ms = 10 frames of 20 ms: clip b's depth-1 rejection is 20 frames off (large), its acceptance 0 (small)
    assert columns["outcomes"][1, 0].tolist() == [1, 0, 0, 1]


def test_depth_table_pools_rounds_over_clips():
    table = depth_table([condition("unrestricted", [A, B])]).set_index("depth")
    # rounds 5; survivors 3, 2, 1
    assert table.s.tolist() == pytest.approx([3 / 5, 2 / 5, 1 / 5])
    assert table.a_c.tolist() == pytest.approx([3 / 5, 2 / 3, 1 / 2])
    assert table.reached.tolist() == [5, 3, 2]
    assert table.error_frames.tolist() == pytest.approx([(10 + 0 + 20) / 5, (2 + 20 + 15) / 3, 0 / 1])
    assert set(table.width) == {1} and set(table.nodes) == {3}


def test_summary_reports_s2_s3_and_accepted_length():
    row = summary_table([condition("unrestricted", [A, B])]).iloc[0]
    assert (row.a1, row.a2c, row.s2, row.s3, row.L) == pytest.approx((3 / 5, 2 / 3, 2 / 5, 1 / 5, 6 / 5))
    assert row.L_low <= row.L <= row.L_high and row.rounds == 5
    assert (row.width, row.nodes) == (1, 3)


def test_restart_table_counts_the_transcript_token_among_the_top_m_restarts():
    # clip a's rounds find it at ranks 1, 2 and 3 of 3; clip b's at rank 1 and nowhere
    a = replace(A, restarts=np.array([[1, 1, 1], [0, 1, 1], [0, 0, 1]], dtype=bool))
    b = replace(B, restarts=np.array([[1, 1, 1], [0, 0, 0]], dtype=bool))
    table = restart_table([condition("unrestricted", [a, b], width=3, nodes=6)]).set_index("m")
    assert table.a1.tolist() == pytest.approx([2 / 5, 3 / 5, 4 / 5])
    assert table.gain.tolist()[1:] == pytest.approx([1 / 5, 2 / 5]) and np.isnan(table.gain[1])
    assert (table.gain_low[[2, 3]] >= 0).all()  # a1(m) never falls below a1(1) on any resample
    assert set(table.width) == {3} and set(table.nodes) == {6}


def test_contrasts_pair_the_same_rounds():
    better = replace(B, accepted=np.array([[1, 1, 1], [1, 0, 0]], dtype=bool))
    conditions = [condition("unrestricted", [A, B]), condition("correct", [A, better])]
    table = contrast_table(conditions).set_index("metric")
    assert set(table.contrast) == {"correct-unrestricted"}
    assert table.loc["s1", "estimate"] == pytest.approx(4 / 5 - 3 / 5)
    assert table.loc["a2c", "estimate"] == pytest.approx(2 / 4 - 2 / 3)
    assert table.loc["L", "estimate"] == pytest.approx((4 + 2 + 2) / 5 - 6 / 5)
    assert "a1c" not in table.index  # a1c is s1
    # clip a is the same in both arms, so the L contrast only moves with clip b's share of the resample
    assert table.loc["L", "low"] >= 0


def test_outcome_table_splits_reached_proposals_by_outcome():
    table = outcome_table([condition("unrestricted", [A, B])]).set_index("depth")
    # depth 1: accepted errors 0, 10 (a) and 0 (b); rejected 0 (a) and 20 (b)
    assert table.loc[1, ["accepted", "rejected"]].tolist() == [3, 2]
    assert table.loc[1, "accepted_error_frames"] == 0 and table.loc[1, "rejected_error_frames"] == 10
    # large (> 10 frames): rejected 1 of 2, accepted 0 of 3; an empty cell counts a half: (1.5/1.5) / (0.5/3.5)
    assert table.loc[1, "odds_ratio"] == pytest.approx(7.0)
    assert table.loc[1, "odds_low"] < table.loc[1, "odds_high"]  # no draw dropped for an empty cell


def test_draft_contrasts_pair_drafts_at_equal_window():
    better = replace(B, accepted=np.array([[1, 1, 1], [1, 0, 0]], dtype=bool))
    conditions = [condition("unrestricted", [A, B], "control"), condition("unrestricted", [A, better], "anchordraft")]
    table = contrast_table(conditions, (("control", "anchordraft"),), by="draft").set_index("metric")
    assert set(table.contrast) == {"anchordraft-control"} and set(table.window) == {"unrestricted"}
    assert table.loc["L", "estimate"] == pytest.approx(8 / 5 - 6 / 5)


def test_windows_are_not_contrasted_for_a_draft_without_audio_attention():
    deaf = [replace(r, draft_peaks=np.full(r.accepted.shape, -1)) for r in (A, B)]
    conditions = [condition("unrestricted", deaf, "no-audio"), condition("correct", deaf, "no-audio")]
    assert contrast_table(conditions).empty


# Rollouts of random float64 models (tests.test_tree's cases), against the loop and against the chains of before


def random_view(case: dict):
    """A float64 random target and draft, its greedy transcript's teacher-forced view (reference frames cut to the
    transcript, as an aligner gives them) and its encoder output and valid frames."""
    target, draft, memory, valid, reference = float64_case(case)
    transcript = greedy(target, memory, valid).tokens
    frames = (reference + [None] * len(transcript))[: len(transcript)]
    clip = Clip(f"{case['family']}-{case['seed']}", np.zeros(1, dtype=np.float32))
    return target, draft, teacher_forced(target, clip, "all", transcript, frames, memory, valid), memory, valid


def by_round(steps) -> dict[int, list]:
    rounds = {}
    for step in steps:
        rounds.setdefault(step.round, []).append(step)
    return rounds


def case_named(name: str) -> dict:
    family, seed = name.rsplit("-", 1)
    return next(c for c in chain_cases() if (c["family"], c["seed"]) == (family, int(seed)))


@pytest.mark.parametrize(
    "recorded", json.loads(MATCHED_ROWS.read_text()), ids=lambda r: f"{r['case']['family']}-{r['case']['seed']}"
)
def test_tree_width_one_gives_the_chain_rollouts_of_before(recorded):
    """From every position, what matched rounds gave before draft trees (commit a00cc39: `train.unroll` and the
    draft's argmax), at every proposal a round reached."""
    case = recorded["case"]
    target, draft, view, _, _ = random_view(case)
    settings = Settings(draft="random", k=recorded["k"], window=case["window"], runtime_layer=1)
    found = roll_out(target, draft, view, settings, list(range(1, len(view.tokens) - len(target.prompt))))
    assert np.cumprod(found.accepted, axis=1).sum(axis=1).tolist() == recorded["accepted"]
    assert [p[r].tolist() for p, r in zip(found.draft_peaks, found.reached, strict=True)] == recorded["draft_peaks"]
    assert found.centres.tolist() == recorded["centres"] and found.reference.tolist() == recorded["reference"]


@pytest.mark.parametrize("tree_shape", [(1, None), (2, None), (3, 5)], ids=lambda t: f"width{t[0]}-nodes{t[1]}")
@pytest.mark.parametrize(("name", "k"), [("whisper-0", 3), ("whisper-4", 4), ("qwen3_asr-4", 3), ("voxtral-8", 4)])
def test_rollouts_from_the_loops_own_rounds_are_the_loops_rounds_on_random_models(name, k, tree_shape):
    """Started where the loop started its rounds, a rollout accepts what the loop accepted and its spine is the
    loop's: the same tokens, window centres and draft attention peaks, a chain's every proposal included."""
    case, (width, nodes) = case_named(name), tree_shape
    target, draft, view, memory, valid = random_view(case)
    settings = Settings(draft="random", k=k, window=case["window"], runtime_layer=1, tree_width=width, tree_nodes=nodes)
    reference = [None if f < 0 else int(f) for f in view.reference]
    result = run_loop(target, draft, memory, valid, settings, reference)
    budget = target.max_length - len(target.prompt) - settings.k - 1  # the length limit cuts the later rounds short
    rounds = [r for r in result.rounds if r.start <= budget]
    found = roll_out(target, draft, view, settings, [r.start for r in rounds])
    assert np.cumprod(found.accepted, axis=1).sum(axis=1).tolist() == [r.accepted for r in rounds]
    assert 0 < sum(r.accepted for r in rounds) < k * len(rounds)  # the case holds acceptances and rejections
    steps = by_round(result.steps)
    for i, r in enumerate(rounds):
        loop = spine(steps[r.index])
        drafted = found.tokens[i] >= 0
        assert found.tokens[i][drafted].tolist() == [s.token for s in loop]
        assert found.centres[i][drafted].tolist() == [-1 if s.window_centre is None else s.window_centre for s in loop]
        assert found.draft_peaks[i][drafted].tolist() == [-1 if s.draft_peak is None else s.draft_peak for s in loop]


def rigged_draft(target, probabilities: dict[int, float]):
    """A draft that proposes the same distribution after every prefix: `probabilities` for the tokens named, the
    rest of the mass spread evenly."""
    draft = random_draft(target, seed=1)
    head = draft._frozen["lm_head"].weight  # (vocabulary, d_model)
    rest = (1 - sum(probabilities.values())) / (head.shape[0] - len(probabilities))
    wanted = torch.full((head.shape[0], 1), rest, dtype=head.dtype)
    for token, p in probabilities.items():
        wanted[token] = p
    zero = head.abs().sum(dim=1) == 0  # a padding row scores 0 whatever the state: log-probabilities relative to it
    logits = wanted.log() - (wanted.log()[zero].mean() if zero.any() else 0)
    with torch.no_grad():
        draft.out_norm.weight.zero_()  # every output state is the bias
        draft.out_norm.bias.copy_(torch.linalg.lstsq(head, logits).solution[:, 0])
    return draft


@pytest.fixture(scope="module")
def rigged():
    """A random target's transcript and a draft whose top two tokens, a (0.6) and b (0.3), are the transcript's
    commonest: a tree of width 2 drafts a and b at depth 1 and below each of them, whatever came before."""
    target, _, view, _, _ = random_view(case_named("whisper-0"))
    transcript = view.tokens[len(target.prompt) : -1]
    (a, _), (b, _) = Counter(transcript).most_common(2)
    return target, rigged_draft(target, {a: 0.6, b: 0.3}), view, transcript, a, b


@pytest.mark.parametrize(
    ("nodes", "tree_paths"),
    [
        (6, {"a", "b", "aa", "ab", "ba", "bb"}),  # every candidate
        (3, {"a", "aa", "b"}),  # the most probable: a 0.6, aa 0.36, b 0.3
        (2, {"a", "aa"}),
    ],
)
def test_a_rigged_tree_accepts_the_longest_transcript_path_it_holds(rigged, nodes, tree_paths):
    target, draft, view, transcript, a, b = rigged
    name = {a: "a", b: "b"}
    truth = [name.get(token, "-") for token in transcript] + ["end", "-"]
    starts = list(range(1, len(transcript) + 1))
    found = roll_out(target, draft, view, Settings(draft="random", k=2, tree_width=2, tree_nodes=nodes), starts)
    accepted = [2 if truth[v] + truth[v + 1] in tree_paths else 1 if truth[v] in tree_paths else 0 for v in starts]
    assert np.cumprod(found.accepted, axis=1).sum(axis=1).tolist() == accepted
    assert 0 < sum(accepted) < 2 * len(starts)  # the case holds both outcomes
    # The spine: the accepted path, then the draft's most probable child (a) where the tree has one
    for v, tokens in zip(starts, found.tokens.tolist(), strict=True):
        held = truth[v] in tree_paths
        first = truth[v] if held else "a"
        second = truth[v + 1] if held and first + truth[v + 1] in tree_paths else "a"
        expected = [first, second if first + second in tree_paths else None]
        assert tokens == [{"a": a, "b": b, None: -1}[t] for t in expected]
    assert found.restarts.tolist() == [[truth[v] == "a", truth[v] in ("a", "b")] for v in starts]


def test_restart_acceptance_brackets_the_trees_own_restart(rigged):
    """a1(1) is the chain's restart; the tree's own a1 (any verified depth-1 node accepted) lies between a1(1) and
    a1(W): it is a1(2) where both restarts are verified, a1(1) where only a is."""
    target, draft, view, transcript, _, _ = rigged
    starts = list(range(1, len(transcript) + 1))
    conditions = []
    for width, nodes in ((1, 2), (2, 2), (2, 6)):
        settings = Settings(draft="random", k=2, tree_width=width, tree_nodes=nodes)
        conditions.append(
            condition("unrestricted", [roll_out(target, draft, view, settings, starts)], "d", width, nodes)
        )
    summary = summary_table(conditions).set_index(["width", "nodes"]).a1
    restarts = restart_table(conditions).set_index(["width", "nodes", "m"]).a1
    assert restarts[1, 2, 1] == summary[1, 2] == restarts[2, 2, 1] == summary[2, 2]
    assert summary[2, 6] == restarts[2, 6, 2] > restarts[2, 6, 1]


def test_restart_acceptance_grows_with_the_candidates_counted_from_the_chains():
    """a1(m) never falls as m grows, and a1(1) is the chain's a1 on the same rounds."""
    target, draft, view, _, _ = random_view(case_named("whisper-4"))
    starts = list(range(1, len(view.tokens) - len(target.prompt)))
    found = {w: roll_out(target, draft, view, Settings(draft="random", k=2, tree_width=w), starts) for w in (1, 4)}
    table = restart_table([condition("unrestricted", [found[4]], width=4, nodes=8)])
    assert table.m.tolist() == [1, 2, 3, 4] and (np.diff(table.a1) >= 0).all() and table.a1.iloc[-1] > 0
    assert table.a1.iloc[0] == summary_table([condition("unrestricted", [found[1]], width=1, nodes=2)]).a1.iloc[0]


# On real speech


@pytest.mark.parametrize(("window", "width"), [("unrestricted", 1), ("correct", 1), ("runtime", 2)])
def test_rollouts_from_the_loops_own_rounds_are_the_loops_rounds(pipeline, tiny_en, sample_clips, window, width):
    """The invariant: started where the real loop started its rounds, the rollout accepts what the loop accepted
    and drafts what it drafted: every node of a round's spine, where the draft attended and its window."""
    settings = Settings(target="whisper-tiny.en", draft="whisper-tiny.en/anchordraft", k=4, tree_width=width)
    clip = sample_clips[0].clip()
    view = read_clip(pipeline, settings, clip, "all")
    settings = replace(settings, window=window, reference="always")
    trace = pipeline.decode(clip, settings)
    found = roll_out(tiny_en, pipeline.draft(settings), view, settings, [r.start for r in trace.rounds])
    assert roll_out(tiny_en, pipeline.draft(settings), view, settings, []).accepted.shape == (0, 4)
    assert np.cumprod(found.accepted, axis=1).sum(axis=1).tolist() == [r.accepted for r in trace.rounds]
    steps = by_round(trace.steps)
    for i, r in enumerate(trace.rounds):
        loop = spine(steps[r.index])
        assert found.tokens[i].tolist() == [s.token for s in loop]
        assert found.draft_peaks[i].tolist() == [s.draft_peak for s in loop]
        assert found.centres[i].tolist() == [-1 if s.window_centre is None else s.window_centre for s in loop]


def test_matched_command_prints_every_table_with_its_protocol(capsys, sample_clips, tmp_path):
    command = ["matched", "--clips", "2", "--draft", "random", "--k", "2", "--db", str(tmp_path / "runs.duckdb")]
    assert main([*command, "--window", "unrestricted,shift", "--tree-width", "2", "--tree-nodes", "3", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["protocol"].startswith("matched rounds: every window starts from the same rounds (the round starts")
    assert {(row["draft"], row["window"], row["width"], row["nodes"]) for row in record["summary"]} == {
        ("random", "unrestricted", 2, 3),
        ("random", "shift", 2, 3),
    }
    assert {row["depth"] for row in record["depths"]} == {1, 2}
    assert {row["contrast"] for row in record["contrasts"]} == {"shift-unrestricted"}
    assert {(row["window"], row["m"]) for row in record["restarts"]} == {
        (window, m) for window in ("unrestricted", "shift") for m in (1, 2)
    }
    with pytest.raises(SystemExit):  # argparse refuses it, before any work
        main([*command, "--window", "sideways"])
    assert "unknown sideways" in capsys.readouterr().err


def test_matched_refuses_a_tree_of_more_nodes_than_it_drafts_in_one_line(capsys):
    assert main(["matched", "--k", "2", "--tree-width", "2", "--tree-nodes", "7"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "can verify 1 to 6 nodes per round, not 7" in err
