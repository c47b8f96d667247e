"""Drift: how far the draft's attention strays from the words, and how acceptance falls, with draft depth."""

import pandas as pd
import streamlit as st

import widgets
from specasr import depth_profile
from specasr.views import depth_figure

st.title("Drift by draft depth")
st.write(
    "Depth 1 is the restart right after a verification; deeper steps run on the draft's own guesses. Anchor error is "
    "the distance between the draft's attention peak and the forced-alignment time of the token it proposed; "
    "conditional acceptance a_k^c is the share of rounds still alive at depth k - 1 whose k-th proposal was accepted. "
    "Intervals resample clips (95%, 1,000 draws); a one-clip run has none."
)

try:
    runs = widgets.store().runs()
except widgets.DECODE_ERRORS as error:
    widgets.report(error)
    st.stop()
runs = runs[runs.rounds > 0]
left, middle, right = st.columns(3)
targets = left.multiselect("Target", sorted(runs.target.unique()), key="drift_target")
windows = middle.multiselect("Window", sorted(runs.window.unique()), key="drift_window")
drafts = right.multiselect("Draft", sorted(runs.draft_name.unique()), key="drift_draft")
for column, chosen in (("target", targets), ("window", windows), ("draft_name", drafts)):
    if chosen:
        runs = runs[runs[column].isin(chosen)]
labels = widgets.run_labels(runs)
opened = st.query_params.get("run")
default = [opened] if opened in labels else list(labels)[:3]
chosen = st.multiselect("Stored runs", list(labels), default=default, format_func=labels.get, key="drift_runs")

profiles = []
current = (st.session_state.get("decoded") or {}).get("trace")
if current is not None and current.rounds:
    profiles.append(depth_profile([current]).assign(series="current decode"))
for run_id in chosen:
    traces = [t for t in widgets.store().traces(run_id) if t.rounds]
    if traces:
        profiles.append(depth_profile(traces).assign(series=labels[run_id]))
if not profiles:
    st.info("No speculative decodes yet: run one on Live decode, or pick stored runs.")
    st.stop()
profile = pd.concat(profiles, ignore_index=True)
left, right = st.columns(2)
errors = profile.dropna(subset=["anchor_error_ms"])
if len(errors):
    left.plotly_chart(
        depth_figure(errors, "anchor_error_ms", "series", "median anchor error (ms)", "error_low", "error_high"),
        key="drift_error",
    )
else:
    left.info("No anchor errors in these decodes (no audio attention, or no reference frames).")
accepted = profile.dropna(subset=["conditional"])
right.plotly_chart(
    depth_figure(
        accepted, "conditional", "series", "conditional acceptance a_k^c", "conditional_low", "conditional_high"
    ),
    key="drift_acceptance",
)
st.dataframe(profile, hide_index=True, key="drift_table")
