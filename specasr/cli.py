"""python -m specasr ...: transcribe, decode, align, eval, bench, profile, experiment, runs, train, drafts."""

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from datetime import datetime
from pathlib import Path

import pandas as pd
import torch
import torch.distributed as dist
from tqdm import tqdm

from specasr.align import ALIGNERS, AlignerUnavailableError, AlignmentError, get_aligner
from specasr.audio import DEFAULT_MAX_SECONDS, AudioError, Clip, load_audio
from specasr.bench import aa_check, benchmark, store_results, summary
from specasr.cache import cache_dir
from specasr.dataset import DEFAULT_SPEECH_DIR, load_manifest, load_utterances, spread
from specasr.draft import DraftMismatchError, shipped_drafts
from specasr.experiments import (
    AGGREGATION,
    MIN_SET_CLIPS,
    PROTOCOL,
    REPEATS,
    Grid,
    Weighting,
    repetition_note,
    run_grid,
    weighting,
)
from specasr.experiments import tables as experiment_tables
from specasr.matched import AGGREGATION as MATCHED_AGGREGATION
from specasr.matched import STARTS, matched_tables, run_matched
from specasr.metrics import aa_warning, acceptance, anchor_error_by_depth, word_error_rate
from specasr.peers import TARGET_LAYERS
from specasr.pipeline import Pipeline
from specasr.precision import precision_table
from specasr.profiling import profile_round
from specasr.store import Store, StoreError, default_db_path
from specasr.targets import BUILTIN_TARGETS, DTYPES, TargetUnavailableError, load_target
from specasr.trace import DECODERS, Settings, Trace
from specasr.train import INITS, VARIANTS, TrainConfig, distributed, train
from specasr.trainset import data_hash, prepare_examples, training_sources
from specasr.windows import WINDOWS


class UsageError(ValueError):
    """A command-line value that cannot be used as given."""


USER_ERRORS = (
    AudioError,
    TargetUnavailableError,
    DraftMismatchError,
    AlignmentError,
    AlignerUnavailableError,
    FileNotFoundError,
    StoreError,
    UsageError,
)


def _layers(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(layer) for layer in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected layer numbers separated by commas, got {text!r}") from None


def _device(text: str) -> str:
    try:
        device = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"unknown device {text!r}; use cpu, cuda or cuda:N") from None
    if device.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"specasr decodes on cpu or cuda, not {device.type}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError("no CUDA device here (torch sees none); use cpu")
    return text


def _add_target_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--target", default="whisper-tiny.en", help=f"{' | '.join(BUILTIN_TARGETS)} | local folder | hub id"
    )
    parser.add_argument("--device", default="cpu", type=_device, help="cpu | cuda | cuda:N")
    parser.add_argument("--dtype", default="float32", choices=list(DTYPES))


def _add_clip_options(parser: argparse.ArgumentParser) -> None:
    _add_target_options(parser)
    parser.add_argument(
        "--eager", action="store_true", help="run every decoding step from the host (on CUDA: no captured graphs)"
    )
    parser.add_argument(
        "--max-seconds", type=float, default=DEFAULT_MAX_SECONDS, help="longest clip accepted (decoded in 30 s windows)"
    )


def _listed(kind: type, choices: Sequence | None = None) -> Callable[[str], tuple]:
    def parse(text: str) -> tuple:
        try:
            values = tuple(kind(value) for value in text.split(","))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected {kind.__name__} values separated by commas, got {text!r}"
            ) from None
        unknown = [v for v in values if choices is not None and v not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(unknown)}; choose from {', '.join(choices)}")
        return values

    return parse


