"""Streamlit pieces the dashboard's pages share: the one pipeline and store, the settings sidebar, the clip input,
decoding with reference frames where the aligner can make them, progress and error reporting. No model logic."""

from collections.abc import Callable
from dataclasses import replace

import soundfile
import streamlit as st
import torch

from specasr.align import AlignerUnavailableError, AlignmentError
from specasr.audio import SAMPLE_RATE, AudioError, Clip, load_audio
from specasr.cache import cache_dir
from specasr.draft import DraftMismatchError, shipped_drafts
from specasr.pipeline import Pipeline
from specasr.store import Store, StoreError
from specasr.targets import BUILTIN_TARGETS, DTYPES, TargetUnavailableError
from specasr.trace import Round, Settings, Trace
from specasr.tts import synthesize_espeak
from specasr.windows import REFERENCE_WINDOWS, WINDOWS

DECODE_ERRORS = (
    AudioError,
    TargetUnavailableError,
    AlignmentError,
    AlignerUnavailableError,
    DraftMismatchError,
    StoreError,
    ValueError,
    torch.OutOfMemoryError,
)
EXAMPLE_TEXT = "The birch canoe slid on the smooth planks. Glue the sheet to the dark blue background."
AS_TARGET = "as the target"
LOCAL_TARGET = "a local model folder"


@st.cache_resource(show_spinner=False)
def pipeline() -> Pipeline:
    """One pipeline per server: targets, drafts and the aligner load once; every decode goes to the run store."""
    return Pipeline(Store())


def store() -> Store:
    return pipeline().store


def devices() -> list[str]:
    """CUDA first where there is one: the dashboard defaults to the GPU."""
    return (["cuda"] if torch.cuda.is_available() else []) + ["cpu"]


def settings_sidebar(windows: bool = True) -> Settings:
    """The decode settings, from the sidebar; changing them decodes nothing until a page's Run button."""
    bar = st.sidebar
    target = bar.selectbox("Target", [*BUILTIN_TARGETS, LOCAL_TARGET], key="target")
    if target == LOCAL_TARGET:
        folder = bar.text_input("Model folder", key="target_folder", help="transformers Whisper, Qwen3-ASR or Voxtral")
        target = folder.strip() or next(iter(BUILTIN_TARGETS))
        if not folder.strip():
            bar.caption(f"No folder given: decoding with {target}.")
    device = bar.selectbox("Device", devices(), key="device")
    bar.caption("Decoding on the GPU." if device.startswith("cuda") else "Decoding on the CPU.")
    dtype = bar.selectbox("Target dtype", list(DTYPES), key="dtype")
    draft = bar.selectbox("Draft", [*shipped_drafts(target), "random", "random-no-audio"], key="draft")
    draft_dtype = bar.selectbox("Draft dtype", [AS_TARGET, *DTYPES], key="draft_dtype", help="float16 is faster on CPU")
    k = bar.slider("K (most proposals per round)", 1, 16, 4, key="k")
    window = bar.selectbox("Draft attention window", WINDOWS, key="window") if windows else "unrestricted"
    half_width = bar.number_input("Window half-width (ms)", 20.0, 5000.0, 400.0, step=20.0, key="half_width")
    layer = bar.number_input("Runtime layer (-1: the target's)", -1, 63, -1, key="runtime_layer")
    threshold = bar.slider("Confidence threshold", 0.0, 0.95, 0.0, step=0.05, key="threshold")
    return Settings(
        target=target,
        device=device,
        dtype=dtype,
        draft=draft,
        draft_dtype=None if draft_dtype == AS_TARGET else draft_dtype,
        k=k,
        window=window,
        half_width_ms=half_width,
        runtime_layer=None if layer < 0 else int(layer),
        threshold=threshold,
    )


def example_clip() -> Clip:
    """A short sentence pair spoken by espeak-ng, synthesized offline on first use and kept in cache/."""
    path = cache_dir() / "examples" / "harvard.wav"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        speech = synthesize_espeak(EXAMPLE_TEXT)
        partial = path.with_suffix(".partial.wav")
        soundfile.write(partial, speech.audio, SAMPLE_RATE)
        partial.replace(path)
    return Clip("example (espeak-ng)", load_audio(path), text=EXAMPLE_TEXT, dataset="example")


def clip_input(key: str) -> Clip | None:
    """A clip from an upload, the browser's microphone, or the bundled example; None until one is given."""
    source = st.radio("Audio", ["example clip", "upload", "microphone"], horizontal=True, key=f"{key}_source")
    try:
        if source == "example clip":
            clip = example_clip()
            st.caption(f"Example: “{EXAMPLE_TEXT}” (espeak-ng, {clip.seconds:.1f} s)")
            return clip
        if source == "upload":
            upload = st.file_uploader("Audio file (wav, flac, ogg, mp3, m4a; up to 10 minutes)", key=f"{key}_upload")
        else:
            upload = st.audio_input("Record a clip", key=f"{key}_microphone")
        return None if upload is None else Clip(upload.name, load_audio(upload))
    except AudioError as error:
        st.error(str(error))
        return None


def decode_with_reference(
    clip: Clip, settings: Settings, on_round: Callable[[Round], None] | None = None
) -> tuple[Trace, str | None]:
    """Decode with reference frames where the aligner can place the words; where it cannot, decode without them
    (unless the window needs them: then AlignmentError) and say why."""
    try:
        return pipeline().decode(clip, replace(settings, reference="always"), on_round), None
    except AlignmentError as error:
        if settings.window in REFERENCE_WINDOWS:
            raise AlignmentError(f"the {settings.window} window needs reference frames: {error}") from error
        trace = pipeline().decode(clip, replace(settings, reference="never"), on_round)
        return trace, f"no reference frames: {error}"


def round_progress(placeholder) -> Callable[[Round], None]:
    """A progress line that follows the rounds of a decode."""

    def report(round: Round) -> None:
        accepted = f"{round.accepted} of {len(round.proposed)} proposals accepted"
        placeholder.write(f"round {round.index + 1}: {accepted}, {round.start + round.accepted + 1} tokens so far")

    return report


def report(error: Exception) -> None:
    st.error(f"{type(error).__name__}: {error}")


def token_pieces(trace: Trace) -> list[str]:
    """Each transcript token's own text, leading space included."""
    tokenizer = pipeline().target(trace.settings).tokenizer
    return [tokenizer.decode([token]) for token in trace.tokens]
