"""Training examples for drafts: speech seen through the frozen target, cached once in shards.

An example holds the target's greedy tokens (the labels), its decoder states at every layer (so any
choice of draft taps reads the same cache), its encoder output over the real audio, and a reference
frame per token: from the synthesizer's own word times (espeak-ng's events, hibari-tts's phoneme durations) for
synthesized speech whose transcript matches the text spoken, otherwise from forced alignment of the transcript.
"""

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soxr
import torch
import torch.distributed as dist
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm import tqdm

from specasr.align import Aligner
from specasr.audio import SAMPLE_RATE, Clip, load_audio
from specasr.cache import cache_dir
from specasr.dataset import TRAIN_SPEECH_2_DIR, TRAIN_SPEECH_DIR, Utterance, heldout_ids, load_manifest
from specasr.decode import greedy_tokens
from specasr.reference import align_tokens, frames_from_words
from specasr.targets import Target
from specasr.words import normalize_for_alignment

FEATURE_VERSION = 2  # 2: shards list their clips; every synthetic clip has its own generator
SHARD_SIZE = 64
SENTENCES = TRAIN_SPEECH_DIR.parent / "text" / "sentences.txt"


@dataclass
class Source:
    """A named stream of training clips: clip(n) makes the n-th, and the first `count` are used. Its settings decide
    the clips and name its cache folder; the count does not, so a longer source reuses a shorter one's cache."""

    name: str
    settings: dict
    count: int
    clip: Callable[[int], Clip]


@dataclass
class Example:
    id: str
    tokens: list[int]  # prompt + greedy transcript + end-of-text
    frames: list[int | None]  # reference frame of each token; None for the prompt, end-of-text and unaligned tokens
    hidden: torch.Tensor  # (len(tokens) - 1, n_layers + 1, d_model): target states for the inputs tokens[:-1]
    memory: torch.Tensor  # (valid_frames, d_model): encoder output over the real audio


def real_source(name: str, utterances: list[Utterance], count: int, settings: dict | None = None) -> Source:
    """The first `count` utterances as clips (all of them if fewer)."""

    def clip(n: int) -> Clip:
        return Clip(utterances[n].id, load_audio(utterances[n].path), dataset=name, path=str(utterances[n].path))

    return Source(name, settings or {}, min(count, len(utterances)), clip)


def train_speech_2(seed: int = 0) -> list[Utterance]:
    """train-speech-2 without its held-out clips, in an order drawn with `seed`, so any first part is a sample."""
    held = heldout_ids()
    utterances = [u for u in load_manifest(TRAIN_SPEECH_2_DIR) if u.id not in held]
    return [utterances[i] for i in np.random.default_rng(seed).permutation(len(utterances))]


PERTURBATION = {"speed": (0.9, 1.1), "shift_s": (0.0, 1.0), "snr_db": (15.0, 40.0)}  # drawn uniformly per clip
LONGEST_SLOWED_S = 27.0  # a clip this long is not slowed down, so that it stays within one 30 s window


def perturbed_source(utterances: list[Utterance], count: int, seed: int = 0) -> Source:
    """Real clips played again changed: clip n is utterance n mod len(utterances) sped up or slowed down (its
    pitch with it), shifted later by a lead of silence, under white noise at a drawn signal-to-noise ratio, each
    draw from its own generator. The target's greedy transcript of the changed audio is its label and forced
    alignment its frames, so any audio serves; the target may hear other words in it than in the original."""
    lows, highs = zip(*PERTURBATION.values(), strict=True)

    def clip(n: int) -> Clip:
        utterance = utterances[n % len(utterances)]
        rng = np.random.default_rng([seed, n])
        speed, shift, snr_db = rng.uniform(lows, highs)
        audio = load_audio(utterance.path)
        if len(audio) > LONGEST_SLOWED_S * SAMPLE_RATE:
            speed = max(speed, 1.0)
        audio = soxr.resample(audio, SAMPLE_RATE * speed, SAMPLE_RATE).astype(np.float32)
        audio = np.concatenate([np.zeros(round(shift * SAMPLE_RATE), np.float32), audio])
        loudness = np.sqrt(np.mean(audio**2)) or 1e-4
        audio += rng.normal(0, loudness * 10 ** (-snr_db / 20), audio.size).astype(np.float32)
        return Clip(f"{utterance.id}-p{n}", np.clip(audio, -1, 1), dataset="perturbed")

    settings = {"seed": seed, "of": len(utterances), **{k: list(v) for k, v in PERTURBATION.items()}}
    return Source("perturbed", settings, count, clip)


