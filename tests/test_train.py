import pytest
import torch

from specasr.audio import load_audio
from specasr.decode import greedy_tokens
from specasr.draft import random_draft
from specasr.train import (
    Batch,
    Objective,
    TrainConfig,
    _chain_mask,
    anchor_loss,
    collate,
    gaussian_targets,
    unroll,
    unrolled_loss,
    unrolled_sums,
    with_feature_noise,
)
from specasr.trainset import teacher_forced


def test_anchor_loss_equals_a_hand_computed_cross_entropy():
    # One position, 4 frames of which 3 are valid, reference frame 1, sigma 1.
    attention = torch.tensor([[[0.1, 0.6, 0.3, 0.0]]])
    frames, valid = torch.tensor([[1]]), torch.tensor([3])
    weights = torch.exp(-torch.tensor([1.0, 0.0, 1.0]) / 2)
    q = weights / weights.sum()
    expected = -(q * torch.log(torch.tensor([0.1, 0.6, 0.3]))).sum()
    assert anchor_loss(attention, frames, valid, sigma=1.0).item() == pytest.approx(expected.item(), rel=1e-6)


def test_gaussian_targets_exclude_padding_and_renormalise():
    q = gaussian_targets(torch.tensor([[2, 9]]), torch.tensor([5]), n_frames=12, sigma=5.0)
    assert torch.allclose(q.sum(-1), torch.ones(1, 2))
    assert (q[..., 5:] == 0).all() and (q[..., :5] > 0).all()


def test_positions_without_a_reference_frame_carry_no_anchor_loss():
    attention = torch.full((1, 3, 4), 0.25)
    with_unaligned = anchor_loss(attention, torch.tensor([[1, -1, -1]]), torch.tensor([4]), 1.0)
    alone = anchor_loss(attention[:, :1], torch.tensor([[1]]), torch.tensor([4]), 1.0)
    assert with_unaligned.item() == pytest.approx(alone.item())
    assert anchor_loss(attention, torch.full((1, 3), -1), torch.tensor([4]), 1.0).item() == 0.0


def test_chain_mask_sees_true_features_then_its_own_chain():
    mask = _chain_mask(depth=3, length=5, device=torch.device("cpu"))
    # Depth 3 at position 4: true keys up to position 2, depth-2 key at 3, depth-3 key at 4.
    assert mask[4].nonzero().flatten().tolist() == [0, 1, 2, 5 + 3, 10 + 4]


def _batch(target, length: int = 7, frames: int = 30) -> Batch:
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(1, length, 3 * target.d_model, generator=generator)
    inputs = torch.randint(0, 1000, (1, length), generator=generator)
    return Batch(
        features=features,
        input_features=features,
        inputs=inputs,
        targets=torch.cat([inputs[:, 1:], torch.full((1, 1), -100)], dim=1),
        frames=torch.tensor([[3, 5, 8, -1, 12, 15, -1]]),
        memory=torch.randn(1, frames, target.d_model, generator=generator),
        valid_frames=torch.tensor([frames - 5]),
        lengths=torch.tensor([length]),
    )


def test_unrolled_depth_two_matches_the_inference_chain(tiny_en):
    """Training at depth 2 sees what the cached loop sees on a draft's second step."""
    draft = random_draft(tiny_en, seed=1).requires_grad_(False)
    batch = _batch(tiny_en)
    t = 4  # compare the depth-2 step at position t
    cache = draft.new_cache(batch.memory, int(batch.valid_frames), capacity=8)
    restart = draft(batch.features[:, :t], batch.inputs[:, :t], cache)  # catch-up on true features 0..t-1
    second = draft(restart.state[:, -1:], batch.inputs[:, t : t + 1], cache, carried=True)  # its own state at t

    captured = []
    original = draft.block
    draft.block = lambda *args: captured.append(original(*args)) or captured[-1]
    unrolled_loss(draft, batch, depths=2, anchor_weight=0.1, sigma=5.0)
    assert torch.allclose(captured[1].hidden[:, t], second.hidden[:, 0], atol=1e-5)
    valid = int(batch.valid_frames)  # the batch keeps padded frames (never attended); the inference cache drops them
    assert captured[1].attention[:, t, valid:].sum() == 0
    assert torch.allclose(captured[1].attention[:, t, :valid], second.attention[:, 0], atol=1e-6)


