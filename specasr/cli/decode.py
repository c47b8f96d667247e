"""decode: the speculative transcript of one clip with its trace, printed (the JSON record naming the run id it is
stored under), then kept in the store."""

import argparse
import json
from dataclasses import asdict

from specasr.cli.options import (
    add_clip_options,
    add_speculative_options,
    add_store_options,
    checked,
    clip,
    settings,
)
from specasr.cli.output import RunStore
from specasr.metrics import acceptance, anchor_error_by_depth
from specasr.pipeline import Pipeline
from specasr.store import ClipBatch
from specasr.trace import Trace


def add_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("decode", help="speculative transcript of one clip, with its trace (kept in the store)")
    p.add_argument("audio")
    add_clip_options(p)
    add_speculative_options(p)
    add_store_options(p)
    p.add_argument("--json", action="store_true", help="print one JSON object with rounds, metrics and timings")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    asked, decoded = settings(args, args.draft), clip(args.audio, args)
    kept = RunStore(args.db, wanted=not args.no_store)
    trace = checked(Pipeline(kept.store).decode, clip=decoded, settings=asked)
    batch = ClipBatch.new(runs=1, clips=0)  # the run's id, known before it is stored: the record names it
    run_id = batch.run_ids[0] if kept.store is not None else None
    print(json.dumps(record(trace, run_id)) if args.json else trace.text, flush=True)  # out before the store write
    kept.write(lambda store: store.write_runs([([trace], None)], "decode", into=batch))
    return kept.finish()


def record(trace: Trace, run_id: str | None) -> dict:
    accepted = acceptance([trace]) if trace.rounds else None
    has_frames = trace.reference_frames is not None and trace.steps
    return {
        "run_id": run_id,
        "text": trace.text,
        "tokens": trace.tokens,
        "settings": asdict(trace.settings),
        "target": trace.settings.target,
        "draft": trace.draft_name,
        "draft_dtype": trace.settings.draft_dtype,
        "k": trace.settings.k,
        "tree_width": trace.settings.tree_width,
        "tree_nodes": trace.settings.tree_nodes,
        "window": trace.settings.window,
        "device": trace.settings.device,
        "dtype": trace.settings.dtype,
        "reference_source": trace.reference_source,
        "segments": [asdict(s) for s in trace.segments],
        "rounds": _round_records(trace),
        "draft_steps": len(trace.steps),
        "metrics": {
            "a1": accepted and accepted.a1,
            "a2c": accepted and accepted.a2c,
            "s": accepted and accepted.s,
            "L": accepted and accepted.L,
            "tokens_per_round": accepted and accepted.tokens_per_round,
            "anchor_error_by_depth": anchor_error_by_depth([trace]).to_dict("records") if has_frames else None,
        },
        "timings": trace.phase_seconds(),
    }


def _round_records(trace: Trace) -> list[dict]:
    records = []
    for r in trace.rounds:
        steps = [s for s in trace.steps if s.round == r.index]
        verified = [v for v in trace.verified if r.start <= v.position <= r.start + r.accepted]
        records.append(
            {
                "segment": r.segment,
                "proposed": r.proposed,
                "parents": [s.parent for s in steps],
                "depths": [s.depth for s in steps],
                "probabilities": [s.probability for s in steps],
                "path": [s.node for s in steps if s.accepted],
                "accepted": r.accepted,
                "target_token": r.target_token,
                "draft_peaks": [s.draft_peak for s in steps],
                "window_centres": [s.window_centre for s in steps],
                "reference_frames": [s.reference_frame for s in steps],
                "verify_peaks": [v.verify_peaks for v in verified],
                "draft_seconds": r.draft_seconds,
                "verify_seconds": r.verify_seconds,
            }
        )
    return records
