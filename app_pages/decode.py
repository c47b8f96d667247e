"""Live decode: one clip through greedy and speculative decoding; where the draft listened, where the target
listened, and where the words are."""

import html
from dataclasses import replace

import streamlit as st

import progress
import widgets
from player import drift_player
from specasr import (
    SAMPLE_RATE,
    aa_check,
    aa_verdict,
    aa_warning,
    acceptance,
    bench_summary,
    benchmark,
    store_results,
    word_error_rate,
)
from specasr.views import attention_heatmap, drift_figure, round_table, token_rows, tree_figure

st.title("Live decode")
requested = st.query_params.get("run"), st.query_params.get("clip")  # a stored run, and one of its clips
if requested[0] and st.session_state.get("opened") != requested:
    st.session_state["opened"] = requested
    try:
        stored = widgets.store().traces(requested[0])
    except widgets.DECODE_ERRORS as error:
        st.error(str(error))
        stored = []
    chosen = [t for t in stored if requested[1] in (None, t.clip_id)]
    if stored and not chosen:
        st.error(f"Run {requested[0]} decoded no clip {requested[1]!r}.")
    if chosen:
        widgets.adopt_settings(chosen[0].settings)
        st.session_state["decoded"] = widgets.stored_result(chosen[0], requested[0])
        st.session_state["decode_source"] = widgets.FOLLOWED  # Run decodes the clip on screen again
settings = widgets.settings_sidebar()
clip = widgets.clip_input("decode", settings.max_seconds)


def run(clip, settings) -> dict | None:
    """One speculative decode, kept in the store; it times nothing against greedy (that is `time_it`)."""
    with st.status("Decoding…", expanded=True) as status:
        status.write("Speculative decode, keeping the draft's attention rows and aligning the transcript")
        try:
            rounds = progress.RoundProgress(st.empty(), clip, settings)
            trace, problem = widgets.decode_with_reference(clip, replace(settings, keep_attention=True), rounds)
            if problem:
                st.warning(f"{problem}; the other positions are still shown.")
        except widgets.DECODE_ERRORS as error:
            widgets.report(error)
            return None
        run_id, unstored = widgets.try_store(
            lambda: widgets.store().write_run([trace], "dashboard", audio={clip.hash: clip.audio})
        )
        status.update(label="Done", state="complete", expanded=False)
    return {"trace": trace, "audio": clip.audio, "clip": clip, "run": run_id, "unstored": unstored, "timing": None}


def time_it(clip, settings, repeats: int) -> dict | None:
    """Greedy against speculative decoding of the clip through the bench's harness: `repeats` warm repetitions per
    arm, interleaved, with the bench's A/A copy of greedy."""
    arms = {"greedy": replace(settings, draft=None), "speculative": replace(settings, reference="never")}
    if settings.needs_reference:
        arms["speculative"] = replace(settings, reference="always")
    with st.status(f"Timing greedy against speculative: {repeats} warm repetitions each", expanded=True) as status:
        try:
            table, results = benchmark(widgets.pipeline(), arms, [clip], repeats, progress.PageBar)
        except widgets.DECODE_ERRORS as error:
            widgets.report(error)
            return None
        runs, unstored = widgets.try_store(lambda: store_results(widgets.store(), results, "dashboard-bench"))
        status.update(label="Timed", state="complete", expanded=False)
    rows = bench_summary(table, results).set_index("arm")
    timed = {"speed": rows.loc["speculative"], "greedy": rows.loc["greedy"], "aa": aa_check(results)}
    greedy = results["greedy"].settings
    timed["baseline"] = f"{'graphed ' if greedy.graphs else ''}greedy decoding on {greedy.device} ({greedy.dtype})"
    return timed | {"runs": runs, "unstored": unstored, "repeats": repeats}


if st.button("Run", type="primary", key="run", disabled=clip is None):
    decoded = st.session_state["decoded"] = run(clip, settings)
    if decoded:
        st.query_params.pop("clip", None)
        st.query_params.pop("run", None)  # a decode the store could not take has no address
        if decoded["run"]:
            st.query_params["run"] = decoded["run"]
            st.session_state["opened"] = (decoded["run"], None)

