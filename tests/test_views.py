"""Figures and tables from hand-built traces, without Streamlit."""

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from specasr.trace import DraftStep, Round, Segment, Settings, Trace, VerifiedToken
from specasr.views import (
    attention_heatmap,
    cost_rule_figure,
    depth_figure,
    drift_figure,
    round_table,
    survival_figure,
    token_rows,
    tree_figure,
    tree_rows,
)

PIECES = [" The", " cat", " sat", "."]


def trace(window: str = "correct", attention: bool = True) -> Trace:
    """Tokens 0..3: token 0 from the prompt pass; round 0 proposed 2 (accepted 1: token 1) and the target gave token 2;
    round 1 proposed 1, rejected, and the target gave token 3."""
    rows = [0.1, 0.7, 0.2] if attention else None
    centre = 10 if window != "unrestricted" else None
    return Trace(
        "clip",
        Settings(draft="random", window=window, k=2),
        [1, 2, 3, 4],
        "The cat sat.",
        segments=[Segment(0, 0, 3, 0, 4)],
        reference_frames=[0, 1, 2, None],
        rounds=[Round(0, 0, 1, [2, 9], 1, 3, 0.01, 0.02, 2), Round(1, 0, 3, [8], 0, 4, 0.01, 0.02, 1)],
        steps=[
            DraftStep(0, 1, 2, True, 1, centre, 1, rows, node=0),
            DraftStep(0, 2, 9, False, 2, centre, 2, rows, node=1, parent=0),
            DraftStep(1, 1, 8, False, 0, centre, None, rows, node=0),
        ],
        verified=[VerifiedToken(i, t, [i, i + 1]) for i, t in enumerate([1, 2, 3, 4])],
    )


def test_token_rows_mark_draft_and_target_tokens():
    rows = token_rows(trace(), PIECES)
    assert rows.source.tolist() == ["target", "draft", "target", "target"]
    assert rows["round"].tolist() == [None, 0, 0, 1]
    assert rows.reference_ms.tolist()[:3] == [0, 20, 40] and rows.reference_ms.isna().tolist()[3]
    assert rows.verify_peaks_ms[1] == [20, 40]


def test_round_table_names_proposals_and_costs():
    table = round_table(trace(), lambda tokens: f"<{tokens[0]}>")
    assert table.proposed.tolist() == ["<2> | <9>", "<8>"]
    assert table.accepted.tolist() == [1, 0] and table["target token"].tolist() == ["<3>", "<4>"]
    assert table["verify ms"].tolist() == pytest.approx([20, 20])


def test_drift_figure_puts_every_position_on_the_time_axis():
    figure = drift_figure(trace(), PIECES, layer=1, audio=np.ones(16000, dtype=np.float32))
    by_name = {t.name: t for t in figure.data}
    accepted, rejected = by_name["draft peak, proposal accepted"], by_name["draft peak, proposal rejected"]
    assert list(accepted.x) == [0.02] and list(accepted.y) == [1]  # round 0 depth 1 predicts token 1
    assert list(rejected.x) == [0.04, 0.0] and list(rejected.y) == [2, 3]
    # the hover names token, round, depth and the draft, verification and alignment positions
    assert list(accepted.customdata[0]) == [
        "1: cat",
        0,
        1,
        "20 ms (frame 1)",
        "40 ms (frame 2)",
        "20 ms (frame 1)",
        "200 ms (frame 10)",
    ]
    assert list(by_name["target verification peak (layer 1)"].x) == pytest.approx([0.02, 0.04, 0.06, 0.08])
    assert list(by_name["forced alignment"].y) == [0, 1, 2]  # the last token has no frame
    window = by_name["draft window"]
    assert list(window.x[:2]) == pytest.approx([0.2 - 0.4, 0.2 + 0.4])  # centre 10 frames, +-400 ms
    assert "waveform" in by_name and by_name["waveform"].yaxis in (None, "y")
    assert {t.yaxis for name, t in by_name.items() if name != "waveform"} == {"y2"}  # below the waveform
    unrestricted = {t.name for t in drift_figure(trace("unrestricted"), PIECES, layer=0).data}
    assert "draft window" not in unrestricted and "waveform" not in unrestricted