def _add_speculative_options(parser: argparse.ArgumentParser, several_drafts: bool = False, grid: bool = False) -> None:
    """grid: --window, --k and --threshold take comma-separated lists, the axes of an experiment."""
    about = "a shipped draft (python -m specasr drafts), a folder, random, or random-no-audio"
    if several_drafts:
        about += "; shipped: every shipped draft of the target"
        parser.add_argument("--draft", action="append", help=about + "; repeat it to compare drafts (default: random)")
    else:
        parser.add_argument("--draft", default="random", help=about)
    parser.add_argument(
        "--draft-dtype", default=None, choices=list(DTYPES), help="the draft's precision (default: the target's)"
    )
    if grid or several_drafts:
        parser.add_argument("--k", type=_listed(int), default=(4,), help="proposals per round, e.g. 2,4,8")
    else:
        parser.add_argument("--k", type=int, default=4, help="most draft proposals per round")
    if grid:
        parser.add_argument("--window", type=_listed(str), default=("unrestricted",), help=", ".join(WINDOWS))
        parser.add_argument(
            "--threshold", type=_listed(float), default=(0.0,), help="draft confidence stops, e.g. 0,0.3"
        )
    else:
        parser.add_argument("--window", default="unrestricted", choices=WINDOWS)
        parser.add_argument("--threshold", type=float, default=0.0, help="stop proposing below this draft confidence")
    parser.add_argument("--half-width-ms", type=float, default=400.0)
    parser.add_argument("--runtime-layer", type=int, default=None, help="target layer (0-based) for runtime windows")
    parser.add_argument(
        "--reference",
        default="auto",
        help="reference frames: auto (aligned when the window needs them), always, never, or a JSON file "
        "with one frame per transcript token",
    )
    parser.add_argument("--aligner", default="pocketsphinx", choices=list(ALIGNERS))


def _add_store_options(parser: argparse.ArgumentParser, optional: bool = True) -> None:
    parser.add_argument(
        "--db", type=Path, default=None, help=f"run store (default {default_db_path()}, or $SPECASR_DB)"
    )
    if optional:
        parser.add_argument("--no-store", action="store_true", help="do not keep this run in the store")


def _settings(args: argparse.Namespace, draft: str | None = None, k: int | None = None) -> Settings:
    """Settings from the parsed options; `draft` None asks for greedy decoding, `k` one of several --k."""
    values = {"target": args.target, "device": args.device, "dtype": args.dtype, "max_seconds": args.max_seconds}
    values["graphs"] = not args.eager
    if draft is not None:
        values |= {
            "draft": draft,
            "draft_dtype": args.draft_dtype,
            "k": args.k if k is None else k,
            "window": args.window,
            "half_width_ms": args.half_width_ms,
            "runtime_layer": args.runtime_layer,
            "threshold": args.threshold,
            "reference": args.reference,
            "aligner": args.aligner,
        }
    try:
        return Settings(**values)
    except ValueError as error:
        raise UsageError(str(error)) from error


def _store(args: argparse.Namespace) -> Store | None:
    return None if getattr(args, "no_store", False) else Store(args.db)


def _clip(path: str, args: argparse.Namespace) -> Clip:
    return Clip(Path(path).stem, load_audio(path, args.max_seconds), path=str(Path(path).resolve()))


def _decode(pipeline: Pipeline, clip: Clip, settings: Settings) -> Trace:
    try:
        return pipeline.decode(clip, settings)
    except USER_ERRORS:
        raise
    except ValueError as error:  # a window without reference frames, a runtime layer out of range, a bad file
        raise UsageError(str(error)) from error


def cmd_transcribe(args: argparse.Namespace) -> None:
    trace = _decode(Pipeline(), _clip(args.audio, args), replace(_settings(args), verify_peaks=False))
    if args.json:
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
    else:
        print(trace.text)


def cmd_eval(args: argparse.Namespace) -> None:
    utterances = load_manifest(args.speech_dir)[: args.limit]
    pipeline, settings = Pipeline(), replace(_settings(args), verify_peaks=False)
    traces = [
        _decode(pipeline, u.clip(args.max_seconds), settings)
        for u in tqdm(utterances, desc=f"greedy {args.target}", unit="utt")
    ]
    wer = word_error_rate([u.text for u in utterances], [t.text for t in traces])
    seconds = sum(t.timings.total for t in traces)
    audio_seconds = sum(u.duration for u in utterances)
    print(f"{args.target} {args.device} {args.dtype}: WER {100 * wer:.2f}% on {len(utterances)} utterances")
    print(
        f"{seconds:.1f} s to transcribe {audio_seconds:.1f} s of audio (real-time factor {seconds / audio_seconds:.3f})"
    )


