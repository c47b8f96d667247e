"""The one comparison routine: runs paired by clip, A - B against hand computations, and the same numbers as the
experiment runner's contrasts and the store's comparison."""

from dataclasses import replace

import pandas as pd
import pytest
from test_experiments import hand_grid, hand_trace  # noqa: F401 (hand_grid: a fixture)
from test_store import SPECULATIVE, greedy_trace, speculative_trace

from specasr.compare import DIFFERENCE, NO_INTERVAL, NoSharedClipError, Word, compare, compare_runs, word_diff
from specasr.experiments import COMMAND
from specasr.metrics import word_error_rate
from specasr.report import tables
from specasr.store import Store

OTHER = replace(SPECULATIVE, draft="other-draft")


def runs_a_and_b() -> tuple[list, list]:
    """A on c1 (twice), c2 and c9; B on c1, c2 and c8 with other accepted counts, transcripts and draft peaks."""
    run_a = [
        speculative_trace("c1", [3, 1]),
        speculative_trace("c2", [1, 1]),
        speculative_trace("c1", [0, 0]),  # c1's second repeat: not compared
        speculative_trace("c9", [2]),
    ]
    run_b = [
        speculative_trace("c8", [1], OTHER),
        speculative_trace("c2", [2, 0], OTHER, text="the cat sat up"),
        speculative_trace("c1", [3, 3, 0], OTHER, text="the cat sat down"),
    ]
    return run_a, run_b


def test_a_minus_b_on_the_shared_clips_equals_a_hand_computation():
    comparison = compare(*runs_a_and_b())
    assert [(a.clip_id, b.clip_id) for a, b in comparison.pairs] == [("c1", "c1"), ("c2", "c2")]
    table = comparison.table().set_index("metric")
    assert list(table.index) == ["a1", "a2c", "L", "wer", "anchor_error_ms"] and (table.clips == 2).all()
    # A pools rounds [3, 1, 1, 1] of K = 3: s = 1, 1, 1/4, 1/4. B pools [3, 3, 0, 2, 0]: s = 1, 3/5, 3/5, 2/5.
    assert table.loc["a1", ["A", "B", DIFFERENCE]].tolist() == pytest.approx([1.0, 3 / 5, 2 / 5])
    assert table.loc["a2c", ["A", "B", DIFFERENCE]].tolist() == pytest.approx([1 / 4, 1.0, -3 / 4])
    assert table.loc["L", ["A", "B", DIFFERENCE]].tolist() == pytest.approx([3 / 2, 8 / 5, -1 / 10])
    # "the cat sat up" against "the cat sat down": A 1 + 1 edits of 8 words, B 0 + 1.
    assert table.loc["wer", ["A", "B", DIFFERENCE]].tolist() == pytest.approx([2 / 8, 1 / 8, 1 / 8])
    # A step at round r and depth d is d * r frames off: A 0 0 0 1 2 3 on each clip (median 0.5 frames), B on c1
    # 0 0 0 1 2 3 2 4 6 and on c2 0 0 0 1 2 3 (median 1 frame); a frame is 20 ms.
    assert table.loc["anchor_error_ms", ["A", "B", DIFFERENCE]].tolist() == pytest.approx([10.0, 20.0, -10.0])
    assert (table.low <= table[DIFFERENCE]).all() and (table[DIFFERENCE] <= table.high).all()
    assert (table.low < table.high).all()  # two clips that differ: a spread to show
    caption = comparison.caption("run one", "run two")
    assert caption.startswith("A - B: A is run one, B is run two, on the 2 clips both decoded")
    assert "95% paired bootstrap interval" in caption and NO_INTERVAL not in caption


def test_the_word_error_rate_is_the_corpus_rate_of_the_shared_clips():
    references = ["Mr. Smith, it's ten o'clock.", "Colour me blue!"]
    decoded = [("Mister Smith it is ten o'clock", "Mister Smith it is ten"), ("Color me red.", "collar me blue")]
    run_a, run_b = [], []
    for clip, (reference, (text_a, text_b)) in enumerate(zip(references, decoded, strict=True)):
        run_a.append(replace(speculative_trace(f"c{clip}", [1], text=text_a), reference_text=reference))
        run_b.append(replace(speculative_trace(f"c{clip}", [1], OTHER, text=text_b), reference_text=reference))
    wer = compare(run_a, run_b).table().set_index("metric").loc["wer"]
    expected_a = word_error_rate(references, [text for text, _ in decoded])
    expected_b = word_error_rate(references, [text for _, text in decoded])
    assert [wer["A"], wer["B"]] == pytest.approx([expected_a, expected_b])
    assert wer[DIFFERENCE] == pytest.approx(expected_a - expected_b) and expected_a != expected_b


def test_one_shared_clip_has_no_interval():
    comparison = compare([speculative_trace("c1", [3, 1])], [speculative_trace("c1", [1, 0], OTHER)])
    table = comparison.table().set_index("metric")
    assert table.loc["L", DIFFERENCE] == pytest.approx(2.0 - 0.5)
    assert "low" not in table and "high" not in table  # never a zero-width interval, nor a column of None
    assert NO_INTERVAL in comparison.caption("a", "b") and "on the one clip" in comparison.caption("a", "b")
    labelled = comparison.table(window="shift")
    assert list(labelled.columns[:2]) == ["window", "metric"] and set(labelled.window) == {"shift"}


