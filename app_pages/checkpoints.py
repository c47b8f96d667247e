"""Checkpoints: two or more drafts on the same clips, side by side, with paired intervals on their differences."""

import hashlib
from dataclasses import dataclass

import pandas as pd
import streamlit as st

import progress
import widgets
from specasr import (
    AGGREGATION,
    DIFFERENCE,
    REPEATS,
    Comparison,
    Grid,
    GridRuns,
    Trace,
    Weighting,
    aa_warning,
    cache_dir,
    compare_runs,
    compare_traces,
    depth_profile,
    draft_label,
    experiment_tables,
    grid_traces,
    repetition_note,
    run_grid,
    shipped_drafts,
    unreliable_mark,
    weighting,
)
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


@dataclass(frozen=True)
class DraftPair:
    """Two drafts' runs of one comparison: A, B and the comparison of A against B."""

    draft_a: str
    draft_b: str
    run_a: str | None  # None: decoded but not stored
    run_b: str | None
    comparison: Comparison


def draft_pairs(runs: GridRuns, sets: Weighting) -> list[DraftPair]:
    """Every other draft (A) against the first (B), speed against the greedy baseline timed beside them."""
    decoded = grid_traces(widgets.store(), runs)
    arms = [(draft_label(s.draft), runs.cells[s], traces) for s, traces in decoded.cells.items()]
    (first, first_run, first_traces), *others = arms
    return [
        DraftPair(name, first, run, first_run, compare_traces(traces, first_traces, decoded.baseline, sets))
        for name, run, traces in others
    ]


def show_pairs(pairs: list[DraftPair]) -> None:
    """Every pair's differences in one table, what they hold, and a link to each pair side by side."""
    rows = [p.comparison.table(**{"run A": p.draft_a, "run B": p.draft_b}) for p in pairs]
    st.dataframe(pd.concat(rows), hide_index=True, key="checkpoint_differences")
    name_a = pairs[0].draft_a if len(pairs) == 1 else "the draft in column run A"
    st.caption(pairs[0].comparison.caption(name_a, pairs[0].draft_b))
    for pair in pairs:
        if pair.run_a and pair.run_b:
            side_by_side(pair.run_a, pair.run_b, f"{pair.draft_a} and {pair.draft_b}")


def compared_traces(pairs: list[DraftPair]) -> dict[str, list[Trace]]:
    """Each draft's first repeats of the compared clips (B, the first draft, is the same in every pair)."""
    return {pairs[0].draft_b: [b for _, b in pairs[0].comparison.pairs]} | {
        p.draft_a: [a for a, _ in p.comparison.pairs] for p in pairs
    }


def side_by_side(run_a: str, run_b: str, name: str = "A and B") -> None:
    st.page_link("app_pages/compare.py", label=f"Open {name} side by side", query_params={"a": run_a, "b": run_b})


tab_run, tab_store = st.tabs(["Run now", "From the store"])
with tab_run:
    choices = [*shipped_drafts(settings.target), "random"]
    drafts = st.multiselect("Drafts", choices, default=choices[:2], key="checkpoint_drafts")
    folders = st.text_input("Draft folders on this machine (comma-separated)", key="checkpoint_folders")
    files = st.file_uploader(
        "Or upload a draft (config.json and draft.safetensors)", accept_multiple_files=True, key="checkpoint_upload"
    )
    current = widgets.followed()
    one_clip = current is not None and current.source != widgets.EXAMPLE_SOURCE  # a clip the user picked
    sources = ["evaluation clips", "one clip"]
    source = st.radio("Clips", sources, index=int(one_clip), horizontal=True, key="checkpoint_source")
    if source == "evaluation clips":
        count = st.slider("Clips spread over ../shared/data/speech", 1, 40, 4, key="checkpoint_count")
    else:
        single = widgets.clip_input("checkpoints", settings.max_seconds)
    repeats = st.number_input("Timing repetitions", 1, 20, REPEATS, key="checkpoint_repeats")
    if st.button("Compare", type="primary", key="compare"):
        try:
            names = drafts + [f.strip() for f in folders.split(",") if f.strip()]
            if files:
                names.append(uploaded_draft(files))
            if len(names) < 2:
                raise ValueError("choose at least two drafts")
            if source == "evaluation clips":
                clips, sets = widgets.evaluation_clips(count)
            elif single is None:
                raise ValueError("give a clip first")
            else:
                clips, sets = [single], weighting({single.hash: single.dataset or "clip"})
            grid = Grid(settings, tuple(names), (settings.window,), (settings.k,), (settings.threshold,))
            with st.spinner(f"Decoding {len(clips)} clips under {len(names)} drafts and greedy…"):
                runs = run_grid(widgets.pipeline(), widgets.store(), grid, clips, repeats, progress.PageBar)
                found = experiment_tables(widgets.store(), runs, sets)
            st.session_state["checkpoints"] = {
                "cells": found.cells,
                "pairs": draft_pairs(runs, sets),
                "rule": sets.rule,
                "aa": found.aa,
                "note": repetition_note(repeats),
                "not_stored": runs.not_stored,
            }
        except widgets.DECODE_ERRORS as error:
            widgets.report(error)

    result = st.session_state.get("checkpoints")
    if result:
        cells = result["cells"]
        st.caption(f"{result['rule']}; {AGGREGATION}")
        if result["note"]:
            st.warning(result["note"])
        for reason in result["not_stored"]:
            st.warning(f"Not stored (shown here only): {reason}")
        st.subheader(f"Each draft{unreliable_mark(result['aa'])}")
        st.dataframe(cells.drop(columns=["s"]), hide_index=True, key="checkpoint_cells")
        pairs = result["pairs"]
        st.subheader(f"Differences from {pairs[0].draft_b}: {DIFFERENCE}")
        show_pairs(pairs)
        st.subheader("A/A check: greedy over its second copy, timed in the same run")
        st.dataframe(result["aa"], hide_index=True, key="checkpoint_aa")
        if warning := aa_warning(result["aa"]):
            st.warning(warning)
        profiles = [depth_profile(traces).assign(draft=name) for name, traces in compared_traces(pairs).items()]
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
    run_a = left.selectbox("Run A", list(labels), format_func=labels.get, key="store_a")
    run_b = right.selectbox("Run B", list(labels), index=min(1, len(labels) - 1), format_func=labels.get, key="store_b")
    if run_a and run_b and st.button("Compare runs", key="compare_runs"):
        try:
            comparison = compare_runs(widgets.store(), run_a, run_b)
            st.dataframe(comparison.table(), hide_index=True, key="store_comparison")
            st.caption(comparison.caption(labels[run_a], labels[run_b]))
            side_by_side(run_a, run_b)
        except widgets.DECODE_ERRORS as error:
            widgets.report(error)
