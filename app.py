"""specasr dashboard: watch alignment drift live, intervene on windows, compare checkpoints, query past runs."""

import streamlit as st

st.set_page_config(page_title="specasr", layout="wide")
PAGES = [
    st.Page("app_pages/decode.py", title="Live decode", default=True),
    st.Page("app_pages/dataset.py", title="Dataset"),
    st.Page("app_pages/compare.py", title="Side by side"),
    st.Page("app_pages/windows.py", title="Windows"),
    st.Page("app_pages/drift.py", title="Drift"),
    st.Page("app_pages/checkpoints.py", title="Checkpoints"),
    st.Page("app_pages/cost_rule.py", title="Cost rule"),
    st.Page("app_pages/runs.py", title="Runs"),
]
page = st.navigation(PAGES)
st.session_state["page"] = page.title
page.run()
