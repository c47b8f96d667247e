"""bench: our greedy and speculative loops and peer decoders timed on the same clips; the tables are printed (and
written to --out) before the runs are stored."""

import argparse
import itertools
import json
from dataclasses import replace
from pathlib import Path

from specasr.bench import aa_check, benchmark, store_results, summary
from specasr.cli.options import (
    add_clip_options,
    add_out_options,
    add_speculative_options,
    add_store_options,
    add_timing_options,
    data_files,
    drafts,
    listed,
    number,
    out_file,
    settings,
    trees,
)
from specasr.cli.output import Report, RunStore, json_value, records
from specasr.dataset import DEFAULT_SPEECH_DIR, load_manifest, spread
from specasr.experiments import REPEATS, shape_label
from specasr.intervals import aa_verdict, aa_warning, unreliable_mark
from specasr.peers import TARGET_LAYERS
from specasr.pipeline import Pipeline
from specasr.report import repetition_note
from specasr.trace import DECODERS, Settings


def add_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("bench", help="time greedy vs speculative decoding on the same clips")
    p.add_argument("--speech-dir", type=Path, default=DEFAULT_SPEECH_DIR)
    p.add_argument("--clips", type=number(int, 1), default=20, help="N clips spread evenly over the manifest")
    p.add_argument(
        "--repeats",
        type=number(int, 1),
        default=REPEATS,
        help="timing repetitions per clip, interleaved; a clip's time is their median",
    )
    p.add_argument(
        "--peers", type=listed(str, DECODERS[1:]), default=(), help=f"peer decoders, e.g. {','.join(DECODERS[1:])}"
    )
    p.add_argument(
        "--assistant",
        default=TARGET_LAYERS,
        help=f"transformers-assisted's assistant: {TARGET_LAYERS} (the target's first and last decoder layers, "
        "untrained) or a Whisper folder or hub id whose decoder reads the target's encoder (distil-whisper)",
    )
    add_clip_options(p)
    add_speculative_options(p, several_drafts=True)
    add_store_options(p)
    add_out_options(p)
    add_timing_options(p)
    p.add_argument("--json", action="store_true", help="print one JSON object: per-clip rows, summary and run ids")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    utterances = spread(load_manifest(args.speech_dir), args.clips)
    report = Report(out_file(args, data_files(str(args.speech_dir))))
    kept = RunStore(args.db, wanted=not args.no_store)
    pipeline = Pipeline(kept.store)
    arms = _arms(args, pipeline)
    clips = [u.clip(args.max_seconds) for u in utterances]
    table, results = benchmark(pipeline, arms, clips, args.repeats)
    arm_rows, aa = summary(table, results), aa_check(results, args.aa_tolerance)
    if args.json:  # the record names the runs: stored first, printed whatever the store did
        runs = kept.write(lambda store: store_results(store, results, "bench")) or {}
        record = {"clips": records(table), "summary": records(arm_rows), "aa": records(aa)}
        record |= {"timing": {"aa": aa_verdict(aa)}, "aa_warning": aa_warning(aa)}
        report.print(json.dumps(record | {"runs": runs}, default=json_value))
        report.save()
    else:
        speed = unreliable_mark(aa)
        report.print(f"Per clip{speed}\n{table.to_string(index=False, float_format='%.4f')}")
        report.print(
            f"\n{args.target}, K={','.join(map(str, args.k))}, {_shapes(args)}, window={args.window}, "
            f"{args.device} {args.dtype} "
            f"(drafts {args.draft_dtype or args.dtype}), {args.repeats} repeats; baseline: {table.baseline.iloc[0]}, "
            "the fastest greedy loop of ours"
        )
        report.print(f"Per arm{speed}\n{arm_rows.to_string(index=False, float_format='%.3f')}")
        report.print(f"\nA/A check: {aa.arm.iloc[0]} over its copy, timed side by side")
        report.print(aa.drop(columns="arm").to_string(index=False, float_format="%.3f"))
        report.warn(aa_warning(aa), repetition_note(args.repeats))
        report.save()
        runs = kept.write(lambda store: store_results(store, results, "bench")) or {}
        for name, run_id in runs.items():
            print(f"stored {name} as run {run_id} in {kept.path}")
    return max(int(report.failed), kept.finish())


def _shapes(args: argparse.Namespace) -> str:
    return "; ".join("chain" if w == 1 else f"tree of width {w}, {n or f'K x {w}'} nodes" for w, n in trees(args))


def _arms(args: argparse.Namespace, pipeline: Pipeline) -> dict[str, Settings]:
    """Our greedy loop with its other variants beside it (eager where the device replays captured steps; plain where
    its steps are compiled, and compiled where they are not unless --no-compile says so), the peers, and every draft
    at every K and tree."""
    arms = {"greedy": settings(args)}
    greedy = pipeline.resolved(arms["greedy"])
    if greedy.graphs:
        arms["greedy eager"] = replace(arms["greedy"], graphs=False, compile=False)
    if greedy.compile:
        arms["greedy plain"] = replace(arms["greedy"], compile=False)
    elif args.compile is None:
        arms["greedy compiled"] = replace(arms["greedy"], compile=True)
    for peer in args.peers:
        assistant = args.assistant if peer == "transformers-assisted" else None
        arms[peer] = replace(arms["greedy"], decoder=peer, assistant=assistant)
    shapes = trees(args)
    for name in drafts(args):
        for k, (width, nodes) in itertools.product(args.k, shapes):
            arm = settings(args, name, k=k, tree_width=width, tree_nodes=nodes)
            arms[name if len(args.k) == len(shapes) == 1 else f"{name} {shape_label(arm)}"] = arm
    return arms
