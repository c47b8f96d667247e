"""specasr dashboard: upload a clip and transcribe it with a real Whisper target."""

import pandas as pd
import streamlit as st
import torch

from specasr.audio import SAMPLE_RATE, AudioError, load_audio
from specasr.decode import transcribe
from specasr.targets import BUILTIN_TARGETS, DTYPES, TargetUnavailableError, WhisperTarget, load_target


@st.cache_resource(show_spinner="Loading target (the first load converts the bundled weights once)…")
def cached_target(name: str, device: str, dtype: str) -> WhisperTarget:
    return load_target(name, device, dtype)


st.set_page_config(page_title="specasr", layout="wide")
st.title("specasr")
st.caption("Single-model speculative decoding for speech recognition. This page: greedy transcription.")

devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
left, middle, right = st.columns(3)
target_name = left.selectbox("Target", list(BUILTIN_TARGETS))
device = middle.selectbox("Device", devices)
dtype = right.selectbox("Dtype", list(DTYPES))
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
        trace = transcribe(target, audio, clip_id=upload.name)
    st.subheader("Transcript")
    st.write(trace.text or "*(no speech recognized)*")
    timings = pd.DataFrame([trace.timings.as_dict()]).T.rename(columns={0: "seconds"})
    left, right = st.columns(2)
    left.dataframe(timings)
    right.metric("Tokens", len(trace.tokens))
    right.metric("Decode ms per token", f"{1000 * trace.timings.decode / max(1, len(trace.tokens)):.1f}")
