"""Runs: every decode the dashboard, the command line and the experiment runner kept in the run store."""

import io
import json
import tempfile
import zipfile
from dataclasses import asdict
from pathlib import Path

import pandas as pd
import streamlit as st

import widgets
from specasr import export_runs

COLUMNS = [
    "label", "run_id", "created", "command", "target", "draft_name", "draft_dtype", "k", "window", "clips",
    "first_clip", "decodes", "rounds", "draft_steps", "tokens", "median_wer", "seconds", "device", "dtype", "note",
    "git_commit", "git_dirty",
]  # fmt: skip

st.title("Runs")
store = widgets.store()
left, middle, right = st.columns(3)
filters = {
    "target": left.text_input("Target", key="runs_target") or None,
    "draft": middle.text_input("Draft (name or name@hash)", key="runs_draft") or None,
    "window": right.text_input("Window", key="runs_window") or None,
    "dataset": left.text_input("Dataset", key="runs_dataset") or None,
}
k = middle.number_input("K (0: any)", 0, 64, 0, key="runs_k")
dates = right.date_input("Created between", value=(), key="runs_dates")
if len(dates) == 2:
    filters |= {"since": str(dates[0]), "until": f"{dates[1]} 23:59:59"}
try:
    runs = store.runs(**filters, k=k or None)
except widgets.DECODE_ERRORS as error:
    widgets.report(error)
    st.stop()
st.caption(f"{len(runs)} runs in {store.path}, newest first. Each run is one set of settings over one or more clips.")
st.dataframe(runs[COLUMNS], hide_index=True, key="runs_table")
if runs.empty:
    st.stop()

labels = widgets.run_labels(runs)
run_id = st.selectbox("Open a run", list(labels), format_func=labels.get, key="runs_open")
chosen = runs.set_index("run_id").loc[run_id]
with st.form("runs_label"):
    name = st.text_input("Name", chosen["name"] or "", key=f"runs_name_{run_id}", help="Shown for the run everywhere")
    note = st.text_area("Note", chosen["note"] or "", key=f"runs_note_{run_id}", height=80)
    if st.form_submit_button("Save name and note"):
        try:
            store.label_run(run_id, name, note)
            st.rerun()
        except widgets.DECODE_ERRORS as error:
            widgets.report(error)
left, right = st.columns(2)
left.page_link("app_pages/decode.py", label=f"Show run {run_id} on Live decode", query_params={"run": run_id})
right.page_link("app_pages/drift.py", label=f"Show run {run_id} on Drift", query_params={"run": run_id})
st.caption(f"Shareable: add ?run={run_id} to the Live decode or Drift page's address.")


def exported(run_id: str) -> tuple[bytes, bytes]:
    """The run's tables exported once, zipped as Parquet (with the export's manifest, for `runs import`) and as
    CSV."""
    with tempfile.TemporaryDirectory() as folder:
        paths = export_runs(store, [run_id], folder)
        parquet = _zip({path.name: path.read_bytes() for path in sorted(Path(folder).iterdir())})
        csv = _zip(
            {path.with_suffix(".csv").name: pd.read_parquet(path).to_csv(index=False).encode() for path in paths}
        )
    return parquet, csv


def _zip(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, content in files.items():
            archive.writestr(name, content)
    return buffer.getvalue()


parquet, csv = exported(run_id)
left, middle, right = st.columns(3)
left.download_button("Parquet (zip)", parquet, f"run-{run_id}-parquet.zip", key="download_parquet")
middle.download_button("CSV (zip)", csv, f"run-{run_id}-csv.zip", key="download_csv")
traces = json.dumps([asdict(t) for t in store.traces(run_id)])
right.download_button("JSON (traces)", traces, f"run-{run_id}.json", mime="application/json", key="download_json")
