"""python -m specasr ...: transcribe, decode, align, eval, bench, train, drafts."""

import argparse
import json
import sys
from pathlib import Path

import torch.distributed as dist
from tqdm import tqdm

from specasr.align import ALIGNERS, AlignerUnavailableError, AlignmentError, align_tokens, get_aligner
from specasr.audio import AudioError, load_audio
from specasr.bench import benchmark, summary
from specasr.cache import cache_dir
from specasr.dataset import DEFAULT_SPEECH_DIR, load_manifest, spread
from specasr.decode import WINDOWS, SpeculativeConfig, greedy_tokens, speculative_transcribe, transcribe
from specasr.draft import Draft, DraftMismatchError, resolve_draft, shipped_drafts
from specasr.metrics import acceptance, anchor_error_by_depth, word_error_rate
from specasr.targets import BUILTIN_TARGETS, DTYPES, FRAME_SECONDS, TargetUnavailableError, WhisperTarget, load_target
from specasr.trace import Trace
from specasr.train import VARIANTS, TrainConfig, distributed, train
from specasr.trainset import data_hash, prepare_examples, training_sources


class UsageError(ValueError):
    """A command-line value that cannot be used as given."""


USER_ERRORS = (
    AudioError,
    TargetUnavailableError,
    DraftMismatchError,
    AlignmentError,
    AlignerUnavailableError,
    FileNotFoundError,
    UsageError,
)


