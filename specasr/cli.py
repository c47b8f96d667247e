"""python -m specasr ...: transcribe a clip, or score a target on a speech set."""

import argparse
import json
import sys
from pathlib import Path

from tqdm import tqdm

from specasr.audio import AudioError, load_audio
from specasr.dataset import DEFAULT_SPEECH_DIR, load_manifest
from specasr.decode import transcribe
from specasr.metrics import word_error_rate
from specasr.targets import BUILTIN_TARGETS, DTYPES, TargetUnavailableError, load_target

USER_ERRORS = (AudioError, TargetUnavailableError, FileNotFoundError)


def _add_target_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--target", default="whisper-tiny.en", help=f"{' | '.join(BUILTIN_TARGETS)} | local folder | hub id"
    )
    parser.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    parser.add_argument("--dtype", default="float32", choices=list(DTYPES))


def cmd_transcribe(args: argparse.Namespace) -> None:
    audio = load_audio(args.audio)
    target = load_target(args.target, args.device, args.dtype)
    trace = transcribe(target, audio, clip_id=Path(args.audio).stem)
    if args.json:
        record = {
            "text": trace.text,
            "tokens": trace.tokens,
            "target": trace.target,
            "device": trace.device,
            "dtype": trace.dtype,
            "timings": trace.timings.as_dict(),
        }
        print(json.dumps(record))
    else:
        print(trace.text)


def cmd_eval(args: argparse.Namespace) -> None:
    utterances = load_manifest(args.speech_dir)[: args.limit]
    target = load_target(args.target, args.device, args.dtype)
    hypotheses, seconds = [], 0.0
    for utterance in tqdm(utterances, desc=f"greedy {target.name}", unit="utt"):
        trace = transcribe(target, load_audio(utterance.path), clip_id=utterance.id)
        hypotheses.append(trace.text)
        seconds += trace.timings.total
    wer = word_error_rate([u.text for u in utterances], hypotheses)
    audio_seconds = sum(u.duration for u in utterances)
    print(f"{target.name} {args.device} {args.dtype}: WER {100 * wer:.2f}% on {len(utterances)} utterances")
    print(
        f"{seconds:.1f} s to transcribe {audio_seconds:.1f} s of audio (real-time factor {seconds / audio_seconds:.3f})"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m specasr", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    p = commands.add_parser("transcribe", help="greedy transcript of one clip")
    p.add_argument("audio", help="wav, flac, ogg, mp3, m4a, ... (at most 30 s)")
    _add_target_options(p)
    p.add_argument("--json", action="store_true", help="print one JSON object with tokens and timings")
    p.set_defaults(run=cmd_transcribe)

    p = commands.add_parser("eval", help="greedy WER of a target on a speech set (manifest.tsv)")
    p.add_argument("--speech-dir", type=Path, default=DEFAULT_SPEECH_DIR)
    p.add_argument("--limit", type=int, default=None, help="only the first N utterances")
    _add_target_options(p)
    p.set_defaults(run=cmd_eval)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.run(args)
    except USER_ERRORS as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0
