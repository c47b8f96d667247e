"""Side by side in a real browser: two drafts' runs of the same real clips, opened from a link; a screenshot in
$SPECASR_SCREENSHOTS (default cache/screenshots)."""

import os
from pathlib import Path

from test_browser import ROOT, open_browser, playwright, pytestmark, server, settle  # noqa: F401 (server: a fixture)

from specasr.store import Store
from specasr.trace import Settings


def test_side_by_side_shows_two_drafts_on_the_same_clips(server, tmp_path, pipeline, sample_clips):  # noqa: F811
    clips = [utterance.clip() for utterance in sample_clips[:2]]
    store = Store(tmp_path / "runs.duckdb")  # the server's store
    drafts = [Settings(draft=f"whisper-tiny.en/{name}", k=3, reference="always") for name in ("control", "no-audio")]
    run_a, run_b = (store.write_run([pipeline.decode(clip, draft) for clip in clips], "test") for draft in drafts)
    with playwright.sync_playwright() as p:
        browser, page = open_browser(p, height=1800, timeout_ms=300_000)
        page.goto(f"{server}/compare?a={run_a}&b={run_b}")  # a link, the fresh server's first request
        page.get_by_text("A - B over the 2 clips both runs decoded").wait_for()
        settle(page)
        page.locator(".js-plotly-plot").nth(1).wait_for()
        text = page.inner_text("body")
        assert "Traceback" not in text and page.locator("[data-testid=stException]").count() == 0
        assert text.count("cooler judgment") == 3  # A's transcript of the first clip, B's, and its reference text
        assert "The two transcripts are the same." in text  # a draft does not change the target's greedy output
        assert "A - B: A is" in text and "95% paired bootstrap interval" in text
        assert page.locator(".js-plotly-plot").count() == 2
        assert page.get_by_role("link", name="Live decode").count() == 1  # the app's own navigation
        assert f"a={run_a}" in page.url and f"b={run_b}" in page.url and "clip=cathy-arctic-a0025" in page.url
        ranges = [plot.evaluate("plot => plot.layout.xaxis.range") for plot in page.locator(".js-plotly-plot").all()]
        assert ranges[0] == ranges[1]  # one time axis
        shots = Path(os.environ.get("SPECASR_SCREENSHOTS", ROOT / "cache" / "screenshots"))
        shots.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(shots / "side-by-side.png"), full_page=True)
        browser.close()
