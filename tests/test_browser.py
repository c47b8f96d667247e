"""The dashboard in a real browser: Debian's chromium driven by playwright against `streamlit run app.py`.

Uploads a clip, presses Run, waits for the drift plot, times it, visits every page and saves a screenshot of each in
$SPECASR_SCREENSHOTS (default cache/screenshots); decodes with a draft tree and saves the tree of a round. Skips,
saying why, where chromium or playwright is missing.
"""

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import soundfile

from specasr.audio import SAMPLE_RATE, load_audio
from specasr.dataset import load_manifest
from specasr.trace import WINDOWS

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium")
playwright = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install chromium)"
)


CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking"]


def open_browser(p, height: int, timeout_ms: int = 300_000):
    """Debian's chromium and a page of it, 1400 px wide."""
    browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
    page = browser.new_page(viewport={"width": 1400, "height": height})
    page.set_default_timeout(timeout_ms)
    return browser, page


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def server(tmp_path):
    port = free_port()
    env = os.environ | {"SPECASR_DB": str(tmp_path / "runs.duckdb")}
    command = [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        "app.py",
        "--server.headless",
        "true",
        "--server.port",
        str(port),
    ]
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            urllib.request.urlopen(f"{url}/_stcore/health", timeout=2)
            break
        except OSError:
            if time.monotonic() > deadline or process.poll() is not None:
                process.kill()
                pytest.fail("the dashboard did not start")
            time.sleep(0.5)
    yield url
    process.terminate()
    process.wait(timeout=30)


def settle(page) -> None:
    """Wait until the script run is over (Streamlit shows its running indicator until then)."""
    page.wait_for_timeout(500)
    page.wait_for_selector("[data-testid=stStatusWidget]", state="detached")


def pick_last_option(page, select) -> None:
    """Open a selectbox and take its last option. A script run that ends meanwhile redraws the box and closes its
    list, so the list is opened again until it stays open."""
    for _ in range(10):
        select.click()
        try:
            page.get_by_role("option").last.click(timeout=10_000)
            return
        except playwright.TimeoutError:
            settle(page)
    raise AssertionError("the selectbox's list never stayed open")


