"""Streamlit pieces the dashboard's pages share: the one pipeline and store, the settings sidebar, the clip input,
decoding with reference frames where the aligner can make them, progress and error reporting. No model logic."""

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

import numpy as np
import pandas as pd
import soundfile
import streamlit as st

from specasr import (
    BUILTIN_TARGETS,
    DEFAULT_MAX_SECONDS,
    DRAFT_PRECISIONS,
    DTYPES,
    MOST_TREE_WIDTH,
    REFERENCE_WINDOWS,
    SAMPLE_RATE,
    USER_ERRORS,
    WINDOWS,
    AlignmentError,
    AudioError,
    AudioTooLongError,
    Clip,
    OutOfMemoryError,
    Pipeline,
    Round,
    Settings,
    SettingsError,
    Store,
    StoreError,
    Trace,
    Weighting,
    cache_dir,
    candidate_count,
    clips_by_set,
    default_nodes,
    devices,
    load_audio,
    load_manifest,
    shipped_drafts,
    spread_clips,
    synthesize_espeak,
    weighting,
)
from specasr.views import cut_seconds

# A page outlives its decode: any bad value and a full GPU are told on the page too, where the command line lets
# them end in a traceback
DECODE_ERRORS = (*USER_ERRORS, ValueError, OutOfMemoryError)
EXAMPLE_TEXT = "The birch canoe slid on the smooth planks. Glue the sheet to the dark blue background."
AS_TARGET = "as the target"
LOCAL_TARGET = "a local model folder"
EXAMPLE_SOURCE = "espeak-ng, the bundled example"


@st.cache_resource(show_spinner=False)
def pipeline() -> Pipeline:
    """One pipeline per server: targets, drafts and the aligner load once; every decode goes to the run store."""
    return Pipeline(Store())


def store() -> Store:
    return pipeline().store


# Sidebar settings kept in the page's address, so that a link reopens the same view: query parameter -> its type.
SIDEBAR_KEYS = ("target", "target_folder", "device", "dtype", "draft", "draft_dtype", "k", "window", "half_width")
SIDEBAR_KEYS += ("runtime_layer", "threshold", "tree_width", "tree_nodes", "longest")
URL_SETTINGS = {"target": str, "device": str, "dtype": str, "draft": str, "window": str, "k": int, "threshold": float}
URL_SETTINGS |= {"tree_width": int, "tree_nodes": int}
MOST_K = 16
DEFAULT = Settings()  # the sidebar starts from the settings a decode takes unless told
MOST_TREE_NODES = candidate_count(MOST_K, MOST_TREE_WIDTH)
LEFT_TO_THE_DECODE = {"runtime_layer": -1, "tree_nodes": 0}  # a number widget's value for a setting's None


def adopt_settings(settings: Settings) -> None:
    """Set the sidebar to a decode's settings (before the sidebar is drawn): the view then shows what it ran with."""
    values = {name: getattr(settings, name) for name in URL_SETTINGS}
    values |= {"half_width": settings.half_width_ms, "runtime_layer": settings.runtime_layer}
    if settings.tree_width == 1:  # a chain's node count is K, which the sidebar's 0 says
        values["tree_nodes"] = None
    values["draft_dtype"] = AS_TARGET if settings.draft_dtype in (None, settings.dtype) else settings.draft_dtype
    if settings.draft is None:  # a greedy run says nothing about the sidebar's draft settings
        values = {name: values[name] for name in ("target", "device", "dtype")}
    _set_sidebar(values)


def _set_sidebar(values: dict) -> None:
    """Put values into the sidebar's widgets where the widget can show them; others keep their current value."""
    if values.get("target") not in (None, *BUILTIN_TARGETS):
        values = values | {"target": LOCAL_TARGET, "target_folder": values["target"]}
    target = values.get("target_folder") or values.get("target") or st.session_state.get("target")
    allowed = {
        "target": [*BUILTIN_TARGETS, LOCAL_TARGET],
        "device": devices(),
        "dtype": list(DTYPES),
        "draft": [*shipped_drafts(target), "random", "random-no-audio"],
        "draft_dtype": [AS_TARGET, *DRAFT_PRECISIONS],
        "window": list(WINDOWS),
    }
    ranges = {"k": (1, MOST_K), "threshold": (0.0, 0.95), "half_width": (20.0, 5000.0), "runtime_layer": (-1, 63)}
    ranges |= {"tree_width": (1, MOST_TREE_WIDTH), "tree_nodes": (0, MOST_TREE_NODES)}
    for key, value in values.items():
        if value is None:
            value = LEFT_TO_THE_DECODE.get(key)
        if key in allowed:
            fits = value in allowed[key]
        else:
            fits = key not in ranges or ranges[key][0] <= value <= ranges[key][1]
        if value is not None and fits:
            st.session_state[key] = value


