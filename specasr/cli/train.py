"""train: a draft (control, anchordraft or no-audio) for a target, on real and synthetic speech."""

import argparse
from pathlib import Path

import torch
import torch.distributed as dist

from specasr.align import get_aligner
from specasr.cache import cache_dir
from specasr.cli.options import UsageError, add_aligner_option, add_target_options, checked, layers, number
from specasr.ranks import joined, leave
from specasr.targets import load_target
from specasr.train import INITS, TOKEN_LOSSES, VARIANTS, TrainConfig, check_global_batch, train
from specasr.trainset import data_hash, prepare_examples, training_sources

# TrainConfig fields set by options of the same name
CONFIG_FIELDS = (
    "variant",
    "epochs",
    "batch_size",
    "lr",
    "unroll",
    "taps",
    "ffn_dim",
    "draft_vocab",
    "init",
    "feature_noise",
    "anchor_weight",
    "sigma_ms",
    "token_loss",
    "seed",
)


def add_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("train", help="train a draft (control, anchordraft or no-audio) for a target")
    add_target_options(p)
    p.add_argument("--variant", default="anchordraft", choices=list(VARIANTS))
    p.add_argument("--epochs", type=number(int, 1), default=20)
    p.add_argument(
        "--batch-size", type=number(int, 1), default=12, help="the global batch: under torchrun N processes share it"
    )
    p.add_argument("--lr", type=number(float, 0, above=True), default=1e-3)
    p.add_argument("--unroll", type=number(int, 1), default=3, help="draft depths trained per position")
    p.add_argument("--taps", type=layers, default=None, help="target layers the draft reads, e.g. 3,6")
    p.add_argument(
        "--ffn-dim", type=number(int, 1), default=None, help="draft feed-forward width (default: the target's)"
    )
    p.add_argument(
        "--draft-vocab", type=number(int, 0), default=4096, help="reduced draft vocabulary size; 0 for the full one"
    )
    p.add_argument(
        "--init", default="random", choices=INITS, help="target-layer: start as the target's last decoder layer"
    )
    p.add_argument(
        "--sigma-ms",
        type=number(float, 0, above=True),
        default=400.0,
        help="width of the anchor loss's Gaussian target",
    )
    p.add_argument(
        "--anchor-weight", type=number(float, 0), default=None, help="lambda (default: 0.1 anchordraft, 0 control)"
    )
    p.add_argument(
        "--token-loss",
        default="ce",
        choices=TOKEN_LOSSES,
        help="ce: on the target's greedy token; kl: from its whole next-token distribution over the draft vocabulary",
    )
    p.add_argument("--feature-noise", type=number(float, 0), default=0.6, help="input-feature noise, in feature stds")
    p.add_argument("--real", type=number(int, 0), default=251, help="clips of ../shared/data/train-speech")
    p.add_argument(
        "--real-2",
        type=number(int, 0),
        default=0,
        help="clips of ../shared/data/train-speech-2 (its held-out clips never)",
    )
    p.add_argument("--espeak", type=number(int, 0), default=400, help="espeak-ng sentences from ../shared/data/text")
    p.add_argument("--hibari", type=number(int, 0), default=200, help="hibari-tts sentences from ../shared/data/text")
    p.add_argument(
        "--perturbed",
        type=number(int, 0),
        default=0,
        help="real training clips again, sped up or slowed, shifted and noised (each its own draw), in turn",
    )
    add_aligner_option(p)
    p.add_argument("--seed", type=int, default=0, help="the draft's initialisation, batch order and feature noise")
    p.add_argument(
        "--data-seed", type=int, default=0, help="which clips and sentences: drafts of one data seed share a cache"
    )
    p.add_argument("--out", type=Path, default=None, help="default: cache/drafts/TARGET/VARIANT")
    p.add_argument(
        "--every-epoch", action="store_true", help="also keep each epoch's draft in OUT/epoch-N (choose where to stop)"
    )
    p.add_argument("--prepare-only", action="store_true", help="build the feature cache and stop")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    config = checked(TrainConfig, **{name: getattr(args, name) for name in CONFIG_FIELDS})
    aligner = get_aligner(args.aligner)
    ranks = joined()
    rank, world = ranks.rank, ranks.size
    target = load_target(args.target, process_device(args.device), args.dtype)
    sources = training_sources(args.real, args.real_2, args.espeak, args.hibari, args.data_seed, args.perturbed)
    if not any(source.count for source in sources):
        raise UsageError(
            "no training clips: give at least one of --real, --real-2, --espeak, --hibari or --perturbed above 0"
        )
    clips = sum(source.count for source in sources)
    checked(check_global_batch, batch_size=config.batch_size, examples=clips, world=world)
    examples = prepare_examples(target, sources, aligner, rank, world)  # under torchrun each makes its own shards
    if args.prepare_only:
        if rank == 0:
            print(f"feature cache ready: {len(examples)} examples from {sum(s.count for s in sources)} clips")
    else:
        out = args.out or cache_dir() / "drafts" / target.folder_name / config.variant
        described = {source.name: {**source.settings, "count": source.count} for source in sources}
        draft = train(target, examples, config, out, data_hash(examples), described, args.every_epoch)
        if rank == 0:
            print(f"{draft.name} trained on {len(examples)} examples; saved in {out}")
    leave()


def process_device(device: str) -> str:
    """Under torchrun, --device cuda is each process's own GPU (LOCAL_RANK)."""
    shared = device == "cuda" and dist.is_initialized() and torch.cuda.is_available()
    return f"cuda:{torch.cuda.current_device()}" if shared else device