def test_a_user_decodes_a_clip_and_visits_every_page(server, sample_clips):
    shots = screenshots()
    with playwright.sync_playwright() as p:
        browser, page = open_browser(p, height=2400, timeout_ms=300_000)
        page.goto(server)
        page.get_by_text("Live decode", exact=True).first.wait_for()
        page.get_by_text("upload", exact=True).click()
        page.set_input_files("input[type=file]", str(sample_clips[0].path))
        page.get_by_text(sample_clips[0].path.name[-9:]).wait_for()  # the uploader shortens long names
        page.get_by_label("Reference text (optional: what is said, for the word error rate)").fill(sample_clips[0].text)
        page.keyboard.press("Enter")
        settle(page)
        page.get_by_role("button", name="Run", exact=True).click()
        page.get_by_text("L (accepted per round)").wait_for()
        settle(page)
        assert "Word error rate against the reference" in page.inner_text("body")
        shared = page.url  # the address now names the run and the settings
        assert "run=" in shared and "draft=" in shared
        page.frame_locator("iframe").first.locator(".js-plotly-plot").wait_for()  # the drift plot with its player
        assert "Not timed" in page.inner_text("body")  # Run decodes; timing waits for its own button
        page.get_by_role("button", name="Time it").click()
        page.get_by_text(re.compile(r"^timed: \d+ of \d+ decodes · ")).wait_for()  # its progress, while it times
        page.get_by_text("Decode-phase speedup").wait_for()
        settle(page)
        text = page.inner_text("body")
        assert "judgment" in text and "A/A check" in text and "Traceback" not in text
        page.screenshot(path=str(shots / "live-decode.png"), full_page=True)

        uploaded = sample_clips[0].path.name
        page.get_by_role("link", name="Windows").click()
        page.get_by_role("button", name="Run every window").wait_for()
        settle(page)
        assert page.get_by_role("radio", name=uploaded).is_checked()  # the upload, followed from Live decode
        page.get_by_role("button", name="Run every window").click()
        page.get_by_text("Anchor error by depth").wait_for()
        settle(page)
        assert f"{uploaded}: whisper-tiny.en" in page.inner_text("body")  # the result names the clip it measured
        page.locator(".js-plotly-plot").nth(1).wait_for()
        page.screenshot(path=str(shots / "windows.png"), full_page=True)

        page.get_by_role("link", name="Checkpoints").click()
        page.get_by_text("Compare").first.wait_for()
        settle(page)
        assert page.get_by_role("radio", name="one clip").is_checked()
        assert page.get_by_role("radio", name=uploaded).is_checked()

        for name, expected in (
            ("Drift", "Drift by draft depth"),
            ("Cost rule", "Try a correction"),
            ("Runs", "runs in"),
        ):
            page.get_by_role("link", name=name).click()
            page.get_by_text(expected).first.wait_for()
            settle(page)
            assert "Traceback" not in page.inner_text("body")
            page.screenshot(path=str(shots / f"{name.lower().replace(' ', '-')}.png"), full_page=True)
        # the decode page kept its decode and its three timed arms (greedy's A/A copy too), the windows page one run
        # per window
        assert int(re.search(r"(\d+) runs in", page.inner_text("body")).group(1)) == 4 + len(WINDOWS)

        fresh = browser.new_context(viewport={"width": 1400, "height": 2400}).new_page()  # another user, a link
        fresh.set_default_timeout(300_000)
        fresh.goto(shared)
        fresh.get_by_text("L (accepted per round)").wait_for()
        settle(fresh)
        player = fresh.frame_locator("iframe").first
        player.locator(".js-plotly-plot").wait_for()
        assert player.locator("audio").count() == 1 and "judgment" in fresh.inner_text("body")
        assert "Stale" not in fresh.inner_text("body")  # its sidebar took the run's settings
        fresh.screenshot(path=str(shots / "shared-run.png"), full_page=True)
        browser.close()


def test_a_77_second_clips_plots_show_one_window_at_a_time_and_fit_the_screen(server, tmp_path):
    """A clip decoded in several 30 s windows: the drift plot and the heatmap show the window picked, at its place on
    the clip's time axis, each figure within one screen's height with its times at its top."""
    clip = tmp_path / "seventy-seven.wav"
    soundfile.write(clip, long_clip(77.0), SAMPLE_RATE)
    with playwright.sync_playwright() as p:
        browser, page = open_browser(p, height=1600, timeout_ms=600_000)
        page.goto(f"{server}/?draft=whisper-tiny.en/control&k=3")
        page.get_by_text("upload", exact=True).click()
        page.set_input_files("input[type=file]", str(clip))
        page.get_by_text("seventy-seven.wav").wait_for()
        page.get_by_role("button", name="Run", exact=True).click()
        page.get_by_text(re.compile(r"^round \d+: .* tokens so far · window \d of 3, ")).first.wait_for()  # progress
        page.get_by_text("L (accepted per round)").wait_for()
        settle(page)
        drift = page.frame_locator("iframe").first.locator(".js-plotly-plot")
        drift.wait_for()
        window = drift.evaluate(
            "plot => [plot._fullLayout.height, plot._fullLayout.xaxis.side, plot.layout.xaxis.range]"
        )
        assert window[0] <= 1400 and window[1] == "top" and window[2][0] == pytest.approx(0.0)
        page.get_by_text("Draft attention heatmap").click()
        heatmap = page.locator("[data-testid=stExpander] .js-plotly-plot").first
        heatmap.wait_for()
        settle(page)  # the expander's key makes its opening a script run
        assert heatmap.evaluate("plot => plot._fullLayout.height") <= 1400
        page.screenshot(path=str(screenshots() / "long-clip-window-1.png"), full_page=True)

        pick_last_option(page, page.get_by_label(re.compile("^30 s window")))  # the clip's last window
        settle(page)
        heatmap = page.locator("[data-testid=stExpander] .js-plotly-plot").first
        heatmap.wait_for()
        page.wait_for_function(  # the redraw may land after the script run ends
            "() => document.querySelector('[data-testid=stExpander] .js-plotly-plot')?._fullData"
            "?.some(t => t.type === 'heatmap' && t.x[0] > 0)"
        )
        # as plotly.js drew them (plot.data can hold the arrays still encoded)
        starts = heatmap.evaluate("plot => plot._fullData.filter(t => t.type === 'heatmap').map(t => t.x[0])")
        cuts = heatmap.evaluate("plot => plot._fullLayout.shapes.map(s => s.x0)")
        shown = heatmap.evaluate("plot => plot._fullLayout.xaxis.range")
        assert len(starts) == 1 and len(cuts) >= 2 and starts[0] == pytest.approx(cuts[-1], abs=1e-6)
        assert 20 < cuts[0] < 30 < cuts[1] < 60 and shown[0] == pytest.approx(cuts[-1]) and shown[1] <= 77.1
        page.screenshot(path=str(screenshots() / "long-clip-last-window.png"), full_page=True)
        browser.close()


