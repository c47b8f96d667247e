"""specasr dashboard: upload a clip, transcribe it, and watch where the draft listens versus the target."""

import pandas as pd
import plotly.graph_objects as go
import streamlit as st
import torch

from specasr.align import AlignerUnavailableError, AlignmentError, align_tokens, get_aligner
from specasr.audio import SAMPLE_RATE, AudioError, load_audio
from specasr.decode import WINDOWS, SpeculativeConfig, speculative_transcribe, transcribe
from specasr.draft import DraftMismatchError, resolve_draft, shipped_drafts
from specasr.metrics import acceptance
from specasr.targets import BUILTIN_TARGETS, DTYPES, FRAME_SECONDS, TargetUnavailableError, WhisperTarget, load_target
from specasr.trace import Trace


@st.cache_resource(show_spinner="Loading target (the first load converts the bundled weights once)…")
def cached_target(name: str, device: str, dtype: str) -> WhisperTarget:
    return load_target(name, device, dtype)


def drift_figure(trace: Trace, reference: list[int | None] | None, layer: int) -> go.Figure:
    """Per transcript token: the draft's audio attention peak, the target's verification peak, the aligner's frame."""
    figure = go.Figure()
    steps = [s for s in trace.steps if s.draft_peak is not None]
    for accepted, name, colour in (
        (True, "draft peak (accepted)", "#2ca02c"),
        (False, "draft peak (rejected)", "#d62728"),
    ):
        chosen = [s for s in steps if s.accepted == accepted]
        start = {r.index: r.start for r in trace.rounds}
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
    if reference:
        figure.add_scatter(
            x=list(range(len(reference))),
            y=[None if f is None else f * FRAME_SECONDS for f in reference],
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
upload = st.file_uploader("Audio clip (wav, flac, ogg, mp3, m4a; at most 30 s)")

if upload is not None:
    try:
        audio = load_audio(upload)
        target = cached_target(target_name, device, dtype)
    except (AudioError, TargetUnavailableError) as error:
        st.error(str(error))
        st.stop()
    st.audio(audio, sample_rate=SAMPLE_RATE)
    with st.spinner("Transcribing…"):
        greedy = transcribe(target, audio, clip_id=upload.name)
    if draft_name == "none (greedy)":
        trace = greedy
    else:
        try:
            reference = align_tokens(get_aligner(), target, audio, greedy.tokens).frames if greedy.tokens else None
            draft = resolve_draft(draft_name, target, DTYPES.get(draft_dtype))
            config = SpeculativeConfig(k=k, window=window)
            with st.spinner("Speculative decoding…"):
                trace = speculative_transcribe(target, draft, audio, config, upload.name, reference)
        except (AlignmentError, AlignerUnavailableError, DraftMismatchError, ValueError) as error:
            st.error(str(error))
            st.stop()
    st.subheader("Transcript")
    st.write(trace.text or "*(no speech recognized)*")
    timings = pd.DataFrame([trace.timings.as_dict()]).T.rename(columns={0: "seconds"})
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
        st.plotly_chart(drift_figure(trace, reference, target.runtime_layer))
