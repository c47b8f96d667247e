"""Figures and tables for the dashboard, built from traces and store DataFrames: no torch, no Streamlit.

Time axes are in seconds of the clip; hovers give positions in milliseconds and frames.
"""

import math
from collections.abc import Callable

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from specasr.trace import DraftStep, Trace

BELOW = {"orientation": "h", "y": -0.25}  # legends under the plot keep narrow columns readable
ON_TOP = {"orientation": "h", "yref": "container", "y": 1, "yanchor": "top"}  # at the figure's top, however tall
ACCEPTED, REJECTED, VERIFIED, ALIGNED, WINDOW = "#2ca02c", "#d62728", "#1f77b4", "#222222", "rgba(128,128,128,0.35)"
# The draft tree's target token (orange, as the transcript marks the target's own tokens), edges and token labels.
TARGET_TOKEN, EDGE, LABEL = "#e67e22", "#bbbbbb", "#222222"
ALIGNMENT_MARK = "#ff2e88"  # seen on every colour of Viridis and on the empty plot around a window
DRIFT_TOKEN_SHARE = 0.82  # of the drift plot's height, the tokens' row
LABEL_PX, MOST_HEIGHT, FRAME_PX = 18, 1400, 200  # a tick label's room; the tallest figure; margins, axes and legend


def token_rows(trace: Trace, pieces: list[str]) -> pd.DataFrame:
    """One row per transcript token: its text, the round that produced it, whether a draft proposal was accepted for
    it or the target supplied it (the first token, and each round's correction), and its positions in ms."""
    origin = ["target"] * len(trace.tokens)
    round_of = [None] * len(trace.tokens)
    for r in trace.rounds:
        for offset in range(r.accepted + 1):
            if (position := r.start + offset) < len(origin):
                origin[position] = "draft" if offset < r.accepted else "target"
                round_of[position] = r.index
    reference = trace.reference_frames or [None] * len(trace.tokens)
    verify = {v.position: v.verify_peaks for v in trace.verified}
    return pd.DataFrame(
        {
            "position": range(len(trace.tokens)),
            "text": pieces,
            "round": pd.Series(round_of, dtype=object),  # None: the first token, from the prompt pass
            "source": origin,
            "reference_ms": [None if f is None else f * trace.frame_seconds * 1000 for f in reference],
            "verify_peaks_ms": [
                [p * trace.frame_seconds * 1000 for p in verify[i]] if i in verify else None for i in range(len(pieces))
            ],
        }
    )


def round_table(trace: Trace, decode: Callable[[list[int]], str]) -> pd.DataFrame:
    """One row per round: its 30 s window and where that starts in the clip, proposals, how many were accepted, the
    target's own token, and its cost in ms."""
    window_start = {seg.index: seg.start_frame * trace.frame_seconds for seg in trace.segments}
    return pd.DataFrame(
        [
            {
                "round": r.index,
                "segment": r.segment,
                "segment start (s)": round(window_start[r.segment], 2) if r.segment in window_start else None,
                "start": r.start,
                "proposed": " | ".join(decode([t]) for t in r.proposed),
                "accepted": r.accepted,
                "target token": decode([r.target_token]),
                "draft ms": round(1000 * r.draft_seconds, 1),
                "verify ms": round(1000 * r.verify_seconds, 1),
            }
            for r in trace.rounds
        ]
    )