def synthetic_source(tts: str, count: int, seed: int = 0, sentences: Path = SENTENCES) -> Source:
    """Synthesized speech of sentences drawn with `seed`, with light noise. espeak-ng: its voices in turn, varied rate
    and pitch; hibari-tts: its one voice at varied speed, speaking sentences from the other end of the same shuffled
    order, so that the two never share a sentence. Each clip draws from its own generator, so any clip can be made
    without the ones before it."""
    from specasr.espeak import ENGLISH_VOICES
    from specasr.tts import synthesize_espeak, synthesize_hibari

    if tts not in ("espeak", "hibari"):
        raise ValueError(f"unknown synthesizer {tts!r}; choose espeak or hibari")
    lines = [line.strip() for line in sentences.read_text().splitlines() if line.strip()]
    order = np.random.default_rng(seed).permutation(len(lines))
    if tts == "hibari":
        order = order[::-1]

    def clip(n: int) -> Clip:
        index = int(order[n])
        rng = np.random.default_rng([seed, index])
        if tts == "espeak":
            voice = ENGLISH_VOICES[n % len(ENGLISH_VOICES)]
            rate, pitch = int(rng.integers(130, 200)), int(rng.integers(30, 70))
            speech = synthesize_espeak(lines[index], voice=voice, rate_wpm=rate, pitch=pitch)
            name = f"espeak-{index}-{voice}"
        else:
            speed = round(float(rng.uniform(0.8, 1.25)), 2)
            speech = synthesize_hibari(lines[index], speed=speed, seed=index)
            name = f"hibari-{index}-{speed}"
        noise_db = rng.uniform(-50, -35)  # relative to full scale
        audio = speech.audio + rng.normal(0, 10 ** (noise_db / 20), speech.audio.size).astype(np.float32)
        return Clip(name, audio, dataset=tts, words=tuple(speech.words))

    return Source(tts, {"seed": seed}, min(count, len(lines)), clip)


def _reference_frames(target: Target, clip: Clip, tokens: list[int], aligner: Aligner) -> list[int | None]:
    if clip.words is not None and normalize_for_alignment(target.decode_text(tokens)) == [w.word for w in clip.words]:
        return frames_from_words(target, tokens, clip.words, len(clip.audio))
    return align_tokens(aligner, target, clip.audio, tokens).frames


@torch.inference_mode()
def make_example(target: Target, clip: Clip, aligner: Aligner) -> Example | None:
    """The example for one clip, or None when the target hears no words in it."""
    memory = target.encode(target.features(clip.audio))
    transcript = greedy_tokens(target, memory)
    if not transcript:
        return None
    frames = _reference_frames(target, clip, transcript, aligner)
    return teacher_forced(target, clip.id, memory, target.valid_frames(len(clip.audio)), transcript, frames)


@torch.inference_mode()
def teacher_forced(
    target: Target, clip_id: str, memory: torch.Tensor, valid_frames: int, transcript: list[int], frames: list
) -> Example:
    """An example from a transcript and its reference frames: the target's states at every layer, one pass."""
    tokens = [*target.prompt, *transcript, target.eot]
    cache = target.new_cache(memory, capacity=len(tokens) - 1)
    inputs = torch.tensor([tokens[:-1]], device=memory.device)
    hidden = target.forward(inputs, cache, taps=tuple(range(target.n_layers + 1))).hidden[0]
    return Example(
        id=clip_id,
        tokens=tokens,
        frames=[None] * len(target.prompt) + frames + [None],
        hidden=hidden.view(len(tokens) - 1, target.n_layers + 1, target.d_model).half().cpu(),
        memory=memory[0, :valid_frames].half().cpu(),
    )


def _shard_path(folder: Path, index: int) -> Path:
    return folder / f"shard-{index:04d}.safetensors"


def write_shard(path: Path, examples: list[Example], clips: list[str]) -> None:
    """One shard file for the clips `clips` (their examples: a clip without words has none), written under a
    temporary name and renamed, so a killed write leaves nothing."""
    tensors = {}
    for i, example in enumerate(examples):
        tensors[f"{i}.hidden"] = example.hidden.contiguous()
        tensors[f"{i}.memory"] = example.memory.contiguous()
    rows = [{"id": e.id, "tokens": e.tokens, "frames": e.frames} for e in examples]
    scratch = path.with_suffix(".tmp")
    save_file(tensors, scratch, metadata={"examples": json.dumps(rows), "clips": json.dumps(clips)})
    scratch.rename(path)


def shard_clips(path: Path) -> list[str]:
    """The ids of the clips a shard was made from, in order."""
    with safe_open(path, "pt") as f:
        return json.loads(f.metadata()["clips"])


def read_shard(path: Path, clips: int | None = None) -> list[Example]:
    """The examples of a shard's first `clips` clips (all by default)."""
    with safe_open(path, "pt") as f:
        metadata = f.metadata()
        wanted = set(json.loads(metadata["clips"])[:clips])
        return [
            Example(**row, hidden=f.get_tensor(f"{i}.hidden"), memory=f.get_tensor(f"{i}.memory"))
            for i, row in enumerate(json.loads(metadata["examples"]))
            if row["id"] in wanted
        ]