def test_one_training_step_reduces_the_loss(tiny_en):
    torch.manual_seed(0)
    draft = random_draft(tiny_en, seed=2).train()
    batch = _batch(tiny_en)
    optimizer = torch.optim.AdamW(draft.parameters(), lr=1e-3)
    before = unrolled_loss(draft, batch, depths=3, anchor_weight=0.1, sigma=5.0)
    before.total.backward()
    optimizer.step()
    after = unrolled_loss(draft, batch, depths=3, anchor_weight=0.1, sigma=5.0)
    assert after.total.item() < before.total.item()
    assert before.anchor > 0 and before.feature > 0


def test_feature_noise_reaches_the_draft_input_and_never_the_regression_target(tiny_en):
    draft = random_draft(tiny_en, seed=2).requires_grad_(False)
    draft.fuse.weight.zero_()  # the draft's output no longer depends on the features it reads
    clean = _batch(tiny_en)
    noisy = with_feature_noise(clean, torch.tensor(1e4), [torch.Generator().manual_seed(0)])
    assert torch.equal(noisy.features, clean.features)
    assert (noisy.input_features - clean.features).abs().mean() > 1e3
    loss = unrolled_loss(draft, noisy, depths=3, anchor_weight=0.0, sigma=20.0)
    assert loss.feature == pytest.approx(unrolled_loss(draft, clean, depths=3, anchor_weight=0.0, sigma=20.0).feature)


def test_train_config_gives_the_anchor_width_in_time_and_lambda_per_variant(tiny_en):
    draft = random_draft(tiny_en)
    assert Objective(draft, TrainConfig(), frame_seconds=0.02).sigma_frames == pytest.approx(20.0)  # 400 ms
    assert Objective(draft, TrainConfig(sigma_ms=100.0), frame_seconds=0.02).sigma_frames == pytest.approx(5.0)
    assert Objective(draft, TrainConfig(), frame_seconds=0.08).sigma_frames == pytest.approx(5.0)  # an 80 ms grid
    assert TrainConfig(variant="anchordraft").anchor_weight == 0.1
    assert TrainConfig(variant="control").anchor_weight == 0.0
    assert TrainConfig(variant="control", anchor_weight=0.2).anchor_weight == 0.2
    assert TrainConfig().feature_noise == 0.6
    with pytest.raises(ValueError, match="no-audio"):
        TrainConfig(variant="no-audio", anchor_weight=0.1)
    with pytest.raises(ValueError, match="sigma_ms"):
        TrainConfig(sigma_ms=0.0)


@pytest.fixture(scope="module")
def examples(tiny_en, speech):
    from specasr.align import get_aligner
    from specasr.trainset import make_example, training_sources

    sources = training_sources(real=2, real_2=0, espeak=2, hibari=1)
    return [make_example(tiny_en, source.clip(n), get_aligner()) for source in sources for n in range(source.count)]


def test_examples_hold_the_targets_view_of_each_clip(examples, tiny_en):
    for example in examples:
        n = len(example.tokens)
        assert example.tokens[:2] == list(tiny_en.prompt) and example.tokens[-1] == tiny_en.eot
        assert example.hidden.shape == (n - 1, tiny_en.n_layers + 1, tiny_en.d_model)
        assert example.memory.shape[1] == tiny_en.d_model and example.memory.shape[0] <= 1500
        assert example.frames[:2] == [None, None] and example.frames[-1] is None
        known = [f for f in example.frames if f is not None]
        assert len(known) >= (n - 3) / 2 and all(0 <= f < example.memory.shape[0] for f in known)


