"""specasr dashboard: upload a clip, transcribe it, and watch where the draft listens versus the target."""

import pandas as pd
import plotly.graph_objects as go
import streamlit as st
import torch

from specasr.align import AlignerUnavailableError, AlignmentError
from specasr.audio import SAMPLE_RATE, AudioError, Clip, load_audio
from specasr.draft import DraftMismatchError, shipped_drafts
from specasr.metrics import acceptance
from specasr.pipeline import Pipeline
from specasr.store import Store, StoreError
from specasr.targets import BUILTIN_TARGETS, DTYPES, FRAME_SECONDS, TargetUnavailableError
from specasr.trace import Settings, Trace
from specasr.windows import WINDOWS

DECODE_ERRORS = (AudioError, TargetUnavailableError, AlignmentError, AlignerUnavailableError, DraftMismatchError)


@st.cache_resource(show_spinner=False)
def cached_pipeline() -> Pipeline:
    """One pipeline per server: targets and drafts load once, and every decode is kept in the run store."""
    return Pipeline(Store())


def drift_figure(trace: Trace, layer: int) -> go.Figure:
    """Per transcript token: the draft's audio attention peak, the target's verification peak, the aligner's frame."""
    figure = go.Figure()
    start = {r.index: r.start for r in trace.rounds}
    steps = [s for s in trace.steps if s.draft_peak is not None]
    for accepted, name, colour in (
        (True, "draft peak (accepted)", "#2ca02c"),
        (False, "draft peak (rejected)", "#d62728"),
    ):
        chosen = [s for s in steps if s.accepted == accepted]
        figure.add_scatter(
            x=[start[s.round] + s.depth - 1 for s in chosen],
            y=[s.draft_peak * FRAME_SECONDS for s in chosen],
            mode="markers",
            name=name,
            marker={"color": colour, "size": [5 + 3 * s.depth for s in chosen]},
            text=[f"depth {s.depth}" for s in chosen],
        )
    figure.add_scatter(
        x=[v.position for v in trace.verified],
        y=[v.verify_peaks[layer] * FRAME_SECONDS for v in trace.verified],
        mode="lines+markers",
        name=f"verification peak, layer {layer}",
    )
    if trace.reference_frames:
        figure.add_scatter(
            x=list(range(len(trace.reference_frames))),
            y=[None if f is None else f * FRAME_SECONDS for f in trace.reference_frames],
            mode="lines",
            name="forced alignment",
            line={"dash": "dot"},
        )
    figure.update_layout(xaxis_title="transcript token", yaxis_title="audio time (s)", height=420)
    return figure


st.set_page_config(page_title="specasr", layout="wide")
st.title("specasr")
st.caption("Single-model speculative decoding for speech recognition: transcribe a clip and watch alignment drift.")

devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
left, middle, right = st.columns(3)
target_name = left.selectbox("Target", list(BUILTIN_TARGETS))
device = middle.selectbox("Device", devices)
dtype = right.selectbox("Dtype", list(DTYPES))
left, middle, right, far = st.columns(4)
draft_name = left.selectbox("Draft", ["none (greedy)", *shipped_drafts(target_name), "random", "random-no-audio"])
draft_dtype = middle.selectbox("Draft dtype", ["as the target", *DTYPES], help="float16 drafts run faster on a CPU")
window = right.selectbox("Draft attention window", WINDOWS)
k = far.slider("K (proposals per round)", 1, 16, 4)
upload = st.file_uploader("Audio clip (wav, flac, ogg, mp3, m4a; up to 10 minutes, decoded in 30 s windows)")

if upload is not None:
    pipeline = cached_pipeline()
    greedy_settings = Settings(target=target_name, device=device, dtype=dtype)
    try:
        clip = Clip(upload.name, load_audio(upload))
        st.audio(clip.audio, sample_rate=SAMPLE_RATE)
        with st.spinner("Transcribing (the first use of a target converts its bundled weights once)…"):
            greedy = pipeline.decode(clip, greedy_settings)
        trace = greedy
        if draft_name != "none (greedy)":
            settings = Settings(
                target=target_name,
                device=device,
                dtype=dtype,
                draft=draft_name,
                draft_dtype=None if draft_dtype == "as the target" else draft_dtype,
                k=k,
                window=window,
                reference="always",
            )
            with st.spinner("Speculative decoding…"):
                trace = pipeline.decode(clip, settings)
        runs = [pipeline.store.write_run([t], "dashboard") for t in ([greedy] if trace is greedy else [greedy, trace])]
    except (*DECODE_ERRORS, StoreError, ValueError) as error:
        st.error(str(error))
        st.stop()
    st.subheader("Transcript")
    st.write(trace.text or "*(no speech recognized)*")
    st.caption(f"Decoded on {trace.settings.device}; kept in the run store as run {runs[-1]}.")
    timings = pd.DataFrame([trace.phase_seconds()]).T.rename(columns={0: "seconds"})
    left, right = st.columns(2)
    left.dataframe(timings)
    right.metric("Tokens", len(trace.tokens))
    right.metric("Decode ms per token", f"{1000 * trace.timings.decode / max(1, len(trace.tokens)):.1f}")
    if trace.rounds:
        accepted = acceptance([trace])
        right.metric("Speedup vs greedy (this run)", f"{greedy.timings.total / trace.timings.total:.2f}x")
        columns = st.columns(4)
        columns[0].metric("a1 (restart)", f"{accepted.a1:.2f}")
        columns[1].metric("a2c (continuation)", "-" if accepted.a2c is None else f"{accepted.a2c:.2f}")
        columns[2].metric("L (accepted per round)", f"{accepted.L:.2f}")
        columns[3].metric("Rounds", accepted.rounds)
        st.subheader("Alignment drift")
        layer = trace.settings.runtime_layer
        st.plotly_chart(drift_figure(trace, pipeline.target(trace.settings).runtime_layer if layer is None else layer))
