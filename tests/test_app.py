"""Every dashboard page as a user drives it (Streamlit AppTest, widgets by key)."""

import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import soundfile
from streamlit.testing.v1 import AppTest
from test_experiments import BASE, hand_trace, peaks_trace, restarts

from specasr import WINDOWS
from specasr.audio import SAMPLE_RATE
from specasr.experiments import COMMAND, stored_grid
from specasr.pipeline import Pipeline
from specasr.store import Store, StoreError
from specasr.trace import Settings

ROOT = Path(__file__).resolve().parents[1]
APP = str(ROOT / "app.py")


def page(name: str | None = None, timeout: int = 300) -> AppTest:
    app = AppTest.from_file(APP, default_timeout=timeout).run()
    return app.switch_page(f"app_pages/{name}.py").run() if name else app


def figures(app: AppTest) -> dict[str, dict]:
    return {chart.key: json.loads(chart.proto.spec) for chart in app.get("plotly_chart")}


def names(figure: dict) -> list[str]:
    return [trace.get("name") for trace in figure["data"]]


def use_random_draft(app: AppTest, k: int = 2) -> None:
    app.sidebar.selectbox(key="draft").set_value("random")
    app.sidebar.selectbox(key="draft_dtype").set_value("float16")
    app.sidebar.slider(key="k").set_value(k)


def upload(app: AppTest, key: str, name: str, content: bytes) -> None:
    app.radio(key=f"{key}_source").set_value("upload").run()
    app.get("file_uploader")[0].upload(name, content).run()


def frame_with(app: AppTest, *columns: str):
    """The first table on the page holding these columns (Streamlit does not address tables by key)."""
    return next(f.value for f in app.dataframe if set(columns) <= set(f.value.columns))


def text_of(app: AppTest) -> str:
    return " ".join(m.value for m in app.markdown)


def test_live_decode_shows_transcript_metrics_and_drift(sample_clips):
    before = len(Store().runs())
    app = page()
    use_random_draft(app)
    upload(app, "decode", "clip.wav", sample_clips[0].path.read_bytes())
    app.text_input(key="decode_text").set_value(sample_clips[0].text)
    app.button(key="run").click().run()
    assert not app.exception and not app.error
    assert "cooler" in text_of(app) and "judgment" in text_of(app)
    labels = {m.label for m in app.metric}
    assert {"a1 (restart)", "a2c (continuation)", "L (accepted per round)"} <= labels
    wer = next(m.value for m in app.metric if m.label == "Word error rate against the reference")
    assert wer == f"{Store().runs().median_wer.iloc[0]:.1%}"  # the stored decode's WER, shown
    assert "Decode-phase speedup" not in labels and app.info[0].value.startswith("Not timed")  # Run only decodes
    player = app.get("iframe")[0].proto.srcdoc  # the clip's player over the drift plot
    assert "data:audio/wav;base64," in player and '"name":"forced alignment"' in player
    app.toggle(key="listen").set_value(False).run()  # the plain chart, to read its figure
    drift = figures(app)["drift"]
    assert {"waveform", "draft peak, proposal rejected", "forced alignment"} <= set(names(drift))
    assert any(n.startswith("target verification peak") for n in names(drift))
    runs = Store().runs()
    assert len(runs) == before + 1 and runs.command.iloc[0] == "dashboard"
    assert any(runs.run_id.iloc[0] in c.value for c in app.caption)

    assert app.number_input(key="repeats").value == 5
    app.number_input(key="repeats").set_value(2)
    app.button(key="time_it").click().run()  # greedy, speculative and greedy's A/A copy, two repetitions each
    assert not app.exception and not app.error and not app.info
    speedup = next(m for m in app.metric if m.label.startswith("Decode-phase speedup"))
    assert re.fullmatch(r"\d+\.\d\dx \[\d+\.\d\d, \d+\.\d\d\]", speedup.value)  # the median and its spread
    runs = Store().runs()
    assert len(runs) == before + 4 and set(runs.command.iloc[:3]) == {"dashboard-bench"}
    shown = " ".join(c.value for c in app.caption)
    assert "medians of 2 warm repetitions per arm" in shown and "A/A check, greedy timed twice" in shown
    assert "Speedups against greedy decoding on cpu (float32) of clip.wav," in shown  # the baseline and the clip
    reliable = re.search(r"the speedups above are (reliable|UNRELIABLE)", shown).group(1) == "reliable"
    assert speedup.label == "Decode-phase speedup" + ("" if reliable else " (UNRELIABLE)")  # the verdict, beside it

    app.selectbox(key="layer_whisper-tiny.en").set_value(0).run()  # a new layer redraws; it does not decode again
    assert len(Store().runs()) == before + 4
    assert "target verification peak (layer 0)" in names(figures(app)["drift"])
    assert any(m.label.startswith("Decode-phase speedup") for m in app.metric)  # the timing stays with the decode