def _settings_from_url() -> None:
    """On a session's first page, the sidebar starts from the settings in the address."""
    if st.session_state.get("url_read"):
        return
    st.session_state["url_read"] = True
    values = {}
    for key, kind in URL_SETTINGS.items():
        if key in st.query_params:
            try:
                values[key] = kind(st.query_params[key])
            except ValueError:
                st.warning(f"Ignored {key}={st.query_params[key]!r} in the address: not a {kind.__name__}.")
    _set_sidebar(values)


def changed_settings(decoded: Settings, current: Settings) -> list[str]:
    """The sidebar settings that differ from those a shown result was decoded with."""
    shown = ["target", "device", "dtype"]
    if decoded.draft is not None:
        shown += ["draft", "draft_dtype", "k", "tree_width", "tree_nodes", "window", "half_width_ms", "threshold"]
    draft_dtype = None if decoded.draft_dtype == decoded.dtype else decoded.draft_dtype
    resolved, current = resolved_tree(replace(decoded, draft_dtype=draft_dtype)), resolved_tree(current)
    return [name for name in shown if getattr(resolved, name) != getattr(current, name)]


def resolved_tree(settings: Settings) -> Settings:
    """The settings with a tree's node count as a number (K x width left to the decode is the same tree) and a
    chain's as None (its K says it)."""
    return replace(settings, tree_nodes=settings.nodes if settings.tree_width > 1 else None)


def select(container, label: str, options: list, key: str, default=None, **kwargs):
    """A selectbox that drops a remembered value its options no longer hold (another target's draft or layers, a
    deleted run): back to `default` where one is given, else to the first option."""
    if st.session_state.get(key) not in options:
        st.session_state.pop(key, None)
        if default is not None:
            st.session_state[key] = default
    return container.selectbox(label, options, key=key, **kwargs)


def settings_sidebar(windows: bool = True) -> Settings:
    """The decode settings, from the sidebar (first from the page's address); changing them decodes nothing until a
    page's Run button, and writes them back to the address."""
    _settings_from_url()
    if st.session_state.get("sidebar_page") != st.session_state.get("page"):  # Streamlit resets a new page's widgets
        st.session_state["sidebar_page"] = st.session_state.get("page")
        _set_sidebar(st.session_state.get("sidebar", {}))
    bar = st.sidebar
    target = select(bar, "Target", [*BUILTIN_TARGETS, LOCAL_TARGET], key="target")
    if target == LOCAL_TARGET:
        folder = bar.text_input("Model folder", key="target_folder", help="transformers Whisper, Qwen3-ASR or Voxtral")
        target = folder.strip() or next(iter(BUILTIN_TARGETS))
        if not folder.strip():
            bar.caption(f"No folder given: decoding with {target}.")
    device = select(bar, "Device", devices(), key="device")
    bar.caption("Decoding on the GPU." if device.startswith("cuda") else "Decoding on the CPU.")
    dtype = select(bar, "Target dtype", list(DTYPES), key="dtype")
    draft = select(bar, "Draft", [*shipped_drafts(target), "random", "random-no-audio"], key="draft")
    draft_dtype = select(
        bar, "Draft dtype", [AS_TARGET, *DRAFT_PRECISIONS], key="draft_dtype", help="int8 and float16 are faster on CPU"
    )
    k = bar.slider("K (most proposals per round)", 1, MOST_K, DEFAULT.k, key="k")
    width, nodes = tree_controls(bar, k)
    window = select(bar, "Draft attention window", list(WINDOWS), key="window") if windows else "unrestricted"
    half_width = bar.number_input(
        "Window half-width (ms)", 20.0, 5000.0, DEFAULT.half_width_ms, step=20.0, key="half_width"
    )
    layer = bar.number_input("Runtime layer (-1: the target's)", -1, 63, -1, key="runtime_layer")
    threshold = bar.slider("Confidence threshold", 0.0, 0.95, DEFAULT.threshold, step=0.05, key="threshold")
    longest = bar.number_input("Longest clip (minutes)", 0.5, 120.0, DEFAULT_MAX_SECONDS / 60, step=0.5, key="longest")
    st.session_state["sidebar"] = {key: st.session_state[key] for key in SIDEBAR_KEYS if key in st.session_state}
    try:
        settings = Settings(
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
            max_seconds=60 * longest,
            tree_width=width,
            tree_nodes=nodes,
        )
    except SettingsError as error:  # a combination the sidebar allows but a decode does not: say why, draw no more
        st.error(f"These settings cannot be decoded: {error}. Change them in the sidebar.")
        st.stop()
    for key in URL_SETTINGS:
        value = getattr(settings, key)
        if value is None:
            st.query_params.pop(key, None)
        else:
            st.query_params[key] = str(value)
    return settings


