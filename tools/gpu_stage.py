"""Pack what a GPU job needs beyond the repository into folders of at most --pack-mb each, since one device call
carries 64 MiB in all (repository included). Every file travels as 1 MiB pieces with a checksum, so packs fill
evenly. Packs p1, p2, ... travel in calls of their own and are copied aside there to /tmp/stage; `last` travels
with the final call, which runs the job's script (tools/gpu_setup.sh joins and checks the pieces and puts the
weights and caches in place first).

  bench (tools/gpu_bench.sh): both targets' converted weights, the evaluation clips, and one
    shard of cached training features (the first 64 hibari-tts clips of tiny.en) to time training there.
  train (tools/gpu_train.sh): tiny.en's weights and its whole feature cache for the default training sources,
    to train the three drafts there at full scale.

Both carry the wheels the GPU image lacks and the sentence corpus.

    python -m tools.gpu_stage [--job bench|train] [--clips 78] [--pack-mb 62] [--packs 4|7] [--out .devcarry]
"""

import argparse
import csv
import hashlib
import io
import shutil
from pathlib import Path

from specasr.cache import cache_dir
from specasr.dataset import DEFAULT_SPEECH_DIR, TRAIN_SPEECH_DIR, load_manifest, spread
from specasr.targets.builtin import BUILTIN_TARGETS, builtin_model_dir
from specasr.trainset import SENTENCES, SHARD_SIZE, Source, feature_key, training_sources

WHEELS = Path(".whl")
TRAIN_TARGET = "whisper-tiny.en"


def target_files(targets: list[str]) -> list[tuple[str, bytes]]:
    """(relative path, bytes) of every file of each converted target folder."""
    return [
        (f"targets/{builtin_model_dir(name).name}/{path.name}", path.read_bytes())
        for name in targets
        for path in sorted(builtin_model_dir(name).iterdir())
    ]


def split(relative: str, data: bytes, step: int = 1024 * 1024) -> list[tuple[str, bytes]]:
    """A file as 1 MiB pieces (RELATIVE.partNNN) and its checksum (RELATIVE.sha256), so that packs fill evenly;
    tools/gpu_setup.sh joins and checks them."""
    name = relative.rsplit("/", 1)[-1]
    digest = hashlib.sha256(data).hexdigest()
    parts = [(f"{relative}.part{i // step:04d}", data[i : i + step]) for i in range(0, len(data), step)]
    return [(f"{relative}.sha256", f"{digest}  {name}\n".encode()), *parts]


def cache_files(source: Source, target: str, shards: int) -> list[tuple[str, bytes]]:
    """The settings and first `shards` shards of a source's feature cache; refuses a cache that lacks them."""
    key, name = feature_key(source.name, source.settings)
    folder = cache_dir() / "train" / target / name
    paths = [folder / f"shard-{index:04d}.safetensors" for index in range(shards)]
    if not all(path.exists() for path in paths):
        raise SystemExit(f"{folder} is incomplete: run `python -m specasr train --target {target} --prepare-only`")
    return [(f"train/{target}/{name}/settings.json", key.encode())] + [
        (f"train/{target}/{name}/{path.name}", path.read_bytes()) for path in paths
    ]


def training_shard(target: str = TRAIN_TARGET) -> list[tuple[str, bytes]]:
    """The first shard of the hibari-tts cache: the 64 clips `train --hibari 64` reads."""
    (source,) = training_sources(real=0, real_2=0, espeak=0, hibari=SHARD_SIZE)
    return cache_files(source, target, 1)


def training_cache(target: str = TRAIN_TARGET) -> list[tuple[str, bytes]]:
    """The target's feature cache for `python -m specasr train`'s default sources."""
    sources = training_sources(real=251, real_2=0, espeak=400, hibari=200)
    return [item for source in sources for item in cache_files(source, target, -(-source.count // SHARD_SIZE))]


def evaluation_clips(count: int) -> list[tuple[str, bytes]]:
    rows, items = [], []
    for u in spread(load_manifest(DEFAULT_SPEECH_DIR), count):
        path = f"audio/{u.path.name}"
        items.append((f"speech/{path}", u.path.read_bytes()))
        rows.append({"id": u.id, "path": path, "duration_s": u.duration, "speaker": u.speaker, "text": u.text})
    manifest = io.StringIO()
    writer = csv.DictWriter(manifest, fieldnames=list(rows[0]), delimiter="\t", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return [("speech/manifest.tsv", manifest.getvalue().encode()), *items]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", choices=("bench", "train"), default="bench")
    parser.add_argument("--clips", type=int, default=78, help="evaluation clips (bench)")
    parser.add_argument("--pack-mb", type=float, default=62)
    parser.add_argument("--packs", type=int, default=4, help="calls before the final one (train: 7)")
    parser.add_argument("--out", type=Path, default=Path(".devcarry"))
    args = parser.parse_args()

    last = [("text/sentences.txt", SENTENCES.read_bytes())]
    last += [(f"whl/{p.name}", p.read_bytes()) for p in sorted(WHEELS.glob("*.whl"))]
    if args.job == "bench":
        files = training_shard() + evaluation_clips(args.clips) + target_files(list(BUILTIN_TARGETS))
    else:
        last.append(("train-speech/manifest.tsv", (TRAIN_SPEECH_DIR / "manifest.tsv").read_bytes()))
        files = training_cache() + target_files([TRAIN_TARGET])
    bulk = [piece for relative, data in files for piece in split(relative, data)]

    shutil.rmtree(args.out, ignore_errors=True)
    pack, used = 1, 0
    for relative, data in bulk:
        if used + len(data) > args.pack_mb * 1e6:
            pack, used = pack + 1, 0
        if pack > args.packs:  # the rest travels with the final call
            last.append((relative, data))
            continue
        write(args.out / f"p{pack}" / relative, data)
        used += len(data)
    for relative, data in last:  # travels with the final call, beside the repository
        write(args.out / "last" / relative, data)
    for folder in sorted(args.out.iterdir()):
        size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
        print(f"{folder}: {size / 1e6:.1f} MB")


def write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


if __name__ == "__main__":
    main()
