"""Checkpoints: two or more drafts on the same clips, side by side, with paired intervals on their differences."""

import hashlib

import pandas as pd
import streamlit as st

import widgets
from specasr.cache import cache_dir
from specasr.dataset import load_manifest, spread
from specasr.draft import shipped_drafts
from specasr.experiments import (
    AGGREGATION,
    REPEATS,
    Grid,
    clip_results,
    contrast,
    draft_label,
    repetition_note,
    run_grid,
    tables,
    weighting,
)
from specasr.metrics import aa_warning, depth_profile
from specasr.views import depth_figure

st.title("Checkpoints")
settings = widgets.settings_sidebar()


def uploaded_draft(files) -> str:
    """An uploaded draft folder (config.json + draft.safetensors) saved under cache/, named by its content."""
    by_name = {f.name: f.getvalue() for f in files}
    if set(by_name) != {"config.json", "draft.safetensors"}:
        raise ValueError("upload exactly a draft's config.json and draft.safetensors")
    digest = hashlib.sha256(by_name["config.json"] + by_name["draft.safetensors"]).hexdigest()[:12]
    folder = cache_dir() / "uploaded-drafts" / digest
    folder.mkdir(parents=True, exist_ok=True)
    for name, content in by_name.items():
        (folder / name).write_bytes(content)
    return str(folder)


tab_run, tab_store = st.tabs(["Run now", "From the store"])
with tab_run:
    choices = [*shipped_drafts(settings.target), "random"]
    drafts = st.multiselect("Drafts", choices, default=choices[:2], key="checkpoint_drafts")
    folders = st.text_input("Draft folders on this machine (comma-separated)", key="checkpoint_folders")
    files = st.file_uploader(
        "Or upload a draft (config.json and draft.safetensors)", accept_multiple_files=True, key="checkpoint_upload"
    )
    source = st.radio("Clips", ["evaluation clips", "one clip"], horizontal=True, key="checkpoint_source")
    if source == "evaluation clips":
        count = st.slider("Clips spread over ../shared/data/speech", 1, 40, 4, key="checkpoint_count")
    else:
        single = widgets.clip_input("checkpoints")
    repeats = st.number_input("Timing repetitions", 1, 20, REPEATS, key="checkpoint_repeats")
    if st.button("Compare", type="primary", key="compare"):
        try:
            names = drafts + [f.strip() for f in folders.split(",") if f.strip()]
            if files:
                names.append(uploaded_draft(files))
            if len(names) < 2:
                raise ValueError("choose at least two drafts")
            if source == "evaluation clips":
                utterances = spread(load_manifest(), count)
                clips = [u.clip() for u in utterances]
                sets = weighting({c.hash: u.subset for c, u in zip(clips, utterances, strict=True)})
            elif single is None:
                raise ValueError("give a clip first")
            else:
                clips, sets = [single], weighting({single.hash: single.dataset or "clip"})
            grid = Grid(settings, tuple(names), (settings.window,), (settings.k,), (settings.threshold,))
            with st.spinner(f"Decoding {len(clips)} clips under {len(names)} drafts and greedy…"):
                runs = run_grid(widgets.pipeline(), widgets.store(), grid, clips, repeats)
                found = tables(widgets.store(), runs, sets)
            greedy = widgets.store().traces(runs.baseline)
            arms = {
                draft_label(s.draft): clip_results(greedy, widgets.store().traces(r), sets)
                for s, r in runs.cells.items()
            }
            st.session_state["checkpoints"] = {
                "cells": found.cells,
                "arms": arms,
                "rule": sets.rule,
                "aa": found.aa,
                "note": repetition_note(repeats),
            }
        except (*widgets.DECODE_ERRORS, FileNotFoundError) as error:
            widgets.report(error)

    result = st.session_state.get("checkpoints")
    if result:
        cells = result["cells"]
        st.caption(f"{result['rule']}; {AGGREGATION}")
        if result["note"]:
            st.warning(result["note"])
        st.subheader("Each draft")
        st.dataframe(cells.drop(columns=["s"]), hide_index=True, key="checkpoint_cells")
        arms = result["arms"]
        (first, baseline), *others = arms.items()
        metrics = ("a1", "a2c", "L", "decode_speedup", "total_speedup")
        differences = [c for name, arm in others for c in contrast(f"{name}-{first}", "", metrics, baseline, arm)]
        st.subheader(f"Differences from {first} (paired bootstrap, 95%)")
        st.dataframe(pd.DataFrame(differences).drop(columns="fixed"), hide_index=True, key="checkpoint_differences")
        st.subheader("A/A check: greedy over its second copy, timed in the same run")
        st.dataframe(result["aa"], hide_index=True, key="checkpoint_aa")
        if warning := aa_warning(result["aa"]):
            st.warning(warning)
        profiles = [depth_profile([r.trace for r in arm]).assign(draft=name) for name, arm in arms.items()]
        profile = pd.concat(profiles, ignore_index=True).dropna(subset=["anchor_error_ms"])
        if len(profile):
            st.plotly_chart(
                depth_figure(
                    profile, "anchor_error_ms", "draft", "median anchor error (ms)", "error_low", "error_high"
                ),
                key="checkpoint_error",
            )

with tab_store:
    runs = widgets.store().runs()
    runs = runs[runs.rounds > 0]
    labels = widgets.run_labels(runs)
    left, right = st.columns(2)
    run_a = left.selectbox("Run a", list(labels), format_func=labels.get, key="store_a")
    run_b = right.selectbox("Run b", list(labels), index=min(1, len(labels) - 1), format_func=labels.get, key="store_b")
    if run_a and run_b and st.button("Compare runs", key="compare_runs"):
        try:
            st.dataframe(widgets.store().compare_runs(run_a, run_b), hide_index=True, key="store_comparison")
        except widgets.DECODE_ERRORS as error:
            widgets.report(error)