def tree_trace() -> Trace:
    """Tokens 0..3 as in `trace`, round 0 drafted as a tree of width 2: at depth 1 " cat" (node 0, accepted) and the
    more probable " dog" (node 1); at depth 2 " sat" below " cat" (node 2, rejected) and " ran" below " dog" (node 3).
    The target gave " sat" itself; round 1 is a chain of one rejected node."""
    rows = [0.1, 0.7, 0.2]

    def node(node: int, parent: int | None, depth: int, token: int, accepted: bool, peak: int, p: float) -> DraftStep:
        return DraftStep(0, depth, token, accepted, peak, None, None, rows, "", node, parent, p)

    return Trace(
        "clip",
        Settings(draft="random", k=2, tree_width=2, tree_nodes=4),
        [1, 2, 3, 4],
        "The cat sat.",
        segments=[Segment(0, 0, 3, 0, 4)],
        rounds=[Round(0, 0, 1, [2, 5, 3, 6], 1, 3, 0.01, 0.02, 2), Round(1, 0, 3, [8], 0, 4, 0.01, 0.02, 1)],
        steps=[
            node(0, None, 1, 2, True, 1, 0.3),
            node(1, None, 1, 5, False, 9, 0.6),
            node(2, 0, 2, 3, False, 2, 0.5),
            node(3, 1, 2, 6, False, 8, 0.9),
            DraftStep(1, 1, 8, False, 0, None, None, rows, "", 0, None, 0.4),
        ],
        verified=[VerifiedToken(i, t, [i, i + 1]) for i, t in enumerate([1, 2, 3, 4])],
    )


TEXTS = {1: " The", 2: " cat", 3: " sat", 4: ".", 5: " dog", 6: " ran", 8: " on"}


def test_drift_and_heatmap_follow_the_accepted_path_of_a_tree():
    tree = tree_trace()
    figure = drift_figure(tree, PIECES, layer=0)
    by_name = {t.name: t for t in figure.data}
    accepted, rejected = by_name["draft peak, proposal accepted"], by_name["draft peak, proposal rejected"]
    assert list(accepted.y) == [1] and list(accepted.x) == pytest.approx([0.02])  # " cat", not the likelier " dog"
    assert list(rejected.y) == [2, 3] and list(rejected.x) == pytest.approx([0.04, 0.0])  # " sat" below it; round 1
    heatmap = attention_heatmap(tree, PIECES)
    assert list(heatmap.layout.yaxis.ticktext) == ["r0 d1 cat", "r0 d2 sat", "r1 d1 ."]  # one row per depth and round


def test_tree_figure_lays_a_round_out_by_depth_with_its_path_and_the_targets_token():
    figure = tree_figure(tree_trace(), 0, lambda tokens: "".join(TEXTS.get(t, "<eot>") for t in tokens))
    by_name = {t.name: t for t in figure.data}
    root, on_path = by_name["root: the last verified token"], by_name["node on the accepted path"]
    off_path, target = by_name["node off the path"], by_name["the target's own next token"]
    assert (list(root.x), list(root.y), list(root.text)) == ([0], [0], ["The"])
    assert (list(on_path.x), list(on_path.y), list(on_path.text)) == ([1], [0], ["cat"])  # the spine is the top row
    assert list(zip(off_path.text, off_path.x, off_path.y, strict=True)) == [
        ("dog", 1, 1),
        ("sat", 2, 0),
        ("ran", 2, 1),
    ]
    assert "draft probability 0.600" in off_path.customdata[0] and "below node 1" in off_path.customdata[2]
    assert (list(target.x), list(target.y), list(target.text)) == ([2], [-1], ["sat"])  # after the path's end
    path = by_name["accepted path"]
    assert list(path.x) == [0, 1, None] and list(path.y) == [0, 0, None]
    edges = by_name["draft edge"]  # each node off the path to its parent
    assert list(edges.x) == [0, 1, None, 1, 2, None, 1, 2, None] and list(edges.y) == [
        0,
        1,
        None,
        0,
        0,
        None,
        1,
        1,
        None,
    ]


