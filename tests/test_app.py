from pathlib import Path

from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parents[1] / "app.py")


def _upload(name: str, content: bytes) -> AppTest:
    app = AppTest.from_file(APP, default_timeout=120).run()
    app.file_uploader[0].upload(name, content).run()
    return app


def test_dashboard_transcribes_an_uploaded_clip(sample_clips):
    app = _upload("clip.wav", sample_clips[0].path.read_bytes())
    assert not app.exception and not app.error
    assert "cooler judgment" in " ".join(m.value for m in app.markdown)
    assert [m.label for m in app.metric] == ["Tokens", "Decode ms per token"]


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
