"""The drift player's HTML, without a browser: the clip as a WAV data URL, the figure as JSON, nothing fetched from the
network, and the script that ties the two together."""

import base64
import io
import json
from html.parser import HTMLParser

import numpy as np
import plotly.graph_objects as go
import pytest
import soundfile
from plotly.offline import get_plotlyjs
from test_views import long_trace

from player import AUDIO_BAR_HEIGHT, PLAYER_JS, player_height, player_html
from specasr.views import drift_figure

PIECES = [" a", " b", " c"]


class Elements(HTMLParser):
    """Every element's tag and attributes, and every <script>'s attributes and text, in document order."""

    def __init__(self, html: str):
        super().__init__()
        self.elements: list[tuple[str, dict]] = []
        self.scripts: list[tuple[dict, str]] = []
        self.in_script = False
        self.feed(html)
        self.close()

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.elements.append((tag, dict(attrs)))
        if tag == "script":
            self.scripts.append((dict(attrs), ""))
            self.in_script = True

    def handle_endtag(self, tag: str) -> None:
        self.in_script = self.in_script and tag != "script"

    def handle_data(self, data: str) -> None:
        if self.in_script:
            attributes, text = self.scripts[-1]
            self.scripts[-1] = (attributes, text + data)

    def figure(self) -> dict:
        return json.loads(next(text for attributes, text in self.scripts if attributes.get("id") == "figure"))

    def audio(self) -> tuple[np.ndarray, int]:
        source = next(attributes["src"] for tag, attributes in self.elements if tag == "audio")
        header, data = source.split(",", 1)
        assert header == "data:audio/wav;base64"
        return soundfile.read(io.BytesIO(base64.b64decode(data)), dtype="float32")


def clip(seconds: float, rate: int = 16000) -> np.ndarray:
    """A 220 Hz tone, its loudness rising and falling every second."""
    t = np.arange(int(seconds * rate)) / rate
    return (0.5 * np.sin(2 * np.pi * 220 * t) * np.abs(np.sin(np.pi * t))).astype(np.float32)


def long_figure(audio: np.ndarray) -> go.Figure:
    return drift_figure(long_trace(), PIECES, layer=0, audio=audio)


def test_the_clip_is_a_wav_of_its_length_and_rate():
    audio = clip(70.0)
    decoded, rate = Elements(player_html(long_figure(audio), audio)).audio()
    assert rate == 16000 and len(decoded) == len(audio)
    np.testing.assert_allclose(decoded, audio, atol=1 / 32768)  # 16-bit PCM
    slow = clip(1.0, rate=8000)
    decoded, rate = Elements(player_html(go.Figure(), slow, rate=8000)).audio()
    assert rate == 8000 and len(decoded) == 8000


def test_samples_beyond_full_scale_are_clipped_not_wrapped():
    decoded, _ = Elements(player_html(go.Figure(), np.array([1.5, -1.5, 0.25], dtype=np.float32))).audio()
    np.testing.assert_allclose(decoded, [32767 / 32768, -1.0, 0.25], atol=1 / 32768)


def test_the_figure_travels_as_its_own_json():
    audio = clip(70.0)
    figure = long_figure(audio)
    shown = Elements(player_html(figure, audio)).figure()
    assert shown == json.loads(figure.to_json())
    assert [shape["x0"] for shape in shown["layout"]["shapes"]] == pytest.approx([28.0, 56.0])  # the window cuts


def test_token_text_cannot_end_the_figure_script():
    pieces = [" a", "</script><script>alert(1)</script>", " <!-- c"]
    audio = clip(70.0)
    figure = drift_figure(long_trace(), pieces, layer=0, audio=audio)
    elements = Elements(player_html(figure, audio))
    assert len(elements.scripts) == 3  # plotly.js, the figure, the player: no script injected by a token
    assert elements.figure()["layout"]["yaxis2"]["ticktext"][1] == "1: </script><script>alert(1)</script>"


def test_nothing_is_fetched_from_the_network():
    audio = clip(1.0)
    elements = Elements(player_html(go.Figure(), audio))
    sources = [(tag, name, value) for tag, attributes in elements.elements for name, value in attributes.items()]
    linked = [(tag, name, value) for tag, name, value in sources if name in ("src", "href")]
    assert [(tag, name) for tag, name, _ in linked] == [("audio", "src")]  # scripts inline, no stylesheets
    assert linked[0][2].startswith("data:")
    assert elements.scripts[0][1] == get_plotlyjs()  # plotly.js inline, from the installed package


def test_the_player_script_seeks_on_click_and_moves_the_playhead():
    elements = Elements(player_html(go.Figure(), clip(1.0)))
    player = elements.scripts[-1][1]
    assert player.strip() == PLAYER_JS.strip()
    wiring = [
        'plot.on("plotly_click"',
        "audio.currentTime = event.points[0].x",  # a click seeks to the point's time
        '"seeked", placePlayhead',
        '"pause", placePlayhead',
        '"timeupdate", followPlayhead',
        "requestAnimationFrame(followWhilePlaying)",
        "Plotly.relayout(plot",
        "...(figure.layout.shapes || [])",  # the playhead goes after the figure's own shapes
    ]
    assert [piece for piece in wiring if piece not in player] == []


def test_the_player_is_as_tall_as_the_figure_and_the_audio_bar():
    figure = long_figure(clip(70.0))
    assert player_height(figure) == figure.layout.height + AUDIO_BAR_HEIGHT
    assert player_height(go.Figure()) == 450 + AUDIO_BAR_HEIGHT  # plotly.js's own default
