"""The feature cache grows and resumes by shard; training sources never reach held-out or evaluation speech."""

import numpy as np
import pytest
import torch

from specasr import trainset
from specasr.audio import Clip, load_audio
from specasr.dataset import TRAIN_SPEECH_2_DIR, heldout_ids, load_manifest, load_utterances
from specasr.trainset import Example, Source


class FakeTarget:
    name = folder_name = "fake-target"


@pytest.fixture
def made(monkeypatch, tmp_path):
    """Examples made without a model (the clip id in the tokens); records which clips were made."""
    monkeypatch.setenv("SPECASR_CACHE", str(tmp_path))
    monkeypatch.setattr(trainset, "SHARD_SIZE", 4)
    clips = []

    def make_example(target, clip, aligner):
        clips.append(clip.id)
        if clip.id.endswith("silent"):
            return None
        n = len(clips)
        return Example(clip.id, [n, n + 1], [None, None], torch.full((1, 2, 3), n), torch.zeros(2, 3))

    monkeypatch.setattr(trainset, "make_example", make_example)
    return clips


def counting_source(count: int, silent: int | None = None) -> Source:
    def clip(n: int) -> Clip:
        return Clip(f"clip-{n}" + ("-silent" if n == silent else ""), np.zeros(16000, np.float32))

    return Source("counting", {"seed": 0}, count, clip)


def test_a_longer_source_makes_only_the_clips_a_shorter_one_lacked(made):
    short = trainset.prepare_examples(FakeTarget(), [counting_source(6)], aligner=None)
    assert [e.id for e in short] == [f"clip-{n}" for n in range(6)]
    assert made == [f"clip-{n}" for n in range(6)]

    made.clear()
    longer = trainset.prepare_examples(FakeTarget(), [counting_source(10)], aligner=None)
    assert made == [f"clip-{n}" for n in range(4, 10)]  # the short last shard (clips 4, 5) is made again in full
    assert [e.id for e in longer] == [f"clip-{n}" for n in range(10)]

    made.clear()
    again = trainset.prepare_examples(FakeTarget(), [counting_source(5)], aligner=None)
    assert made == [] and [e.id for e in again] == [f"clip-{n}" for n in range(5)]
    assert all(torch.equal(a.hidden, b.hidden) for a, b in zip(again, longer, strict=False))
    assert [e.tokens for e in again] == [e.tokens for e in longer[:5]]


def test_a_clip_without_words_has_no_example_and_is_not_made_again(made):
    examples = trainset.prepare_examples(FakeTarget(), [counting_source(4, silent=2)], aligner=None)
    assert [e.id for e in examples] == ["clip-0", "clip-1", "clip-3"]
    made.clear()
    assert len(trainset.prepare_examples(FakeTarget(), [counting_source(4, silent=2)], aligner=None)) == 3
    assert made == []


def test_an_interrupted_build_resumes_at_the_shard_it_was_making(made, monkeypatch):
    source = counting_source(8)
    make = trainset.make_example

    def killed_at_clip_6(target, clip, aligner):
        if clip.id == "clip-6":
            raise KeyboardInterrupt
        return make(target, clip, aligner)

    monkeypatch.setattr(trainset, "make_example", killed_at_clip_6)
    with pytest.raises(KeyboardInterrupt):
        trainset.prepare_examples(FakeTarget(), [source], aligner=None)
    monkeypatch.setattr(trainset, "make_example", make)
    made.clear()
    assert len(trainset.prepare_examples(FakeTarget(), [source], aligner=None)) == 8
    assert made == ["clip-4", "clip-5", "clip-6", "clip-7"]


def test_synthetic_clips_do_not_depend_on_the_clips_before_them():
    # hibari-tts is deterministic; espeak-ng's audio varies by a few samples from call to call, so only its sentence
    # and voice are compared
    hibari = trainset.synthetic_source("hibari", 10, seed=0)
    fifth = hibari.clip(5)
    hibari.clip(3)
    again = trainset.synthetic_source("hibari", 6, seed=0).clip(5)
    assert fifth.id == again.id and np.array_equal(fifth.audio, again.audio)
    espeak = [trainset.synthetic_source("espeak", count, seed=0) for count in (10, 6)]
    assert espeak[0].clip(5).id == espeak[1].clip(5).id != espeak[0].clip(4).id
    assert not {espeak[0].clip(n).id.split("-")[1] for n in range(10)} & {
        hibari.clip(n).id.split("-")[1] for n in range(10)
    }


def test_train_speech_2_sources_never_hold_held_out_clips():
    if not (TRAIN_SPEECH_2_DIR / "manifest.tsv").is_file():
        pytest.skip(f"training speech not found at {TRAIN_SPEECH_2_DIR}")
    held = heldout_ids()
    utterances = trainset.train_speech_2(seed=0)
    assert len(held) == 47 and len(utterances) == len(load_manifest(TRAIN_SPEECH_2_DIR)) - 47
    assert not held & {u.id for u in utterances}
    assert [u.id for u in trainset.train_speech_2(seed=0)] == [u.id for u in utterances]
    assert {u.id for u in load_utterances("heldout")} == held
    (source,) = trainset.training_sources(real=0, real_2=3, espeak=0, hibari=0)
    assert source.count == 3 and source.clip(0).id == utterances[0].id


def test_train_prepare_only_fills_the_cache_and_trains_nothing(made, monkeypatch, capsys, tmp_path):
    from specasr.cli import main, train

    if not (TRAIN_SPEECH_2_DIR / "manifest.tsv").is_file():
        pytest.skip(f"training speech not found at {TRAIN_SPEECH_2_DIR}")
    monkeypatch.setattr(train, "load_target", lambda name, device, dtype: FakeTarget())
    argv = ["train", "--prepare-only", "--real", "2", "--real-2", "3", "--espeak", "0", "--hibari", "0"]
    assert main([*argv, "--out", str(tmp_path / "draft")]) == 0
    assert capsys.readouterr().out.strip() == "feature cache ready: 5 examples from 5 clips"
    assert len(made) == 5 and not (tmp_path / "draft").exists()
    assert {p.name.rsplit("-", 1)[0] for p in (tmp_path / "train" / FakeTarget.name).iterdir()} == {
        "train-speech",
        "train-speech-2",
    }


def test_perturbed_clips_are_their_own_draws_of_speed_shift_and_noise(sample_clips):
    source = trainset.perturbed_source(sample_clips, count=6, seed=0)
    again = trainset.perturbed_source(sample_clips, count=3, seed=0).clip(2)
    clips = [source.clip(n) for n in range(6)]
    assert clips[2].id == again.id == f"{sample_clips[2 % len(sample_clips)].id}-p2"
    assert np.array_equal(clips[2].audio, again.audio)  # the same draw, whichever clips came before
    original = load_audio(sample_clips[0].path)
    low, high = trainset.PERTURBATION["speed"]
    most_lead = trainset.PERTURBATION["shift_s"][1] * 16000
    assert len(original) / high - 1 <= len(clips[0].audio) <= len(original) / low + most_lead + 1
    assert clips[0].words is None and clips[0].dataset == "perturbed"  # frames come from forced alignment
    assert all(np.abs(c.audio).max() <= 1 and c.audio.dtype == np.float32 for c in clips)
    first = trainset.perturbed_source(sample_clips, count=6, seed=1).clip(0)
    assert first.id == clips[0].id and not np.array_equal(first.audio, clips[0].audio)