def feature_key(source: str, settings: dict) -> tuple[str, str]:
    """The JSON that identifies one source's cache, and the folder name derived from it."""
    key = json.dumps({"version": FEATURE_VERSION, "source": source, **settings}, sort_keys=True)
    return key, f"{source}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"


def feature_cache(target: Target, source: Source) -> Path:
    """The cache folder for one target and one data source; any change of settings gets a new folder."""
    key, name = feature_key(source.name, source.settings)
    folder = cache_dir() / "train" / target.folder_name / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "settings.json").write_text(key)
    return folder


def _shard_spans(count: int) -> list[tuple[int, int]]:
    """(first clip, clips) of each shard holding the first `count` clips."""
    return [(first, min(SHARD_SIZE, count - first)) for first in range(0, count, SHARD_SIZE)]


def missing_shards(folder: Path, count: int) -> list[tuple[int, int, int]]:
    """(index, first clip, clips) of each shard of the first `count` clips that the folder lacks. Shards already
    holding their clips are kept, so an interrupted build resumes and a longer source only makes the clips a shorter
    one lacked (a shorter last shard is made again in full)."""
    return [
        (index, first, n)
        for index, (first, n) in enumerate(_shard_spans(count))
        if not _shard_path(folder, index).exists() or len(shard_clips(_shard_path(folder, index))) < n
    ]


def build_caches(target: Target, sources: list[Source], aligner: Aligner, rank: int = 0, world: int = 1) -> list[Path]:
    """Fill each source's cache folder with shards for its first `count` clips. Of `world` processes sharing one
    cache (torchrun), process `rank` makes every world-th missing shard, so each shard is made once and the shares
    are balanced to within a shard; the caller waits for all of them before reading."""
    folders = [feature_cache(target, source) for source in sources]
    missing = [
        (source, folder, *shard)
        for source, folder in zip(sources, folders, strict=True)
        for shard in missing_shards(folder, source.count)
    ]
    if world > 1:
        dist.barrier()  # every process has listed the missing shards before any is written, so all lists agree
    share = missing[rank::world]
    quiet = rank != 0 or not share  # one bar, that of the first process
    with tqdm(total=sum(n for *_, n in share), desc=f"features {target.name}", unit="clip", disable=quiet) as progress:
        for source, folder, index, first, n in share:
            clips, examples = [], []
            for position in range(first, first + n):
                clip = source.clip(position)
                clips.append(clip.id)
                examples.append(make_example(target, clip, aligner))
                progress.update()
            write_shard(_shard_path(folder, index), [e for e in examples if e is not None], clips)
    return folders


def load_examples(folder: Path, count: int) -> list[Example]:
    """The examples of a cache folder's first `count` clips."""
    return [e for index, (_, n) in enumerate(_shard_spans(count)) for e in read_shard(_shard_path(folder, index), n)]


def data_hash(examples: list[Example]) -> str:
    """Identifies the training data: every example's id and tokens."""
    digest = hashlib.sha256()
    for example in examples:
        digest.update(json.dumps([example.id, example.tokens]).encode())
    return digest.hexdigest()


def training_sources(
    real: int, real_2: int, espeak: int, hibari: int, seed: int = 0, perturbed: int = 0
) -> list[Source]:
    """Real speech (../shared/data/train-speech, then train-speech-2 without its held-out clips), espeak-ng and
    hibari-tts speech of the sentence corpus, and the real clips perturbed (all of them in turn, the first of
    train-speech-2's drawn order first); a source asked for no clips is not read at all."""
    held_out = {"seed": seed, "heldout": len(heldout_ids())}
    makers = [
        (real, lambda: real_source("train-speech", load_manifest(TRAIN_SPEECH_DIR), real)),
        (real_2, lambda: real_source("train-speech-2", train_speech_2(seed), real_2, held_out)),
        (espeak, lambda: synthetic_source("espeak", espeak, seed)),
        (hibari, lambda: synthetic_source("hibari", hibari, seed)),
        (perturbed, lambda: perturbed_source(load_manifest(TRAIN_SPEECH_DIR) + train_speech_2(seed), perturbed, seed)),
    ]
    return [make() for count, make in makers if count]


def prepare_examples(
    target: Target, sources: list[Source], aligner: Aligner, rank: int = 0, world: int = 1
) -> list[Example]:
    """Build (or reuse) each source's cache for this target, `rank`'s share of it when `world` processes share the
    work, and load the examples of each source's first `count` clips, every shard's once all are made."""
    folders = build_caches(target, sources, aligner, rank, world)
    if world > 1:
        dist.barrier()
    return [e for source, folder in zip(sources, folders, strict=True) for e in load_examples(folder, source.count)]
