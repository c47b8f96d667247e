"""Dataset: a folder or upload of clips, decoded clip by clip; the worst clips first."""

import hashlib

import pandas as pd
import streamlit as st

import progress
import widgets
from specasr import (
    DEFAULT_SPEECH_DIR,
    AudioError,
    Clip,
    Settings,
    Utterance,
    cache_dir,
    clipset,
    load_audio,
    spread_clips,
)

DEFAULT_CLIPS = 20
FOLDER, UPLOAD = "a manifest folder", "an upload"
COLUMN_CONFIG = {
    "clip_id": st.column_config.TextColumn("clip"),
    "duration_s": st.column_config.NumberColumn("seconds", format="%.1f", width=60),
    "wer": st.column_config.NumberColumn("WER", format="percent", width=64),
    "a1": st.column_config.NumberColumn("a1", format="%.2f", width=50, help="Restart acceptance"),
    "a2c": st.column_config.NumberColumn("a2c", format="%.2f", width=50, help="Continuation acceptance"),
    "L": st.column_config.NumberColumn("L", format="%.2f", width=50, help="Accepted proposals per round"),
    "anchor_error_ms": st.column_config.NumberColumn(
        "anchor error (ms)", format="%.0f", width=115, help="Median over the clip's draft steps"
    ),
    "run_id": st.column_config.TextColumn("run"),
}

st.title("Dataset")
st.write(
    "Decode a set of clips under the sidebar's settings, then find the worst clips and open one on Live decode to "
    "hear it while watching drift. Each clip is stored as soon as it is decoded: stopping loses at most the clip in "
    "progress, and decoding the set again skips every clip already stored under these settings."
)
settings = widgets.settings_sidebar()


@st.cache_data(show_spinner=False, max_entries=10_000)
def audio_hash(path: str, modified_ns: int) -> str | None:
    """A clip file's audio hash, the store's key for it, read once per version of the file; None where it is not
    audio (decoding the set says why)."""
    try:
        return Clip("", load_audio(path)).hash
    except AudioError:
        return None


@st.cache_data(show_spinner=False, max_entries=10_000)
def run_metrics(db: str, run_id: str) -> dict:
    """A stored clip's row of the table; runs never change, and `db` keeps the runs of two stores apart."""
    return clipset.clip_metrics(widgets.store().traces(run_id)[0])


def source_folder() -> str | None:
    """The folder of the manifest to read: typed in, or made from an upload; None until there is one."""
    source = st.radio("Clips from", [FOLDER, UPLOAD], horizontal=True, key="dataset_source")
    if source == FOLDER:
        return st.text_input("Manifest folder (or its manifest.tsv)", str(DEFAULT_SPEECH_DIR), key="dataset_folder")
    files = st.file_uploader(
        "A manifest (.tsv with columns id, path, duration_s, speaker and text) and the audio files it names",
        accept_multiple_files=True,
        key="dataset_upload",
    )
    if not files:
        return None
    folder = clipset.save_upload({f.name: f.getvalue() for f in files}, cache_dir() / "uploads")
    st.caption(f"Saved in {folder}: give that folder as a manifest folder to come back to this set.")
    return str(folder)


def stored(utterances: list[Utterance], settings: Settings) -> dict[str, str]:
    """Clip id -> its stored dataset run under these settings, for the clips the store holds."""
    with st.spinner("Reading the clips…"):
        hashes = {u.id: audio_hash(str(u.path), u.path.stat().st_mtime_ns) for u in utterances}
    held = clipset.stored_runs(widgets.store(), widgets.pipeline().resolved(clipset.dataset_settings(settings)))
    return {u.id: held[hashes[u.id]] for u in utterances if hashes[u.id] in held}


def decode(utterances: list[Utterance], settings: Settings, keep_audio: bool) -> clipset.SetDecode | None:
    """Decode the set with a progress bar and a Stop button (any control stops the run at the next clip's report;
    the flag it leaves set tells the next run)."""
    st.session_state["dataset_running"] = True
    stop = st.empty()
    stop.button("Stop", key="dataset_stop", help="Stops before the next clip; the clips decoded so far stay stored")
    bar = progress.PageBar(total=len(utterances), desc="clips", unit="clips")
    rounds = st.empty()

    def started(index: int, utterance: Utterance) -> None:
        bar.update(index - bar.n)
        bar.set_postfix_str(f"now {utterance.id}")

    try:
        outcome = clipset.decode_set(
            widgets.pipeline(),
            widgets.store(),
            utterances,
            settings,
            started,
            keep_audio,
            progress.RoundProgress(rounds),
        )
    except widgets.DECODE_ERRORS as error:
        widgets.report(error)
        outcome = None
    st.session_state["dataset_running"] = False  # not reached when Streamlit stops the run for another
    stop.empty()
    bar.close()
    rounds.empty()
    return outcome


