"""One clip, followed everywhere: the clip a page measures is the clip the user is looking at (AppTest)."""

from dataclasses import replace

from streamlit.testing.v1 import AppTest
from test_app import APP, frame_with, page, upload, use_random_draft

from specasr.store import Store
from specasr.trace import Settings

RANDOM = Settings(draft="random", draft_dtype="float16", k=2)


def opened(run_id: str) -> AppTest:
    app = AppTest.from_file(APP, default_timeout=300)
    app.query_params["run"] = run_id
    return app.run()


def test_a_stored_runs_link_opens_with_its_clip_as_the_input_and_run_decodes_it(sample_clips, pipeline):
    clip = sample_clips[1].clip()
    run_id = Store().write_run([pipeline.decode(clip, RANDOM)], "decode")
    app = opened(run_id)
    assert not app.exception and not app.error
    audio = app.radio(key="decode_source")
    assert audio.value == "followed" and audio.options[0] == clip.id  # the option reads as the clip's name
    assert any(c.value.startswith(f"{clip.id}: {clip.seconds:.1f} s, from {clip.path}") for c in app.caption)
    app.button(key="run").click().run()
    assert not app.exception and not app.error
    decoded = app.session_state["decoded"]["trace"]
    assert (decoded.clip_id, decoded.clip_hash) == (clip.id, clip.hash) and app.query_params["run"] != run_id


def test_a_stored_run_whose_audio_is_gone_says_so_and_decodes_nothing(sample_clips, pipeline):
    clip = replace(sample_clips[2].clip(), path="")  # an upload whose audio was not kept
    run_id = Store().write_run([pipeline.decode(clip, RANDOM)], "decode")
    app = opened(run_id)
    assert not app.exception and not app.error
    assert app.radio(key="decode_source").value == "followed"
    assert app.warning[0].value.startswith(f"{clip.id} comes from run {run_id}, whose audio is neither stored")
    assert app.button(key="run").disabled  # never the example in its place


def test_an_upload_on_live_decode_is_the_clip_windows_and_checkpoints_measure(sample_clips):
    app = page()
    upload(app, "decode", "mine.wav", sample_clips[0].path.read_bytes())
    app.switch_page("app_pages/windows.py").run()
    assert app.radio(key="windows_source").value == "followed"
    use_random_draft(app, k=2)
    app.button(key="run_windows").click().run()
    assert not app.exception and not app.error
    measured = {trace.clip_id for trace in app.session_state["windows"]["traces"].values()}
    assert measured == {"mine.wav"}
    app.switch_page("app_pages/checkpoints.py").run()
    assert app.radio(key="checkpoint_source").value == "one clip"
    assert app.radio(key="checkpoints_source").value == "followed"


def test_picking_the_example_is_followed_too():
    app = page()
    app.radio(key="decode_source").set_value("example clip").run()
    app.switch_page("app_pages/windows.py").run()
    assert app.radio(key="windows_source").value == "example clip"
    assert "followed" not in app.radio(key="windows_source").options
    app.switch_page("app_pages/checkpoints.py").run()
    assert app.radio(key="checkpoint_source").value == "evaluation clips"


def test_side_by_side_lists_the_followed_clips_runs_first(sample_clips, pipeline):
    clip = sample_clips[3].clip()
    runs = [Store().write_run([pipeline.decode(clip, replace(RANDOM, k=k))], "decode") for k in (2, 3)]
    Store().write_run([pipeline.decode(sample_clips[0].clip(), RANDOM)], "decode")  # newer, another clip
    app = opened(runs[0])
    app.switch_page("app_pages/compare.py").run()
    assert not app.exception and not app.error
    assert {app.selectbox(key="side_a").value, app.selectbox(key="side_b").value} == set(runs)
    assert frame_with(app, "metric", "A - B") is not None
