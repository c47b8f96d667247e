"""Draft trees: width 1 is today's chain row for row, and the tree's pieces keep what the loop relies on."""

import json
from collections import Counter
from pathlib import Path

import pytest
import torch

from specasr.decode import greedy_tokens
from specasr.draft import random_draft
from specasr.targets.head import VocabularyHead
from specasr.trace import Settings
from specasr.windows import WINDOWS
from tests.conftest import random_prefix_target, random_whisper_target, run_loop

CHAIN_ROWS = Path(__file__).parent / "data" / "chain_rows.json"


def chain_cases() -> list[dict]:
    """The cases of tests/data/chain_rows.json: three families, every window, K 1-7, eager and captured."""
    cases = []
    for i, (family, seed) in enumerate((f, s) for f in ("whisper", "qwen3_asr", "voxtral") for s in range(12)):
        cases.append(
            {
                "family": family,
                "seed": seed,
                "k": (1, 3, 4, 7)[seed % 4],
                "window": WINDOWS[(seed + i) % len(WINDOWS)],
                "threshold": 0.3 if seed % 5 == 2 else 0.0,
                "captured": seed % 2 == 1,
                "constant": None if seed % 3 == 0 else "common",
                "audio": seed % 6 != 5,
                "init_std": (0.005, 0.3)[seed % 4 == 0],
            }
        )
    return cases


def float64_case(case: dict):
    """A float64 random target and draft (float64, so that another CPU's rounding cannot flip a choice), its encoder
    output, valid frames and reference frames; a draft that mostly proposes the target's commonest token."""
    family, seed = case["family"], case["seed"]
    if family == "whisper":
        target = random_whisper_target(seed, 2, 2, 8, 32, case["init_std"])
    else:
        target = random_prefix_target(family, seed, 2, 2, 8, 32, case["init_std"], 1 + seed % 2)
    target.model.double()
    target.lm_head = VocabularyHead(target.lm_head.weight)
    draft = random_draft(target, audio=case["audio"], seed=seed + 1)
    memory = torch.randn(1, 40, target.d_model, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    if case["constant"] is not None:
        common = Counter(greedy_tokens(target, memory)).most_common(1)
        with torch.no_grad():
            draft.out_norm.weight.mul_(0.2)
            draft.out_norm.bias.copy_(8 * draft._frozen["lm_head"].weight[common[0][0] if common else 3])
    valid = 10 + seed % 30
    reference = [None if (j * 7 + seed) % 5 == 0 else (j * 3 + seed) % valid for j in range(30)]
    return target, draft, memory, valid, reference


def chain_rows(result) -> dict:
    return {
        "tokens": result.tokens,
        "rounds": [[r.segment, r.start, r.proposed, r.accepted, r.target_token] for r in result.rounds],
        "steps": [
            [s.round, s.depth, s.token, s.accepted, s.draft_peak, s.window_centre, s.reference_frame]
            for s in result.steps
        ],
        "verified": [[v.position, v.token, v.verify_peaks] for v in result.verified],
        "runtime_peaks": result.runtime_peaks,
    }


@pytest.mark.parametrize(
    "recorded", json.loads(CHAIN_ROWS.read_text()), ids=lambda r: f"{r['case']['family']}-{r['case']['seed']}"
)
def test_tree_width_one_is_the_chain_row_for_row(recorded):
    """The rows the chain loop gave before trees existed (commit f581639), from the same loop at tree width 1."""
    case = recorded["case"]
    assert case in chain_cases()
    target, draft, memory, valid, reference = float64_case(case)
    settings = Settings(
        draft="random", k=case["k"], window=case["window"], threshold=case["threshold"], runtime_layer=1
    )
    result = run_loop(target, draft, memory, valid, settings, reference, case["captured"])
    assert chain_rows(result) == recorded["rows"]
    assert [(s.node, s.parent) for s in result.steps] == [
        (s.depth - 1, s.depth - 2 if s.depth > 1 else None) for s in result.steps
    ]