def _layers(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(layer) for layer in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected layer numbers separated by commas, got {text!r}") from None


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


def _add_speculative_options(parser: argparse.ArgumentParser, several_drafts: bool = False) -> None:
    about = "a shipped draft (python -m specasr drafts), a folder, random, or random-no-audio"
    if several_drafts:
        parser.add_argument("--draft", action="append", help=about + "; repeat it to compare drafts (default: random)")
    else:
        parser.add_argument("--draft", default="random", help=about)
    parser.add_argument(
        "--draft-dtype", default=None, choices=list(DTYPES), help="the draft's precision (default: the target's)"
    )
    parser.add_argument("--k", type=int, default=4, help="most draft proposals per round")
    parser.add_argument("--window", default="unrestricted", choices=WINDOWS)
    parser.add_argument("--half-width-ms", type=float, default=400.0)
    parser.add_argument("--runtime-layer", type=int, default=None, help="target decoder layer (0-based) for runtime")
    parser.add_argument("--threshold", type=float, default=0.0, help="stop proposing below this draft confidence")


def _speculative_config(args: argparse.Namespace) -> SpeculativeConfig:
    try:
        return SpeculativeConfig(
            k=args.k,
            window=args.window,
            half_width_ms=args.half_width_ms,
            runtime_layer=args.runtime_layer,
            threshold=args.threshold,
        )
    except ValueError as error:
        raise UsageError(str(error)) from error


def _reference(path: str | None, target: WhisperTarget, audio) -> list[int | None] | None:
    """Reference frames from a JSON file, or with `auto` from force-aligning the target's greedy transcript."""
    if path is None:
        return None
    if path == "auto":
        tokens = greedy_tokens(target, target.encode(target.features(audio)))
        return align_tokens(get_aligner(), target, audio, tokens).frames
    try:
        frames = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise UsageError(f"cannot read reference frames from {path}: {error}") from error
    if not isinstance(frames, list) or not all(f is None or isinstance(f, int) for f in frames):
        raise UsageError(f"{path} must hold a JSON list of frame numbers (or null), one per transcript token")
    return frames


def _round_records(trace: Trace) -> list[dict]:
    records = []
    for r in trace.rounds:
        steps = [s for s in trace.steps if s.round == r.index]
        verified = [v for v in trace.verified if r.start <= v.position <= r.start + r.accepted]
        records.append(
            {
                "proposed": r.proposed,
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


def _draft(name: str, target: WhisperTarget, args: argparse.Namespace) -> Draft:
    return resolve_draft(name, target, DTYPES[args.draft_dtype] if args.draft_dtype else None)


def cmd_decode(args: argparse.Namespace) -> None:
    audio = load_audio(args.audio)
    config = _speculative_config(args)
    target = load_target(args.target, args.device, args.dtype)
    reference = _reference(args.reference, target, audio)
    try:
        trace = speculative_transcribe(
            target, _draft(args.draft, target, args), audio, config, Path(args.audio).stem, reference
        )
    except ValueError as error:  # a window that needs reference frames, a runtime layer out of range
        raise UsageError(str(error)) from error
    if not args.json:
        print(trace.text)
        return
    accepted = acceptance([trace]) if trace.rounds else None
    record = {
        "text": trace.text,
        "tokens": trace.tokens,
        "target": trace.target,
        "draft": trace.draft,
        "draft_dtype": trace.draft_dtype,
        "k": trace.k,
        "window": trace.window,
        "device": trace.device,
        "dtype": trace.dtype,
        "rounds": _round_records(trace),
        "metrics": {
            "a1": accepted and accepted.a1,
            "a2c": accepted and accepted.a2c,
            "s": accepted and accepted.s,
            "L": accepted and accepted.L,
            "tokens_per_round": accepted and accepted.tokens_per_round,
            "anchor_error_by_depth": anchor_error_by_depth([trace]).to_dict("records") if reference else None,
        },
        "timings": trace.timings.as_dict(),
    }
    print(json.dumps(record))


def cmd_align(args: argparse.Namespace) -> None:
    audio = load_audio(args.audio)
    aligner = get_aligner(args.aligner)
    target = load_target(args.target, args.device, args.dtype)
    if args.text is not None:
        tokens = target.tokenizer.encode(" " + args.text.strip(), add_special_tokens=False)
    else:
        tokens = greedy_tokens(target, target.encode(target.features(audio)))
    alignment = align_tokens(aligner, target, audio, tokens)
    pieces = [target.tokenizer.decode([t]) for t in tokens]
    if args.json:
        record = {
            "text": alignment.text,
            "target": target.name,
            "aligner": aligner.name,
            "words": [w.__dict__ for w in alignment.words],
            "tokens": tokens,
            "frames": alignment.frames,
            "frame_seconds": FRAME_SECONDS,
        }
        print(json.dumps(record))
        return
    print(alignment.text)
    for word in alignment.words:
        span = f"{word.start:7.2f} {word.end:7.2f}" if word.aligned else "  (not aligned)"
        print(f"  {span}  {word.word}")
    for token, piece, frame in zip(tokens, pieces, alignment.frames, strict=True):
        print(f"  token {token:>6} {piece!r:>16}  frame {frame if frame is not None else '-'}")


def cmd_bench(args: argparse.Namespace) -> None:
    utterances = spread(load_manifest(args.speech_dir), args.clips)
    config = _speculative_config(args)
    target = load_target(args.target, args.device, args.dtype)
    drafts = {name: _draft(name, target, args) for name in args.draft or ["random"]}
    clips = [(u.id, load_audio(u.path)) for u in utterances]
    table, traces = benchmark(target, drafts, clips, config, args.repeats)
    print(table.to_string(index=False, float_format="%.4f"))
    draft_dtype = args.draft_dtype or args.dtype
    print(
        f"\n{target.name}, K={config.k}, window={config.window}, {args.device} {args.dtype} "
        f"(drafts {draft_dtype}), {args.repeats} repeats"
    )
    print(summary(table, traces).to_string(index=False, float_format="%.3f"))


def cmd_train(args: argparse.Namespace) -> None:
    config = TrainConfig(
        variant=args.variant,
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        unroll=args.unroll,
        taps=args.taps,
        ffn_dim=args.ffn_dim,
        draft_vocab=args.draft_vocab,
        seed=args.seed,
    )
    aligner = get_aligner(args.aligner)
    target = load_target(args.target, args.device, args.dtype)
    sources = training_sources(args.real, args.espeak, args.hibari, args.seed)
    rank, _ = distributed()
    if rank == 0:  # one process fills the feature cache; under torchrun the others wait, then read it
        examples = prepare_examples(target, sources, aligner)
    if dist.is_initialized():
        dist.barrier()
    if rank != 0:
        examples = prepare_examples(target, sources, aligner)
    out = args.out or cache_dir() / "drafts" / target.name / config.variant
    described = {source.name: source.settings for source in sources}
    draft = train(target, examples, config, out, data_hash(examples), described)
    if rank == 0:
        print(f"{draft.name} trained on {len(examples)} examples; saved in {out}")


def cmd_drafts(args: argparse.Namespace) -> None:
    for name in shipped_drafts(args.target):
        print(name)


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

    p = commands.add_parser("decode", help="speculative transcript of one clip, with its trace")
    p.add_argument("audio")
    _add_target_options(p)
    _add_speculative_options(p)
    p.add_argument(
        "--reference",
        default=None,
        help="JSON list of reference frames, one per transcript token, or auto (align the greedy transcript)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object with rounds, metrics and timings")
    p.set_defaults(run=cmd_decode)

    p = commands.add_parser("align", help="reference frame of every transcript token, by forced alignment")
    p.add_argument("audio")
    p.add_argument("--text", default=None, help="the transcript to align (default: the target's greedy transcript)")
    p.add_argument("--aligner", default="pocketsphinx", choices=list(ALIGNERS))
    _add_target_options(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=cmd_align)

    p = commands.add_parser("train", help="train a draft (control, anchordraft or no-audio) for a target")
    _add_target_options(p)
    p.add_argument("--variant", default="anchordraft", choices=list(VARIANTS))
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=12)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--unroll", type=int, default=3, help="draft depths trained per position")
    p.add_argument("--taps", type=_layers, default=None, help="target layers the draft reads, e.g. 3,6")
    p.add_argument("--ffn-dim", type=int, default=None, help="draft feed-forward width (default: the target's)")
    p.add_argument("--draft-vocab", type=int, default=4096, help="reduced draft vocabulary size; 0 for the full one")
    p.add_argument("--real", type=int, default=251, help="clips of ../shared/data/train-speech")
    p.add_argument("--espeak", type=int, default=400, help="espeak-ng sentences from ../shared/data/text")
    p.add_argument("--hibari", type=int, default=200, help="hibari-tts sentences from ../shared/data/text")
    p.add_argument("--aligner", default="pocketsphinx", choices=list(ALIGNERS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="default: cache/drafts/TARGET/VARIANT")
    p.set_defaults(run=cmd_train)

    p = commands.add_parser("drafts", help="list the drafts that come with specasr")
    p.add_argument("--target", default=None)
    p.set_defaults(run=cmd_drafts)

    p = commands.add_parser("bench", help="time greedy vs speculative decoding on the same clips")
    p.add_argument("--speech-dir", type=Path, default=DEFAULT_SPEECH_DIR)
    p.add_argument("--clips", type=int, default=20, help="N clips spread evenly over the manifest")
    p.add_argument("--repeats", type=int, default=5)
    _add_target_options(p)
    _add_speculative_options(p, several_drafts=True)
    p.set_defaults(run=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.run(args)
    except USER_ERRORS as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0