def tree_figure(trace: Trace, round_index: int, decode: Callable[[list[int]], str]) -> go.Figure:
    """One round's draft tree: the root (the last verified token) at depth 0, each node at its depth with an edge to
    its parent, the accepted path in green and the target's own next token after its end; the top row is the round's
    spine (`Trace.spine`, what the drift plot shows), other branches below it. Hovers give the draft's probabilities."""
    round = next(r for r in trace.rounds if r.index == round_index)
    steps = [s for s in trace.steps if s.round == round_index]
    row = tree_rows(steps)
    place = {s.node: (s.depth, row[s.node]) for s in steps} | {None: (0, 0)}
    figure = go.Figure()
    for on_path, name, line in (
        (False, "draft edge", {"color": EDGE, "width": 1.5}),
        (True, "accepted path", {"color": ACCEPTED, "width": 4}),
    ):
        figure.add_scatter(
            **_edges([s for s in steps if s.accepted == on_path], place),
            mode="lines",
            name=name,
            line=line,
            hoverinfo="skip",
        )
    end = place[next((s.node for s in steps if s.accepted and s.depth == round.accepted), None)]
    after = (round.accepted + 1, -1)  # the target's token, one row above the spine, off the nodes' rows
    figure.add_scatter(
        x=[end[0], after[0]],
        y=[end[1], after[1]],
        mode="lines",
        showlegend=False,
        line={"color": TARGET_TOKEN, "width": 2, "dash": "dot"},
        hoverinfo="skip",
    )
    root = (0, 0, decode([trace.tokens[round.start - 1]]), f"transcript token {round.start - 1}")
    _token_marks(figure, "root: the last verified token", {"color": VERIFIED, "symbol": "square", "size": 14}, [root])
    for on_path, name, colour in (
        (True, "node on the accepted path", ACCEPTED),
        (False, "node off the path", REJECTED),
    ):
        chosen = [s for s in steps if s.accepted == on_path]
        marker = {"color": colour, "size": [8 + 16 * (s.probability or 0.0) for s in chosen]}  # larger: more probable
        _token_marks(figure, name, marker, [(s.depth, row[s.node], decode([s.token]), _node_hover(s)) for s in chosen])
    target = (*after, decode([round.target_token]), "the target's greedy choice after the accepted path")
    _token_marks(
        figure, "the target's own next token", {"color": TARGET_TOKEN, "symbol": "diamond", "size": 14}, [target]
    )
    deepest = max((s.depth for s in steps), default=0)
    figure.update_xaxes(
        tickvals=list(range(deepest + 2)),
        ticktext=["root", *(f"depth {d}" for d in range(1, deepest + 2))],
        range=[-0.5, deepest + 1.6],
        showgrid=False,
        zeroline=False,
    )
    lowest = max(row.values())
    figure.update_yaxes(visible=False, range=[lowest + 0.5, after[1] - 0.7])  # downwards, room for the top labels
    figure.update_layout(height=140 + 56 * (lowest + 2), legend=BELOW, margin={"t": 30})
    return figure


def tree_rows(steps: list[DraftStep]) -> dict[int | None, int]:
    """Each node's row (None: the root's): siblings in order of preference (the accepted one, then the draft's most
    probable), each leaf on a row of its own and each parent on its first child's, so the spine is row 0."""
    children: dict[int | None, list[int]] = {}
    for s in sorted(steps, key=lambda s: (not s.accepted, -(s.probability or 0.0))):
        children.setdefault(s.parent, []).append(s.node)
    order, pending = [], [None]
    while pending:  # depth first, preferred children first
        node = pending.pop()
        order.append(node)
        pending += reversed(children.get(node, []))
    rows = {node: i for i, node in enumerate(n for n in order if n not in children)}
    for node in reversed(order):  # children before their parents
        if node in children:
            rows[node] = rows[children[node][0]]
    return rows


def _edges(steps: list[DraftStep], place: dict[int | None, tuple[int, int]]) -> dict[str, list]:
    """Line segments from each node to its parent, apart (None) from one another."""
    xs, ys = [], []
    for s in steps:
        (x0, y0), (x1, y1) = place[s.parent], place[s.node]
        xs += [x0, x1, None]
        ys += [y0, y1, None]
    return {"x": xs, "y": ys}


