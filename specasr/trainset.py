"""Training examples for drafts: speech seen through the frozen target, cached once in shards.

An example holds the target's greedy tokens (the labels), its decoder states at every layer (so any
choice of draft taps reads the same cache), its encoder output over the real audio, and a reference
frame per token: from the synthesizer's own word times (espeak-ng's events, hibari-tts's phoneme durations) for
synthesized speech whose transcript matches the text spoken, otherwise from forced alignment of the transcript.
"""

import functools
import hashlib
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from specasr.align import Aligner, align_tokens, frames_from_words, normalize_for_alignment
from specasr.audio import Clip, load_audio
from specasr.cache import cache_dir
from specasr.dataset import TRAIN_SPEECH_DIR, load_manifest
from specasr.decode import greedy_tokens
from specasr.targets import WhisperTarget

FEATURE_VERSION = 1
SHARD_SIZE = 64
SENTENCES = TRAIN_SPEECH_DIR.parent / "text" / "sentences.txt"


@dataclass
class Example:
    id: str
    tokens: list[int]  # prompt + greedy transcript + end-of-text
    frames: list[int | None]  # reference frame of each token; None for the prompt, end-of-text and unaligned tokens
    hidden: torch.Tensor  # (len(tokens) - 1, n_layers + 1, d_model): target states for the inputs tokens[:-1]
    memory: torch.Tensor  # (valid_frames, d_model): encoder output over the real audio


def real_clips(speech_dir: Path = TRAIN_SPEECH_DIR, limit: int | None = None) -> Iterator[Clip]:
    for utterance in load_manifest(speech_dir)[:limit]:
        yield Clip(utterance.id, load_audio(utterance.path), dataset=speech_dir.name)


def synthetic_clips(count: int, seed: int = 0, tts: str = "espeak", sentences: Path = SENTENCES) -> Iterator[Clip]:
    """Synthesized speech of `count` sentences drawn with `seed`, with light noise. espeak-ng: its voices in turn,
    varied rate and pitch; hibari-tts: its one voice at varied speed, speaking sentences from the other end of the
    same shuffled order, so that the two never share a sentence."""
    from specasr.tts import ENGLISH_VOICES, synthesize_espeak, synthesize_hibari

    if tts not in ("espeak", "hibari"):
        raise ValueError(f"unknown synthesizer {tts!r}; choose espeak or hibari")
    lines = [line.strip() for line in sentences.read_text().splitlines() if line.strip()]
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(lines))
    for n, index in enumerate(order[:count] if tts == "espeak" else order[::-1][:count]):
        if tts == "espeak":
            voice = ENGLISH_VOICES[n % len(ENGLISH_VOICES)]
            rate, pitch = int(rng.integers(130, 200)), int(rng.integers(30, 70))
            speech = synthesize_espeak(lines[index], voice=voice, rate_wpm=rate, pitch=pitch)
            name = f"espeak-{index}-{voice}"
        else:
            speed = round(float(rng.uniform(0.8, 1.25)), 2)
            speech = synthesize_hibari(lines[index], speed=speed, seed=int(index))
            name = f"hibari-{index}-{speed}"
        noise_db = rng.uniform(-50, -35)  # relative to full scale
        audio = speech.audio + rng.normal(0, 10 ** (noise_db / 20), speech.audio.size).astype(np.float32)
        yield Clip(name, audio, dataset=tts, words=tuple(speech.words))


def _reference_frames(target: WhisperTarget, clip: Clip, tokens: list[int], aligner: Aligner) -> list[int | None]:
    if clip.words is not None and normalize_for_alignment(target.decode_text(tokens)) == [w.word for w in clip.words]:
        return frames_from_words(target, tokens, clip.words, len(clip.audio))
    return align_tokens(aligner, target, clip.audio, tokens).frames


@torch.inference_mode()
def make_example(target: WhisperTarget, clip: Clip, aligner: Aligner) -> Example | None:
    """The example for one clip, or None when the target hears no words in it."""
    memory = target.encode(target.features(clip.audio))
    transcript = greedy_tokens(target, memory)
    if not transcript:
        return None
    tokens = [*target.prompt, *transcript, target.eot]
    cache = target.new_cache(memory, capacity=len(tokens) - 1)
    inputs = torch.tensor([tokens[:-1]], device=memory.device)
    hidden = target.forward(inputs, cache, taps=tuple(range(target.n_layers + 1))).hidden[0]
    frames = [None] * len(target.prompt) + _reference_frames(target, clip, transcript, aligner) + [None]
    valid = target.valid_frames(len(clip.audio))
    return Example(
        id=clip.id,
        tokens=tokens,
        frames=frames,
        hidden=hidden.view(len(tokens) - 1, target.n_layers + 1, target.d_model).half().cpu(),
        memory=memory[0, :valid].half().cpu(),
    )


