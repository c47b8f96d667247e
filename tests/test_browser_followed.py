"""In a real browser: a stored run's link opens with its own clip as the input, and two users pressing Run at once
each get their own decode, stored."""

from test_browser import open_browser, playwright, pytestmark, server, settle  # noqa: F401 (server: a fixture)

from specasr.store import Store
from specasr.trace import Settings

CONTROL = Settings(draft="whisper-tiny.en/control", k=3)


def test_a_stored_runs_link_shows_its_clip_as_the_input(server, tmp_path, pipeline, sample_clips):  # noqa: F811
    clip = sample_clips[1].clip()
    store = Store(tmp_path / "runs.duckdb")  # the server's store
    run_id = store.write_run([pipeline.decode(clip, CONTROL)], "decode")
    with playwright.sync_playwright() as p:
        browser, page = open_browser(p, height=1600)
        page.goto(f"{server}/?run={run_id}")
        page.get_by_text("L (accepted per round)").wait_for()
        settle(page)
        assert page.get_by_role("radio", name=clip.id).is_checked()  # the Audio input reads the run's clip
        assert not page.get_by_role("radio", name="example clip").is_checked()
        assert f"{clip.id}: {clip.seconds:.1f} s, from {clip.path}" in page.inner_text("body")
        page.get_by_role("button", name="Run", exact=True).click()
        page.wait_for_function(f"() => !window.location.search.includes('run={run_id}')")  # a new run, stored
        settle(page)
        newest = store.traces(store.runs().run_id.iloc[0])[0]
        assert (newest.clip_id, newest.clip_hash) == (clip.id, clip.hash)
        browser.close()


def test_two_users_pressing_run_at_once_each_get_their_decode(server, tmp_path, pipeline, sample_clips):  # noqa: F811
    clips = [sample_clips[0], sample_clips[2]]
    alone = {u.id: pipeline.decode(u.clip(), CONTROL).tokens for u in clips}
    with playwright.sync_playwright() as p:
        browser, _ = open_browser(p, height=1600)
        pages = []
        for utterance in clips:  # two contexts: two users, two Streamlit sessions
            page = browser.new_context(viewport={"width": 1400, "height": 1600}).new_page()
            page.set_default_timeout(300_000)
            page.goto(f"{server}/?draft={CONTROL.draft}&k={CONTROL.k}")
            page.get_by_text("upload", exact=True).click()
            page.set_input_files("input[type=file]", str(utterance.path))
            page.get_by_text(utterance.path.name[-9:]).wait_for()
            settle(page)
            pages.append(page)
        for page in pages:
            page.get_by_role("button", name="Run", exact=True).click()
        for page in pages:
            page.get_by_text("L (accepted per round)").wait_for()
            settle(page)
            assert "Traceback" not in page.inner_text("body")
        browser.close()
    store = Store(tmp_path / "runs.duckdb")
    decoded = {t.clip_id: t.tokens for run_id in store.runs().run_id for t in store.traces(run_id)}
    assert decoded == {f"{u.path.name}": alone[u.id] for u in clips}  # both stored, each as decoded alone
