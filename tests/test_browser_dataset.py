"""The Dataset page in a real browser: Debian's chromium driven by playwright against `streamlit run app.py`.

Decodes five clips of the developer set, sees five rows in the table, saves a screenshot as dataset.png in
$SPECASR_SCREENSHOTS (default cache/screenshots), then selects the worst clip and opens it on Live decode, where it
plays. Skips, saying why, where chromium or playwright is missing.
"""

import os
import re
from pathlib import Path

from test_browser import ROOT, open_browser, playwright, pytestmark, server, settle  # noqa: F401


def test_a_user_decodes_five_clips_and_opens_the_worst(server, speech):  # noqa: F811
    shots = Path(os.environ.get("SPECASR_SCREENSHOTS", ROOT / "cache" / "screenshots"))
    shots.mkdir(parents=True, exist_ok=True)
    with playwright.sync_playwright() as p:
        browser, page = open_browser(p, height=1400, timeout_ms=300_000)
        page.goto(server)  # the sidebar's default settings: the shipped AnchorDraft
        page.get_by_text("Live decode", exact=True).first.wait_for()
        settle(page)
        page.get_by_role("link", name="Dataset").click()
        count = page.get_by_label(re.compile("Clips, spread evenly"))
        count.wait_for()
        settle(page)
        count.fill("5")
        count.press("Enter")
        settle(page)
        page.get_by_role("button", name="Decode the set").click()
        page.get_by_text("5 clips decoded and stored").wait_for()
        settle(page)
        table = page.locator("[data-testid=stDataFrame]")
        grid = table.locator("table[role=grid]")  # the grid's accessible copy: a header row, then the data rows
        assert grid.get_attribute("aria-rowcount") == "6"
        body = page.inner_text("body")
        assert "5 of 5 clips" in body and "Traceback" not in body
        page.screenshot(path=str(shots / "dataset.png"), full_page=True)

        worst = grid.locator("tr[aria-rowindex='2'] td").first.inner_text()  # the first row's clip id
        box = table.bounding_box()
        page.mouse.click(box["x"] + 18, box["y"] + 52)  # the first row's selection box, drawn on the canvas
        settle(page)
        page.get_by_role("link", name=re.compile(f"Open {worst} on Live decode")).click()
        page.get_by_text("L (accepted per round)").wait_for()
        settle(page)
        player = page.frame_locator("iframe").first  # the clip's player, tied to the drift plot
        player.locator(".js-plotly-plot").wait_for()
        assert player.locator("audio").count() == 1 and worst in page.inner_text("body")
        assert "Stale" not in page.inner_text("body")  # the sidebar took the run's settings
        page.screenshot(path=str(shots / "dataset-opened.png"), full_page=True)
        browser.close()
