"""The store's run history, one row per run: its settings, code, row counts, seconds and median WER, and the
filters a listing takes."""

from dataclasses import fields

import duckdb
import pandas as pd

from specasr.trace import Timings

TIMING_COLUMNS = [f"{f.name}_seconds" for f in fields(Timings)]

RUN_FILTERS = {
    "target": "target = $target",
    "draft": "(draft = $draft OR starts_with(draft_name, $draft))",
    "window": '"window" = $window',
    "k": "k = $k",
    "dataset": "run_id IN (SELECT run_id FROM decodes JOIN clips USING (clip_hash) WHERE dataset = $dataset)",
    "since": "created >= CAST($since AS TIMESTAMP)",
    "until": "created <= CAST($until AS TIMESTAMP)",
    "batch": "batch = $batch",
    "clip_hash": "run_id IN (SELECT run_id FROM decodes WHERE clip_hash = $clip_hash)",
    "run_ids": "list_contains($run_ids, run_id)",
}

# A run without decodes (left by an import before imports were checked) is listed too, so that it can be deleted.
RUN_OVERVIEW = f"""
    SELECT runs.*, coalesce(d.draft_name, runs.draft, 'none') AS draft_name, coalesce(d.clips, 0) AS clips,
           d.first_clip, coalesce(d.decodes, 0) AS decodes, coalesce(r.rounds, 0) AS rounds,
           coalesce(s.draft_steps, 0) AS draft_steps, coalesce(d.tokens, 0) AS tokens, d.median_wer,
           {", ".join(f"coalesce(d.{c}, 0) AS {c}" for c in TIMING_COLUMNS)}
    FROM runs
    LEFT JOIN (
        SELECT run_id, any_value(draft_name) AS draft_name, count(DISTINCT clip_hash) AS clips, count(*) AS decodes,
               arg_min(clip_id, decode) AS first_clip,
               sum(len(tokens)) AS tokens, median(wer) AS median_wer,
               {", ".join(f"sum({c}) AS {c}" for c in TIMING_COLUMNS)}
        FROM decodes GROUP BY run_id
    ) d USING (run_id)
    LEFT JOIN (SELECT run_id, count(*) AS rounds FROM rounds GROUP BY run_id) r USING (run_id)
    LEFT JOIN (SELECT run_id, count(*) AS draft_steps FROM draft_steps GROUP BY run_id) s USING (run_id)
"""


def overview(con: duckdb.DuckDBPyConnection, where: str, params: dict) -> pd.DataFrame:
    """RUN_OVERVIEW's rows that match, newest first, with each run's phase seconds summed into its total."""
    frame = con.execute(f"SELECT * FROM ({RUN_OVERVIEW}) WHERE {where} ORDER BY created DESC, run_id", params).df()
    frame["seconds"] = [Timings(*phases).total for phases in frame[TIMING_COLUMNS].itertuples(index=False)]
    frame["label"] = [run_label(row) for row in frame.itertuples(index=False)]
    return frame.drop(columns=TIMING_COLUMNS)


def run_label(run) -> str:
    """A run as people name it: its name where it has one, else its clip (or clip count) and settings."""
    if run.name:
        return run.name
    clips = run.first_clip if run.clips == 1 else f"{run.clips} clips"
    arm = "greedy" if run.draft_name == "none" else f"{run.draft_name.split('@')[0]} {run.window} K={run.k}"
    return f"{clips}: {arm} ({run.command})"