def test_shards_round_trip_and_a_killed_write_leaves_nothing(examples, tmp_path, monkeypatch):
    from specasr import trainset

    trainset.write_shard(tmp_path / "shard-0000.safetensors", examples, [e.id for e in examples])
    loaded = trainset.read_shard(tmp_path / "shard-0000.safetensors")
    assert [e.id for e in loaded] == [e.id for e in examples]
    assert all(torch.equal(a.hidden, b.hidden) and a.frames == b.frames for a, b in zip(loaded, examples, strict=True))

    def killed(tensors, path, metadata):
        path.write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(trainset, "save_file", killed)
    with pytest.raises(KeyboardInterrupt):
        trainset.write_shard(tmp_path / "shard-0001.safetensors", examples, [e.id for e in examples])
    assert sorted(p.name for p in tmp_path.glob("shard-*.safetensors")) == ["shard-0000.safetensors"]


def test_collate_masks_the_prompt_padding_and_unaligned_tokens(examples, tiny_en):
    from specasr.train import collate

    to_draft = torch.arange(tiny_en.vocab_size)
    batch = collate(examples[:2], (1, 2, 4), len(tiny_en.prompt), to_draft)
    for b, example in enumerate(examples[:2]):
        n = len(example.tokens) - 1
        assert batch.targets[b, 0] == example.tokens[2]  # position 0 reads sot's features and predicts token 2
        assert batch.targets[b, n - 2] == tiny_en.eot and (batch.targets[b, n - 1 :] == -100).all()
        assert (batch.frames[b, n - 1 :] == -1).all()  # padding and end-of-text have no frame
        unaligned = [i - 2 for i, f in enumerate(example.frames) if f is None and 2 <= i <= n]
        assert all(batch.frames[b, i] == -1 for i in unaligned)
        assert batch.valid_frames[b] == example.memory.shape[0]
        assert (batch.memory[b, example.memory.shape[0] :] == 0).all()


def test_training_is_deterministic_and_resumes_where_it_stopped(examples, tiny_en, tmp_path, monkeypatch):
    from specasr import train as training
    from specasr.draft import load_draft

    config = training.TrainConfig(
        variant="anchordraft", epochs=3, batch_size=2, unroll=2, taps=(2, 4), ffn_dim=64, draft_vocab=256, seed=3
    )
    sources = {"train-speech": {"count": 2}, "espeak": {"count": 2, "seed": 0}}
    straight = training.train(tiny_en, examples[:4], config, tmp_path / "a", "test", sources, every_epoch=True)

    calls, forward = [], training.Objective.forward

    def killed_in_third_epoch(self, batch):
        calls.append(1)
        if len(calls) == 5:  # two batches per epoch
            raise KeyboardInterrupt
        return forward(self, batch)

    monkeypatch.setattr(training.Objective, "forward", killed_in_third_epoch)
    with pytest.raises(KeyboardInterrupt):
        training.train(tiny_en, examples[:4], config, tmp_path / "b", data_hash="test", sources=sources)
    optimizer = torch.optim.AdamW(straight.parameters())
    assert training.load_optimizer(optimizer, tmp_path / "b" / "resume" / "optimizer.safetensors") == 2
    assert not list((tmp_path / "b").rglob("*.pt"))  # nothing pickled
    assert not (tmp_path / "b" / "config.json").exists()  # no final draft from an interrupted run
    monkeypatch.setattr(training.Objective, "forward", forward)
    resumed = training.train(tiny_en, examples[:4], config, tmp_path / "b", data_hash="test", sources=sources)
    assert resumed.weights_hash() == straight.weights_hash()
    last = load_draft(tmp_path / "a" / "epoch-3", tiny_en)
    assert last.weights_hash() == load_draft(tmp_path / "a", tiny_en).weights_hash()
    assert last.config.training["stopped_after"] == 3 and "stopped_after" not in straight.config.training
    assert load_draft(tmp_path / "a" / "epoch-1", tiny_en).weights_hash() != last.weights_hash()

    saved = load_draft(tmp_path / "a", tiny_en)
    assert saved.config.variant == "anchordraft" and len(saved.config.vocab_ids) == 256
    assert saved.config.training["data_hash"] == "test" and saved.config.training["seed"] == 3
    assert saved.config.training["sources"] == sources
    assert saved.config.training["sigma_ms"] == 400.0 and saved.config.training["anchor_weight"] == 0.1
    assert saved.config.taps == (2, 4) and saved.config.ffn_dim == 64
    assert tiny_en.eot in saved.config.vocab_ids
    with pytest.raises(ValueError, match="other settings"):
        training.train(tiny_en, examples[:4], training.TrainConfig(epochs=4, batch_size=2), tmp_path / "b", "test")