result = st.session_state.get("decoded")
if not result:
    st.info("Pick a clip and press Run. Changing a setting decodes nothing until you press Run again.")
    st.stop()
if changed := widgets.changed_settings(result["trace"].settings, settings):
    st.warning(
        f"Stale: the result below was decoded with other settings ({', '.join(changed)} differ from the sidebar's). "
        "Press Run to decode with the current ones."
    )

trace = result["trace"]
pieces = widgets.token_pieces(trace)
run_note = f"stored as run {result['run']}" if result["run"] else "not stored"
tree = f", a tree of width {trace.settings.tree_width} verifying {trace.settings.nodes} nodes per round"
st.caption(
    f"{trace.clip_id}: {trace.settings.target} on {trace.settings.device} ({trace.settings.dtype}), draft "
    f"{trace.draft_name}, window {trace.settings.window}, K={trace.settings.k}"
    f"{tree if trace.settings.tree_width > 1 else ''}; {run_note}."
)
if result["unstored"]:
    st.warning(f"This decode was not stored: {result['unstored']}")
listen = False  # the clip's player tied to the drift plot below, where the audio is at hand
if result["audio"] is not None:
    listen = st.toggle("Listen along the drift plot (click a mark in it to play from its time)", True, key="listen")
    if not listen:
        st.audio(result["audio"], sample_rate=SAMPLE_RATE)

tokens = token_rows(trace, pieces)
st.subheader("Transcript")
marked, rounds = [], tokens["round"].tolist()
for row in tokens.itertuples():
    if row.position > 0 and row.round != rounds[row.position - 1]:
        marked.append('<span style="color:#999">│</span>')
    style = "background:#d4f5d4" if row.source == "draft" else "background:#fde2c8;font-weight:600"
    marked.append(f'<span style="{style}" title="round {row.round}, {row.source}">{html.escape(row.text)}</span>')
st.markdown("".join(marked) or "*(no speech recognized)*", unsafe_allow_html=True)
st.caption("Green: a draft proposal the target accepted. Orange: the target's own token. │: a new round.")

if trace.reference_text:
    st.caption(f"Reference: “{trace.reference_text}”")
    try:
        wer = word_error_rate([trace.reference_text], [trace.text])
        st.metric("Word error rate against the reference", f"{wer:.1%}")
    except ValueError:
        st.caption("The reference text has no words to score.")
if trace.rounds:
    accepted = acceptance([trace])
    columns = st.columns(4)
    columns[0].metric("a1 (restart)", f"{accepted.a1:.2f}")
    columns[1].metric("a2c (continuation)", "-" if accepted.a2c is None else f"{accepted.a2c:.2f}")
    columns[2].metric("L (accepted per round)", f"{accepted.L:.2f}")
    columns[3].metric("Rounds", accepted.rounds)

st.subheader("Speed")
timeable = result["clip"] is not None and trace.settings.draft is not None
if timeable:
    repeats = st.number_input("Timing repetitions per arm (warm, interleaved)", 1, 20, 5, key="repeats")
    if st.button("Time it", key="time_it", help="Decode the clip again, greedy and speculative in turn, timed"):
        timed = replace(trace.settings, keep_attention=False, reference="auto")
        result["timing"] = time_it(result["clip"], timed, repeats)
timing = result.get("timing")
if timing is None:
    if timeable:
        how = "press Time it"
    elif trace.settings.draft is None:
        how = "this is a greedy decode; decode the clip with a draft"
    else:
        how = "the clip's audio is not at hand; decode it here with Run, then press Time it"
    st.info(f"Not timed: a decode is not benchmarked unless asked; {how} to time it against greedy.")