def tree_controls(bar, k: int) -> tuple[int, int | None]:
    """The draft tree's width and the nodes verified per round (None: K x width); a chain's node count is K."""
    width = bar.slider(
        "Tree width (1: a chain)",
        1,
        MOST_TREE_WIDTH,
        1,
        key="tree_width",
        help="children drafted below each frontier node",
    )
    nodes = bar.number_input(
        "Tree nodes per round (0: K x width)",
        0,
        MOST_TREE_NODES,
        0,
        key="tree_nodes",
        disabled=width == 1,
        help="nodes verified per round: the draft's most probable of its tree; a chain verifies its K proposals",
    )
    if width == 1:
        return width, None
    verified = nodes or default_nodes(k, width)
    bar.caption(f"A tree of depth {k} and width {width} drafts {candidate_count(k, width)} nodes; {verified} verified.")
    return width, nodes or None


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


@dataclass(frozen=True)
class Followed:
    """The clip every page measures until the user picks another, and where its audio came from; `clip` is None
    where a stored run's audio is no longer at hand."""

    name: str
    source: str
    clip: Clip | None


FOLLOWED = "followed"  # the Audio choice that stands for the followed clip, shown by its name


def followed() -> Followed | None:
    return st.session_state.get("followed")


def follow(clip: Clip | None, source: str, name: str | None = None) -> None:
    st.session_state["followed"] = Followed(name or clip.id, source, clip)


def follow_stored(trace: Trace, run_id: str) -> Clip | None:
    """Follow a stored run's clip, from its audio in the store or its file; returns it, None where neither holds it."""
    audio, source = _audio_and_source(trace)
    if audio is None:
        follow(None, f"run {run_id}, whose audio is neither stored nor in its file", trace.clip_id)
        return None
    clip = Clip(trace.clip_id, audio, trace.reference_text, trace.dataset, path=trace.audio_path or "")
    follow(clip, source)
    return clip


def clip_input(key: str, max_seconds: float = DEFAULT_MAX_SECONDS) -> Clip | None:
    """The clip a page measures: the followed clip (the last one picked on any page, or a stored run's), an
    upload, the browser's microphone, or the bundled example; None until one is given. What is picked here is
    followed on every page."""
    current = followed()
    sources = ["example clip", "upload", "microphone"]
    if current is not None and current.source != EXAMPLE_SOURCE:
        sources.insert(0, FOLLOWED)
    source = st.radio(
        "Audio",
        sources,
        horizontal=True,
        key=f"{key}_source",
        format_func=lambda s: current.name if s == FOLLOWED else s,
    )
    try:
        if source == FOLLOWED:
            return _followed_clip(current)
        if source == "example clip":
            clip = example_clip()
            follow(clip, EXAMPLE_SOURCE)
            st.caption(f"Example: “{EXAMPLE_TEXT}” (espeak-ng, {clip.seconds:.1f} s)")
            return clip
        if source == "upload":
            upload = st.file_uploader(
                f"Audio file (wav, flac, ogg, mp3, m4a; up to {max_seconds / 60:g} minutes)", key=f"{key}_upload"
            )
        else:
            upload = st.audio_input("Record a clip", key=f"{key}_microphone")
        text = st.text_input("Reference text (optional: what is said, for the word error rate)", key=f"{key}_text")
        if upload is None:
            return None
        clip = Clip(upload.name, load_audio(upload, max_seconds), text=text.strip())
        follow(clip, "an upload" if source == "upload" else "a recording")
        return clip
    except AudioError as error:
        report(error)
        return None


def _followed_clip(current: Followed) -> Clip | None:
    if current.clip is None:
        st.warning(f"{current.name} comes from {current.source}: upload it again to decode it, or pick another clip.")
        return None
    clip = current.clip
    text = f"; reference “{clip.text}”" if clip.text else ""
    st.caption(
        f"{clip.id}: {clip.seconds:.1f} s, from {current.source}{text}. Every page measures it until you pick another."
    )
    return clip


