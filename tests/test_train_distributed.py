"""Training under torchrun: two gloo processes on the CPU train the draft one process trains with the same global
batch, and processes sharing a feature cache each make their own shards of it.

Run as a script under torchrun, this file is one process of the shared cache build (see prepare_shards).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from specasr import trainset
from specasr.audio import Clip
from specasr.dataset import TRAIN_SPEECH_DIR
from specasr.draft import Draft, load_draft
from specasr.ranks import joined, leave
from specasr.targets import load_target
from specasr.train import check_global_batch, epoch_batches
from specasr.trainset import Example, Source

ROOT = Path(__file__).resolve().parents[1]
CLIPS = 8


def torchrun(*args: str, cache: Path, processes: int = 2) -> None:
    """Run `args` under torchrun with `processes` gloo processes on the CPU, on a free port."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}"]
    environment = {**os.environ, "SPECASR_CACHE": str(cache), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([*launcher, *args], cwd=ROOT, env=environment, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


@pytest.fixture
def target_folder(tmp_path) -> Path:
    """A tiny random Whisper, saved as a local model folder that `train --target` loads."""
    from tests.conftest import random_whisper_target

    target = random_whisper_target(seed=0, layers=2, heads=2, vocab_size=24, max_length=40)
    folder = tmp_path / "random-whisper"
    for part in (target.model, target.tokenizer, target.feature_extractor):
        part.save_pretrained(folder)
    return folder


def fill_feature_cache(folder: Path) -> None:
    """The cache `train --real CLIPS` reads: the target's states over random transcripts of different lengths, so
    that the two processes' shares of a batch hold different numbers of tokens (no audio is decoded here)."""
    target = load_target(str(folder))
    generator = torch.Generator().manual_seed(0)
    examples = []
    for n in range(CLIPS):
        transcript = torch.randint(6, 24, (3 + 3 * n,), generator=generator).tolist()
        valid = 20 + n
        memory = torch.randn(1, valid, target.d_model, generator=generator)
        frames = [min(2 * i, valid - 1) for i in range(len(transcript))]
        examples.append(trainset.teacher_forced(target, f"clip-{n}", memory, valid, transcript, frames))
    source = Source("train-speech", {}, CLIPS, clip=None)  # real speech's settings, as training_sources names them
    shard = trainset.feature_cache(target, source) / "shard-0000.safetensors"
    trainset.write_shard(shard, examples, [e.id for e in examples])


def without_key_biases(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The weights with the attention keys' biases zeroed. A key bias adds the same to every score of a query, which
    the softmax cancels: its gradient is float noise, and AdamW's normalisation turns that noise into steps."""
    d = weights["self_norm.weight"].numel()
    kept = dict(weights)
    kept["qkv.bias"] = torch.cat([weights["qkv.bias"][:d], torch.zeros(d), weights["qkv.bias"][2 * d :]])
    kept["audio_kv.bias"] = torch.cat([torch.zeros(d), weights["audio_kv.bias"][d:]])
    return kept


def test_two_processes_train_the_draft_one_process_trains_with_the_same_global_batch(
    target_folder, tmp_path, monkeypatch
):
    if not (TRAIN_SPEECH_DIR / "manifest.tsv").is_file():
        pytest.skip(f"train --real reads the manifest of {TRAIN_SPEECH_DIR}")
    cache = tmp_path / "cache"
    monkeypatch.setenv("SPECASR_CACHE", str(cache))
    fill_feature_cache(target_folder)
    train = ["-m", "specasr", "train", "--target", str(target_folder), "--real", str(CLIPS), "--espeak", "0"]
    # Batches of 3, 3 and 2 of the 8 examples: shares of 2 and 1 examples, then 1 and 1.
    train += ["--hibari", "0", "--epochs", "2", "--batch-size", "3", "--unroll", "2", "--draft-vocab", "0"]
    train += ["--sigma-ms", "160", "--seed", "1"]
    torchrun(*train, "--out", str(tmp_path / "two"), cache=cache, processes=2)
    torchrun(*train, "--out", str(tmp_path / "one"), cache=cache, processes=1)

    # The float32 weights of the last epoch; the final draft is the same in float16.
    two = load_file(tmp_path / "two" / "resume" / "draft.safetensors")
    one = load_file(tmp_path / "one" / "resume" / "draft.safetensors")
    torch.testing.assert_close(without_key_biases(two), without_key_biases(one), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(two, one, rtol=0, atol=1e-4)
    target = load_target(str(target_folder))
    config = load_draft(tmp_path / "two", target).config
    assert config.training["batch_size"] == 3 and config.training["examples"] == CLIPS
    torch.manual_seed(1)  # train's seed: the draft's initialisation
    start = Draft(config).state_dict()
    moved = max((two[name] - start[name]).abs().max().item() for name in two)
    assert 0 < moved < 0.01  # six AdamW steps of lr 1e-3 at most from the same start


def test_a_training_set_smaller_than_the_processes_is_refused_before_it_trains_nothing():
    check_global_batch(batch_size=4, examples=2, world=2)  # one example each
    assert epoch_batches(1, 4, seed=0, epoch=0, rank=0, world=2) == []  # one example for two: no batch at all
    with pytest.raises(ValueError, match=r"^1 training examples cannot give each of 2 processes one$"):
        check_global_batch(batch_size=4, examples=1, world=2)


def counting_source(name: str, count: int) -> Source:
    return Source(name, {"seed": 0}, count, lambda n: Clip(f"{name}-{n}", np.zeros(1600, np.float32)))


SOURCES = (("counting", 7), ("other", 3))  # shards of 2 clips: 4 and 2


class FakeTarget:
    name = folder_name = "fake-target"


def prepare_shards(rank: int, world: int, log: Path) -> None:
    """This process's part of building the cache of SOURCES, the examples made without a model (each from its clip
    id alone); which clips it made and the examples it read go to `log` as JSON."""
    made = []

    def make_example(target, clip: Clip, aligner) -> Example:
        made.append(clip.id)
        n = int(clip.id.rsplit("-", 1)[1])
        return Example(clip.id, [n, n + 1], [None, None], torch.full((1, 2, 3), float(n)), torch.zeros(2, 3))

    trainset.SHARD_SIZE, trainset.make_example = 2, make_example
    sources = [counting_source(name, count) for name, count in SOURCES]
    examples = trainset.prepare_examples(FakeTarget(), sources, aligner=None, rank=rank, world=world)
    log.write_text(json.dumps({"made": made, "read": [e.id for e in examples]}))


def cache_contents(cache: Path) -> dict[str, tuple]:
    """Every shard of a cache by its path in it: its clips and its examples' ids, tokens and states."""
    return {
        str(shard.relative_to(cache)): (
            trainset.shard_clips(shard),
            [(e.id, e.tokens, e.hidden.tolist()) for e in trainset.read_shard(shard)],
        )
        for shard in sorted(cache.rglob("shard-*.safetensors"))
    }


def test_processes_sharing_a_feature_cache_each_make_their_own_shards(tmp_path, monkeypatch):
    torchrun(__file__, str(tmp_path), cache=tmp_path / "shared")
    monkeypatch.setenv("SPECASR_CACHE", str(tmp_path / "alone"))
    monkeypatch.setattr(trainset, "make_example", trainset.make_example)  # prepare_shards replaces both
    monkeypatch.setattr(trainset, "SHARD_SIZE", trainset.SHARD_SIZE)
    prepare_shards(0, 1, tmp_path / "alone.json")

    ranks = [json.loads((tmp_path / f"rank-{rank}.json").read_text()) for rank in (0, 1)]
    alone = json.loads((tmp_path / "alone.json").read_text())
    assert ranks[0]["made"] and ranks[1]["made"] and not set(ranks[0]["made"]) & set(ranks[1]["made"])
    assert sorted(ranks[0]["made"] + ranks[1]["made"]) == sorted(alone["made"])
    assert ranks[0]["read"] == ranks[1]["read"] == alone["read"]  # every process reads every shard
    shared, single = cache_contents(tmp_path / "shared"), cache_contents(tmp_path / "alone")
    assert len(shared) == 6 and shared == single


if __name__ == "__main__":
    ranks = joined()
    prepare_shards(ranks.rank, ranks.size, Path(sys.argv[1]) / f"rank-{ranks.rank}.json")
    leave()
