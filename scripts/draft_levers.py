"""Which training levers make a stronger draft: each row a draft trained by one `python -m specasr train` command,
rolled out in the real loop (K=4 chain, unrestricted, float16 weights) on clips no draft trained on.

    python -m scripts.draft_levers --target whisper-tiny.en --rows baseline,vocab-8192 --epochs 6 \\
        --out docs/measurements/cpu-2026-12-07/levers-whisper-tiny.en.json

Every row adds one lever to the recipe of the row it names as its base. A row whose draft is already in
cache/levers/TARGET-SOURCES/ROW is not trained again (a killed training resumes where `train` left its state).
Acceptance is pooled over the rounds of the evaluation clips (`--data`: ../shared/data/speech and the held-out clips of
train-speech-2 unless told); every decode is checked against greedy. Acceptance is a count, not a time, so the rows
may be measured while other work runs.
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

from tqdm import tqdm

from specasr import Pipeline, Settings, acceptance
from specasr.cache import cache_dir
from specasr.dataset import DEFAULT_SPEECH_DIR, load_utterances, spread

SHAPE = {
    "whisper-tiny.en": ["--taps", "1,2,4", "--ffn-dim", "384"],
    "whisper-base": ["--taps", "3,6", "--ffn-dim", "512"],
}
# the training clips: the shipped drafts' sources, or a smaller draw of the same sources (the first clips of each)
SOURCES = {
    "shipped": {
        "whisper-tiny.en": ["--real", "251", "--real-2", "2512", "--espeak", "1200", "--hibari", "800"],
        "whisper-base": ["--real", "251", "--real-2", "1728", "--espeak", "768", "--hibari", "384"],
    },
    "small": {target: ["--real", "251", "--real-2", "1000", "--espeak", "400", "--hibari", "200"] for target in SHAPE},
}
# row: (the row it adds to, the options it adds or changes)
ROWS = {
    "baseline": (None, ["--variant", "control", "--init", "target-layer", "--unroll", "3", "--draft-vocab", "4096"]),
    "vocab-8192": ("baseline", ["--draft-vocab", "8192"]),
    "unroll-4": ("vocab-8192", ["--unroll", "4"]),
    "kl": ("unroll-4", ["--token-loss", "kl"]),
    "vocab-8192-kl": ("vocab-8192", ["--token-loss", "kl"]),  # unroll 4 cost acceptance on the small draw
    "all-taps": ("unroll-4", ["--taps", "ALL"]),
    "perturbed": ("unroll-4", ["--perturbed", "REAL"]),  # every real clip once more, perturbed
}


def recipe(target: str, row: str, epochs: int, sources: str = "shipped") -> list[str]:
    """The row's train options: the sources and the shipped shape, then each lever on the way from the baseline."""
    chain = []
    while row is not None:
        base, options = ROWS[row]
        chain.insert(0, options)
        row = base
    options = [*SHAPE[target], *SOURCES[sources][target], "--epochs", str(epochs)]
    for levers in chain:
        for name, value in zip(levers[::2], levers[1::2], strict=True):
            if name in options:
                options[options.index(name) + 1] = value
            else:
                options += [name, value]
    if "ALL" in options:
        layers = {"whisper-tiny.en": 4, "whisper-base": 6}[target]
        options[options.index("ALL")] = ",".join(str(i) for i in range(layers + 1))
    if "REAL" in options:
        real = sum(int(options[options.index(name) + 1]) for name in ("--real", "--real-2"))
        options[options.index("REAL")] = str(real)
    return options


def train(target: str, row: str, epochs: int, sources: str, processes: int = 1) -> tuple[Path, list[str]]:
    """The row's draft folder and the command that trains it: under torchrun where `processes` share the work (on a
    CPU one thread each; on the 2-core VM two such processes made tiny.en's features 1.6x faster than one process with
    two threads, its training steps about 1.1x)."""
    out = cache_dir() / "levers" / f"{target}-{sources}" / row
    launcher = ["-m", "torch.distributed.run", "--nproc-per-node", str(processes)] if processes > 1 else []
    options = recipe(target, row, epochs, sources)
    command = [sys.executable, *launcher, "-m", "specasr", "train", "--target", target, *options, "--out", str(out)]
    if not (out / "draft.safetensors").is_file():
        subprocess.run(command, check=True)
    return out, command[1:]


def measure(pipeline: Pipeline, target: str, drafts: dict[str, Path], clips) -> list[dict]:
    """Each draft's acceptance over the clips, lossless against greedy on every clip, and how many of greedy's
    tokens its vocabulary holds."""
    greedy = [pipeline.decode(clip, Settings(target=target)) for clip in tqdm(clips, desc="greedy", unit="clip")]
    tokens = [token for trace in greedy for token in trace.tokens]
    rows = []
    for name, folder in drafts.items():
        settings = Settings(target=target, draft=str(folder), draft_dtype="float16", k=4)
        vocabulary = set(pipeline.draft(settings).config.vocab_ids or range(pipeline.target(settings).vocab_size))
        traces = [pipeline.decode(clip, settings) for clip in tqdm(clips, desc=name, unit="clip")]
        found = acceptance(traces)
        rows.append(
            {
                "row": name,
                "clips": len(clips),
                "rounds": found.rounds,
                "a1": found.a1,
                "a2c": found.conditional[1],
                "s": found.s[1:],
                "L": found.L,
                "lossless_clips": sum(t.tokens == g.tokens for t, g in zip(traces, greedy, strict=True)),
                "in_vocabulary": sum(token in vocabulary for token in tokens) / len(tokens),
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="whisper-tiny.en", choices=list(SHAPE))
    parser.add_argument("--sources", default="shipped", choices=list(SOURCES), help="the training clips of every row")
    parser.add_argument("--rows", default=",".join(ROWS), help="rows to train and measure, comma-separated")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--processes", type=int, default=1, help="train each row under torchrun with this many")
    parser.add_argument(
        "--data", default=f"{DEFAULT_SPEECH_DIR},heldout", help="evaluation sets, each a manifest's folder or heldout"
    )
    parser.add_argument("--clips", type=int, default=48, help="clips spread over each evaluation set")
    parser.add_argument("--shipped", action="store_true", help="measure the shipped control draft beside the rows")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    rows = args.rows.split(",")
    trained = {row: train(args.target, row, args.epochs, args.sources, args.processes) for row in rows}
    drafts = {row: folder for row, (folder, _) in trained.items()}
    if args.shipped:
        drafts = {"shipped control": Path("drafts") / args.target / "control", **drafts}
    pipeline = Pipeline()
    record = {"target": args.target, "sources": args.sources, "epochs": args.epochs}
    record["commands"] = {row: command for row, (_, command) in trained.items()}
    for data in args.data.split(","):
        clips = [u.clip() for u in spread(load_utterances(data), args.clips)]
        name = "heldout" if data == "heldout" else Path(data).name
        record[name] = measure(pipeline, args.target, drafts, clips)
        for row in record[name]:
            print(f"{name:8s} {row['row']:16s} a1 {row['a1']:.3f} a2c {row['a2c']:.3f} L {row['L']:.3f} "
                  f"vocabulary {row['in_vocabulary']:.3f} lossless {row['lossless_clips']}/{row['clips']}")  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
