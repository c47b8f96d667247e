"""Pack what a GPU job needs beyond the code into one gzipped tar, split into pieces that each fit one device call.

One call to the lent machine carries 64 MiB, the working tree included, so the tar travels piece by piece: each
piece `.devcarry/pN/` goes in a call of its own that copies it to /tmp/stage there, and the last call joins, checks
and unpacks them (tools/gpu_job.sh). `drafts/` must be out of the working tree during those calls (the tar holds
it): `python -m tools.gpu_stage` prints the calls.

It holds both targets' converted float16 weights, the shipped drafts, the wheels the image lacks (.whl/, but
those the bench never imports), the evaluation clips as FLAC with their manifest, and one 30 s clip made of whole
clips and silence.

    python -m tools.gpu_stage [--clips 20] [--piece-mb 61] [--out .devcarry]
"""

import argparse
import csv
import hashlib
import io
import shutil
import tarfile
from pathlib import Path

import numpy as np
import soundfile

from specasr.audio import SAMPLE_RATE
from specasr.dataset import DEFAULT_SPEECH_DIR, Utterance, load_manifest, spread
from specasr.draft import SHIPPED_DRAFTS
from specasr.targets import load_target
from specasr.targets.builtin import BUILTIN_TARGETS, builtin_model_dir

WHEELS = Path(".whl")
LEAVE_OUT = ("av", "pocketsphinx")  # the bench reads FLAC with soundfile and aligns nothing
LONG_SECONDS = 30.0


def flac(audio: np.ndarray) -> bytes:
    out = io.BytesIO()
    soundfile.write(out, audio, SAMPLE_RATE, format="FLAC", subtype="PCM_16")
    return out.getvalue()


def manifest(rows: list[dict]) -> bytes:
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(rows[0]), delimiter="\t", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return text.getvalue().encode()


def clip_set(folder: str, clips: list[tuple[Utterance, np.ndarray]]) -> dict[str, bytes]:
    """A manifest folder of FLAC clips (16-bit, as the WAV sources: the same samples)."""
    files, rows = {}, []
    for u, audio in clips:
        path = f"audio/{u.id}.flac"
        files[f"{folder}/{path}"] = flac(audio)
        row = {"id": u.id, "path": path, "duration_s": len(audio) / SAMPLE_RATE, "speaker": u.speaker, "text": u.text}
        rows.append(row)
    return {f"{folder}/manifest.tsv": manifest(rows), **files}


def long_clip(utterances: list[Utterance]) -> tuple[Utterance, np.ndarray]:
    """Whole clips in manifest order while they fit in 30 s, then silence up to 30 s: one full Whisper window."""
    parts, texts = [], []
    for u in utterances:
        audio = u.clip().audio
        if sum(map(len, parts)) + len(audio) > LONG_SECONDS * SAMPLE_RATE:
            break
        parts.append(audio)
        texts.append(u.text)
    audio = np.concatenate(parts)
    audio = np.pad(audio, (0, int(LONG_SECONDS * SAMPLE_RATE) - len(audio)))
    return Utterance("long-30s", Path("long-30s.flac"), LONG_SECONDS, "several", " ".join(texts), "long", "long"), audio


def folder_files(folder: Path, prefix: str) -> dict[str, bytes]:
    return {f"{prefix}/{p.relative_to(folder)}": p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def bench_files(clips: int) -> dict[str, bytes]:
    files = {}
    for name in BUILTIN_TARGETS:
        load_target(name)  # converts the bundled weights once, where they are not converted yet
        files |= folder_files(builtin_model_dir(name), f"targets/{builtin_model_dir(name).name}")
    files |= folder_files(SHIPPED_DRAFTS, "drafts")
    files |= {f"whl/{p.name}": p.read_bytes() for p in sorted(WHEELS.glob("*.whl")) if not p.name.startswith(LEAVE_OUT)}
    utterances = load_manifest(DEFAULT_SPEECH_DIR)
    files |= clip_set("speech", [(u, u.clip().audio) for u in spread(utterances, clips)])
    files |= clip_set("long", [long_clip(utterances)])
    return files


def pack(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz", compresslevel=1) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clips", type=int, default=20, help="evaluation clips (bench)")
    parser.add_argument("--piece-mb", type=float, default=61)
    parser.add_argument("--out", type=Path, default=Path(".devcarry"))
    args = parser.parse_args()

    data = pack(bench_files(args.clips))
    step = int(args.piece_mb * 1e6)
    shutil.rmtree(args.out, ignore_errors=True)
    pieces = range(0, len(data), step)
    for number, start in enumerate(pieces, start=1):
        folder = args.out / f"p{number}"
        folder.mkdir(parents=True)
        (folder / f"stage.tar.gz.{number:02d}").write_bytes(data[start : start + step])
    (args.out / f"p{len(pieces)}" / "stage.sha256").write_text(f"{hashlib.sha256(data).hexdigest()}  stage.tar.gz\n")
    print(f"{len(data) / 1e6:.1f} MB in {len(pieces)} pieces; with drafts/ out of the working tree, a call each:")
    for number in range(1, len(pieces)):
        print(f"  carry .devcarry/p{number}: mkdir -p /tmp/stage && cp .devcarry/p{number}/* /tmp/stage/")
    print(f"  carry .devcarry/p{len(pieces)}: bash tools/gpu_job.sh")


if __name__ == "__main__":
    main()
