"""Side by side, and the Checkpoints comparisons, as a user drives them (Streamlit AppTest, widgets by key): every
view's A - B table is the one routine's."""

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from test_app import figures, frame_with, page, text_of
from test_store import SPECULATIVE, greedy_trace, speculative_trace

from specasr.audio import SAMPLE_RATE
from specasr.compare import COLUMNS, DIFFERENCE, compare, compare_runs
from specasr.pipeline import Pipeline
from specasr.store import Store

OTHER = replace(SPECULATIVE, draft="other-draft")


def with_texts(trace):
    """A trace that renders without its target, as runs stored today do: its token texts and runtime layer kept."""
    return replace(trace, token_texts=[f" w{token}" for token in trace.tokens], target_runtime_layer=1)


@pytest.fixture
def two_runs(monkeypatch) -> tuple[str, str]:
    """Run A and run B of clips c1 and c2 (c1's audio in the store), which no page may need a model to show."""
    run_a = [speculative_trace("c1", [3, 1]), speculative_trace("c2", [1, 1])]
    run_b = [
        speculative_trace("c2", [2, 0], OTHER, text="the cat sat up"),
        speculative_trace("c1", [3, 3, 0], OTHER, text="the dog sat down"),
    ]
    audio = {"hash-c1": (0.1 * np.sin(np.arange(int(2.5 * SAMPLE_RATE)) / 10)).astype(np.float32)}
    store = Store()
    ids = store.write_run([with_texts(t) for t in run_a], "decode", audio=audio)
    ids = ids, store.write_run([with_texts(t) for t in run_b], "decode")
    monkeypatch.setattr(Pipeline, "target", lambda *_: pytest.fail("a stored run loaded its target"))
    return ids


def opened(**address: str):
    app = page()
    app.query_params.update(address)
    return app.switch_page("app_pages/compare.py").run()


def param(app, key: str) -> str:
    value = app.query_params[key]
    return value[0] if isinstance(value, list) else value


def test_side_by_side_opens_from_its_address_and_shows_both_runs(two_runs):
    run_a, run_b = two_runs
    app = opened(a=run_a, b=run_b, clip="c1")
    assert not app.exception and not app.error
    assert (app.selectbox(key="side_a").value, app.selectbox(key="side_b").value) == (run_a, run_b)
    assert app.selectbox(key="side_clip").options == ["c1", "c2"] and app.selectbox(key="side_clip").value == "c1"
    shown = frame_with(app, "metric", DIFFERENCE)
    expected = compare_runs(Store(), run_a, run_b).table()
    pd.testing.assert_frame_equal(shown.reset_index(drop=True), expected)
    assert shown.set_index("metric").loc["L", DIFFERENCE] == pytest.approx(3 / 2 - 8 / 5)
    assert any(c.value.startswith("A - B: A is") for c in app.caption)
    # c1: A said "the cat sat up", B "the dog sat down"
    assert '<span style="background:#fde2c8">cat</span>' in text_of(app)
    assert '<span style="background:#cfe3fb">dog</span>' in text_of(app)
    assert '<span style="background:#fde2c8">sat</span>' not in text_of(app)
    drawn = figures(app)
    assert set(drawn) == {"drift_a", "drift_b"} and len(app.get("audio")) == 1
    ranges = {name: (f["layout"]["xaxis"]["range"], f["layout"]["xaxis2"]["range"]) for name, f in drawn.items()}
    assert ranges["drift_a"] == ranges["drift_b"]  # one time axis: the clip's 2.5 s, with a margin of 2% each side
    assert ranges["drift_a"][0] == ranges["drift_a"][1] == pytest.approx([-0.05, 2.55])
    assert any(trace.get("name") == "waveform" for trace in drawn["drift_a"]["data"])

    app.selectbox(key="side_clip").set_value("c2").run()  # the choice goes back into the address
    assert not app.exception and param(app, "clip") == "c2" and (param(app, "a"), param(app, "b")) == (run_a, run_b)
    assert "The two transcripts are the same." in [c.value for c in app.caption]
    app.selectbox(key="side_a").set_value(run_b)
    app.selectbox(key="side_b").set_value(run_a).run()
    swapped = frame_with(app, "metric", DIFFERENCE).set_index("metric")
    assert swapped.loc["L", DIFFERENCE] == pytest.approx(8 / 5 - 3 / 2)  # B - A now: the signs turn
    assert param(app, "a") == run_b


def test_runs_without_a_shared_clip_say_so(two_runs):
    lone = Store().write_run([with_texts(speculative_trace("c7", [1], OTHER))], "decode")
    app = opened(a=two_runs[0], b=lone)
    assert not app.exception
    assert app.error[0].value.startswith("Run A and run B decoded no clip in common (A: c1, c2; B: c7)")
    assert not figures(app)


def test_a_greedy_run_is_shown_with_what_it_has(two_runs):
    greedy = replace(greedy_trace("c1"), clip_hash="hash-c1", reference_text="the cat sat down", text="the cat")
    run_b = Store().write_run([with_texts(greedy)], "decode")
    app = opened(a=two_runs[0], b=run_b)
    assert not app.exception and not app.error
    assert any(i.value.startswith("Run B is a greedy decode: it has no rounds") for i in app.info)
    assert frame_with(app, "metric", DIFFERENCE).metric.tolist() == ["wer"]
    assert set(figures(app)) == {"drift_a", "drift_b"}


def test_the_checkpoints_store_tab_shows_the_routines_a_minus_b(two_runs):
    run_a, run_b = two_runs
    app = page("checkpoints")
    app.selectbox(key="store_a").set_value(run_a)
    app.selectbox(key="store_b").set_value(run_b)
    app.button(key="compare_runs").click().run()
    assert not app.exception and not app.error
    expected = compare(Store().traces(run_a), Store().traces(run_b)).table()
    pd.testing.assert_frame_equal(frame_with(app, "metric", DIFFERENCE), expected)
    assert frame_with(app, "metric", DIFFERENCE).set_index("metric").loc["a1", DIFFERENCE] == pytest.approx(1 - 3 / 5)
    assert any(c.value.startswith("A - B: A is") for c in app.caption)


def test_checkpoints_run_now_and_its_store_tab_agree_on_the_same_runs():
    """The complaint of issue 35: the store tab disagreed with 'run now' on the same runs."""
    app = page("checkpoints")
    app.multiselect(key="checkpoint_drafts").set_value(["whisper-tiny.en/control", "whisper-tiny.en/no-audio"])
    app.slider(key="checkpoint_count").set_value(2)
    app.number_input(key="checkpoint_repeats").set_value(1)
    app.button(key="compare").click().run()
    assert not app.exception and not app.error
    run_now = frame_with(app, "run A", DIFFERENCE)
    assert set(run_now["run A"]) == {"no-audio"} and set(run_now["run B"]) == {"control"}
    assert {"a1", "a2c", "L", "decode_speedup", "total_speedup", "wer"} <= set(run_now.metric)
    assert (run_now.clips == 2).all() and run_now.low.notna().all()
    pair = app.session_state["checkpoints"]["pairs"][0]

    app.selectbox(key="store_a").set_value(pair.run_a)
    app.selectbox(key="store_b").set_value(pair.run_b).run()  # the store held no run to pick when the page opened
    app.button(key="compare_runs").click().run()
    assert not app.exception and not app.error
    from_store = next(f.value for f in app.dataframe if list(f.value.columns) == COLUMNS)
    pd.testing.assert_frame_equal(from_store, run_now[COLUMNS].reset_index(drop=True))