def evaluation_clips(count: int) -> tuple[list[Clip], Weighting]:
    """`count` clips spread over the evaluation set, and how its sets weigh them (as the command line's --clips)."""
    clips, sets = clips_by_set(spread_clips(load_manifest(), count))
    return clips, weighting(sets)


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


def window_picker(trace: Trace, key: str) -> int | None:
    """The 30 s window a long clip's figures show, picked by the user; None for a clip of one window (shown
    whole)."""
    if len(trace.segments) < 2:
        return None
    bounds = [0.0, *cut_seconds(trace), trace.clip_seconds]
    count = len(trace.segments)
    return select(
        st,
        f"30 s window (the clip was decoded in {count})",
        list(range(count)),
        key=key,
        format_func=lambda i: f"window {i + 1} of {count}: {bounds[i]:.1f}-{bounds[i + 1]:.1f} s",
    )


def report(error: Exception) -> None:
    if isinstance(error, AudioTooLongError):
        st.error(f"{error}: raise Longest clip in the sidebar, or split the clip.")
    elif isinstance(error, AudioError):
        st.error(str(error))
    else:
        st.error(f"{type(error).__name__}: {error}")


Written = TypeVar("Written")


def try_store(write: Callable[[], Written]) -> tuple[Written | None, str | None]:
    """A store write's result, or None and why the store refused it (busy, read-only, a full disk): a page keeps
    what it decoded on screen either way, and says when it was not stored."""
    try:
        return write(), None
    except StoreError as error:
        return None, str(error)


def run_labels(runs: pd.DataFrame) -> dict[str, str]:
    """Run id -> how a picker shows it: its name, or its clip and settings, then the id."""
    return {r.run_id: f"{r.label} · {r.target} · {r.run_id}" for r in runs.itertuples()}


def token_pieces(trace: Trace) -> list[str]:
    """Each transcript token's own text, leading space included (from the target's tokenizer only for runs stored
    before traces kept them)."""
    if trace.token_texts is not None:
        return trace.token_texts
    tokenizer = pipeline().target(trace.settings).tokenizer
    return [tokenizer.decode([token]) for token in trace.tokens]


def token_decoder(trace: Trace) -> Callable[[list[int]], str]:
    """Token ids -> text for a trace's transcript and proposals: from the texts the trace keeps (a token it does not
    hold is the end of text, after the transcript), or the target's tokenizer for runs stored before it kept them."""
    if trace.token_texts is None or any(step.text is None for step in trace.steps):
        return pipeline().target(trace.settings).tokenizer.decode
    texts = dict(zip(trace.tokens, trace.token_texts, strict=True)) | {s.token: s.text for s in trace.steps}
    return lambda tokens: "".join(texts.get(token, "<end of text>") for token in tokens)


def runtime_layer(trace: Trace) -> int:
    """The layer the runtime windows read, as the decode resolved it (from the target for runs stored before)."""
    if trace.target_runtime_layer is not None:
        return trace.target_runtime_layer
    return trace.settings.readout_layer(pipeline().target(trace.settings).runtime_layer)


def stored_result(trace: Trace, run_id: str) -> dict:
    """A stored decode as a page shows it, its clip followed: with the clip where the store (or the clip's file)
    still has the audio, so that it can be heard, decoded and timed again."""
    clip = follow_stored(trace, run_id)
    audio = None if clip is None else clip.audio
    return {"trace": trace, "audio": audio, "clip": clip, "run": run_id, "unstored": None, "timing": None}


def clip_audio(trace: Trace) -> np.ndarray | None:
    """The decoded clip's waveform: kept in the store, or read again from its file if that still holds the same
    audio; None where neither does."""
    return _audio_and_source(trace)[0]


def _audio_and_source(trace: Trace) -> tuple[np.ndarray | None, str | None]:
    """The decoded clip's waveform and where it came from ("the store", or its file's path)."""
    audio = store().audio(trace.clip_hash)
    if audio is not None:
        return audio, "the store"
    if not trace.audio_path or not Path(trace.audio_path).is_file():
        return None, None
    try:
        clip = Clip(trace.clip_id, load_audio(trace.audio_path))
    except AudioError:
        return None, None
    return (clip.audio, trace.audio_path) if clip.hash == trace.clip_hash else (None, None)
