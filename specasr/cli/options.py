"""The options commands share, checked where they are parsed, and the one way they become Settings."""

import argparse
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import torch

from specasr.align import ALIGNERS
from specasr.audio import DEFAULT_MAX_SECONDS, Clip, load_clip
from specasr.dataset import (
    DEFAULT_SPEECH_DIR,
    TRAIN_SPEECH_2_DIR,
    clips_by_set,
    load_utterances,
    manifest_file,
    spread,
)
from specasr.decode import checked_layer
from specasr.draft import shipped_drafts
from specasr.intervals import AA_TOLERANCE
from specasr.pooled import MIN_SET_CLIPS, Weighting, weighting
from specasr.store import default_db_path, is_duckdb_file
from specasr.targets import BUILTIN_TARGETS, DTYPES, decoder_layers
from specasr.trace import DRAFT_PRECISIONS, MOST_K, MOST_TREE_WIDTH, RUNTIME_WINDOWS, WINDOWS, Settings

# Settings fields a speculative decode takes from options of the same name.
SPECULATIVE_FIELDS = (
    "draft_dtype",
    "k",
    "window",
    "half_width_ms",
    "runtime_layer",
    "threshold",
    "reference",
    "aligner",
    "tree_width",
    "tree_nodes",
)

T = TypeVar("T")


class UsageError(ValueError):
    """A command-line value that cannot be used as given."""


def checked(make: Callable[..., T], **values) -> T:
    """`make(**values)`, its ValueError (a record refusing a value) a UsageError."""
    try:
        return make(**values)
    except ValueError as error:
        raise UsageError(str(error)) from error


# Option types: each refuses a value argparse would accept, with one message naming what is allowed


def layers(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(layer) for layer in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected layer numbers separated by commas, got {text!r}") from None


def number(
    kind: type, low: float | None = None, high: float | None = None, above: bool = False, below: bool = False
) -> Callable:
    """A finite int or float from `low` to `high` (either excluded where `above`, `below`); anything else refused
    with the range."""
    bounds = [
        f"{'>' if above else '>='} {low:g}" if low is not None else "",
        f"{'<' if below else '<='} {high:g}" if high is not None else "",
    ]
    wanted = f"{'a whole number' if kind is int else 'a number'} {' and '.join(filter(None, bounds))}".strip()

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            value = None
        fits = value is not None and math.isfinite(value)
        fits = fits and (low is None or value > low or (value == low and not above))
        if not (fits and (high is None or value < high or (value == high and not below))):
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}")
        return value

    return parse


def listed(parse: Callable[[str], T], choices: Sequence | None = None) -> Callable[[str], tuple[T, ...]]:
    """Comma-separated values, each read by `parse` (and one of `choices`, where given)."""

    def parse_all(text: str) -> tuple:
        values = tuple(parse(value) for value in text.split(","))
        unknown = [v for v in values if choices is not None and v not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(unknown)}; choose from {', '.join(choices)}")
        return values

    return parse_all


def device(text: str) -> str:
    try:
        found = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"unknown device {text!r}; use cpu, cuda or cuda:N") from None
    if found.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"specasr decodes on cpu or cuda, not {found.type}")
    if found.type == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError("no CUDA device here (torch sees none); use cpu")
    return text


def store_path(text: str) -> Path:
    """A store file whose folder exists (the default store's folder is made when it is opened)."""
    path = Path(text)
    if path != default_db_path() and not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"{path.parent} does not exist: create it first, or give a path in a folder")
    return path


def out_file(args: argparse.Namespace, reading: Sequence[Path] = ()) -> Path | None:
    """--out, checked before any work: in a folder that exists, not over a file unless --force, and never over the
    run store, another DuckDB file or a file the command reads (`reading`), --force or not."""
    path = args.out
    if path is None:
        return None
    if not path.parent.is_dir():
        raise UsageError(f"--out: {path.parent} does not exist: create it first")
    if path.is_dir():
        raise UsageError(f"--out: {path} is a folder; give a file")
    if _same_file(path, args.db or default_db_path()):
        raise UsageError(f"--out: {path} is the run store (--db); give another file")
    if is_duckdb_file(path):
        raise UsageError(f"--out: {path} is a DuckDB database (a run store?); give another file")
    if any(_same_file(path, read) for read in reading):
        raise UsageError(f"--out: {path} is a file this command reads; give another file")
    if path.exists() and not args.force:
        raise UsageError(f"--out: {path} exists; give --force to replace it")
    return path


def _same_file(a: Path, b: Path) -> bool:
    return Path(a).resolve() == Path(b).resolve()


def data_files(data: str) -> list[Path]:
    """The manifests --data names and the audio files they list: what a command over them reads."""
    manifests = [manifest_file(TRAIN_SPEECH_2_DIR if name == "heldout" else name) for name in data.split(",")]
    return [*manifests, *(u.path for u in load_utterances(data))]