def report_outcome(outcome: clipset.SetDecode) -> None:
    if outcome.decoded or outcome.reused:
        st.success(
            f"{outcome.decoded} clips decoded and stored; {outcome.reused} reused from the store, already decoded "
            "under these settings."
        )
    if outcome.unstored:
        st.warning(f"{len(outcome.unstored)} clips decoded but not stored: {outcome.store_error}")
    if outcome.problems:
        with st.expander(f"{len(outcome.problems)} clips with a problem", expanded=True):
            for clip_id, problem in outcome.problems.items():
                st.warning(f"{clip_id}: {problem}")


if st.session_state.get("dataset_running"):
    st.session_state["dataset_running"] = False
    st.warning(
        "The last decode stopped before the end. The clips it finished are stored: press Decode the set to go on "
        "with the rest."
    )
try:
    folder = source_folder()
    utterances = clipset.read_manifest(folder.strip()) if folder else []
except clipset.ClipSetError as error:
    st.error(str(error))
    st.stop()
if not utterances:
    st.info("Upload a manifest and its audio files.")
    st.stop()
if st.session_state.get("dataset_count", 0) > len(utterances):  # remembered from a larger manifest
    # Set, not deleted: the browser keeps showing a deleted value until the widget is sent a new one.
    st.session_state["dataset_count"] = min(DEFAULT_CLIPS, len(utterances))
count = st.number_input(
    f"Clips, spread evenly through the manifest's {len(utterances)}",
    1,
    len(utterances),
    min(DEFAULT_CLIPS, len(utterances)),
    key="dataset_count",
)
chosen = spread_clips(utterances, count)
asked = (tuple(u.id for u in chosen), settings)
if st.button("Decode the set", type="primary", key="decode_set"):
    outcome = decode(chosen, settings, keep_audio=st.session_state["dataset_source"] == UPLOAD)
    st.session_state["dataset_outcome"] = (asked, outcome)
last = st.session_state.get("dataset_outcome")
unstored = {}  # clip id -> a decode of these clips under these settings that the store could not take
if last and last[0] == asked and last[1] is not None:
    report_outcome(last[1])
    unstored = last[1].unstored

try:
    runs = stored(chosen, settings)
except widgets.DECODE_ERRORS as error:
    widgets.report(error)
    st.stop()
st.caption(f"{len(runs)} of these {len(chosen)} clips are stored under the sidebar's settings.")
st.subheader("Clips, worst first")
if not runs and not unstored:
    st.info("None of these clips is stored under the sidebar's settings yet: press Decode the set.")
    st.stop()

store = widgets.store()
with st.spinner("Reading the stored decodes…"):
    rows = {clip_id: run_metrics(str(store.path), run_id) | {"run_id": run_id} for clip_id, run_id in runs.items()}
rows |= {clip_id: clipset.clip_metrics(trace) | {"run_id": None} for clip_id, trace in unstored.items()}
table = clipset.clip_table(chosen, rows)
left, middle, right = st.columns(3)
options = sorted(table["set"].unique())
st.session_state["dataset_sets"] = [s for s in st.session_state.get("dataset_sets", []) if s in options]
sets = left.multiselect("Sets", options, key="dataset_sets")
least = middle.number_input("WER at least (0.1 is 10%)", 0.0, None, 0.0, step=0.05, key="dataset_min_wer")
search = right.text_input("Clip id contains", key="dataset_search")
shown = table[
    (table["set"].isin(sets) if sets else True)
    & ((table.wer >= least) if least > 0 else True)
    & table.clip_id.str.contains(search.strip(), case=False, regex=False)
]
# A selection points at a row of the table as it was drawn: another table gets a fresh one.
drawn = hashlib.sha256(",".join(shown.clip_id + ":" + shown.run_id.fillna("")).encode()).hexdigest()[:12]
event = st.dataframe(
    shown,
    hide_index=True,
    column_config=COLUMN_CONFIG,
    on_select="rerun",
    selection_mode="single-row",
    key=f"dataset_table_{drawn}",
)
st.caption(
    f"{len(shown)} of {len(table)} clips. Highest WER first, then lowest L; click a column's header to sort by it. "
    "Anchor error: the draft's attention peak against the forced-alignment frame of the token, median over the "
    "clip's draft steps."
)
row = shown.iloc[event.selection.rows[0]] if event.selection.rows else None
if row is None:
    st.caption("Select a row (the box at its left) to open that clip's run on Live decode.")
elif pd.isna(row.run_id):
    st.caption(f"The decode of {row.clip_id} was not stored, so it cannot be opened on Live decode.")
else:
    st.page_link(
        "app_pages/decode.py",
        label=f"Open {row.clip_id} on Live decode (run {row.run_id}): hear it while watching drift",
        icon=":material/play_circle:",
        query_params={"run": row.run_id, "clip": row.clip_id},
    )
