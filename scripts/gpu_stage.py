"""Pack what a GPU bench needs beyond the repository into folders of at most --pack-mb each, since one device
call carries 64 MiB in all (repository included): converted target weights (split into pieces), the evaluation
clips and the wheels the GPU image lacks. Each pack travels in its own call and is copied aside there to
/tmp/stage; scripts/gpu_bench.sh then reassembles the weights and runs the bench.

    python -m scripts.gpu_stage [--clips 78] [--pack-mb 58] [--out .devcarry]
"""

import argparse
import csv
import hashlib
import shutil
from pathlib import Path

from specasr.cache import cache_dir
from specasr.dataset import DEFAULT_SPEECH_DIR, load_manifest, spread
from specasr.targets.builtin import BUILTIN_TARGETS, builtin_model_dir

WHEELS = Path(".whl")


def pieces() -> list[tuple[str, bytes]]:
    """(relative path, bytes) of everything to carry; weight files split into 16 MB pieces."""
    items = []
    for name in BUILTIN_TARGETS:
        folder = builtin_model_dir(name)
        for path in sorted(folder.iterdir()):
            data = path.read_bytes()
            if path.name == "model.safetensors":
                step = 16 * 1024 * 1024
                digest = hashlib.sha256(data).hexdigest()
                items.append((f"targets/{folder.name}/model.sha256", f"{digest}  model.safetensors\n".encode()))
                for i in range(0, len(data), step):
                    items.append((f"targets/{folder.name}/model.part{i // step:03d}", data[i : i + step]))
            else:
                items.append((f"targets/{folder.name}/{path.name}", data))
    return items


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clips", type=int, default=78)
    parser.add_argument("--pack-mb", type=float, default=58)
    parser.add_argument("--out", type=Path, default=Path(".devcarry"))
    args = parser.parse_args()

    items = pieces()
    utterances = spread(load_manifest(DEFAULT_SPEECH_DIR), args.clips)
    rows = []
    for u in utterances:
        items.append((f"speech/audio/{u.path.name}", u.path.read_bytes()))
        path = f"audio/{u.path.name}"
        rows.append({"id": u.id, "path": path, "duration_s": u.duration, "speaker": u.speaker, "text": u.text})
    items += [(f"whl/{p.name}", p.read_bytes()) for p in sorted(WHEELS.glob("*.whl"))]

    shutil.rmtree(args.out, ignore_errors=True)
    pack, used = 1, 0
    for relative, data in items:
        if used + len(data) > args.pack_mb * 1e6:
            pack, used = pack + 1, 0
        path = args.out / f"p{pack}" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        used += len(data)
    with open(args.out / f"p{pack}" / "speech" / "manifest.tsv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]), delimiter="\t")
        writer.writeheader()
        writer.writerows(rows)
    for folder in sorted(args.out.iterdir()):
        size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
        print(f"{folder}: {size / 1e6:.1f} MB")
    print(f"cache: {cache_dir()}")


if __name__ == "__main__":
    main()
