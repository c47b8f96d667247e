"""Cost rule: when a correction pays. A correction that adds dL accepted tokens per round and costs dC (in
verification passes) speeds decoding up when dL / (1 + L) > dC / (1 + K rho) (paper eq. 5)."""

import streamlit as st

import progress
import widgets
from specasr import (
    BUILTIN_TARGETS,
    REPEATS,
    RUNTIME_BASES,
    Grid,
    Settings,
    acceptance,
    correction_pays,
    devices,
    experiment_tables,
    predicted_speed_change,
    rho,
    run_grid,
    shipped_drafts,
    stored_grid,
)
from specasr.views import cost_rule_figure

RUNTIME_CONTRAST = (*RUNTIME_BASES, "runtime")  # the runtime correction and the loops Table 16 holds it against
st.title("Cost rule")
st.write(
    "One round costs about 1 + K rho verification passes (rho: one draft step's cost relative to one verification) "
    "and advances 1 + L tokens. A correction that changes L by dL and adds dC to the round's cost pays when "
    "**dL / (1 + L) > dC / (1 + K rho)**."
)


@st.cache_data(show_spinner="Computing the experiment's tables (bootstrap intervals)…")
def latest_tables(db: str, target: str, runs_key: tuple) -> dict:
    """The runner's tables for the latest experiment on `target`; `runs_key` names its runs, so a new run refreshes."""
    found = experiment_tables(widgets.store(), stored_grid(widgets.store(), target))
    return {"runtime": found.runtime, "sweep": found.sweep}


current = (st.session_state.get("decoded") or {}).get("trace")
defaults = {"L": 1.0, "rho": 0.1, "k": 4}
if current is not None and current.rounds:
    try:
        defaults = {"L": acceptance([current]).L, "rho": rho([current]), "k": current.settings.k}
        st.caption(
            f"Measured on your latest decode ({current.clip_id}, draft {current.draft_name}, K={current.settings.k}): "
            f"L = {defaults['L']:.2f}, rho = {defaults['rho']:.3f}."
        )
    except ValueError as error:
        st.caption(f"Your latest decode gives no rho: {error}")

st.subheader("Try a correction")
columns = st.columns(5)
L = columns[0].number_input("L", 0.0, 16.0, float(defaults["L"]), step=0.05, key="rule_L")
k = columns[1].number_input("K", 1, 16, int(defaults["k"]), key="rule_k")
measured_rho = columns[2].number_input(
    "rho", 0.0, 2.0, float(defaults["rho"]), step=0.01, format="%.3f", key="rule_rho"
)
delta_L = columns[3].number_input("dL", -4.0, 4.0, 0.1, step=0.05, key="rule_dL")
delta_cost = columns[4].number_input("dC (verification passes)", -1.0, 4.0, 0.05, step=0.01, key="rule_dC")
recovered, cost = delta_L / (1 + L), delta_cost / (1 + k * measured_rho)
verdict = "pays" if correction_pays(delta_L, L, delta_cost, k, measured_rho) else "does not pay"
st.metric("Work recovered minus cost", f"{recovered - cost:+.3f}", help="dL / (1 + L) - dC / (1 + K rho)")
st.write(f"dL / (1 + L) = {recovered:.3f} against dC / (1 + K rho) = {cost:.3f}: the correction **{verdict}**.")
change = predicted_speed_change(delta_L, L, delta_cost, k, measured_rho)
st.write(f"Predicted speed change (paper eq. 4): {change:+.1%}.")

st.subheader("Measured by the experiment runner")
target = st.selectbox("Target", list(BUILTIN_TARGETS), key="rule_target")
try:
    runs = stored_grid(widgets.store(), target)
except widgets.DECODE_ERRORS as error:
    widgets.report(error)
    st.stop()
with st.expander("Run an experiment here", expanded=runs is None):
    st.caption(
        f"Every draft shipped for {target}, unrestricted, shifted and runtime-corrected windows, at each K, timed "
        "against greedy decoding with its A/A copy (the command line's `python -m specasr experiment` takes more "
        "choices: trees, thresholds, several data sets)."
    )
    columns = st.columns(3)
    count = columns[0].slider("Evaluation clips", 1, 40, 4, key="rule_clips")
    ks = columns[1].multiselect("K", list(range(1, 9)), [2, 4], key="rule_ks")
    repeats = columns[2].number_input("Timing repetitions", 1, 20, REPEATS, key="rule_repeats")
    if st.button("Run the experiment", type="primary", key="rule_run", disabled=not ks):
        base = Settings(target=target, device=devices()[0])
        grid = Grid(base, tuple(shipped_drafts(target)), RUNTIME_CONTRAST, tuple(sorted(ks)))
        try:
            with st.spinner(f"Decoding {count} clips under {len(grid.cells())} cells and greedy…"):
                clips, _ = widgets.evaluation_clips(count)
                made = run_grid(widgets.pipeline(), widgets.store(), grid, clips, repeats, progress.PageBar)
            for reason in made.not_stored:
                st.warning(f"Not stored, so not shown below: {reason}")
            runs = stored_grid(widgets.store(), target)
        except widgets.DECODE_ERRORS as error:
            widgets.report(error)
if runs is None:
    st.info(f"No experiment on {target} in the store yet: run one above.")
    st.stop()
key = (runs.baseline, runs.peaks, tuple(sorted(runs.cells.values())))
found = latest_tables(str(widgets.store().path), target, key)
if len(found["runtime"]):
    st.plotly_chart(cost_rule_figure(found["runtime"]), key="rule_figure")
    st.caption(
        "Each point is a runtime-corrected cell against an uncorrected loop of the same draft, K and threshold (no "
        "window, or the window shifted 0.5 s: the `uncorrected` column): "
        "above the dashed line the rule predicts a gain; green where the measured decode phase got faster. In the "
        "table, predicted_change (eq. 4) stands beside the measured net_decode; readout_error is the runtime layer's "
        "peak against the forced alignment, centre_error the window's centre (by depth 1..K)."
    )
    st.dataframe(found["runtime"], hide_index=True, key="rule_runtime")
else:
    st.info("This experiment has no runtime-window cell next to an unrestricted one.")
st.subheader("K and threshold sweep")
st.dataframe(found["sweep"], hide_index=True, key="rule_sweep")
