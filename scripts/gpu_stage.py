"""Pack what a GPU bench needs beyond the repository into folders of at most --pack-mb each, since one device
call carries 64 MiB in all (repository included): converted target weights (split into pieces), the evaluation
clips, the wheels the GPU image lacks, and one shard of cached training features (the first 64 hibari-tts clips
of tiny.en, filed as the 64-clip source it equals) to time training there. Packs p1, p2, ... travel in calls of their
own and are copied aside there to /tmp/stage; `last` travels with the final call, which runs
scripts/gpu_bench.sh: it reassembles the weights and runs.

    python -m scripts.gpu_stage [--clips 78] [--pack-mb 62] [--packs 4] [--out .devcarry]
"""

import argparse
import csv
import hashlib
import io
import shutil
from pathlib import Path

from specasr.cache import cache_dir
from specasr.dataset import DEFAULT_SPEECH_DIR, load_manifest, spread
from specasr.targets.builtin import BUILTIN_TARGETS, builtin_model_dir
from specasr.trainset import SENTENCES, SHARD_SIZE, feature_key

WHEELS = Path(".whl")


def pieces() -> list[tuple[str, bytes]]:
    """(relative path, bytes) of each converted target folder; weights in 1 MiB pieces with their checksum."""
    items = []
    for name in BUILTIN_TARGETS:
        folder = builtin_model_dir(name)
        for path in sorted(folder.iterdir()):
            data = path.read_bytes()
            if path.name == "model.safetensors":
                step = 1024 * 1024
                digest = hashlib.sha256(data).hexdigest()
                items.append((f"targets/{folder.name}/model.sha256", f"{digest}  model.safetensors\n".encode()))
                for i in range(0, len(data), step):
                    items.append((f"targets/{folder.name}/model.part{i // step:03d}", data[i : i + step]))
            else:
                items.append((f"targets/{folder.name}/{path.name}", data))
    return items


def training_shard(target: str = "whisper-tiny.en") -> list[tuple[str, bytes]]:
    """The first shard of the 200-clip hibari cache holds exactly the clips a 64-clip hibari source would."""
    _, full = feature_key("hibari", {"count": 200, "seed": 0})
    key, small = feature_key("hibari", {"count": SHARD_SIZE, "seed": 0})
    shard = (cache_dir() / "train" / target / full / "shard-0000.safetensors").read_bytes()
    return [
        (f"train/{target}/{small}/shard-0000.safetensors", shard),
        (f"train/{target}/{small}/settings.json", key.encode()),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clips", type=int, default=78)
    parser.add_argument("--pack-mb", type=float, default=62)
    parser.add_argument("--packs", type=int, default=4, help="calls before the final one")
    parser.add_argument("--out", type=Path, default=Path(".devcarry"))
    args = parser.parse_args()

    bulk = training_shard()  # first: whole files fill packs best before the 1 MiB weight pieces
    rows = []
    for u in spread(load_manifest(DEFAULT_SPEECH_DIR), args.clips):
        path = f"audio/{u.path.name}"
        bulk.append((f"speech/{path}", u.path.read_bytes()))
        rows.append({"id": u.id, "path": path, "duration_s": u.duration, "speaker": u.speaker, "text": u.text})
    manifest = io.StringIO()
    writer = csv.DictWriter(manifest, fieldnames=list(rows[0]), delimiter="\t", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    last = [("speech/manifest.tsv", manifest.getvalue().encode()), ("text/sentences.txt", SENTENCES.read_bytes())]
    last += [(f"whl/{p.name}", p.read_bytes()) for p in sorted(WHEELS.glob("*.whl"))]
    bulk += pieces()

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
