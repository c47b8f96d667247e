"""The tiny.en 2x2 on a lent GPU (issue 34): initialisation (random, target layer) x anchor weight (0, 0.1), two seeds,
all from one set of examples, each epoch's draft scored on the held-out clips and the best one kept.

The examples are the local feature cache's (tools/gpu_stage.py --job 2x2): the same clips, transcripts and reference
frames, the target's states recomputed here (data hash checked). Every draft has the target's feed-forward width, so
the two initialisations differ in their starting weights alone. Held-out score: L over matched rounds from every
transcript position, unrestricted (no reference frames needed). Writes results.json and the chosen drafts as
drafts.tar.gz.NN pieces of at most 15 MB to --out, as it goes.

    python3 tools/gpu_2x2.py --stage /tmp/stage --out $OUT [--epochs 12]
"""

import argparse
import io
import json
import tarfile
import time
from pathlib import Path

import torch
from tqdm import tqdm

from specasr.audio import load_audio
from specasr.dataset import load_manifest
from specasr.draft import last_target_layer, load_draft
from specasr.intervals import pooled_estimate
from specasr.matched import read_clip, roll_out, round_starts
from specasr.matched_tables import clip_columns
from specasr.pipeline import Pipeline
from specasr.pooled import METRICS
from specasr.targets import Target
from specasr.trace import Settings
from specasr.train import INITS, TrainConfig, train
from specasr.trainset import Example, data_hash, teacher_forced

PIECE_BYTES = 15_000_000


def examples_from(stage: Path, target: Target, limit: int | None = None) -> tuple[list[Example], dict]:
    spec = json.loads((stage / "examples.json").read_text())
    prompt, examples = len(target.prompt), []
    for row in tqdm(spec["examples"][:limit], desc="examples"):
        audio = load_audio(stage / "train" / f"{row['id']}.flac")
        with torch.inference_mode():
            memory = target.encode(target.features(target.samples(audio)))
        transcript, frames = row["tokens"][prompt:-1], row["frames"][prompt:-1]
        examples.append(teacher_forced(target, row["id"], memory, target.valid_frames(len(audio)), transcript, frames))
    if limit is None and data_hash(examples) != spec["data_hash"]:
        raise SystemExit("the examples do not hash as the local cache does")
    return examples, spec


def heldout_length(pipeline: Pipeline, settings: Settings, folder: Path, views: list) -> float:
    target = pipeline.target(settings)
    draft = load_draft(folder, target)
    rollouts = [
        roll_out(target, draft, view, settings, round_starts(pipeline, settings, view.clip, view, "all"))
        for view in views
    ]
    return pooled_estimate(METRICS["L"], [clip_columns(rollouts)])


def pack(folders: dict[str, Path], out: Path) -> None:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as tar:
        for name, folder in folders.items():
            tar.add(folder, arcname=name)
    data = data.getvalue()
    for old in out.glob("drafts.tar.gz.*"):
        old.unlink()
    for number, start in enumerate(range(0, len(data), PIECE_BYTES)):
        (out / f"drafts.tar.gz.{number:02d}").write_bytes(data[start : start + PIECE_BYTES])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stage", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=Path("/tmp/2x2"))
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--limit", type=int, default=None, help="the first N examples and held-out clips")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--budget", type=float, default=450, help="seconds: start no draft that would end past it")
    args = parser.parse_args()

    pipeline = Pipeline()
    settings = Settings(target="whisper-tiny.en", device=args.device, k=4, graphs=False)
    target = pipeline.target(settings)
    examples, spec = examples_from(args.stage, target, args.limit)
    heldout = [u.clip() for u in load_manifest(args.stage / "heldout")][: args.limit]
    views = [read_clip(pipeline, settings, clip, "heldout", reference=False) for clip in heldout]
    width = last_target_layer(target).fc1.out_features
    results, chosen = {"examples": len(examples), "data_hash": spec["data_hash"], "heldout_clips": len(views)}, {}
    began, longest = time.perf_counter(), 0.0
    for seed in range(args.seeds):
        for init in INITS:
            for variant in ("control", "anchordraft"):
                name = f"{init}-{variant}-s{seed}"
                if time.perf_counter() - began + longest > args.budget:
                    print(f"{name}: not trained, out of time", flush=True)
                    continue
                config = TrainConfig(variant=variant, init=init, seed=seed, epochs=args.epochs, ffn_dim=width)
                start = time.perf_counter()
                train(target, examples, config, args.work / name, spec["data_hash"], spec["sources"], every_epoch=True)
                trained = time.perf_counter() - start
                scores = {
                    epoch: heldout_length(pipeline, settings, args.work / name / f"epoch-{epoch}", views)
                    for epoch in range(1, args.epochs + 1)
                }
                best = max(scores, key=scores.get)
                chosen[name] = args.work / name / f"epoch-{best}"
                results[name] = {"train_seconds": trained, "heldout_L": scores, "chosen_epoch": best}
                (args.out / "results.json").write_text(json.dumps(results, indent=1))
                pack(chosen, args.out)
                longest = max(longest, time.perf_counter() - start)
                print(name, f"{trained:.0f} s", {e: round(s, 3) for e, s in scores.items()}, "chosen", best, flush=True)


if __name__ == "__main__":
    main()
