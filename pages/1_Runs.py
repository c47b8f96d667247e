"""Past runs: every decode the dashboard and the command line kept in the run store."""

import streamlit as st

from specasr.store import Store, StoreError

COLUMNS = [
    "run_id", "created", "command", "target", "draft_name", "draft_dtype", "k", "window", "clips", "decodes", "rounds",
    "draft_steps", "tokens", "median_wer", "seconds", "device", "dtype", "git_commit", "git_dirty",
]  # fmt: skip

st.set_page_config(page_title="specasr: runs", layout="wide")
st.title("Runs")
try:
    store = Store()
    runs = store.runs()
except StoreError as error:
    st.error(str(error))
    st.stop()
st.caption(f"{len(runs)} runs in {store.path}, newest first. Each run is one set of settings over one or more clips.")
st.dataframe(runs[COLUMNS], hide_index=True)
