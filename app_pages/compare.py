"""Side by side: two runs on the same clip or set (two drafts, two windows, two checkpoints): their transcripts with
the differing words marked, their drift plots on one time axis, and their metrics as A - B with paired intervals over
every clip both decoded. The address (?a=RUN&b=RUN&clip=CLIP_ID) reopens the view."""

import html

import numpy as np
import plotly.graph_objects as go
import streamlit as st

import widgets
from specasr import (
    DIFFERENCE,
    SAMPLE_RATE,
    Comparison,
    NoSharedClipError,
    Trace,
    Word,
    compare_runs,
    word_diff,
    word_error_rate,
)
from specasr.views import drift_figure

ONLY_A, ONLY_B = "#fde2c8", "#cfe3fb"  # highlights of the words one transcript has and the other lacks
ADDRESS = ("a", "b", "clip")
EDGE = 0.02  # of the time axis, kept free on each side so that a mark at the clip's start or end is drawn whole


def adopt_address(labels: dict[str, str]) -> None:
    """On opening a link (an address the pickers did not write), the pickers take the runs and clip it names."""
    requested = tuple(st.query_params.get(key) for key in ADDRESS)
    if st.session_state.get("side_address") == requested:
        return
    for key, run in zip(("side_a", "side_b"), requested[:2], strict=True):
        if run in labels:
            st.session_state[key] = run
        elif run:
            st.warning(f"No run {run} in the store: pick another.")
    if requested[2]:
        st.session_state["side_clip"] = requested[2]


def comparison(run_a: str, run_b: str) -> Comparison:
    """The two runs compared (the store's comparison, as Checkpoints shows it), kept while the same runs are shown."""
    kept = st.session_state.get("side_comparison")
    if kept is None or kept[0] != (run_a, run_b):
        kept = (run_a, run_b), compare_runs(widgets.store(), run_a, run_b)
        st.session_state["side_comparison"] = kept
    return kept[1]


def marked(words: list[Word], colour: str) -> str:
    """A transcript as HTML, the words the other transcript lacks highlighted."""
    spans = [
        f'<span style="background:{colour}">{html.escape(w.text)}</span>' if w.changed else html.escape(w.text)
        for w in words
    ]
    return " ".join(spans) or "*(no speech recognized)*"


def drift(trace: Trace, audio: np.ndarray | None, segment: int | None) -> go.Figure:
    """The trace's drift plot (of one 30 s window where `segment` says), the target's verification peaks at the layer
    its runtime windows read."""
    layers = max((len(v.verify_peaks) for v in trace.verified), default=0)
    layer = min(widgets.runtime_layer(trace), layers - 1) if layers else 0
    figure = drift_figure(trace, widgets.token_pieces(trace), layer, audio, segment=segment)
    # Without legends (the caption says what each mark is), both plots keep the same size and place.
    return figure.update_layout(showlegend=False, margin={"t": 40})


def share_time_axis(figures: list[go.Figure], traces: list[Trace]) -> None:
    """One time range for every figure: the clip, or as far as any figure draws, with room for the marks at its
    ends (a window's own range is kept: both runs cut the clip alike)."""
    if figures[0].layout.xaxis.range is not None:
        return
    drawn = [x for f in figures for d in f.data if d.x is not None for x in d.x if x is not None]
    end = max([*drawn, *(t.clip_seconds for t in traces)])
    for figure in figures:
        figure.update_xaxes(range=[-EDGE * end, (1 + EDGE) * end])


st.title("Side by side")
runs = widgets.store().runs()
labels = widgets.run_labels(runs)
if not labels:
    st.info("No runs stored yet: decode a clip on Live decode, Windows or Checkpoints, then compare two runs here.")
    st.stop()
adopt_address(labels)
followed = widgets.followed()
followed_clip = None if followed is None else followed.clip
of_clip = [] if followed_clip is None else list(widgets.store().runs(clip_hash=followed_clip.hash).run_id)
ids = list(dict.fromkeys([*of_clip, *labels]))  # the followed clip's runs first, newest first
left, right = st.columns(2)
run_a = widgets.select(left, "Run A", ids, "side_a", ids[0], format_func=labels.get)
run_b = widgets.select(right, "Run B", ids, "side_b", ids[min(1, len(ids) - 1)], format_func=labels.get)
if of_clip:
    st.caption(f"Runs of {followed_clip.id}, the clip followed from page to page, are listed first.")