def test_runs_without_a_shared_clip_are_refused():
    with pytest.raises(NoSharedClipError, match="no clip in common"):
        compare([speculative_trace("c1", [1])], [speculative_trace("c2", [1], OTHER)])


def test_a_greedy_run_compares_on_what_it_has():
    greedy = replace(greedy_trace("c1"), clip_hash="hash-c1", reference_text="the cat sat down", text="the cat")
    table = compare([speculative_trace("c1", [3, 1])], [greedy]).table()
    assert table.metric.tolist() == ["wer"]  # no rounds, no draft steps: acceptance and anchor error left out
    assert table[DIFFERENCE].iloc[0] == pytest.approx(1 / 4 - 2 / 4)


def test_the_experiment_runners_contrasts_are_the_routines(hand_grid):  # noqa: F811 (the fixture)
    """control - no-audio in the experiment's table is compare(control, no-audio, baseline): the same numbers."""
    store, runs = hand_grid
    expected = tables(store, runs).contrasts.set_index("metric")
    cells = {settings.draft: store.traces(run_id) for settings, run_id in runs.cells.items()}
    table = compare(cells["control"], cells["no-audio"], store.traces(runs.baseline)).table().set_index("metric")
    speeds = ["decode_speedup", "total_speedup"]
    assert set(expected.name) == {"control-no-audio"} and list(table.index[:5]) == ["a1", "a2c", "L", *speeds]
    pd.testing.assert_frame_equal(
        table.loc[expected.index, [DIFFERENCE, "low", "high", "clips"]],
        expected[["estimate", "low", "high", "clips"]].rename(columns={"estimate": DIFFERENCE}),
        check_dtype=False,
    )


def test_compare_runs_matches_clips_uses_first_repeats_and_reports_a_minus_b(tmp_path):
    store = Store(tmp_path / "runs.duckdb")
    arm_a = [speculative_trace("c1", [0, 0]), speculative_trace("c1", [3, 1]), speculative_trace("c2", [1, 1])]
    arm_b = [speculative_trace(c, accepted, OTHER) for c, accepted in (("c3", [3]), ("c2", [2, 0]), ("c1", [3, 3]))]
    run_a = store.write_run(arm_a, "bench", repeats=[1, 0, 0])  # c1's first repeat written after its second
    run_b = store.write_run(arm_b, "bench")
    table = compare_runs(store, run_a, run_b).table().set_index("metric")
    # Shared clips c1 and c2. A pools [3, 1, 1, 1]: s = 1, 1, 1/4, 1/4; B pools [3, 3, 2, 0]: s = 1, 3/4, 3/4, 1/2.
    assert table.clips.tolist() == [2] * len(table)
    assert table.loc[["a1", "a2c", "L"], "A - B"].to_dict() == {"a1": 0.25, "a2c": -0.75, "L": -0.5}
    assert table.loc[["a1", "a2c", "L"], "A"].to_dict() == {"a1": 1.0, "a2c": 0.25, "L": 1.5}
    assert (table.low <= table["A - B"]).all() and (table["A - B"] <= table.high).all()
    assert "decode_speedup" not in table.index  # no greedy baseline timed beside them


def test_the_store_compares_runs_of_one_batch_against_their_baseline(tmp_path):
    """Runs decoded beside a greedy baseline (one batch, two repetitions): the store finds it and the comparison
    holds speed too, each clip timed by the median of its repetitions."""
    store = Store(tmp_path / "runs.duckdb")
    greedy = replace(SPECULATIVE, draft=None, verify_peaks=False)  # timed, as a batch's baseline is

    def twice(settings, clips: dict[str, tuple[list[int], list[float]]]) -> tuple[list, list[int]]:
        """Two repetitions of each clip, its rounds accepting these counts, decoded in these seconds."""
        traces = [hand_trace(settings, c, accepted, s) for c, (accepted, seconds) in clips.items() for s in seconds]
        return traces, [0, 1] * len(clips)

    batch = [
        twice(greedy, {"u": ([], [2.0, 2.0]), "v": ([], [1.0, 3.0])}),
        twice(SPECULATIVE, {"u": ([3, 1], [1.0, 1.0]), "v": ([2], [0.5, 1.5])}),
        twice(OTHER, {"u": ([0, 1], [2.0, 3.0]), "v": ([1], [1.5, 1.5]), "w": ([3], [1.0, 1.0])}),
    ]
    baseline, run_a, run_b = store.write_runs(batch, COMMAND)
    table = compare_runs(store, run_a, run_b).table().set_index("metric")
    # Decode seconds, each clip's median: greedy 2.0 + 2.0, A 1.0 + 1.0, B 2.5 + 1.5 (w: not in A).
    assert table.loc["decode_speedup", ["A", "B", DIFFERENCE]].tolist() == pytest.approx([2.0, 1.0, 1.0])
    assert table.loc["L", DIFFERENCE] == pytest.approx(6 / 3 - 2 / 3) and (table.clips == 2).all()
    expected = compare(store.traces(run_a), store.traces(run_b), store.traces(baseline)).table()
    pd.testing.assert_frame_equal(table.reset_index(), expected)


def test_word_diff_marks_the_words_the_other_transcript_lacks():
    said_a, said_b = word_diff("the cat sat on the mat", "the cat sit on a mat now")
    assert [w.text for w in said_a if w.changed] == ["sat", "the"]
    assert [w.text for w in said_b if w.changed] == ["sit", "a", "now"]
    assert said_a[:2] == [Word("the", False), Word("cat", False)]
    assert word_diff("", "hello") == ([], [Word("hello", True)])