# Option groups


def add_target_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--target", default="whisper-tiny.en", help=f"{' | '.join(BUILTIN_TARGETS)} | local folder | hub id"
    )
    parser.add_argument("--device", default="cpu", type=device, help="cpu | cuda | cuda:N")
    parser.add_argument("--dtype", default="float32", choices=list(DTYPES))


def add_clip_options(parser: argparse.ArgumentParser, loops: bool = True) -> None:
    """The target's and the clip's options; with `loops`, how our decoding loops run (commands that decode)."""
    add_target_options(parser)
    if loops:
        parser.add_argument(
            "--eager", action="store_true", help="run every decoding step from the host (on CUDA: no captured graphs)"
        )
        parser.add_argument(
            "--compile",
            action=argparse.BooleanOptionalAction,
            help="compile our loops' steps with torch.compile (inductor) before they run or are captured "
            "(default: off; compiled steps were slower on a CPU and are not yet measured on CUDA)",
        )
    parser.add_argument(
        "--max-seconds",
        type=number(float, 0, above=True),
        default=DEFAULT_MAX_SECONDS,
        help="longest clip accepted (decoded in 30 s windows)",
    )


def add_aligner_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--aligner", default="pocketsphinx", choices=list(ALIGNERS))


def add_draft_options(parser: argparse.ArgumentParser, several: bool = False) -> None:
    """several: --draft may be repeated, and `shipped` names every shipped draft of the target."""
    about = "a shipped draft (python -m specasr drafts), a folder, random, or random-no-audio"
    if several:
        about += "; shipped: every shipped draft of the target"
        parser.add_argument("--draft", action="append", help=about + "; repeat it to compare drafts (default: random)")
    else:
        parser.add_argument("--draft", default="random", help=about)
    parser.add_argument(
        "--draft-dtype",
        default=None,
        choices=DRAFT_PRECISIONS,
        help="the draft's weights (default: the target's dtype); on a CPU float16 and int8 compute in float32",
    )


def add_window_options(parser: argparse.ArgumentParser) -> None:
    """The window's width and the runtime window's layer; the window itself is each command's own option."""
    parser.add_argument("--half-width-ms", type=number(float, 0), default=400.0)
    parser.add_argument(
        "--runtime-layer",
        type=number(int, 0),
        default=None,
        help="target layer (0-based) the runtime windows read (default: the target's); the other windows ignore it",
    )


def add_tree_options(parser: argparse.ArgumentParser, several: bool = False) -> None:
    """Draft trees (specasr.tree); several: each option takes a comma-separated list, and every width above 1 is
    tried with every node count (`trees`)."""
    width, nodes = number(int, 1, MOST_TREE_WIDTH), number(int, 1)
    if several:
        parser.add_argument(
            "--tree-width",
            type=listed(width),
            default=(1,),
            help="draft-tree widths, e.g. 1,2,3: the draft's top W tokens below each of its W most probable nodes "
            "per depth; 1 is the chain of K proposals",
        )
        parser.add_argument(
            "--tree-nodes",
            type=listed(nodes),
            default=(),
            help="tree nodes verified per round, e.g. 8,12, tried with every width above 1 (default: K x width)",
        )
    else:
        parser.add_argument(
            "--tree-width",
            type=width,
            default=1,
            help="draft-tree width: the draft's top W tokens below each of its W most probable nodes per depth; "
            "1 is the chain of K proposals",
        )
        parser.add_argument(
            "--tree-nodes", type=nodes, default=None, help="tree nodes verified per round (default: K x width)"
        )


def trees(args: argparse.Namespace) -> list[tuple[int, int | None]]:
    """The (width, nodes) draft trees of a command whose tree options take lists: the chain for width 1, every node
    count (None: K x width) for the others."""
    found = []
    for width in dict.fromkeys(args.tree_width):
        found += [(1, None)] if width == 1 else [(width, nodes) for nodes in dict.fromkeys(args.tree_nodes or [None])]
    return found


