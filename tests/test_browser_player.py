"""The drift player in a real browser: Debian's chromium, driven by playwright, opens the player's HTML from a file (no
Streamlit server), clicks a token's marker on the drift plot with the mouse, and checks that the clip plays from that
token's time and that the playhead follows the audio as it really plays. Saves a screenshot as player.png in
$SPECASR_SCREENSHOTS (default cache/screenshots). Skips, saying why, where chromium or playwright is missing."""

import os
from pathlib import Path

import pytest
from test_browser import CHROMIUM, CHROMIUM_ARGS, ROOT, playwright, pytestmark  # noqa: F401 (pytestmark: the skip)
from test_player import PIECES, clip
from test_views import long_trace

from player import player_height, player_html
from specasr.views import drift_figure

ARGS = [*CHROMIUM_ARGS, "--autoplay-policy=no-user-gesture-required"]
PLAYHEAD_X = "document.getElementById('plot').layout.shapes.at(-1).x0"


def click_marker(page, trace: int, point: int) -> None:
    """A real mouse click on a marker of the lower subplot (the tokens), once plotly shows the marker's hover label:
    plotly reports a click on the point it is hovering."""
    marker = page.locator(".subplot.x2y2 .scatterlayer .trace").nth(trace).locator("path.point").nth(point)
    box = marker.bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.locator(".hoverlayer .hovertext").first.wait_for()
    page.mouse.down()
    page.mouse.up()


def test_clicking_a_token_plays_the_clip_from_its_time_under_a_moving_playhead(tmp_path):
    audio = clip(70.0)
    figure = drift_figure(long_trace(), PIECES, layer=0, audio=audio)  # tokens heard at 2 s, 30 s and 58 s
    document = tmp_path / "player.html"
    document.write_text(player_html(figure, audio))
    shots = Path(os.environ.get("SPECASR_SCREENSHOTS", ROOT / "cache" / "screenshots"))
    shots.mkdir(parents=True, exist_ok=True)
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1100, "height": player_height(figure)})
        page.set_default_timeout(60_000)
        fetched = []
        page.on("request", lambda request: fetched.append(request.url))
        page.goto(document.as_uri())
        page.wait_for_function("document.getElementById('clip').readyState >= 1")  # its duration known: seekable
        page.locator(".subplot.x2y2 .scatterlayer .trace path.point").first.wait_for()
        assert page.evaluate("document.getElementById('clip').duration") == pytest.approx(70.0)
        page.evaluate(
            "window.seekedTo = null;"
            "document.getElementById('clip').addEventListener('seeking', e => window.seekedTo = e.target.currentTime)"
        )

        click_marker(page, trace=0, point=1)  # the accepted draft proposal for token 1, heard at 30 s
        page.wait_for_function("window.seekedTo !== null")
        assert page.evaluate("window.seekedTo") == pytest.approx(30.0, abs=0.01)
        # it plays on: the playhead passes half a second after the token while the clip is still playing
        page.wait_for_function(f"{PLAYHEAD_X} > 30.5 && !document.getElementById('clip').paused")
        page.evaluate("document.getElementById('clip').pause()")
        page.wait_for_function(f"Math.abs({PLAYHEAD_X} - document.getElementById('clip').currentTime) < 1e-3")
        stopped = page.evaluate("document.getElementById('clip').currentTime")
        assert stopped > 30.5
        shapes = page.evaluate("document.getElementById('plot').layout.shapes.map(s => [s.x0, s.yref, s.y0, s.y1])")
        assert shapes[:2] == [[pytest.approx(cut), "paper", 0, 1] for cut in (28.0, 56.0)]  # the window cuts stay
        assert shapes[2] == [pytest.approx(stopped, abs=1e-3), "paper", 0, 1]  # the playhead spans the figure
        assert all(url.startswith("file:") or url.startswith("data:") for url in fetched)  # nothing from the network
        page.screenshot(path=str(shots / "player.png"), full_page=True)
        browser.close()
