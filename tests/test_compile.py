"""Compiled steps (torch.compile, inductor): the same tokens and rows as the static steps run plainly (captured, where
CUDA exists, either way), segment after segment of different lengths without compiling again. Kept to one tiny
random Whisper: each step compiles in seconds."""

import os
import subprocess
import sys
from dataclasses import replace

import pytest
import torch
from torch._dynamo.utils import counters

from specasr import decode
from specasr.pipeline import Pipeline
from specasr.trace import Settings
from tests.conftest import run_loop
from tests.test_graphs import _target_and_draft

SEGMENTS = ((0, 40), (1, 17), (2, 31))  # (seed of the encoder output, valid frames)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def _rounds(result) -> list[tuple]:
    return [(r.start, r.proposed, r.accepted, r.target_token, r.drafted) for r in result.rounds]


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
@pytest.mark.parametrize(
    ("draft", "shape"),
    [(None, {}), ("random", {"k": 3, "window": "runtime"}), ("random", {"k": 3, "tree_width": 3, "tree_nodes": 6})],
    ids=["greedy", "chain", "tree"],
)
def test_compiled_steps_equal_the_plain_ones_and_compile_once(draft, shape, device):
    target, random_draft, _ = _target_and_draft(device)
    loop_draft = random_draft if draft else None
    plain = Settings(draft=draft, **shape)
    compiled, kept = replace(plain, compile=True), {}
    for seed, valid_frames in SEGMENTS:
        memory = torch.randn(1, 40, target.d_model, generator=torch.Generator().manual_seed(seed)).to(device)
        reference = [min(2 * i, valid_frames - 1) for i in range(40)]
        expected = run_loop(target, loop_draft, memory, valid_frames, plain, reference, captured=True)
        result = run_loop(target, loop_draft, memory, valid_frames, compiled, reference, captured=True, kept=kept)
        assert result.tokens == expected.tokens == decode.greedy(target, memory, valid_frames).tokens
        assert _rounds(result) == _rounds(expected)
        assert [(s.token, s.depth, s.accepted, s.window_centre) for s in result.steps] == [
            (s.token, s.depth, s.accepted, s.window_centre) for s in expected.steps
        ]
        assert [v.token for v in result.verified] == [v.token for v in expected.verified]
    steps = 2 if draft is None else 3  # greedy: the prompt's pass and a token's; a round: those two and drafting
    assert len(kept) == 1 and counters["stats"]["unique_graphs"] == steps  # no segment compiled again
    (made,) = kept.values()
    assert all(step.compile_seconds > 0 for step in vars(made).values() if hasattr(step, "compile_seconds"))


def test_settings_take_the_devices_default_unless_told():
    pipeline = Pipeline()
    assert pipeline.resolved(Settings()).compile is False  # measured slower on a CPU
    assert pipeline.resolved(Settings(compile=True)).compile is True
    assert pipeline.resolved(Settings(compile=True, decoder="transformers")).compile is False  # our loops only


def test_inductor_keeps_its_kernels_in_our_cache(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"} | {"SPECASR_CACHE": str(tmp_path)}
    code = "import os, specasr.pipeline; print(os.environ['TORCHINDUCTOR_CACHE_DIR'])"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == str(tmp_path / "inductor")
