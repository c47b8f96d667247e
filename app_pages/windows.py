"""Windows: the same clip and draft under every attention window, side by side."""

from dataclasses import replace

import pandas as pd
import streamlit as st

import progress
import widgets
from specasr import DIFFERENCE, WINDOWS, AlignmentError, Comparison, acceptance, compare_traces, depth_profile
from specasr.views import depth_figure, survival_figure

BASE = "unrestricted"  # the window every other is compared with
st.title("Windows")
st.write(
    "One click decodes the clip under every window condition with the same draft and K. If the draft uses the audio "
    "where the words are, the correct window should do at least as well as unrestricted attention, and a window "
    "shifted 500 ms off the words should do much worse."
)
settings = widgets.settings_sidebar(windows=False)
clip = widgets.clip_input("windows", settings.max_seconds)


def run_windows(clip, settings) -> dict:
    traces, reasons = {}, {}
    with st.status(f"Decoding {clip.id} under every window…", expanded=True) as status:
        bar = progress.PageBar(WINDOWS, desc="windows", unit="windows")
        rounds = st.empty()
        for window in bar:
            bar.set_postfix_str(window)
            try:
                traces[window], reasons[window] = widgets.decode_with_reference(
                    clip,
                    replace(settings, window=window, verify_peaks=False),
                    progress.RoundProgress(rounds, clip, settings),
                )
            except AlignmentError as error:
                reasons[window] = str(error)
            except widgets.DECODE_ERRORS as error:
                widgets.report(error)
                return {}
        written, unstored = widgets.try_store(
            lambda: widgets.store().write_runs([([trace], None) for trace in traces.values()], "dashboard")
        )
        status.update(label="Done", state="complete", expanded=False)
    reasons = {w: r for w, r in reasons.items() if r}
    runs = dict(zip(traces, written or [None] * len(traces), strict=True))
    differences = differences_from_base(traces)
    return {"traces": traces, "reasons": reasons, "runs": runs, "unstored": unstored, "differences": differences}


def differences_from_base(traces: dict) -> dict[str, Comparison]:
    """Each window (A) against the unrestricted one (B) on the clip, as every page compares two runs."""
    if BASE not in traces:
        return {}
    return {window: compare_traces([trace], [traces[BASE]]) for window, trace in traces.items() if window != BASE}


if st.button("Run every window", type="primary", key="run_windows", disabled=clip is None):
    st.session_state["windows"] = run_windows(clip, settings)

result = st.session_state.get("windows")
if not result or not result["traces"]:
    st.info("Pick a clip and press Run every window.")
    st.stop()
if result["unstored"]:
    st.warning(f"These decodes were not stored: {result['unstored']}")
for window, reason in result["reasons"].items():
    st.warning(f"{window}: {reason}" if window in result["traces"] else f"{window}: not run; {reason}")

traces = result["traces"]
first = next(iter(traces.values()))
st.caption(f"{first.clip_id}: {first.settings.target}, draft {first.draft_name}, K={first.settings.k}.")
accepted = {window: acceptance([trace]) for window, trace in traces.items()}
summary = pd.DataFrame(
    [
        {"window": w, "a1": a.a1, "a2c": a.a2c, "L": a.L, "rounds": a.rounds, "run": result["runs"][w]}
        for w, a in accepted.items()
    ]
)
survival = pd.DataFrame(
    [{"window": w, "depth": depth, "s": s} for w, a in accepted.items() for depth, s in enumerate(a.s)]
)
left, right = st.columns(2)
left.subheader("Survival by depth")
left.plotly_chart(survival_figure(survival), key="survival")
profiles = pd.concat([depth_profile([trace]).assign(window=w) for w, trace in traces.items()], ignore_index=True)
errors = profiles.dropna(subset=["anchor_error_ms"])
right.subheader("Anchor error by depth")
if len(errors):
    right.plotly_chart(
        depth_figure(errors, "anchor_error_ms", "window", "median |draft peak - alignment| (ms)"), key="error"
    )
else:
    right.info("No anchor errors: the draft has no audio attention, or no token got a reference frame.")
st.dataframe(summary, hide_index=True, key="summary")

differences = result["differences"]
if differences:
    st.subheader(f"Each window against {BASE}: {DIFFERENCE}")
    rows = [c.table(window=w) for w, c in differences.items()]
    st.dataframe(pd.concat(rows), hide_index=True, key="differences")
    st.caption(next(iter(differences.values())).caption("the row's window", BASE))
    if result["unstored"] is None:  # runs that were not stored have no page to open
        for window in differences:
            query = {"a": result["runs"][window], "b": result["runs"][BASE]}
            st.page_link("app_pages/compare.py", label=f"Open {window} and {BASE} side by side", query_params=query)
