"""The clip's audio player tied to a plotly figure whose x axis is the clip's time in seconds (the drift plot): clicking
a point plays the clip from that point's time, and a playhead line moves across the figure while the clip plays.

One self-contained HTML document shown with st.iframe: plotly.js inline from the installed plotly package and the clip
as a WAV data URL, so nothing is fetched from the network."""

import base64
import io
from functools import cache

import numpy as np
import plotly.graph_objects as go
import soundfile
import streamlit as st
from plotly.offline import get_plotlyjs

from specasr import SAMPLE_RATE

AUDIO_BAR_HEIGHT = 60  # the 40 px <audio controls> bar, its 8 px margin, and room to spare against a scroll bar
PLOTLY_DEFAULT_HEIGHT = 450  # what plotly.js draws when a figure's layout gives no height

# Appends the playhead to the figure's own shapes (the window cuts) and keeps it at the audio's current time: on each
# seek and pause, and while playing on timeupdate and every animation frame (timeupdate comes a few times a second).
PLAYER_JS = """
const audio = document.getElementById("clip");
const plot = document.getElementById("plot");
const figure = JSON.parse(document.getElementById("figure").textContent);
const playhead = (figure.layout.shapes || []).length;
figure.layout.shapes = [
  ...(figure.layout.shapes || []),
  {type: "line", xref: "x", yref: "paper", x0: 0, x1: 0, y0: 0, y1: 1, line: {color: "#ff7f0e", width: 2}},
];

function placePlayhead() {
  const seconds = audio.currentTime;
  Plotly.relayout(plot, {[`shapes[${playhead}].x0`]: seconds, [`shapes[${playhead}].x1`]: seconds});
}

// Moving a shape redraws the whole figure (a long clip's takes tens of milliseconds), so the playhead follows only once
// the audio is a pixel's worth of time past it: the div is wider than the plot, so that is under a pixel.
function followPlayhead() {
  const [start, end] = plot.layout.xaxis.range;
  const behind = Math.abs(audio.currentTime - plot.layout.shapes[playhead].x0);
  if (behind >= (end - start) / plot.clientWidth) placePlayhead();
}

let frame = 0;
function followWhilePlaying() {
  followPlayhead();
  frame = audio.paused ? 0 : requestAnimationFrame(followWhilePlaying);
}

Plotly.newPlot(plot, figure.data, figure.layout, {responsive: true, displaylogo: false}).then(() => {
  plot.on("plotly_click", (event) => {
    audio.currentTime = event.points[0].x;
    audio.play();
  });
  audio.addEventListener("seeked", placePlayhead);
  audio.addEventListener("pause", placePlayhead);
  audio.addEventListener("timeupdate", followPlayhead);
  audio.addEventListener("play", () => {
    cancelAnimationFrame(frame);
    followWhilePlaying();
  });
});
"""


@cache
def plotly_js() -> str:
    """plotly.js from the installed plotly package (about 5 MB), read once per process."""
    return get_plotlyjs()


def wav_data_url(audio: np.ndarray, rate: int) -> str:
    """The clip as 16-bit PCM WAV in a data URL (clipped to [-1, 1] first: PCM has no room beyond it)."""
    buffer = io.BytesIO()
    soundfile.write(buffer, np.clip(audio, -1.0, 1.0), rate, format="WAV", subtype="PCM_16")
    return "data:audio/wav;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def figure_json(figure: go.Figure) -> str:
    """The figure as JSON that is safe inside a <script> element: with every "<" escaped (it occurs only inside
    strings), token text such as "</script>" cannot end the element."""
    return figure.to_json().replace("<", "\\u003c")


def figure_height(figure: go.Figure) -> int:
    return figure.layout.height or PLOTLY_DEFAULT_HEIGHT


def player_height(figure: go.Figure) -> int:
    return figure_height(figure) + AUDIO_BAR_HEIGHT


def player_html(figure: go.Figure, audio: np.ndarray, rate: int = SAMPLE_RATE) -> str:
    """One HTML document: the clip's audio player above the figure, tied together by PLAYER_JS."""
    return f"""<!DOCTYPE html>
<html>
<head>
<meta charset="utf-8">
<style>
body {{ margin: 0; font-family: sans-serif; }}
audio {{ display: block; width: 100%; height: 40px; margin-bottom: 8px; }}
</style>
<script>{plotly_js()}</script>
</head>
<body>
<audio id="clip" controls preload="auto" src="{wav_data_url(audio, rate)}"></audio>
<div id="plot" style="height: {figure_height(figure)}px"></div>
<script type="application/json" id="figure">{figure_json(figure)}</script>
<script>{PLAYER_JS}</script>
</body>
</html>
"""


def drift_player(figure: go.Figure, audio: np.ndarray, rate: int = SAMPLE_RATE) -> None:
    """Show the figure with the clip's player above it: click a point to listen from its time."""
    st.iframe(player_html(figure, audio, rate), height=player_height(figure), alt="audio player and drift plot")