def test_a_tree_decode_is_stored_with_its_tree_and_draws_a_round_of_it(sample_clips):
    app = page()
    use_random_draft(app)
    app.sidebar.slider(key="tree_width").set_value(2).run()  # the node count opens with a tree
    app.sidebar.number_input(key="tree_nodes").set_value(3)
    upload(app, "decode", "clip.wav", sample_clips[0].path.read_bytes())
    app.button(key="run").click().run()
    assert not app.exception and not app.error
    stored = Store().traces(app.query_params["run"])[0]
    assert (stored.settings.k, stored.settings.tree_width, stored.settings.tree_nodes) == (2, 2, 3)
    assert (app.query_params["tree_width"], app.query_params["tree_nodes"]) == ("2", "3")
    assert any("a tree of width 2 verifying 3 nodes per round" in c.value for c in app.caption)
    tree = figures(app)["tree"]
    assert {"root: the last verified token", "the target's own next token"} <= set(names(tree))
    drawn = sum(len(t["text"]) for t in tree["data"] if t.get("name", "").startswith("node "))
    longest = max(r.accepted for r in stored.rounds)
    picker = next(s for s in app.selectbox if s.label == "Round")
    assert picker.value == next(r.index for r in stored.rounds if r.accepted == longest) and drawn == 3


def test_a_tree_the_settings_do_not_allow_shows_why_and_decodes_nothing():
    before = len(Store().runs())
    app = page()
    use_random_draft(app)
    app.sidebar.slider(key="tree_width").set_value(2).run()  # the node count opens with a tree
    app.sidebar.number_input(key="tree_nodes").set_value(7).run()  # K=2, width 2: 2 + 4 candidates
    assert not app.exception
    assert "it can verify 1 to 6 nodes per round, not 7" in app.error[0].value and not app.button
    app.sidebar.number_input(key="tree_nodes").set_value(0)
    app.sidebar.slider(key="threshold").set_value(0.5).run()
    assert not app.exception
    assert app.error[0].value.startswith("These settings cannot be decoded: a confidence threshold cuts a chain")
    app.sidebar.slider(key="tree_width").set_value(1).run()  # a chain may stop at a threshold
    assert not app.error and app.button(key="run") and len(Store().runs()) == before


def fill_the_disk(monkeypatch: pytest.MonkeyPatch) -> str:
    """Every store write fails from now on, as it would on a full disk; returns the reason the store gives."""
    reason = "cannot write runs.duckdb: it is on a full disk"

    def fail(*args, **kwargs):
        raise StoreError(reason)

    monkeypatch.setattr(Store, "write_run", fail)
    monkeypatch.setattr(Store, "write_runs", fail)
    return reason


def test_a_decode_the_store_cannot_take_stays_on_screen_and_says_so(sample_clips, monkeypatch):
    full_disk = fill_the_disk(monkeypatch)
    before = len(Store().runs())
    app = page()
    use_random_draft(app)
    upload(app, "decode", "clip.wav", sample_clips[0].path.read_bytes())
    app.button(key="run").click().run()
    assert not app.exception and not app.error
    assert "cooler" in text_of(app) and any(m.label == "L (accepted per round)" for m in app.metric)
    assert [w.value for w in app.warning] == [f"This decode was not stored: {full_disk}"]
    assert "run" not in app.query_params and len(Store().runs()) == before
    app.toggle(key="listen").set_value(False).run()  # the page drawn again: the result and its warning stay
    assert "cooler" in text_of(app) and "drift" in figures(app) and app.warning[0].value.endswith(full_disk)

    app.number_input(key="repeats").set_value(1)
    app.button(key="time_it").click().run()
    assert not app.exception and not app.error
    assert any(m.label.startswith("Decode-phase speedup") for m in app.metric)
    assert f"These timings were not stored: {full_disk}" in [w.value for w in app.warning]
    assert len(Store().runs()) == before