else:
    speed, runs = timing["speed"], timing["runs"]
    if timing["unstored"]:
        st.warning(f"These timings were not stored: {timing['unstored']}")
    verdict = aa_verdict(timing["aa"])
    unreliable = "" if verdict["reliable"] else " (UNRELIABLE)"
    columns = st.columns(3)
    for column, phase, label in ((columns[0], "decode", "Decode-phase"), (columns[1], "total", "End-to-end")):
        low, high = speed[f"{phase}_speedup_low"], speed[f"{phase}_speedup_high"]
        column.metric(
            f"{label} speedup{unreliable}", f"{speed[f'{phase}_speedup_pooled']:.2f}x [{low:.2f}, {high:.2f}]"
        )
    columns[2].metric("Greedy decode ms/token", f"{timing['greedy'].ms_per_token:.1f}")
    spread = (
        "one repetition: no run-to-run spread to show"
        if timing["repeats"] == 1
        else "in brackets the 95% bootstrap interval over the repetitions, paired by repetition: the run-to-run spread"
    )
    stored_as = f" (runs {runs['greedy']} and {runs['speculative']})" if runs else ""
    st.caption(
        f"Speedups against {timing['baseline']} of {trace.clip_id}, medians of {timing['repeats']} warm repetitions "
        "per arm, "
        f"interleaved, after one warm-up decode each; {spread}{stored_as}."
    )
    if not speed.same_tokens_clips:
        st.error("The speculative transcript differed from greedy's: report this as a bug.")
    aa = timing["aa"].set_index("phase")
    aa_run = f" (run {runs['greedy (A/A)']})" if runs else ""
    st.caption(
        f"A/A check, greedy timed twice in the same run{aa_run}: decode "
        f"{aa.ratio['decode']:.3f}x [{aa.low['decode']:.3f}, {aa.high['decode']:.3f}], end-to-end "
        f"{aa.ratio['total']:.3f}x [{aa.low['total']:.3f}, {aa.high['total']:.3f}]: the speedups above are "
        f"{'reliable' if verdict['reliable'] else 'UNRELIABLE'} (the interval must hold 1 and stay within "
        f"+-{verdict['tolerance']:.0%})."
    )
    if warning := aa_warning(timing["aa"]):
        st.warning(warning)

st.subheader("Alignment drift")
layers = max((len(v.verify_peaks) for v in trace.verified), default=1)
runtime = widgets.runtime_layer(trace)
layer = st.selectbox(  # one choice per target: another target's layer numbers mean other layers
    "Target layer for verification peaks", range(layers), min(runtime, layers - 1), key=f"layer_{trace.settings.target}"
)
segment = widgets.window_picker(trace, key=f"window_{result['run']}")
figure = drift_figure(trace, pieces, layer, result["audio"], segment=segment)
if listen:
    drift_player(figure, result["audio"])
else:
    st.plotly_chart(figure, key="drift")
st.caption(
    "Each row is a transcript token. Circles: the draft's attention peak for an accepted proposal (larger: deeper in "
    "the round); crosses: rejected proposals; blue dots: where the target's verification attended at the chosen layer; "
    "diamonds: the forced-alignment time; grey bars: the draft's attention window where one applied."
)
with st.expander("Draft attention heatmap", key="heatmap_open"):  # kept open when another window is picked
    try:
        st.plotly_chart(attention_heatmap(trace, pieces, segment), key="heatmap")
    except ValueError as error:
        st.info(str(error))
decode = widgets.token_decoder(trace)
with st.expander("Rounds"):
    st.dataframe(round_table(trace, decode), hide_index=True)

if trace.rounds:
    st.subheader("A round's draft tree")
    path_length = {r.index: r.accepted for r in trace.rounds}
    nodes = {r.index: len(r.proposed) for r in trace.rounds}
    chosen = widgets.select(
        st,
        "Round",
        list(path_length),
        key=f"tree_round_{result['run']}",
        default=max(path_length, key=path_length.get),  # the first round with the longest accepted path
        format_func=lambda i: f"round {i}: {path_length[i]} of {nodes[i]} nodes accepted",
    )
    st.plotly_chart(tree_figure(trace, chosen, decode), key="tree")
    st.caption(
        "Opens on the first round with the longest accepted path, where drafting paid off most. The root is the last "
        "verified token; each node is a draft proposal at its depth, joined to the node it was drafted below (larger: "
        "more probable to the draft; hover for its probability). Green: the path the target accepted; red: nodes off "
        "it; orange diamond: the target's own next token after the path. The top row is the round's spine, what the "
        "drift plot shows: the accepted path, then the draft's likeliest child at each depth."
    )