def test_tree_rows_put_the_preferred_child_on_its_parents_row():
    steps = tree_trace().steps[:4]
    assert tree_rows(steps) == {None: 0, 0: 0, 2: 0, 1: 1, 3: 1}
    chain = [
        DraftStep(0, d, 7, d == 1, None, None, None, node=d - 1, parent=d - 2 if d > 1 else None) for d in (1, 2, 3)
    ]
    assert tree_rows(chain) == {None: 0, 0: 0, 1: 0, 2: 0}  # a chain: one line


def test_heatmap_needs_kept_rows():
    figure = attention_heatmap(trace(), PIECES)
    assert np.asarray(figure.data[0].z).shape == (3, 3)
    assert list(figure.layout.yaxis.ticktext) == ["r0 d1 cat", "r0 d2 sat", "r1 d1 ."]
    with pytest.raises(ValueError, match="kept no attention"):
        attention_heatmap(trace(attention=False), PIECES)


def test_survival_depth_and_cost_rule_figures():
    survival = pd.DataFrame({"window": ["a", "a", "b", "b"], "depth": [0, 1, 0, 1], "s": [1, 0.5, 1, 0.2]})
    assert [t.name for t in survival_figure(survival).data] == ["a", "b"]
    table = pd.DataFrame({"run": ["x", "x"], "depth": [1, 2], "e": [10.0, 20.0], "lo": [5.0, 15.0], "hi": [12.0, 30.0]})
    line = depth_figure(table, "e", "run", "error", "lo", "hi").data[0]
    assert list(line.error_y.array) == [2, 10] and list(line.error_y.arrayminus) == [5, 5]
    runtime = pd.DataFrame(
        {"draft": ["d"], "window": ["runtime"], "uncorrected": ["shift"], "k": [4], "gross": [0.1], "cost": [0.2],
         "rho": [0.25], "measured_pays": [True], "net_decode": [0.05], "d_L": [0.2]}
    )  # fmt: skip
    point = cost_rule_figure(runtime).data[1]
    assert list(point.x) == pytest.approx([0.1]) and list(point.y) == pytest.approx([0.1])  # 0.2 / (1 + 4 * 0.25)
    assert list(point.text) == ["d runtime over shift K=4"]


def long_trace() -> Trace:
    """A 70 s clip cut into windows at 28 s and 56 s (frames 1400 and 2800): one round per window, each draft step
    attending at the window's own frame 100 (clip frames 100, 1500, 2900), its token aligned there."""
    starts, valid = [0, 1400, 2800], [1400, 1400, 700]
    segments = [Segment(i, start, frames, i, 1) for i, (start, frames) in enumerate(zip(starts, valid, strict=True))]
    rows = [[1.0 if f == 100 else 0.0 for f in range(frames)] for frames in valid]
    rounds = [Round(i, i, i, [10 + i], 1, 20 + i, 0.01, 0.02, 1) for i in range(3)]
    steps = [
        DraftStep(i, 1, 10 + i, True, start + 100, None, start + 100, rows[i], node=0) for i, start in enumerate(starts)
    ]
    return Trace(
        "long",
        Settings(draft="random", k=1),
        [10, 11, 12],
        "a b c",
        clip_seconds=70.0,
        segments=segments,
        reference_frames=[100, 1500, 2900],
        rounds=rounds,
        steps=steps,
        verified=[VerifiedToken(i, 10 + i, [start + 100]) for i, start in enumerate(starts)],
    )


