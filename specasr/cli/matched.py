"""matched: every window from the same rounds, followed through K depths (Table 12)."""

import argparse
import json
import sys
from dataclasses import dataclass

import pandas as pd

from specasr.cli.options import (
    add_aligner_option,
    add_clip_options,
    add_data_options,
    add_draft_options,
    add_store_options,
    add_tree_options,
    add_window_options,
    drafts,
    evaluation_clips,
    listed,
    number,
    settings,
)
from specasr.cli.output import RunStore, json_value, records
from specasr.matched import AGGREGATION, PROTOCOL, STARTS, run_matched
from specasr.matched_tables import (
    Condition,
    contrast_table,
    depth_table,
    outcome_table,
    restart_table,
    summary_table,
)
from specasr.pipeline import Pipeline
from specasr.ranks import joined, leave
from specasr.trace import MOST_K, WINDOWS


@dataclass
class MatchedTables:
    protocol: str
    summary: pd.DataFrame
    depths: pd.DataFrame  # Table 12, top
    contrasts: pd.DataFrame
    outcomes: pd.DataFrame  # Table 12, bottom
    restarts: pd.DataFrame


def matched_tables(conditions: list[Condition], starts: str) -> MatchedTables:
    return MatchedTables(
        protocol=PROTOCOL.format(starts=STARTS[starts]),
        summary=summary_table(conditions),
        depths=depth_table(conditions),
        contrasts=contrast_table(conditions),
        outcomes=outcome_table(conditions),
        restarts=restart_table(conditions),
    )


def add_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("matched", help="every window from the same rounds, followed through K depths (Table 12)")
    add_data_options(p, sets=True)
    add_clip_options(p)
    add_draft_options(p, several=True)
    p.add_argument("--k", type=number(int, 1, MOST_K), default=4, help="depths followed from each round start")
    add_tree_options(p)
    p.add_argument(
        "--window", type=listed(str, WINDOWS), default=("unrestricted", "correct", "shift"), help=", ".join(WINDOWS)
    )
    add_window_options(p)
    add_aligner_option(p)
    p.add_argument(
        "--starts", default="loop", choices=list(STARTS), help="; ".join(f"{k}: {v}" for k, v in STARTS.items())
    )
    add_store_options(p, optional=False)
    p.add_argument("--json", action="store_true", help="print one JSON object with every table")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    names = drafts(args)
    cells = [settings(args, names[0], window=window) for window in args.window]  # every window checked before work
    clips, sets = evaluation_clips(args)
    ranks = joined()  # under torchrun, the first rank keeps the store and prints; every rank rolls out a share
    cache = RunStore(args.db, wanted=ranks.first)  # reference frames and each clip's rollouts; it stores no runs
    pipeline = Pipeline(cache.store)
    conditions = run_matched(pipeline, cells[0], names, list(args.window), clips, sets, args.starts, ranks)
    leave()
    if conditions is None:
        return
    if cache.failure is not None:
        print(f"warning: reference frames not cached in {cache.path}: {cache.failure}", file=sys.stderr)
    found = matched_tables(conditions, args.starts)
    left_out = sum(group is None for group in sets.groups.values())
    apart = f"; matched rounds do not roll out the {left_out} clips left out" if left_out else ""
    aggregation = f"{sets.rule}{apart}; {AGGREGATION}"
    if args.json:
        record = {"protocol": found.protocol, "aggregation": aggregation}
        record |= {name: records(table) for name, table in vars(found).items() if isinstance(table, pd.DataFrame)}
        print(json.dumps(record, default=json_value))
        return
    tree = f"tree width {cells[0].tree_width} (1: a chain), {cells[0].nodes} nodes verified per round"
    print(f"{args.target} on {len(clips)} clips of {args.data}, K={args.k}, {tree}")
    print(f"protocol: {found.protocol}\n{aggregation}")
    for title, table, number_format in (
        ("Each condition", found.summary, "%.3f"),
        ("Drift by depth (Table 12): anchor error in frames, survival, conditional acceptance", found.depths, "%.3f"),
        ("Paired contrasts, b-a, same rounds", found.contrasts, "%+.3f"),
        ("Anchor error by outcome and depth, frames; odds of an error over 200 ms (Table 12)", found.outcomes, "%.3f"),
        ("Restart acceptance with m candidates: a1(m); gain = a1(m) - a1(1), same rounds", found.restarts, "%.3f"),
    ):
        if len(table):
            print(f"\n{title}\n{table.to_string(index=False, float_format=number_format)}")