def _round_records(trace: Trace) -> list[dict]:
    records = []
    for r in trace.rounds:
        steps = [s for s in trace.steps if s.round == r.index]
        verified = [v for v in trace.verified if r.start <= v.position <= r.start + r.accepted]
        records.append(
            {
                "segment": r.segment,
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


def cmd_decode(args: argparse.Namespace) -> None:
    settings = _settings(args, draft=args.draft)
    clip = _clip(args.audio, args)
    store = _store(args)
    trace = _decode(Pipeline(store), clip, settings)
    run_id = store.write_run([trace], "decode") if store else None
    if not args.json:
        print(trace.text)
        return
    accepted = acceptance([trace]) if trace.rounds else None
    has_frames = trace.reference_frames is not None and trace.steps
    record = {
        "run_id": run_id,
        "text": trace.text,
        "tokens": trace.tokens,
        "settings": asdict(trace.settings),
        "target": trace.settings.target,
        "draft": trace.draft_name,
        "draft_dtype": trace.settings.draft_dtype,
        "k": trace.settings.k,
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
    print(json.dumps(record))


def cmd_align(args: argparse.Namespace) -> None:
    settings = Settings(
        target=args.target, device=args.device, dtype=args.dtype, aligner=args.aligner, max_seconds=args.max_seconds
    )
    clip, pipeline = _clip(args.audio, args), Pipeline()
    if args.text is not None:
        reference = pipeline.align_text(clip, settings, args.text)
    else:
        reference = pipeline.reference(clip, settings)
    target = pipeline.target(settings)
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


def cmd_bench(args: argparse.Namespace) -> None:
    utterances = spread(load_manifest(args.speech_dir), args.clips)
    pipeline = Pipeline(_store(args))
    arms = {"greedy": _settings(args)}
    if pipeline.resolved(arms["greedy"]).graphs:  # captured steps there: eager greedy beside them
        arms["greedy eager"] = replace(arms["greedy"], graphs=False)
    for peer in args.peers:
        assistant = args.assistant if peer == "transformers-assisted" else None
        arms[peer] = replace(arms["greedy"], decoder=peer, assistant=assistant)
    drafts = [name for draft in args.draft or ["random"] for name in _expand_shipped(draft, args.target)]
    for name in drafts:
        arms |= {name if len(args.k) == 1 else f"{name} K={k}": _settings(args, name, k) for k in args.k}
    clips = [u.clip(args.max_seconds) for u in utterances]
    store = pipeline.store
    table, results = benchmark(pipeline, arms, clips, args.repeats)
    runs = store_results(store, results, "bench") if store else {}
    aa = aa_check(results)
    if args.json:
        record = {"clips": _records(table), "summary": _records(summary(table, results)), "aa": _records(aa)}
        print(json.dumps(record | {"aa_warning": aa_warning(aa), "runs": runs}, default=_json_value))
        return
    print(table.to_string(index=False, float_format="%.4f"))
    print(
        f"\n{args.target}, K={','.join(map(str, args.k))}, window={args.window}, {args.device} {args.dtype} "
        f"(drafts {args.draft_dtype or args.dtype}), {args.repeats} repeats; baseline: {table.baseline.iloc[0]}, "
        "the fastest greedy loop of ours"
    )
    print(summary(table, results).to_string(index=False, float_format="%.3f"))
    print(f"\nA/A check: {aa.arm.iloc[0]} over its copy, timed side by side")
    print(aa.drop(columns="arm").to_string(index=False, float_format="%.3f"))
    _warn(aa_warning(aa), repetition_note(args.repeats))
    for name, run_id in runs.items():
        print(f"stored {name} as run {run_id} in {store.path}")


def _warn(*warnings: str | None) -> None:
    for warning in filter(None, warnings):
        print(f"warning: {warning}")


def cmd_precision(args: argparse.Namespace) -> None:
    clips = [u.clip(args.max_seconds) for u in spread(load_utterances(args.data), args.clips)]
    reference = _settings(args)
    arms = {}
    for dtype in args.low:
        arms[f"greedy {dtype}"] = replace(reference, dtype=dtype)
        arms[f"{args.draft} K={args.k} {dtype}"] = replace(_settings(args, draft=args.draft), dtype=dtype)
    table = precision_table(Pipeline(), clips, arms, reference)
    if args.json:
        print(json.dumps(_records(table), default=_json_value))
        return
    print(f"{args.target} on {len(clips)} clips of {args.data}, against float32 greedy, {args.device}")
    print(table.to_string(index=False, float_format="%.4f"))


def cmd_profile(args: argparse.Namespace) -> None:
    settings = _settings(args, draft=args.draft)
    clip = _clip(args.audio, args)
    pipeline = Pipeline()
    target, draft = pipeline.target(settings), pipeline.draft(settings)
    audio = clip.audio[: target.window_samples]
    memory = target.encode(target.features(audio))
    table = profile_round(target, draft, memory, target.valid_frames(len(audio)), settings.k, args.repeats)
    if args.json:
        print(json.dumps(_records(table)))
        return
    print(f"{clip.id}: {settings.target} {settings.device} {settings.dtype}, draft {draft.name} {draft.dtype}")
    print("ms: median time of a pass; target_steps: in target steps of one row; the rest: shares of the ops' own time")
    print(table.to_string(index=False, float_format="%.3f"))


def _expand_shipped(draft: str, target: str) -> list[str]:
    """`shipped`: every draft that comes with specasr for the target."""
    if draft != "shipped":
        return [draft]
    names = shipped_drafts(target)
    if not names:
        raise UsageError(f"no shipped drafts for {target} (python -m specasr drafts)")
    return names


def _grid_settings(args: argparse.Namespace, **fixed) -> tuple[Settings, list[str]]:
    """What every cell of an experiment or a matched run shares, and its drafts (`shipped` expanded)."""
    base = Settings(
        target=args.target,
        device=args.device,
        dtype=args.dtype,
        draft_dtype=args.draft_dtype,
        half_width_ms=args.half_width_ms,
        runtime_layer=args.runtime_layer,
        aligner=args.aligner,
        max_seconds=args.max_seconds,
        graphs=not args.eager,
        **fixed,
    )
    return base, [name for draft in args.draft or ["random"] for name in _expand_shipped(draft, args.target)]


def _evaluation_clips(args: argparse.Namespace) -> tuple[list[Clip], Weighting]:
    """--clips clips spread over --data, and how their evaluation sets are weighted."""
    utterances = spread(load_utterances(args.data), args.clips)
    clips = [u.clip(args.max_seconds) for u in utterances]
    sets = {clip.hash: u.subset for clip, u in zip(clips, utterances, strict=True)}
    return clips, weighting(sets, args.min_set_clips)


def cmd_experiment(args: argparse.Namespace) -> None:
    try:
        base, drafts = _grid_settings(args)
        grid = Grid(base, tuple(drafts), args.window, args.k, args.threshold)
        grid.cells()  # checks every cell's settings before any work
    except ValueError as error:
        raise UsageError(str(error)) from error
    clips, sets = _evaluation_clips(args)
    store = Store(args.db)
    runs = run_grid(Pipeline(store), store, grid, clips, args.repeats)
    found = experiment_tables(store, runs, sets)
    aggregation = f"{sets.rule}; {AGGREGATION}"
    best = found.cells.loc[found.cells.decode_speedup.idxmax()]
    warnings = {"aa_warning": aa_warning(found.aa), "timing_note": repetition_note(args.repeats)}
    if args.json:
        record = {"protocol": PROTOCOL, "aggregation": aggregation, "baseline_run": runs.baseline}
        record["peaks_run"] = runs.peaks
        record |= {"second_baseline_run": runs.second_baseline, "repeats": args.repeats} | warnings
        record |= {name: _records(table) for name, table in vars(found).items()}
        print(json.dumps(record | {"best_run": best.run_id}, default=_json_value))
        return
    print(f"{args.target} on {len(clips)} clips of {args.data} x {args.repeats} repeats")
    print(f"greedy run {runs.baseline}, verification-peaks run {runs.peaks}\nprotocol: {PROTOCOL}\n{aggregation}")
    for title, table, number_format in (
        ("Cells (Tables 1, 2, 3, 6)", found.cells.drop(columns="s"), "%.3f"),
        ("Contrasts, b-a (Tables 1, 2, 3, 6, 16)", found.contrasts, "%+.3f"),
        ("Attention peaks vs reference frames (Table 7)", found.peaks, "%.3f"),
        ("Restart anchor error by proposal outcome, ms (Table 10)", found.outcomes, "%.3f"),
        ("Runtime correction vs the unrestricted loop (Table 16)", found.runtime, "%.3f"),
        ("K and threshold sweep (Table 21)", found.sweep, "%.3f"),
        ("Cells, set by set (Tables 1, 6)", found.cells_by_set.drop(columns="s", errors="ignore"), "%.3f"),
        ("Restart anchor error by outcome, set by set (Table 10)", found.outcomes_by_set, "%.3f"),
        ("Runtime correction, set by set (Table 16)", found.runtime_by_set, "%.3f"),
        (f"A/A check: greedy over its second copy (run {runs.second_baseline})", found.aa, "%.3f"),
    ):
        if len(table):
            print(f"\n{title}\n{table.to_string(index=False, float_format=number_format)}")
    print(
        f"\nfastest cell: {best.draft} {best.window} K={best.k} threshold={best.threshold:g}, "
        f"decode speedup {best.decode_speedup:.3f}x [{best.decode_speedup_low:.3f}, {best.decode_speedup_high:.3f}]"
    )
    _warn(*warnings.values())


def cmd_matched(args: argparse.Namespace) -> None:
    try:
        base, drafts = _grid_settings(args, k=args.k)
        for window in args.window:
            replace(base, draft=drafts[0], window=window)  # checks every window before any work
    except ValueError as error:
        raise UsageError(str(error)) from error
    clips, sets = _evaluation_clips(args)
    conditions = run_matched(Pipeline(Store(args.db)), base, drafts, list(args.window), clips, sets, args.starts)
    found = matched_tables(conditions, args.starts)
    aggregation = f"{sets.rule}; {MATCHED_AGGREGATION}"
    if args.json:
        record = {"protocol": found.protocol, "aggregation": aggregation}
        record |= {name: _records(table) for name, table in vars(found).items() if isinstance(table, pd.DataFrame)}
        print(json.dumps(record, default=_json_value))
        return
    print(f"{args.target} on {len(clips)} clips of {args.data}, K={args.k}\nprotocol: {found.protocol}\n{aggregation}")
    for title, table, number_format in (
        ("Each condition", found.summary, "%.3f"),
        ("Drift by depth (Table 12): anchor error in frames, survival, conditional acceptance", found.depths, "%.3f"),
        ("Paired contrasts, b-a, same rounds", found.contrasts, "%+.3f"),
        ("Anchor error by outcome and depth, frames; odds of an error over 200 ms (Table 12)", found.outcomes, "%.3f"),
    ):
        if len(table):
            print(f"\n{title}\n{table.to_string(index=False, float_format=number_format)}")


def _records(table: pd.DataFrame) -> list[dict]:
    """A table's rows for JSON: missing values as null (JSON has no NaN)."""
    return table.astype(object).where(table.notna(), None).to_dict("records")


def _json_value(value):
    """numpy scalars (booleans among them) as plain JSON values."""
    return value.item() if hasattr(value, "item") else str(value)


def cmd_runs(args: argparse.Namespace) -> None:
    store = Store(args.db)
    filters = {name: getattr(args, name) for name in ("target", "draft", "window", "k", "dataset", "since", "until")}
    if args.action == "list":
        runs = store.runs(**filters)
        if args.json:
            print(runs.to_json(orient="records", date_format="iso"))
        else:
            print(runs.to_string(index=False) if len(runs) else f"no runs in {store.path}")
    elif args.action == "export":
        if args.parquet is None:
            raise UsageError("runs export needs --parquet DIR")
        run_ids = [args.run_id] if args.run_id else store.runs(**filters).run_id.tolist()
        if not run_ids:
            raise UsageError(f"no run in {store.path} matches those filters")
        for path in store.export_runs(run_ids, args.parquet):
            print(path)
    elif args.run_id is None:
        raise UsageError(f"runs {args.action} needs a run id (python -m specasr runs list)")
    elif args.action == "show":
        traces = store.traces(args.run_id)
        if args.json:
            print(json.dumps([asdict(t) for t in traces]))
        else:
            print(store.run_summary([args.run_id]).T.to_string(header=False))
            for trace in traces:
                print(f"  {trace.clip_id}: {trace.text}")
    elif args.action == "delete":
        store.delete_run(args.run_id)
        print(f"deleted run {args.run_id} from {store.path}")
    elif args.action == "import":
        for run_id in store.import_runs(Path(args.run_id)):
            print(f"imported run {run_id}")


def cmd_train(args: argparse.Namespace) -> None:
    try:
        config = TrainConfig(
            variant=args.variant,
            epochs=args.epochs,
            batch_size=args.batch_size,
            lr=args.lr,
            unroll=args.unroll,
            taps=args.taps,
            ffn_dim=args.ffn_dim,
            draft_vocab=args.draft_vocab,
            init=args.init,
            feature_noise=args.feature_noise,
            anchor_weight=args.anchor_weight,
            sigma_ms=args.sigma_ms,
            seed=args.seed,
        )
    except ValueError as error:
        raise UsageError(str(error)) from error
    aligner = get_aligner(args.aligner)
    target = load_target(args.target, args.device, args.dtype)
    sources = training_sources(args.real, args.real_2, args.espeak, args.hibari, args.data_seed)
    rank, _ = distributed()
    if rank == 0:  # one process fills the feature cache; under torchrun the others wait, then read it
        examples = prepare_examples(target, sources, aligner)
    if dist.is_initialized():
        dist.barrier()
    if rank != 0:
        examples = prepare_examples(target, sources, aligner)
    if args.prepare_only:
        print(f"feature cache ready: {len(examples)} examples from {sum(s.count for s in sources)} clips")
        return
    out = args.out or cache_dir() / "drafts" / target.folder_name / config.variant
    described = {source.name: {**source.settings, "count": source.count} for source in sources}
    draft = train(target, examples, config, out, data_hash(examples), described, args.every_epoch)
    if rank == 0:
        print(f"{draft.name} trained on {len(examples)} examples; saved in {out}")


def cmd_drafts(args: argparse.Namespace) -> None:
    for name in shipped_drafts(args.target):
        print(name)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m specasr", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    p = commands.add_parser("transcribe", help="greedy transcript of one clip")
    p.add_argument("audio", help="wav, flac, ogg, mp3, m4a, ... (long clips are decoded in 30 s windows)")
    _add_clip_options(p)
    p.add_argument("--json", action="store_true", help="print one JSON object with tokens and timings")
    p.set_defaults(run=cmd_transcribe)

    p = commands.add_parser("eval", help="greedy WER of a target on a speech set (manifest.tsv)")
    p.add_argument("--speech-dir", type=Path, default=DEFAULT_SPEECH_DIR)
    p.add_argument("--limit", type=int, default=None, help="only the first N utterances")
    _add_clip_options(p)
    p.set_defaults(run=cmd_eval)

    p = commands.add_parser("decode", help="speculative transcript of one clip, with its trace (kept in the store)")
    p.add_argument("audio")
    _add_clip_options(p)
    _add_speculative_options(p)
    _add_store_options(p)
    p.add_argument("--json", action="store_true", help="print one JSON object with rounds, metrics and timings")
    p.set_defaults(run=cmd_decode)

    p = commands.add_parser("align", help="reference frame of every transcript token, by forced alignment")
    p.add_argument("audio")
    p.add_argument("--text", default=None, help="the transcript to align (default: the target's greedy transcript)")
    p.add_argument("--aligner", default="pocketsphinx", choices=list(ALIGNERS))
    _add_clip_options(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=cmd_align)

    p = commands.add_parser("runs", help="the run store: list, show, export, import or delete runs")
    p.add_argument("action", choices=["list", "show", "export", "import", "delete"])
    p.add_argument("run_id", metavar="RUN", nargs="?", default=None, help="run id (import: an export's folder)")
    p.add_argument("--parquet", type=Path, default=None, help="export: the folder for the Parquet files")
    p.add_argument("--target", default=None, help="list, export: only runs of this target")
    p.add_argument("--draft", default=None, help="list, export: only runs of this draft")
    p.add_argument("--window", default=None, choices=WINDOWS, help="list, export: only runs with this window")
    p.add_argument("--k", type=int, default=None, help="list, export: only runs with this K")
    p.add_argument("--dataset", default=None, help="list, export: only runs that decoded clips of this dataset")
    p.add_argument(
        "--since",
        type=datetime.fromisoformat,
        default=None,
        help="list, export: only runs created at or after this UTC time (2026-11-30)",
    )
    p.add_argument(
        "--until",
        type=datetime.fromisoformat,
        default=None,
        help="list, export: only runs created at or before this UTC time",
    )
    p.add_argument("--json", action="store_true")
    _add_store_options(p, optional=False)
    p.set_defaults(run=cmd_runs)

    p = commands.add_parser("experiment", help="a grid of drafts x windows x K x thresholds, kept in the store")
    p.add_argument(
        "--data",
        default=DEFAULT_SPEECH_DIR,
        help="a manifest.tsv or its folder; heldout: the held-out clips of ../shared/data/train-speech-2",
    )
    p.add_argument("--clips", type=int, default=20, help="N clips spread evenly over the manifest")
    p.add_argument(
        "--repeats",
        type=int,
        default=REPEATS,
        help=f"timing repetitions per clip, interleaved; speed intervals resample them (under {REPEATS}: a warning)",
    )
    p.add_argument(
        "--min-set-clips",
        type=int,
        default=MIN_SET_CLIPS,
        help="evaluation sets smaller than this are merged into one, or every metric pooled over all clips",
    )
    _add_clip_options(p)
    _add_speculative_options(p, several_drafts=True, grid=True)
    _add_store_options(p, optional=False)
    p.add_argument("--json", action="store_true", help="print one JSON object with cells and contrasts")
    p.set_defaults(run=cmd_experiment)

    p = commands.add_parser("matched", help="every window from the same rounds, followed through K depths (Table 12)")
    p.add_argument("--data", default=DEFAULT_SPEECH_DIR, help="a manifest.tsv or its folder; heldout")
    p.add_argument("--clips", type=int, default=20, help="N clips spread evenly over the manifest")
    p.add_argument("--min-set-clips", type=int, default=MIN_SET_CLIPS)
    _add_clip_options(p)
    about = "a shipped draft, a folder, random or random-no-audio; shipped: every shipped draft; repeat to compare"
    p.add_argument("--draft", action="append", help=about)
    p.add_argument("--draft-dtype", default=None, choices=list(DTYPES))
    p.add_argument("--k", type=int, default=4, help="depths followed from each round start")
    p.add_argument(
        "--window", type=_listed(str, WINDOWS), default=("unrestricted", "correct", "shift"), help=", ".join(WINDOWS)
    )
    p.add_argument("--half-width-ms", type=float, default=400.0)
    p.add_argument("--runtime-layer", type=int, default=None, help="target decoder layer (0-based) for runtime")
    p.add_argument("--aligner", default="pocketsphinx", choices=list(ALIGNERS))
    p.add_argument(
        "--starts", default="loop", choices=list(STARTS), help="; ".join(f"{k}: {v}" for k, v in STARTS.items())
    )
    _add_store_options(p, optional=False)
    p.add_argument("--json", action="store_true", help="print one JSON object with every table")
    p.set_defaults(run=cmd_matched)

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
    p.add_argument(
        "--init", default="random", choices=INITS, help="target-layer: start as the target's last decoder layer"
    )
    p.add_argument("--sigma-ms", type=float, default=400.0, help="width of the anchor loss's Gaussian target")
    p.add_argument("--anchor-weight", type=float, default=None, help="lambda (default: 0.1 anchordraft, 0 control)")
    p.add_argument("--feature-noise", type=float, default=0.6, help="input-feature noise, in feature stds")
    p.add_argument("--real", type=int, default=251, help="clips of ../shared/data/train-speech")
    p.add_argument(
        "--real-2", type=int, default=0, help="clips of ../shared/data/train-speech-2 (its held-out clips never)"
    )
    p.add_argument("--espeak", type=int, default=400, help="espeak-ng sentences from ../shared/data/text")
    p.add_argument("--hibari", type=int, default=200, help="hibari-tts sentences from ../shared/data/text")
    p.add_argument("--aligner", default="pocketsphinx", choices=list(ALIGNERS))
    p.add_argument("--seed", type=int, default=0, help="the draft's initialisation, batch order and feature noise")
    p.add_argument(
        "--data-seed", type=int, default=0, help="which clips and sentences: drafts of one data seed share a cache"
    )
    p.add_argument("--out", type=Path, default=None, help="default: cache/drafts/TARGET/VARIANT")
    p.add_argument(
        "--every-epoch", action="store_true", help="also keep each epoch's draft in OUT/epoch-N (choose where to stop)"
    )
    p.add_argument("--prepare-only", action="store_true", help="build the feature cache and stop")
    p.set_defaults(run=cmd_train)

    p = commands.add_parser("drafts", help="list the drafts that come with specasr")
    p.add_argument("--target", default=None)
    p.set_defaults(run=cmd_drafts)

    p = commands.add_parser("profile", help="where a round's time goes: target step, verification and draft step")
    p.add_argument("audio")
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--json", action="store_true", help="print the table as a JSON list of rows")
    _add_clip_options(p)
    _add_speculative_options(p)
    p.set_defaults(run=cmd_profile)

    p = commands.add_parser("precision", help="low-precision loops against float32 greedy (paper A.4)")
    p.add_argument("--data", default=DEFAULT_SPEECH_DIR, help="a manifest.tsv or its folder, or heldout")
    p.add_argument("--clips", type=int, default=20, help="N clips spread evenly over the manifest")
    p.add_argument(
        "--low", type=_listed(str, ("float16", "bfloat16")), default=("bfloat16",), help="float16, bfloat16 or both"
    )
    p.add_argument("--json", action="store_true", help="print the table as a JSON list of rows")
    _add_clip_options(p)
    _add_speculative_options(p)
    p.set_defaults(run=cmd_precision)

    p = commands.add_parser("bench", help="time greedy vs speculative decoding on the same clips")
    p.add_argument("--speech-dir", type=Path, default=DEFAULT_SPEECH_DIR)
    p.add_argument("--clips", type=int, default=20, help="N clips spread evenly over the manifest")
    p.add_argument(
        "--repeats", type=int, default=REPEATS, help="timing repetitions per clip, interleaved; intervals resample them"
    )
    p.add_argument(
        "--peers", type=_listed(str, DECODERS[1:]), default=(), help=f"peer decoders, e.g. {','.join(DECODERS[1:])}"
    )
    p.add_argument(
        "--assistant",
        default=TARGET_LAYERS,
        help=f"transformers-assisted's assistant: {TARGET_LAYERS} (the target's first and last decoder layers, "
        "untrained) or a Whisper folder or hub id whose decoder reads the target's encoder (distil-whisper)",
    )
    _add_clip_options(p)
    _add_speculative_options(p, several_drafts=True)
    _add_store_options(p)
    p.add_argument("--json", action="store_true", help="print one JSON object: per-clip rows, summary and run ids")
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