def test_long_audio_views_place_every_window_on_the_clip_time_axis():
    trace, pieces = long_trace(), [" a", " b", " c"]
    heatmap = attention_heatmap(trace, pieces)
    windows = [t for t in heatmap.data if t.type == "heatmap"]
    for window, start, frames in zip(windows, [0, 1400, 2800], [1400, 1400, 700], strict=True):
        assert window.x[0] == pytest.approx(start * 0.02) and window.x[-1] == pytest.approx((start + frames - 1) * 0.02)
        row = np.asarray(window.z)[0]
        assert window.x[int(np.nanargmax(row))] == pytest.approx((start + 100) * 0.02)  # the peak where it was heard
    marks = next(t for t in heatmap.data if t.name == "forced alignment")
    assert list(marks.x) == pytest.approx([2.0, 30.0, 58.0])
    assert marks.marker.color != "white"  # seen where no window's attention is drawn
    assert [shape.x0 for shape in heatmap.layout.shapes] == pytest.approx([28.0, 56.0])  # the cuts
    drift = drift_figure(trace, pieces, layer=0, audio=np.zeros(70 * 16000, dtype=np.float32))
    by_name = {t.name: t for t in drift.data}
    assert list(by_name["draft peak, proposal accepted"].x) == pytest.approx([2.0, 30.0, 58.0])
    assert list(by_name["target verification peak (layer 0)"].x) == pytest.approx([2.0, 30.0, 58.0])
    assert list(by_name["forced alignment"].x) == pytest.approx([2.0, 30.0, 58.0])
    assert by_name["waveform"].x[-1] == pytest.approx(70.0, abs=0.03)
    assert [shape.x0 for shape in drift.layout.shapes] == pytest.approx([28.0, 56.0])
    rounds = round_table(trace, lambda tokens: str(tokens[0]))
    assert rounds["segment start (s)"].tolist() == pytest.approx([0.0, 28.0, 56.0])


def test_a_long_clips_window_shows_its_own_tokens_and_seconds():
    trace, pieces = long_trace(), [" a", " b", " c"]
    drift = drift_figure(trace, pieces, layer=0, segment=1)
    assert list(drift.layout.yaxis2.range) == [1.5, 0.5]  # token 1 alone, the first on top
    assert list(drift.layout.yaxis2.tickvals) == [1]
    assert list(drift.layout.xaxis2.range) == pytest.approx([28.0, 56.0])
    heatmap = attention_heatmap(trace, pieces, segment=2)
    assert [t.name for t in heatmap.data if t.type == "heatmap"] == ["window 2"]
    assert list(heatmap.layout.xaxis.range) == pytest.approx([56.0, 70.0])
    assert list(heatmap.layout.yaxis.ticktext) == ["r2 d1 c"]


def test_drift_figure_shows_times_above_and_below_and_keeps_its_labels_apart():
    count = 300  # the tokens of a long clip
    long = Trace("long", Settings(), list(range(count)), "", segments=[Segment(0, 0, 1500, 0, count)])
    figure = drift_figure(long, [f" w{i}" for i in range(count)], layer=0)
    assert figure.layout.height <= 1400
    ticks = list(figure.layout.yaxis2.tickvals)
    pixels = 0.82 * (figure.layout.height - 200) / count * (ticks[1] - ticks[0])
    assert pixels >= 18  # a label's room
    assert figure.layout.xaxis.side == "top" and figure.layout.xaxis.showticklabels  # times above the waveform
    assert figure.layout.yaxis2.title.standoff > 0 and figure.layout.yaxis2.automargin  # the title clears its labels
    few = drift_figure(trace(), PIECES, layer=0)
    assert list(few.layout.yaxis2.tickvals) == [0, 1, 2, 3]


def test_verification_peaks_are_points_not_a_line_across_the_plot():
    figure = drift_figure(trace(), PIECES, layer=1)
    assert next(t for t in figure.data if t.name.startswith("target verification")).mode == "markers"


def test_round_table_rounds_its_times():
    table = round_table(long_trace(), lambda tokens: str(tokens[0]))
    assert table["draft ms"].tolist() == [10.0, 10.0, 10.0] and table["verify ms"].tolist() == [20.0, 20.0, 20.0]
    odd = round_table(replace(trace(), rounds=[Round(0, 0, 1, [2], 1, 3, 0.6469654, 0.2003616, 1)]), str)
    assert (odd["draft ms"][0], odd["verify ms"][0]) == (647.0, 200.4)
