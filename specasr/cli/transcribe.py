"""transcribe: the target's greedy transcript of one clip."""

import argparse
import json
from dataclasses import asdict

from specasr.cli.options import add_clip_options, checked, clip, settings
from specasr.pipeline import Pipeline


def add_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("transcribe", help="greedy transcript of one clip")
    p.add_argument("audio", help="wav, flac, ogg, mp3, m4a, ... (long clips are decoded in 30 s windows)")
    add_clip_options(p)
    p.add_argument("--json", action="store_true", help="print one JSON object with tokens and timings")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    trace = checked(Pipeline().decode, clip=clip(args.audio, args), settings=settings(args, verify_peaks=False))
    if not args.json:
        print(trace.text)
        return
    record = {
        "text": trace.text,
        "tokens": trace.tokens,
        "target": trace.settings.target,
        "device": trace.settings.device,
        "dtype": trace.settings.dtype,
        "segments": [asdict(s) for s in trace.segments],
        "timings": trace.phase_seconds(),
    }
    print(json.dumps(record))