def test_a_user_decodes_with_a_draft_tree_and_sees_a_round_of_it(server, sample_clips):
    """Live decode of a tree from a link's settings: the tree of the round with the longest accepted path, its 12
    nodes and the target's own token, screenshotted (the page, and the tree's section as live-decode-tree.png)."""
    with playwright.sync_playwright() as p:
        browser, page = open_browser(p, height=3400)  # the whole page in view: the tree is its last section
        page.goto(f"{server}/?draft=whisper-tiny.en/control&k=4&tree_width=3&tree_nodes=12")
        page.get_by_text("upload", exact=True).click()
        page.set_input_files("input[type=file]", str(sample_clips[0].path))
        page.get_by_text(sample_clips[0].path.name[-9:]).wait_for()
        page.get_by_role("button", name="Run", exact=True).click()
        page.get_by_text("A round's draft tree").wait_for()
        settle(page)
        text = page.inner_text("body")
        assert "a tree of width 3 verifying 12 nodes per round" in text and "Traceback" not in text
        tree = page.locator(".js-plotly-plot").filter(has_text="the target's own next token")
        tree.wait_for()
        drawn = tree.evaluate(
            "plot => plot._fullData.filter(t => (t.name || '').startsWith('node ')).map(t => t.x.length)"
        )
        assert sum(drawn) == 12 and drawn[0] >= 1  # every node verified; the picked round accepted some
        shots = screenshots()
        page.screenshot(path=str(shots / "live-decode-tree-page.png"), full_page=True)
        top = page.get_by_text("A round's draft tree").bounding_box()
        end = page.get_by_text("Opens on the first round with the longest accepted path").bounding_box()
        section = {"x": top["x"] - 16, "y": top["y"] - 16, "width": end["width"] + 32}
        page.screenshot(
            path=str(shots / "live-decode-tree.png"),
            clip=section | {"height": end["y"] + end["height"] - section["y"] + 16},
        )
        browser.close()


def screenshots() -> Path:
    """Where the browser tests put their screenshots: $SPECASR_SCREENSHOTS, or cache/screenshots."""
    shots = Path(os.environ.get("SPECASR_SCREENSHOTS", ROOT / "cache" / "screenshots"))
    shots.mkdir(parents=True, exist_ok=True)
    return shots


def long_clip(seconds: float) -> np.ndarray:
    """Developer-set clips one after another, with half a second of silence between them, cut to `seconds`."""
    gap = np.zeros(SAMPLE_RATE // 2, dtype=np.float32)
    pieces, total = [], 0
    for utterance in load_manifest():
        pieces += [load_audio(utterance.path), gap]
        total += len(pieces[-2]) + len(gap)
        if total >= seconds * SAMPLE_RATE:
            break
    return np.concatenate(pieces)[: int(seconds * SAMPLE_RATE)]