def test_a_bad_upload_shows_its_message_and_stores_nothing():
    before = len(Store().runs())
    app = page()
    upload(app, "decode", "notes.wav", b"plain text, not audio")
    assert not app.exception
    assert "cannot decode notes.wav" in app.error[0].value
    assert app.button(key="run").disabled and len(Store().runs()) == before


def test_a_clip_over_the_sidebars_length_limit_says_where_to_raise_it(tmp_path):
    path = tmp_path / "long.wav"
    soundfile.write(path, np.full(31 * SAMPLE_RATE, 0.1, dtype=np.float32), SAMPLE_RATE)
    app = page()
    app.sidebar.number_input(key="longest").set_value(0.5).run()
    upload(app, "decode", "long.wav", path.read_bytes())
    assert not app.exception
    assert app.error[0].value == (
        "long.wav is 31.00 s long, over the 30 s limit: raise Longest clip in the sidebar, or split the clip."
    )
    app.sidebar.number_input(key="longest").set_value(1.0).run()
    assert not app.error and not app.button(key="run").disabled


def test_a_local_folder_target_is_read_and_refused_with_its_reason(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')
    before = len(Store().runs())
    app = page()
    app.sidebar.selectbox(key="target").set_value("a local model folder").run()
    app.sidebar.text_input(key="target_folder").set_value(str(tmp_path)).run()
    assert app.sidebar.selectbox(key="draft").options == ["random", "random-no-audio"]  # no shipped draft fits it
    app.button(key="run").click().run()
    assert not app.exception
    assert "'bert' model; specasr reads these families: whisper, qwen3_asr, voxtral" in app.error[0].value
    assert len(Store().runs()) == before


def test_windows_page_draws_every_window():
    app = page("windows")
    use_random_draft(app, k=3)
    app.button(key="run_windows").click().run()
    assert not app.exception and not app.error
    survival = figures(app)["survival"]
    assert names(survival) == list(WINDOWS)
    assert names(figures(app)["error"]) == list(WINDOWS)  # each window's anchor error by depth
    assert frame_with(app, "window", "L", "run").window.tolist() == list(WINDOWS)
    differences = frame_with(app, "window", "metric", "A - B")  # each window against unrestricted, on one clip
    assert set(differences.window) == set(WINDOWS) - {"unrestricted"}
    assert "low" not in differences and "None" not in differences.to_string()  # one clip: no interval to show


def test_windows_the_store_cannot_take_stay_on_screen_and_say_so(monkeypatch):
    full_disk = fill_the_disk(monkeypatch)
    app = page("windows")
    use_random_draft(app, k=3)
    app.button(key="run_windows").click().run()
    assert not app.exception and not app.error
    summary = frame_with(app, "window", "L", "run")
    assert summary.window.tolist() == list(WINDOWS) and summary.run.isna().all()
    assert f"These decodes were not stored: {full_disk}" in [w.value for w in app.warning]
    assert not app.get("page_link")  # no side-by-side links to runs that do not exist


def test_checkpoints_page_compares_two_drafts():
    app = page("checkpoints")
    app.multiselect(key="checkpoint_drafts").set_value(["whisper-tiny.en/anchordraft", "random"])
    app.slider(key="checkpoint_count").set_value(1)
    assert app.number_input(key="checkpoint_repeats").value == 5
    app.number_input(key="checkpoint_repeats").set_value(2)
    app.button(key="compare").click().run()
    assert not app.exception and not app.error
    cells = frame_with(app, "draft", "lossless_clips")
    assert set(cells.draft) == {"anchordraft", "random"} and (cells.clips == 1).all()
    assert (cells.decode_speedup_low <= cells.decode_speedup_high).all()
    assert app.warning[0].value.startswith("2 timing repetitions per clip (under 5): a clip's median leaves few")
    assert frame_with(app, "phase", "ratio", "reliable").phase.tolist() == ["decode", "total"]  # the A/A check
    differences = frame_with(app, "run A", "run B", "metric", "A - B")
    assert set(differences[["run A", "run B"]].itertuples(index=False, name=None)) == {("random", "anchordraft")}
    assert {"a1", "L"} <= set(differences.metric)
    assert any(c.value.startswith("no set reaches 20 clips: pooled over all 1 clips") for c in app.caption)  # the rule


def test_checkpoints_the_store_cannot_take_stay_on_screen_and_say_so(monkeypatch):
    full_disk = fill_the_disk(monkeypatch)
    app = page("checkpoints")
    app.multiselect(key="checkpoint_drafts").set_value(["whisper-tiny.en/anchordraft", "random"])
    app.slider(key="checkpoint_count").set_value(1)
    app.number_input(key="checkpoint_repeats").set_value(1)
    app.button(key="compare").click().run()
    assert not app.exception and not app.error
    assert set(frame_with(app, "draft", "lossless_clips").draft) == {"anchordraft", "random"}
    assert {"a1", "L"} <= set(frame_with(app, "run A", "run B", "metric", "A - B").metric)
    not_stored = [w.value for w in app.warning if w.value.startswith("Not stored")]
    assert len(not_stored) == 1 and not_stored[0].endswith(full_disk)
    assert not [link for link in app.get("page_link") if "side by side" in link.proto.label]  # no runs to open


@pytest.fixture
def stored_run() -> str:
    """A speculative run of two hand-built traces in the session's store."""
    draft = replace(BASE, draft="random", reference="always")
    traces = [hand_trace(draft, c, [2, 0, 1], 1.0, steps=restarts([2, 0, 1], [0, 3, 30])) for c in "uv"]
    return Store().write_run(traces, "decode")


def test_runs_page_lists_a_stored_run_and_opens_it(stored_run):
    app = page("runs")
    assert not app.exception and not app.error
    listed = frame_with(app, "run_id", "command", "draft_steps")
    assert len(listed) == len(Store().runs()) >= 1
    run_id = listed.run_id.iloc[0]
    assert run_id == stored_run and any(run_id in c.value for c in app.caption)

    opened = AppTest.from_file(APP, default_timeout=120)
    opened.query_params["run"] = run_id
    opened.run()
    assert not opened.exception and not opened.error
    assert any(run_id in c.value for c in opened.caption)


def test_a_shared_run_opens_in_a_fresh_session_without_its_model(sample_clips, pipeline, monkeypatch):
    """A dashboard decode of an upload, opened from its address alone: audio, waveform, transcript, drift, heatmap
    and rounds come from the store, and the sidebar shows the settings it ran with."""
    settings = Settings(draft="whisper-tiny.en/control", window="correct", k=3, keep_attention=True, reference="always")
    clip = replace(sample_clips[0].clip(), path="")  # an upload: no file to read it back from
    trace = pipeline.decode(clip, settings)
    run_id = Store().write_run([trace], "dashboard", audio={clip.hash: clip.audio})
    monkeypatch.setattr(Pipeline, "target", lambda *_: pytest.fail("a stored run loaded its target"))

    app = AppTest.from_file(APP, default_timeout=120)
    app.query_params["run"] = run_id
    app.run()
    assert not app.exception and not app.error
    player = app.get("iframe")[0].proto.srcdoc
    assert "data:audio/wav;base64," in player and '"name":"waveform"' in player and "cooler" in text_of(app)
    assert "heatmap" in figures(app)
    assert (app.sidebar.selectbox(key="window").value, app.sidebar.slider(key="k").value) == ("correct", 3)
    assert app.sidebar.selectbox(key="draft").value == "whisper-tiny.en/control"
    assert not app.warning  # the sidebar matches the shown run: nothing is stale
    app.sidebar.slider(key="k").set_value(4).run()
    assert app.warning[0].value.startswith("Stale: the result below was decoded with other settings (k differ")


def test_a_stored_tree_opens_with_its_tree_without_its_model(sample_clips, pipeline, monkeypatch):
    settings = Settings(draft="random", draft_dtype="float16", k=2, tree_width=2, tree_nodes=4)
    trace = pipeline.decode(sample_clips[0].clip(), settings)
    run_id = Store().write_run([trace], "decode")
    monkeypatch.setattr(Pipeline, "target", lambda *_: pytest.fail("a stored run loaded its target"))

    app = AppTest.from_file(APP, default_timeout=120)
    app.query_params["run"] = run_id
    app.run()
    assert not app.exception and not app.error
    assert "tree" in figures(app)
    assert (app.sidebar.slider(key="tree_width").value, app.sidebar.number_input(key="tree_nodes").value) == (2, 4)
    assert not app.warning  # the sidebar took the run's tree: nothing is stale
    app.sidebar.slider(key="tree_width").set_value(3).run()
    assert app.warning[0].value.startswith("Stale: the result below was decoded with other settings (tree_width differ")


def test_the_sidebar_keeps_its_settings_from_page_to_page():
    app = page()
    app.sidebar.slider(key="k").set_value(7)
    app.sidebar.selectbox(key="window").set_value("shift").run()
    for name in ("dataset", "windows", "compare", "decode"):  # Side by side draws no settings: they come back after it
        app.switch_page(f"app_pages/{name}.py").run()
        assert not app.exception and not app.warning
        assert name == "compare" or app.sidebar.slider(key="k").value == 7
    assert app.sidebar.selectbox(key="window").value == "shift"


def test_settings_in_the_address_set_the_sidebar():
    app = AppTest.from_file(APP, default_timeout=60)
    app.query_params.update(
        {"window": "shift", "k": "7", "draft": "no-such-draft", "tree_width": "3", "tree_nodes": "12"}
    )
    app.run()
    assert not app.exception
    assert (app.sidebar.selectbox(key="window").value, app.sidebar.slider(key="k").value) == ("shift", 7)
    assert (app.sidebar.slider(key="tree_width").value, app.sidebar.number_input(key="tree_nodes").value) == (3, 12)
    assert app.sidebar.selectbox(key="draft").value != "no-such-draft"  # not a choice: the default stays
    assert app.query_params["k"] == ["7"] or app.query_params["k"] == "7"


def test_drift_page_draws_stored_runs(stored_run):
    app = page("drift")
    assert not app.exception and not app.error
    assert "drift_acceptance" in figures(app)


def test_cost_rule_page_shows_the_runtime_table_of_a_stored_experiment():
    store = Store()
    greedy = replace(BASE, k=0, verify_peaks=False, reference="never")
    base = replace(BASE, draft="anchordraft")
    runtime = replace(base, window="runtime")
    timed = (0.05, 0.2)
    store.write_run([peaks_trace("u", [1, 2, 3], [0]), peaks_trace("v", [4, 5], [0])], COMMAND)
    cells = [
        [hand_trace(settings, c, rounds, 1.0, steps=restarts(rounds, [0, 0, 0]), round_seconds=timed) for c in "uv"]
        for settings, rounds in ((base, [0, 1, 0]), (runtime, [1, 1, 2]))
    ]
    greedy_traces = [hand_trace(greedy, "u", [], 2.0), hand_trace(greedy, "v", [], 2.0)]
    baseline, *_ = store.write_runs([(greedy_traces, None), *((traces, None) for traces in cells)], COMMAND)
    assert stored_grid(store, "whisper-tiny.en").baseline == baseline

    app = page("cost_rule")
    assert not app.exception and not app.error
    for key, value in {"rule_L": 1.0, "rule_k": 4, "rule_rho": 0.1, "rule_dL": 0.1, "rule_dC": 0.05}.items():
        app.number_input(key=key).set_value(value)
    app.run()  # 0.1 / 2 = 0.050 recovered against 0.05 / 1.4 = 0.036 of cost
    assert "the correction **pays**" in text_of(app) and app.metric[0].value == "+0.014"
    app.number_input(key="rule_dC").set_value(0.2).run()  # 0.2 / 1.4 = 0.143
    assert "the correction **does not pay**" in text_of(app) and app.metric[0].value == "-0.093"
    row = frame_with(app, "d_L", "cost", "predicted_pays").iloc[0]
    assert (row.window, row.d_L) == ("runtime", pytest.approx(4 / 3 - 1 / 3))
    assert "rule_figure" in figures(app)


def test_cost_rule_page_runs_an_experiment_with_progress_and_shows_its_tables():
    app = page("cost_rule")
    before = stored_grid(Store(), "whisper-tiny.en")
    app.slider(key="rule_clips").set_value(1)
    app.multiselect(key="rule_ks").set_value([2])
    app.number_input(key="rule_repeats").set_value(1)
    app.button(key="rule_run").click().run()
    assert not app.exception and not app.error
    runs = stored_grid(Store(), "whisper-tiny.en")
    assert before is None or runs.baseline != before.baseline
    assert {s.window for s in runs.cells} == {"unrestricted", "shift", "runtime"}
    runtime = frame_with(app, "d_L", "cost", "predicted_pays")
    assert set(runtime.uncorrected) == {"unrestricted", "shift"}