def add_speculative_options(parser: argparse.ArgumentParser, several_drafts: bool = False, grid: bool = False) -> None:
    """grid: --window, --k and --threshold take comma-separated lists, the axes of an experiment; with several drafts
    or a grid, K and the draft trees take lists too."""
    add_draft_options(parser, several_drafts)
    if grid or several_drafts:
        parser.add_argument(
            "--k", type=listed(number(int, 1, MOST_K)), default=(4,), help="proposals per round, e.g. 2,4,8"
        )
    else:
        parser.add_argument("--k", type=number(int, 1, MOST_K), default=4, help="most draft proposals per round")
    add_tree_options(parser, several=grid or several_drafts)
    if grid:
        parser.add_argument("--window", type=listed(str), default=("unrestricted",), help=", ".join(WINDOWS))
        parser.add_argument(
            "--threshold",
            type=listed(number(float, 0, 1, below=True)),
            default=(0.0,),
            help="draft confidence stops, e.g. 0,0.3",
        )
    else:
        parser.add_argument("--window", default="unrestricted", choices=WINDOWS)
        parser.add_argument(
            "--threshold",
            type=number(float, 0, 1, below=True),
            default=0.0,
            help="stop proposing below this draft confidence",
        )
    add_window_options(parser)
    parser.add_argument(
        "--reference",
        default="auto",
        help="reference frames: auto (aligned when the window needs them), always, never, or a JSON file "
        "with one frame per transcript token",
    )
    add_aligner_option(parser)


def add_store_options(parser: argparse.ArgumentParser, optional: bool = True) -> None:
    parser.add_argument(
        "--db", type=store_path, default=None, help=f"run store (default {default_db_path()}, or $SPECASR_DB)"
    )
    if optional:
        parser.add_argument("--no-store", action="store_true", help="do not keep this run in the store")


def add_out_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=None, help="also write what is printed to this file")
    parser.add_argument("--force", action="store_true", help="replace the --out file if it exists")


def add_timing_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--aa-tolerance",
        type=number(float, 0, above=True),
        default=AA_TOLERANCE,
        help="speed figures are marked unreliable where the A/A ratio's interval excludes 1 or reaches past 1 +- this "
        f"(default {AA_TOLERANCE})",
    )


def add_data_options(parser: argparse.ArgumentParser, sets: bool = False) -> None:
    """--data and --clips; sets: --min-set-clips, for commands that weight evaluation sets."""
    parser.add_argument(
        "--data",
        default=DEFAULT_SPEECH_DIR,
        help="a manifest.tsv or its folder, several comma-separated; heldout: the held-out clips of "
        "../shared/data/train-speech-2",
    )
    parser.add_argument("--clips", type=number(int, 1), default=20, help="N clips spread evenly over the manifest")
    if sets:
        parser.add_argument(
            "--min-set-clips",
            type=number(int, 1),
            default=MIN_SET_CLIPS,
            help="evaluation sets smaller than this are merged into one set, other, if together they reach it, and are "
            "otherwise left out of the weighted estimate and reported apart",
        )
        parser.add_argument(
            "--condition-on-sets",
            action="store_true",
            help="intervals resample clips within each set only, as the paper does (default: the sets too)",
        )


# From options to what commands decode


def settings(args: argparse.Namespace, draft: str | None = None, **chosen) -> Settings:
    """The Settings of every command: the target's options and, where `draft` names a draft (None: greedy), the
    speculative options the command has; `chosen` stands in for options that hold several values (one K of a
    bench's, a grid's cell) or that a command sets itself."""
    values = {"target": args.target, "device": args.device, "dtype": args.dtype, "max_seconds": args.max_seconds}
    if hasattr(args, "compile"):
        values["graphs"], values["compile"] = not args.eager, args.compile
    if draft is not None:
        values |= {name: getattr(args, name) for name in SPECULATIVE_FIELDS if hasattr(args, name)} | {"draft": draft}
    return fits_target(checked(Settings, **(values | chosen)))


def fits_target(settings: Settings) -> Settings:
    """The settings, their runtime layer checked against the target's decoder layers before any weights load, where
    a runtime window reads it and the target's config says how many (others are checked once the target loads)."""
    layers = decoder_layers(settings.target) if settings.runtime_layer is not None else None
    if layers is not None and settings.window in RUNTIME_WINDOWS:
        checked(checked_layer, layer=settings.runtime_layer, layers=layers)
    return settings


def drafts(args: argparse.Namespace) -> list[str]:
    """The drafts a repeatable --draft names (default: random), `shipped` expanded to every shipped draft."""
    names = []
    for draft in args.draft or ["random"]:
        shipped = shipped_drafts(args.target) if draft == "shipped" else [draft]
        if not shipped:
            raise UsageError(f"no shipped drafts for {args.target} (python -m specasr drafts)")
        names += shipped
    return names


def clip(path: str, args: argparse.Namespace) -> Clip:
    """The clip in the file `path` (audio.load_clip)."""
    return load_clip(path, args.max_seconds)


def evaluation_clips(args: argparse.Namespace) -> tuple[list[Clip], Weighting]:
    """--clips clips spread over --data, and how their evaluation sets are weighted."""
    clips, sets = clips_by_set(spread(load_utterances(args.data), args.clips), args.max_seconds)
    return clips, weighting(sets, args.min_set_clips, resample_sets=not args.condition_on_sets)
