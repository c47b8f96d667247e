"""eval: the target's greedy word error rate and real-time factor on a speech set."""

import argparse
import json
from pathlib import Path

from tqdm import tqdm

from specasr.cli.options import add_clip_options, checked, number, settings
from specasr.dataset import DEFAULT_SPEECH_DIR, load_manifest
from specasr.metrics import word_error_rate
from specasr.pipeline import Pipeline


def add_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("eval", help="greedy WER of a target on a speech set (manifest.tsv)")
    p.add_argument("--speech-dir", type=Path, default=DEFAULT_SPEECH_DIR)
    p.add_argument("--limit", type=number(int, 1), default=None, help="only the first N utterances")
    p.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    add_clip_options(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    utterances = load_manifest(args.speech_dir)[: args.limit]
    pipeline, greedy = Pipeline(), settings(args, verify_peaks=False)
    traces = [
        checked(pipeline.decode, clip=u.clip(args.max_seconds), settings=greedy)
        for u in tqdm(utterances, desc=f"greedy {args.target}", unit="utt")
    ]
    wer = word_error_rate([u.text for u in utterances], [t.text for t in traces])
    seconds = sum(t.timings.total for t in traces)
    audio_seconds = sum(u.duration for u in utterances)
    if args.json:
        record = {"target": args.target, "device": args.device, "dtype": args.dtype, "utterances": len(utterances)}
        print(json.dumps(record | {"wer": wer, "seconds": seconds, "audio_seconds": audio_seconds}))
        return
    print(f"{args.target} {args.device} {args.dtype}: WER {100 * wer:.2f}% on {len(utterances)} utterances")
    print(
        f"{seconds:.1f} s to transcribe {audio_seconds:.1f} s of audio (real-time factor {seconds / audio_seconds:.3f})"
    )
