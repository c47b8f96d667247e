"""align: the reference frame of every transcript token, by forced alignment."""

import argparse
import json
from dataclasses import asdict

from specasr.cli.options import add_aligner_option, add_clip_options, clip, settings
from specasr.pipeline import Pipeline


def add_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("align", help="reference frame of every transcript token, by forced alignment")
    p.add_argument("audio")
    p.add_argument("--text", default=None, help="the transcript to align (default: the target's greedy transcript)")
    add_aligner_option(p)
    add_clip_options(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    asked, aligned, pipeline = settings(args, aligner=args.aligner), clip(args.audio, args), Pipeline()
    if args.text is not None:
        reference = pipeline.align_text(aligned, asked, args.text)
    else:
        reference = pipeline.reference(aligned, asked)
    target = pipeline.target(asked)
    tokens = [t for window in reference.window_tokens for t in window]
    text = " ".join(target.decode_text(window) for window in reference.window_tokens if window)
    if args.json:
        record = {
            "text": text,
            "target": target.name,
            "aligner": reference.source,
            "words": [asdict(w) for w in reference.words],
            "tokens": tokens,
            "frames": reference.frames,
            "frame_seconds": target.frame_seconds,
        }
        print(json.dumps(record))
        return
    print(text)
    for word in reference.words:
        span = f"{word.start:7.2f} {word.end:7.2f}" if word.aligned else "  (not aligned)"
        print(f"  {span}  {word.word}")
    for token, frame in zip(tokens, reference.frames, strict=True):
        piece = target.tokenizer.decode([token])
        print(f"  token {token:>6} {piece!r:>16}  frame {frame if frame is not None else '-'}")