def _shard_path(folder: Path, index: int) -> Path:
    return folder / f"shard-{index:04d}.safetensors"


def write_shard(path: Path, examples: list[Example]) -> None:
    """One shard file, written under a temporary name and renamed, so a killed write leaves nothing."""
    tensors = {}
    for i, example in enumerate(examples):
        tensors[f"{i}.hidden"] = example.hidden.contiguous()
        tensors[f"{i}.memory"] = example.memory.contiguous()
    rows = [{"id": e.id, "tokens": e.tokens, "frames": e.frames} for e in examples]
    scratch = path.with_suffix(".tmp")
    save_file(tensors, scratch, metadata={"examples": json.dumps(rows)})
    scratch.rename(path)


def read_shard(path: Path) -> list[Example]:
    from safetensors import safe_open

    with safe_open(path, "pt") as f:
        rows = json.loads(f.metadata()["examples"])
    tensors = load_file(path)
    return [Example(**row, hidden=tensors[f"{i}.hidden"], memory=tensors[f"{i}.memory"]) for i, row in enumerate(rows)]


def feature_key(source: str, settings: dict) -> tuple[str, str]:
    """The JSON that identifies one source's cache, and the folder name derived from it."""
    key = json.dumps({"version": FEATURE_VERSION, "source": source, **settings}, sort_keys=True)
    return key, f"{source}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"


def feature_cache(target: WhisperTarget, source: str, settings: dict) -> Path:
    """The cache folder for one target and one data source; any change of settings gets a new folder."""
    key, name = feature_key(source, settings)
    folder = cache_dir() / "train" / target.name.replace("/", "_") / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "settings.json").write_text(key)
    return folder


def build_cache(target: WhisperTarget, clips: Iterable[Clip], count: int, folder: Path, aligner: Aligner) -> Path:
    """Fill `folder` shard by shard; shards already there are kept, so an interrupted build resumes."""
    shards = -(-count // SHARD_SIZE)
    if all(_shard_path(folder, shard).exists() for shard in range(shards)):
        return folder  # complete: reuse it without producing a single clip
    clips = iter(clips)
    progress = tqdm(total=count, desc=f"features {target.name} {folder.name}", unit="clip")
    for shard in range(shards):
        n = min(SHARD_SIZE, count - shard * SHARD_SIZE)
        path = _shard_path(folder, shard)
        if path.exists():
            for _ in range(n):  # skip the clips this shard holds
                next(clips)
        else:
            examples = [make_example(target, next(clips), aligner) for _ in range(n)]
            write_shard(path, [e for e in examples if e is not None])
        progress.update(n)
    progress.close()
    return folder


def load_examples(folders: list[Path]) -> list[Example]:
    return [e for folder in folders for path in sorted(folder.glob("shard-*.safetensors")) for e in read_shard(path)]


def data_hash(examples: list[Example]) -> str:
    """Identifies the training data: every example's id and tokens."""
    digest = hashlib.sha256()
    for example in examples:
        digest.update(json.dumps([example.id, example.tokens]).encode())
    return digest.hexdigest()


@dataclass
class Source:
    """A named stream of training clips; its settings decide which cache folder it fills."""

    name: str
    settings: dict
    count: int
    clips: Callable[[], Iterator[Clip]]


def training_sources(real: int, espeak: int, hibari: int, seed: int = 0) -> list[Source]:
    """Real untranscribed speech (../shared/data/train-speech) and espeak-ng and hibari-tts speech of the sentence
    corpus."""
    sources = []
    if real:
        real = min(real, len(load_manifest(TRAIN_SPEECH_DIR)))
        sources.append(Source("train-speech", {"count": real}, real, lambda: real_clips(limit=real)))
    for tts, count in (("espeak", espeak), ("hibari", hibari)):
        if count:
            clips = functools.partial(synthetic_clips, count, seed, tts)
            sources.append(Source(tts, {"count": count, "seed": seed}, count, clips))
    return sources


def prepare_examples(target: WhisperTarget, sources: list[Source], aligner: Aligner) -> list[Example]:
    """Build (or reuse) each source's cache for this target and load every example."""
    folders = [
        build_cache(target, source.clips(), source.count, feature_cache(target, source.name, source.settings), aligner)
        for source in sources
    ]
    return load_examples(folders)
