"""specasr dashboard: watch alignment drift live, intervene on windows, compare checkpoints, query past runs."""

import streamlit as st

st.set_page_config(page_title="specasr", layout="wide")
PAGES = [
    st.Page("pages/decode.py", title="Live decode", default=True),
    st.Page("pages/windows.py", title="Windows"),
    st.Page("pages/drift.py", title="Drift"),
    st.Page("pages/checkpoints.py", title="Checkpoints"),
    st.Page("pages/cost_rule.py", title="Cost rule"),
    st.Page("pages/runs.py", title="Runs"),
]
st.navigation(PAGES).run()
