"""precision: low-precision loops against float32 greedy (paper A.4)."""

import argparse
import json
from dataclasses import replace

from specasr.cli.options import add_clip_options, add_data_options, add_speculative_options, listed, settings
from specasr.cli.output import json_value, records
from specasr.dataset import load_utterances, spread
from specasr.pipeline import Pipeline
from specasr.precision import precision_table


def add_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("precision", help="low-precision loops against float32 greedy (paper A.4)")
    add_data_options(p)
    p.add_argument(
        "--low", type=listed(str, ("float16", "bfloat16")), default=("bfloat16",), help="float16, bfloat16 or both"
    )
    p.add_argument("--json", action="store_true", help="print the table as a JSON list of rows")
    add_clip_options(p)
    add_speculative_options(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    clips = [u.clip(args.max_seconds) for u in spread(load_utterances(args.data), args.clips)]
    reference = settings(args)
    arms = {}
    for dtype in args.low:
        arms[f"greedy {dtype}"] = replace(reference, dtype=dtype)
        arms[f"{args.draft} K={args.k} {dtype}"] = settings(args, args.draft, dtype=dtype)
    table = precision_table(Pipeline(), clips, arms, reference)
    if args.json:
        print(json.dumps(records(table), default=json_value))
        return
    print(f"{args.target} on {len(clips)} clips of {args.data}, against float32 greedy, {args.device}")
    print(table.to_string(index=False, float_format="%.4f"))