st.query_params.update(a=run_a, b=run_b)
shown = {"A": run_a, "B": run_b}
if run_a == run_b:
    st.info("Run A and run B are the same run: pick another for B.")

try:
    compared = comparison(run_a, run_b)
except NoSharedClipError:
    clips = {name: sorted({t.clip_id for t in widgets.store().traces(run)}) for name, run in shown.items()}
    st.error(
        f"Run A and run B decoded no clip in common (A: {', '.join(clips['A'])}; B: {', '.join(clips['B'])}). "
        "Pick two runs of the same clip or set."
    )
    st.session_state["side_address"] = tuple(st.query_params.get(key) for key in ADDRESS)
    st.stop()
except widgets.DECODE_ERRORS as error:
    widgets.report(error)
    st.stop()

for name, trace in zip(shown, compared.pairs[0], strict=True):  # a run's settings are its every trace's
    if trace.settings.draft is None:
        st.info(
            f"Run {name} is a greedy decode: it has no rounds, so no acceptance, draft peaks or anchor error to "
            "compare; its transcript, word error rate and the target's own attention still are."
        )

st.subheader(f"{DIFFERENCE} over the {compared.clips} clip{'s' if compared.clips > 1 else ''} both runs decoded")
if compared.differences:
    st.dataframe(compared.table(), hide_index=True, key="side_differences")
    st.caption(compared.caption(labels[run_a], labels[run_b]))
else:
    st.info("No metric both runs define: two greedy runs of clips with no reference text.")

by_clip = {a.clip_id: (a, b) for a, b in compared.pairs}
clip_ids = list(by_clip)
clip_id = clip_ids[0]
if len(clip_ids) > 1:
    shown_first = followed_clip.id if followed_clip is not None and followed_clip.id in by_clip else clip_ids[0]
    clip_id = widgets.select(st, "Clip", clip_ids, "side_clip", shown_first)
st.query_params["clip"] = clip_id
st.session_state["side_address"] = tuple(st.query_params.get(key) for key in ADDRESS)
pair = by_clip[clip_id]
audio = widgets.clip_audio(pair[0])
if audio is not None:
    st.audio(audio, sample_rate=SAMPLE_RATE)

st.subheader(f"Transcripts of {clip_id}")
words = word_diff(pair[0].text, pair[1].text)
for column, name, trace, said, colour in zip(st.columns(2), shown, pair, words, (ONLY_A, ONLY_B), strict=True):
    column.markdown(f"**{name}**: {html.escape(labels[shown[name]])}")
    column.markdown(marked(said, colour), unsafe_allow_html=True)
    try:
        column.caption(f"Word error rate: {word_error_rate([trace.reference_text], [trace.text]):.1%}")
    except ValueError:
        column.caption("No reference text with words: no word error rate.")
if pair[0].reference_text:
    st.caption(f"Reference: “{pair[0].reference_text}”")
st.caption(
    "Highlighted: words the other transcript does not have at that place (orange only in A, blue only in B)."
    if any(w.changed for side in words for w in side)
    else "The two transcripts are the same."
)

st.subheader("Alignment drift, on one time axis")
cut_alike = [s.start_frame for s in pair[0].segments] == [s.start_frame for s in pair[1].segments]
segment = widgets.window_picker(pair[0], key=f"side_window_{clip_id}") if cut_alike else None
figures = [drift(trace, audio, segment) for trace in pair]
share_time_axis(figures, list(pair))
for column, name, figure in zip(st.columns(2), shown, figures, strict=True):
    column.markdown(f"**{name}**")
    column.plotly_chart(figure, key=f"drift_{name.lower()}")
st.caption(
    "Each row is a transcript token; the clip's waveform above. Green circles: the draft's attention peak for an "
    "accepted proposal (larger: deeper in the round); red crosses: rejected proposals; blue dots: the target's "
    "verification peak at the runtime layer; diamonds: the forced-alignment time; grey bars: the draft's attention "
    "window where one applied."
)