def _token_marks(figure: go.Figure, name: str, marker: dict, points: list[tuple[int, int, str, str]]) -> None:
    """Markers at (x, y), each labelled with its token's text and a hover line."""
    xs, ys, texts, hovers = zip(*points, strict=True) if points else ([], [], [], [])
    figure.add_scatter(
        x=list(xs),
        y=list(ys),
        mode="markers+text",
        name=name,
        text=[text.strip() or repr(text) for text in texts],
        textposition="top center",
        textfont={"size": 15, "color": LABEL},
        marker=marker,
        customdata=list(hovers),
        hovertemplate="%{text}<br>%{customdata}<extra></extra>",
    )


def _node_hover(step: DraftStep) -> str:
    below = "the root" if step.parent is None else f"node {step.parent}"
    probability = "-" if step.probability is None else f"{step.probability:.3f}"
    return f"node {step.node}, depth {step.depth}, below {below}<br>draft probability {probability}"


def drift_figure(
    trace: Trace,
    pieces: list[str],
    layer: int,
    audio: np.ndarray | None = None,
    rate: int = 16000,
    segment: int | None = None,
) -> go.Figure:
    """Where each transcript token was heard, over the clip's time: the draft's attention peak at every proposal
    (accepted or rejected, marker size by depth), the draft's window where one applied, the target's verification
    peak at `layer`, and the forced-alignment frame; the waveform above on the same axis, which shows its times
    above the waveform too. segment: show that 30 s window's tokens and time only (a long clip's whole drift plot is
    too tall to read)."""
    figure = make_subplots(
        rows=2, cols=1, shared_xaxes=True, row_heights=[1 - DRIFT_TOKEN_SHARE, DRIFT_TOKEN_SHARE], vertical_spacing=0.03
    )
    if audio is not None and len(audio):
        _add_waveform(figure, audio, rate, trace.frame_seconds)
    label = {i: f"{i}: {p.strip() or repr(p)}" for i, p in enumerate(pieces)}
    verification = {v.position: v.verify_peaks[layer] for v in trace.verified if layer < len(v.verify_peaks)}
    _add_draft_windows(figure, trace)
    _add_draft_peaks(figure, trace, label, verification)
    if verification:
        _add_verification_peaks(figure, trace, label, verification, layer)
    if trace.reference_frames:
        _add_alignment(figure, trace, label)
    first, end = _token_span(trace, len(pieces), segment)
    height = _height(end - first, DRIFT_TOKEN_SHARE)
    shown = range(first, end, _label_step(end - first, height, DRIFT_TOKEN_SHARE))
    figure.update_yaxes(
        title={"text": "transcript token", "standoff": 8},
        automargin=True,
        tickvals=list(shown),
        ticktext=[label[i] for i in shown],
        range=[end - 0.5, first - 0.5],  # reversed: the first token on top
        row=2,
        col=1,
    )
    figure.update_yaxes(showticklabels=False, row=1, col=1)
    figure.update_xaxes(showticklabels=True, side="top", row=1, col=1)
    figure.update_xaxes(title_text="audio time (s)", row=2, col=1)
    if segment is not None:
        figure.update_xaxes(range=_segment_seconds(trace, segment))
    mark_cuts(figure, trace)
    figure.update_layout(height=height, legend=ON_TOP, margin={"t": 110})  # room for the legend and the times
    return figure


