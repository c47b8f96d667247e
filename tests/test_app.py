from pathlib import Path

from streamlit.testing.v1 import AppTest

from specasr.store import Store

ROOT = Path(__file__).resolve().parents[1]
APP = str(ROOT / "app.py")
RUNS_PAGE = str(ROOT / "pages" / "1_Runs.py")


def _upload(name: str, content: bytes) -> AppTest:
    app = AppTest.from_file(APP, default_timeout=120).run()
    app.file_uploader[0].upload(name, content).run()
    return app


def test_dashboard_transcribes_an_uploaded_clip_and_keeps_the_run(sample_clips):
    before = len(Store().runs())
    app = _upload("clip.wav", sample_clips[0].path.read_bytes())
    assert not app.exception and not app.error
    assert "cooler judgment" in " ".join(m.value for m in app.markdown)
    assert [m.label for m in app.metric] == ["Tokens", "Decode ms per token"]
    runs = Store().runs()
    assert len(runs) == before + 1 and runs.iloc[0].command == "dashboard"
    assert runs.iloc[0].run_id in " ".join(c.value for c in app.caption)


def test_dashboard_reports_bad_audio_without_crashing():
    app = _upload("notes.wav", b"plain text, not audio")
    assert not app.exception
    assert "cannot decode notes.wav" in app.error[0].value


def test_dashboard_shows_acceptance_and_drift_for_a_draft(sample_clips):
    app = AppTest.from_file(APP, default_timeout=180).run()
    app.selectbox[3].set_value("random").run()
    app.selectbox[4].set_value("float16").run()
    app.file_uploader[0].upload("clip.wav", sample_clips[0].path.read_bytes()).run()
    assert not app.exception and not app.error
    assert "cooler judgment" in " ".join(m.value for m in app.markdown)
    labels = [m.label for m in app.metric]
    assert {"a1 (restart)", "a2c (continuation)", "L (accepted per round)", "Rounds"} <= set(labels)
    assert [h.value for h in app.subheader] == ["Transcript", "Alignment drift"]
    latest = Store().runs().iloc[0]
    assert (latest.draft, latest.draft_dtype, latest.command) == ("random", "float16", "dashboard")


def test_runs_page_lists_the_stored_runs(sample_clips):
    _upload("clip.wav", sample_clips[0].path.read_bytes())
    page = AppTest.from_file(RUNS_PAGE, default_timeout=60).run()
    assert not page.exception and not page.error
    shown = page.dataframe[0].value
    assert len(shown) == len(Store().runs()) >= 1
    assert {"run_id", "target", "draft_name", "window", "k", "clips", "rounds", "draft_steps"} <= set(shown.columns)
