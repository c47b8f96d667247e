"""Pack what a GPU job needs beyond the code into one gzipped tar, split into pieces that each fit one device call.

One call to the lent machine carries 64 MiB, the working tree included, so the tar travels piece by piece: each
piece `.devcarry/pN/` goes in a call of its own that copies it to /tmp/stage there, and the last call joins, checks
and unpacks them (tools/gpu_job.sh). `drafts/` must be out of the working tree during those calls (the tar holds
it): `python -m tools.gpu_stage` prints the calls.

For the bench (default) it holds both targets' converted float16 weights, the shipped drafts, the wheels the image
lacks (.whl/, but those the bench never imports), the evaluation clips as FLAC with their manifest, and one 30 s
clip made of whole clips and silence. For the tiny.en 2x2 (`--job 2x2`, tools/gpu_2x2.py): tiny.en's weights, the
wheels, the local feature cache's examples (ids, tokens, reference frames: the states are recomputed there) with
their clips as FLAC, and the held-out clips of train-speech-2.

For Live decode on the GPU (`--job dashboard`, tools/gpu_dashboard.py): the bench's files and the dashboard's wheels.

    python -m tools.gpu_stage [--job bench|2x2|dashboard] [--clips 20] [--piece-mb 61] [--out .devcarry]
"""

import argparse
import csv
import hashlib
import io
import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import numpy as np
import soundfile

from specasr.audio import SAMPLE_RATE
from specasr.dataset import DEFAULT_SPEECH_DIR, Utterance, load_manifest, load_utterances, spread
from specasr.draft import SHIPPED_DRAFTS
from specasr.targets import load_target
from specasr.targets.builtin import BUILTIN_TARGETS, builtin_model_dir
from specasr.trainset import SENTENCES, data_hash, feature_cache, load_examples, training_sources

WHEELS = Path(".whl")
LEAVE_OUT = ("av", "pocketsphinx")  # the bench reads FLAC with soundfile and aligns nothing
# The dashboard's own wheels with all their needs; the job installs only those the image lacks. Filled once with:
#   pip download streamlit==1.67.0 pocketsphinx==5.0.4 --only-binary=:all: --python-version 3.12
#       --platform manylinux2014_x86_64 -d .whl-dashboard
DASHBOARD_WHEELS = Path(".whl-dashboard")
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


def dashboard_files(clips: int) -> dict[str, bytes]:
    """The bench's files, and the wheels Streamlit and the aligner need, for Live decode through AppTest."""
    wheels = sorted(DASHBOARD_WHEELS.glob("*.whl"))
    if not any(p.name.startswith("streamlit-") for p in wheels):
        raise SystemExit(f"no streamlit wheel in {DASHBOARD_WHEELS}/: download the dashboard's wheels first")
    return bench_files(clips) | {f"whl-dashboard/{p.name}": p.read_bytes() for p in wheels}


def committed_code() -> dict[str, bytes]:
    """specasr/ and tools/ as committed: the job runs what HEAD holds, whatever the working tree is in the middle of."""
    archive = subprocess.run(["git", "archive", "HEAD", "specasr", "tools"], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def two_by_two_files(real: int, real_2: int) -> dict[str, bytes]:
    """tiny.en, the wheels, the cached examples of `real` + `real_2` clips (built here first: python -m specasr train
    --prepare-only) with their audio, and the held-out clips."""
    target = load_target("whisper-tiny.en")
    files = folder_files(builtin_model_dir(target.name), f"targets/{builtin_model_dir(target.name).name}")
    files |= {f"whl/{p.name}": p.read_bytes() for p in sorted(WHEELS.glob("*.whl")) if not p.name.startswith(LEAVE_OUT)}
    sources = training_sources(real, real_2, 0, 0)
    rows, examples = [], []
    for source in sources:
        clips = {clip.id: clip for clip in map(source.clip, range(source.count))}
        for example in load_examples(feature_cache(target, source), source.count):
            files[f"train/{example.id}.flac"] = flac(clips[example.id].audio)
            rows.append({"id": example.id, "tokens": example.tokens, "frames": example.frames})
            examples.append(example)
    described = {source.name: {**source.settings, "count": source.count} for source in sources}
    spec = {"data_hash": data_hash(examples), "sources": described, "examples": rows}
    files["examples.json"] = json.dumps(spec).encode()
    files |= {f"code/{name}": data for name, data in committed_code().items()}
    files["shared/data/text/sentences.txt"] = SENTENCES.read_bytes()  # the draft vocabulary's backfill, beside code/
    return files | clip_set("heldout", [(u, u.clip().audio) for u in load_utterances("heldout")])


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
    parser.add_argument("--job", default="bench", choices=["bench", "2x2", "dashboard"])
    parser.add_argument("--clips", type=int, default=20, help="evaluation clips (bench)")
    parser.add_argument("--real", type=int, default=251, help="2x2: clips of train-speech")
    parser.add_argument("--real-2", type=int, default=500, help="2x2: clips of train-speech-2")
    parser.add_argument("--piece-mb", type=float, default=61)
    parser.add_argument("--out", type=Path, default=Path(".devcarry"))
    args = parser.parse_args()

    jobs = {"bench": lambda: bench_files(args.clips), "dashboard": lambda: dashboard_files(args.clips)}
    jobs["2x2"] = lambda: two_by_two_files(args.real, args.real_2)
    data = pack(jobs[args.job]())
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
    job = "bash tools/gpu_job.sh" + ("" if args.job == "bench" else f" {args.job}")
    print(f"  carry .devcarry/p{len(pieces)}: {job}")


if __name__ == "__main__":
    main()