def test_a_draft_started_from_the_target_layer_takes_its_width_and_trains_from_it(examples, tiny_en, tmp_path):
    from specasr import train as training
    from specasr.draft import random_draft, start_from_target_layer

    config = training.TrainConfig(epochs=1, batch_size=2, unroll=1, init="target-layer", draft_vocab=256)
    trained = training.train(tiny_en, examples[:2], config, tmp_path / "d", data_hash="test")
    assert trained.config.ffn_dim == 1536 and trained.config.training["init"] == "target-layer"
    start = random_draft(tiny_en, ffn_dim=1536)
    start_from_target_layer(start, tiny_en)
    moved = (trained.ffn[0].weight - start.ffn[0].weight).abs().max()
    assert 0 < moved < 0.01  # one step of lr 1e-3 from the copied layer, not from random weights
    with pytest.raises(ValueError, match="unknown init"):
        training.TrainConfig(init="pretrained")


def test_draft_vocabulary_keeps_predicted_tokens_first_and_never_the_prompt(examples, tiny_en):
    from collections import Counter

    from specasr.train import draft_vocabulary

    vocab = draft_vocabulary(examples, 40, len(tiny_en.prompt), tiny_en.eot, Counter({7: 100, 8: 1}))
    assert len(vocab) == 40 and tiny_en.eot in vocab
    assert not set(tiny_en.prompt) & set(vocab)
    full = draft_vocabulary(examples, 10_000, len(tiny_en.prompt), tiny_en.eot, Counter({7: 100, 8: 1}))
    predicted = {t for e in examples for t in e.tokens[2:]}
    assert set(full) == predicted | {7, 8}
    assert draft_vocabulary(examples, 0, 2, tiny_en.eot) is None


def test_the_kl_teacher_is_the_targets_own_next_token_distribution(tiny_en, sample_clips):
    """Its most probable token at every position is the target's greedy token there."""
    memory = tiny_en.encode(tiny_en.features(load_audio(sample_clips[0].path)))
    transcript = greedy_tokens(tiny_en, memory)
    example = teacher_forced(tiny_en, "c", memory, memory.shape[1], transcript, [None] * len(transcript))
    draft = random_draft(tiny_en)  # the whole vocabulary: draft indices are target ids
    batch = collate([example], draft.config.taps, len(tiny_en.prompt), torch.arange(tiny_en.vocab_size), True)
    teacher = Objective(draft, TrainConfig(token_loss="kl"), 0.02, tiny_en.frozen_head().final_norm).teacher(batch)
    scored = batch.targets[0] != -100
    assert scored.sum() == len(transcript) + 1  # every transcript token, and end-of-text
    assert torch.equal(teacher[0, scored].argmax(dim=-1), batch.targets[0, scored])
    assert torch.allclose(teacher.exp().sum(dim=-1), torch.ones(1, teacher.shape[1]), atol=1e-4)


def test_the_kl_token_loss_is_zero_against_the_drafts_own_distribution_and_positive_otherwise(tiny_en):
    draft = random_draft(tiny_en, seed=1).requires_grad_(False)
    batch = _batch(tiny_en)
    (first, _), *_ = unroll(draft, batch, depths=1)
    own = draft.logits(first.hidden).float().log_softmax(dim=-1)
    sums, counts = unrolled_sums(draft, batch, 1, sigma=5.0, anchor=False, teacher=own)
    assert sums[0, 0].item() == pytest.approx(0.0, abs=1e-3) and counts[0, 0] == (batch.targets != -100).sum()
    sums, _ = unrolled_sums(
        draft, batch, 1, sigma=5.0, anchor=False, teacher=(5 * torch.randn_like(own)).log_softmax(dim=-1)
    )
    assert sums[0, 0] > 1.0
    with pytest.raises(ValueError, match="unknown token loss 'mse'"):
        TrainConfig(token_loss="mse")
