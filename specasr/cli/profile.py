"""profile: where a round's time goes, pass by pass."""

import argparse
import json

from specasr.cli.options import add_clip_options, add_draft_options, add_tree_options, clip, number, settings
from specasr.cli.output import records
from specasr.decode import LoopOptions
from specasr.pipeline import Pipeline
from specasr.profiling import profile_round
from specasr.trace import MOST_K


def add_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "profile",
        help="where a round's time goes: a target step, a verification and a draft step (a chain's or a tree's)",
    )
    p.add_argument("audio")
    p.add_argument("--repeats", type=number(int, 1), default=50)
    p.add_argument("--json", action="store_true", help="print the table as a JSON list of rows")
    add_clip_options(p, loops=False)  # it times the passes themselves, outside any loop
    add_draft_options(p)  # a round's passes, timed without a window: no window options
    p.add_argument(
        "--k", type=number(int, 1, MOST_K), default=4, help="draft proposals per profiled round (a tree's depth)"
    )
    add_tree_options(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    asked, profiled, pipeline = settings(args, args.draft), clip(args.audio, args), Pipeline()
    target, draft = pipeline.target(asked), pipeline.draft(asked)
    options = LoopOptions.of(pipeline.resolved(asked), target)
    audio = profiled.audio[: target.window_samples]
    memory = target.encode(target.features(audio))
    valid_frames = target.valid_frames(len(audio))
    table = profile_round(target, draft, memory, valid_frames, options.nodes, options.width, args.repeats)
    if args.json:
        print(json.dumps(records(table)))
        return
    print(f"{profiled.id}: {asked.target} {asked.device} {asked.dtype}, draft {draft.name} {draft.dtype}")
    print("ms: median time of a pass; target_steps: in target steps of one row; the rest: shares of the ops' own time")
    print(table.to_string(index=False, float_format="%.3f"))