def _add_waveform(figure: go.Figure, audio: np.ndarray, rate: int, frame_seconds: float) -> None:
    """The clip's envelope, one point per encoder frame, in the top row."""
    frames = max(1, len(audio) // int(rate * frame_seconds))
    envelope = np.abs(audio[: frames * (len(audio) // frames)]).reshape(frames, -1).max(axis=1)
    times = np.arange(frames) * (len(audio) / rate / frames)
    figure.add_scatter(
        x=times, y=envelope, fill="tozeroy", mode="lines", name="waveform", line={"color": "#999"}, row=1, col=1
    )


def _spine_positions(trace: Trace) -> list[tuple[DraftStep, int]]:
    """Each draft step on its round's spine, with the transcript position it proposed."""
    start = {r.index: r.start for r in trace.rounds}
    return [(s, start[s.round] + s.depth - 1) for s in trace.spine if s.round in start]


def _add_draft_windows(figure: go.Figure, trace: Trace) -> None:
    """A bar over the audio the draft could attend at each proposal, where a window applied."""
    half_width = trace.settings.half_width_ms / 1000
    xs, ys = [], []
    for s, position in _spine_positions(trace):
        if s.window_centre is not None:
            centre = s.window_centre * trace.frame_seconds
            xs += [centre - half_width, centre + half_width, None]
            ys += [position, position, None]
    if xs:
        figure.add_scatter(
            x=xs,
            y=ys,
            mode="lines",
            name="draft window",
            line={"color": WINDOW, "width": 8},
            hoverinfo="skip",
            row=2,
            col=1,
        )


def _add_draft_peaks(figure: go.Figure, trace: Trace, label: dict, verification: dict[int, int]) -> None:
    """The draft's attention peak at each proposal: accepted ones as circles, rejected ones as crosses."""
    seconds = trace.frame_seconds
    for accepted, name, colour, symbol in ((True, "accepted", ACCEPTED, "circle"), (False, "rejected", REJECTED, "x")):
        chosen = [(s, p) for s, p in _spine_positions(trace) if s.accepted == accepted and s.draft_peak is not None]
        figure.add_scatter(
            x=[s.draft_peak * seconds for s, _ in chosen],
            y=[p for _, p in chosen],
            mode="markers",
            name=f"draft peak, proposal {name}",
            marker={"color": colour, "symbol": symbol, "size": [6 + 3 * s.depth for s, _ in chosen]},
            customdata=[
                [
                    label.get(p, p),
                    s.round,
                    s.depth,
                    _ms(s.draft_peak, seconds),
                    _ms(verification.get(p), seconds),
                    _ms(s.reference_frame, seconds),
                    _ms(s.window_centre, seconds),
                ]
                for s, p in chosen
            ],
            hovertemplate="token %{customdata[0]}<br>round %{customdata[1]}, depth %{customdata[2]}<br>"
            "draft peak %{customdata[3]}<br>verification peak %{customdata[4]}<br>alignment %{customdata[5]}"
            "<br>window centre %{customdata[6]}"
            "<extra></extra>",
            row=2,
            col=1,
        )


def _add_verification_peaks(
    figure: go.Figure, trace: Trace, label: dict, verification: dict[int, int], layer: int
) -> None:
    """The target's verification peak of each transcript token. Points only: a line would cross the plot wherever a
    peak falls on the clip's start."""
    figure.add_scatter(
        x=[peak * trace.frame_seconds for peak in verification.values()],
        y=list(verification),
        mode="markers",
        name=f"target verification peak (layer {layer})",
        marker={"color": VERIFIED, "size": 5},
        customdata=[
            [label.get(position, position), _ms(peak, trace.frame_seconds)] for position, peak in verification.items()
        ],
        hovertemplate="token %{customdata[0]}<br>verification peak %{customdata[1]}<extra></extra>",
        row=2,
        col=1,
    )


def _add_alignment(figure: go.Figure, trace: Trace, label: dict) -> None:
    """The forced-alignment frame of each transcript token that has one."""
    known = [(i, f) for i, f in enumerate(trace.reference_frames) if f is not None]
    figure.add_scatter(
        x=[f * trace.frame_seconds for _, f in known],
        y=[i for i, _ in known],
        mode="markers",
        name="forced alignment",
        marker={"color": ALIGNED, "symbol": "diamond-open", "size": 8},
        customdata=[[label.get(i, i), _ms(f, trace.frame_seconds)] for i, f in known],
        hovertemplate="token %{customdata[0]}<br>forced alignment %{customdata[1]}<extra></extra>",
        row=2,
        col=1,
    )


def _token_span(trace: Trace, count: int, segment: int | None) -> tuple[int, int]:
    """The transcript positions [first, end) a figure shows: a window's, or all."""
    if segment is None:
        return 0, count
    chosen = trace.segments[segment]
    return chosen.first_token, chosen.first_token + chosen.tokens


def _segment_seconds(trace: Trace, segment: int) -> list[float]:
    chosen = trace.segments[segment]
    return [chosen.start_frame * trace.frame_seconds, (chosen.start_frame + chosen.valid_frames) * trace.frame_seconds]


def _height(rows: int, share: float) -> int:
    """A figure tall enough for a label per row, up to MOST_HEIGHT (then labels are thinned: _label_step)."""
    return min(MOST_HEIGHT, max(420, int(LABEL_PX * rows / share) + FRAME_PX))


def _label_step(rows: int, height: int, share: float) -> int:
    """Label every n-th row so that labels keep LABEL_PX apart."""
    return max(1, math.ceil(LABEL_PX * rows / (share * (height - FRAME_PX))))


def _ms(frame: int | None, frame_seconds: float) -> str:
    """A clip frame for a hover: milliseconds, and the frame itself."""
    return "-" if frame is None else f"{frame * frame_seconds * 1000:.0f} ms (frame {frame})"


def attention_heatmap(trace: Trace, pieces: list[str], segment: int | None = None) -> go.Figure:
    """The draft's head-averaged audio attention of every kept proposal (rows: round/depth/token), with the forced
    alignment of the token it proposed for. Each 30 s window's rows sit at that window's place on the clip's time
    axis; dashed lines mark the cuts between windows. segment: that window's rows only."""
    segment_of = {r.index: r.segment for r in trace.rounds}
    rows = [s for s in trace.spine if s.attention is not None and segment in (None, segment_of[s.round])]
    if not rows:
        raise ValueError("this decode kept no attention rows (decode with keep_attention and an audio draft)")
    start = {r.index: r.start for r in trace.rounds}
    origin = {seg.index: seg.start_frame for seg in trace.segments}
    names = [
        f"r{s.round} d{s.depth} {pieces[p].strip() if (p := start[s.round] + s.depth - 1) < len(pieces) else '<eot>'}"
        for s in rows
    ]
    figure = go.Figure()
    for index in sorted({segment_of[s.round] for s in rows}):
        chosen = [i for i, s in enumerate(rows) if segment_of[s.round] == index]
        width = max(len(rows[i].attention) for i in chosen)
        matrix = np.full((len(chosen), width), np.nan)
        for line, i in enumerate(chosen):
            matrix[line, : len(rows[i].attention)] = rows[i].attention
        figure.add_heatmap(
            z=matrix,
            x=(np.arange(width) + origin.get(index, 0)) * trace.frame_seconds,
            y=chosen,
            coloraxis="coloraxis",
            name=f"window {index}",
            hovertemplate="%{x:.2f} s<br>attention %{z:.3f}<extra></extra>",
        )
    aligned = [
        (i, s.reference_frame * trace.frame_seconds) for i, s in enumerate(rows) if s.reference_frame is not None
    ]
    if aligned:
        figure.add_scatter(
            x=[x for _, x in aligned],
            y=[i for i, _ in aligned],
            mode="markers",
            name="forced alignment",
            marker={"color": ALIGNMENT_MARK, "symbol": "diamond-open", "size": 8, "line": {"width": 2}},
        )
    mark_cuts(figure, trace)
    height = _height(len(rows), 1.0)
    shown = range(0, len(rows), _label_step(len(rows), height, 1.0))
    figure.update_yaxes(tickvals=list(shown), ticktext=[names[i] for i in shown], range=[len(rows) - 0.5, -0.5])
    figure.update_xaxes(title_text="audio time (s)", side="top")  # its times above the rows, however many
    if segment is not None:
        figure.update_xaxes(range=_segment_seconds(trace, segment))
    figure.update_layout(
        height=height,
        margin={"t": 60},
        coloraxis={"colorscale": "Viridis", "colorbar": {"title": "attention"}},
        legend={"orientation": "h", "y": 0, "yanchor": "top"},  # right under the rows, not a share of their height
    )
    return figure


def cut_seconds(trace: Trace) -> list[float]:
    """Where the clip was cut into 30 s windows, in seconds of the clip."""
    return [seg.start_frame * trace.frame_seconds for seg in trace.segments if seg.index > 0]


def mark_cuts(figure: go.Figure, trace: Trace) -> None:
    """A dashed line at every cut between windows, through the whole height of the figure."""
    for seconds in cut_seconds(trace):
        line = {"dash": "dash", "color": "#888", "width": 1}
        figure.add_shape(type="line", x0=seconds, x1=seconds, y0=0, y1=1, xref="x", yref="paper", line=line)
        figure.add_annotation(
            x=seconds, y=1, yref="paper", text="window cut", showarrow=False, xanchor="left", font={"color": "#666"}
        )


def survival_figure(survival: pd.DataFrame, by: str = "window") -> go.Figure:
    """Survival s_k by draft depth, one line per `by` value (columns: by, depth, s)."""
    figure = go.Figure()
    for name, rows in survival.groupby(by, sort=False):
        figure.add_scatter(x=rows.depth, y=rows.s, mode="lines+markers", name=str(name))
    figure.update_layout(
        xaxis_title="draft depth k", yaxis_title="survival s_k", yaxis_range=[0, 1.02], height=420, legend=BELOW
    )
    return figure


def depth_figure(
    table: pd.DataFrame, value: str, by: str, title: str, low: str | None = None, high: str | None = None
) -> go.Figure:
    """A per-depth quantity (anchor error, conditional acceptance) as one line per `by` value, with an interval band
    where `low` and `high` columns are given."""
    figure = go.Figure()
    for name, rows in table.groupby(by, sort=False):
        error = None
        if low and high:
            error = {
                "type": "data",
                "symmetric": False,
                "array": rows[high] - rows[value],
                "arrayminus": rows[value] - rows[low],
            }
        figure.add_scatter(x=rows.depth, y=rows[value], error_y=error, mode="lines+markers", name=str(name))
    figure.update_layout(xaxis_title="draft depth k", yaxis_title=title, height=420, legend=BELOW)
    return figure


def cost_rule_figure(runtime: pd.DataFrame) -> go.Figure:
    """The cost rule (paper eq. 5) per runtime-corrected cell: accepted work recovered, dL / (1 + L), against the
    correction's cost, dC / (1 + K rho). Above the diagonal the rule predicts a gain; marker colour is the measured
    sign of the decode speed change."""
    recovered = runtime.gross
    cost = runtime.cost / (1 + runtime.k * runtime.rho)
    limit = float(np.nanmax(np.abs(np.concatenate([recovered, cost, [0.05]])))) * 1.2
    figure = go.Figure()
    figure.add_scatter(
        x=[-limit, limit], y=[-limit, limit], mode="lines", name="break-even", line={"dash": "dash", "color": "#888"}
    )
    figure.add_scatter(
        x=cost,
        y=recovered,
        mode="markers",  # a label beside each point overlaps where drafts land together: the label is in the hover
        text=[
            f"{d} {w} over {u} K={k}"
            for d, w, u, k in zip(runtime.draft, runtime.window, runtime.uncorrected, runtime.k, strict=True)
        ],
        marker={"size": 12, "color": [ACCEPTED if paid else REJECTED for paid in runtime.measured_pays]},
        name="cell (green: measured faster)",
        customdata=np.stack([runtime.net_decode * 100, runtime.d_L], axis=-1),
        hovertemplate="%{text}<br>cost %{x:.3f}<br>recovered %{y:.3f}<br>measured decode change %{customdata[0]:+.1f}%"
        "<br>dL %{customdata[1]:+.3f}<extra></extra>",
    )
    figure.update_layout(
        xaxis_title="correction cost, dC / (1 + K rho)",
        yaxis_title="accepted work recovered, dL / (1 + L)",
        xaxis_range=[-limit, limit],
        yaxis_range=[-limit, limit],
        height=420,
    )
    return figure
