"""The metrics of stored runs, from a store's rows without rebuilding the traces."""

from collections.abc import Sequence
from typing import TYPE_CHECKING

import pandas as pd

from specasr.metrics import Acceptance, anchor_error_table, pooled_acceptance
from specasr.trace import DraftStep, spine

if TYPE_CHECKING:
    from specasr.store import Store


def survival(store: "Store", run_ids: Sequence[str]) -> pd.DataFrame:
    """Per speculative run and depth 0..K: survival s (1 at depth 0) and conditional acceptance a_k^c."""
    rows = [
        {"run_id": run_id, "depth": depth, "s": s, "conditional": [None, *result.conditional][depth]}
        for run_id, result in _stored_acceptances(store, run_ids).items()
        for depth, s in enumerate(result.s)
    ]
    return pd.DataFrame(rows, columns=["run_id", "depth", "s", "conditional"])


def stored_anchor_error_by_depth(store: "Store", run_ids: Sequence[str]) -> pd.DataFrame:
    """Per run and draft depth: n, median, mean and p90 of |draft peak - reference frame| in frames, over each
    round's spine (trace.spine)."""
    tree = ["decode", "round", "node", "parent", "accepted", "probability"]
    steps = spine_rows(store.rows("draft_steps", run_ids, ["run_id", *tree, "depth", "draft_peak", "reference_frame"]))
    by_run = dict(tuple(steps.groupby("run_id")))
    tables = [anchor_error_table(by_run[r]).assign(run_id=r) for r in run_ids if r in by_run]
    columns = ["run_id", "depth", "n", "median", "mean", "p90"]
    return pd.concat(tables, ignore_index=True)[columns] if tables else pd.DataFrame(columns=columns)


def spine_rows(steps: pd.DataFrame) -> pd.DataFrame:
    """The draft-step rows (with run_id, decode, node, parent, accepted and probability) on every round's spine."""
    if steps.empty:
        return steps
    kept = []
    for _, rows in steps.groupby(["run_id", "decode", "round"], sort=False):
        nodes = [
            DraftStep(0, depth, 0, accepted, None, None, None, node=node, parent=_value(parent), probability=_value(p))
            for depth, accepted, node, parent, p in zip(
                rows.depth, rows.accepted, rows.node, rows.parent, rows.probability, strict=True
            )
        ]
        kept.append(rows[rows.node.isin({step.node for step in spine(nodes)})])
    return pd.concat(kept)


def _value(value):
    """A row's value, its missing values as None."""
    return None if pd.isna(value) else value


def run_summary(store: "Store", run_ids: Sequence[str]) -> pd.DataFrame:
    """One row per run: its arm, sizes, acceptance (None for greedy runs), total seconds and median WER."""
    run_ids = list(run_ids)
    summary = store.runs(run_ids=run_ids).set_index("run_id").loc[run_ids].reset_index()
    acceptances = _stored_acceptances(store, run_ids)
    for name in ("a1", "a2c", "L"):
        summary[name] = [getattr(acceptances[r], name) if r in acceptances else None for r in run_ids]
    columns = ["run_id", "target", "draft_name", "window", "k", "clips", "decodes", "rounds", "draft_steps"]
    return summary[[*columns, "tokens", "a1", "a2c", "L", "seconds", "median_wer"]]


def _stored_acceptances(store: "Store", run_ids: Sequence[str]) -> dict[str, Acceptance]:
    """Each speculative run's acceptance pooled over its rounds, in run_ids order (greedy runs have none)."""
    k = store.rows("runs", run_ids, ["run_id", "k"]).set_index("run_id").k
    accepted = store.rows("rounds", run_ids, ["run_id", "accepted"]).groupby("run_id").accepted
    decodes = store.rows("decodes", run_ids, ["run_id", "tokens"])
    tokens = decodes.tokens.map(len).groupby(decodes.run_id).sum()
    counts = {run_id: rounds.tolist() for run_id, rounds in accepted}
    return {r: pooled_acceptance(counts[r], int(k[r]), int(tokens[r])) for r in run_ids if r in counts}
