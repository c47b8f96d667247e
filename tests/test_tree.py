"""Draft trees: width 1 is today's chain row for row, and the tree's pieces keep what the loop relies on."""

import itertools
import json
import math
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from specasr import tree
from specasr.decode import LoopOptions, _SpeculativeLoop, greedy_tokens
from specasr.draft import random_draft
from specasr.records import Origin
from specasr.store import Store
from specasr.stored_metrics import spine_rows
from specasr.targets.head import VocabularyHead
from specasr.trace import WINDOWS, DraftStep, Segment, Settings, Trace, spine
from specasr.transfer import export_runs, import_runs
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


def candidates(parents: list[int], probabilities: list[float]) -> tree.Candidates:
    """Hand-built candidates (parents before children); tokens 10, 11, ... in drafted order."""
    depths = []
    for parent in parents:
        depths.append(1 if parent < 0 else depths[parent] + 1)
    scores = [0.0] * len(parents)
    for i, (parent, p) in enumerate(zip(parents, probabilities, strict=True)):
        scores[i] = (0.0 if parent < 0 else scores[parent]) + math.log(p)
    as_tensor = torch.tensor
    return tree.Candidates(
        tokens=torch.arange(10, 10 + len(parents)),
        parents=as_tensor(parents),
        depths=as_tensor(depths),
        probabilities=as_tensor(probabilities),
        scores=as_tensor(scores, dtype=torch.float32),
        sources=torch.zeros(len(parents), dtype=torch.long),
    )


def test_the_chosen_nodes_hold_every_parent_even_at_probability_one():
    # Two roots' children, then children of probability 1: a child's path is exactly as probable as its parent's.
    found = candidates([-1, -1, 0, 0, 1, 2, 2, 4], [0.5, 0.5, 1.0, 0.25, 1.0, 1.0, 0.5, 1.0])
    for nodes in range(1, 9):
        chosen = tree.choose(found, nodes).tolist()
        assert chosen == sorted(chosen) and len(chosen) == nodes
        assert all(found.parents[i] < 0 or found.parents[i] in chosen for i in chosen)
    assert tree.choose(found, 4).tolist() == [0, 1, 2, 4]  # 0.5 each; the stable sort keeps drafted order


def test_acceptance_keeps_the_longest_path_the_target_agrees_with():
    # Root children 10, 11; 12 below 10, 13 below 11; 14 below 12.
    found = candidates([-1, -1, 0, 1, 2], [0.6, 0.4, 0.9, 0.9, 0.9])
    block = tree.block(found, torch.arange(5), depth=3)
    assert block.parents.tolist() == [0, 0, 0, 1, 2, 3]
    assert block.sees[5].tolist() == [True, True, False, True, False, True]  # root, 10, 12, 14
    eot = 99
    # The target chooses 11 after the root, 13 after 11, then 7: the path root-11-13 and the correction 7.
    choices = torch.tensor([11, 0, 7, 0, 13, 0])
    choices[2] = 13  # after 11 (row 2)
    choices[4] = 7  # after 13 (row 4)
    accepted, path = tree.accept(block, choices, eot, limit=3, depth=3)
    assert accepted.tolist() == [2] and path.tolist() == [0, 2, 4, 0]
    accepted, _ = tree.accept(block, choices, eot, limit=1, depth=3)  # the length limit stops it at depth 1
    assert accepted.tolist() == [1]
    choices = torch.tensor([10, 12, 0, 14, 0, 5])  # root-10-12-14, all agreed
    assert tree.accept(block, choices, eot, limit=3, depth=3)[0].tolist() == [3]
    ended = candidates([-1, -1, 0, 1, 2], [0.6, 0.4, 0.9, 0.9, 0.9])
    ended.tokens[0] = eot  # nothing below an accepted end-of-text counts
    block = tree.block(ended, torch.arange(5), depth=3)
    choices = torch.tensor([eot, 12, 0, 14, 0, 5])
    assert tree.accept(block, choices, eot, limit=3, depth=3)[0].tolist() == [1]


def test_a_rounds_spine_is_its_accepted_path_then_the_drafts_likeliest_child():
    def node(n, parent, depth, accepted, p):
        return DraftStep(0, depth, n, accepted, None, None, None, node=n, parent=parent, probability=p)

    steps = [node(0, None, 1, True, 0.5), node(1, None, 1, False, 0.4), node(2, 0, 2, False, 0.3)]
    steps += [node(3, 0, 2, False, 0.6), node(4, 1, 2, False, 0.9), node(5, 3, 3, False, 0.2)]
    assert [s.node for s in spine(steps)] == [0, 3, 5]
    chain = [node(d - 1, d - 2 if d > 1 else None, d, d == 1, None) for d in (1, 2, 3)]
    assert spine(chain) == chain


@pytest.mark.parametrize("captured", [False, True])
@pytest.mark.parametrize(("family", "seed"), [("whisper", 0), ("qwen3_asr", 5)])
def test_tree_rounds_record_their_nodes_and_keep_the_accepted_path(family, seed, captured):
    """Every node's parent is one depth up in its round; the accepted nodes are one path whose tokens, then the
    target's own, are what the round added to the transcript."""
    if family == "whisper":
        target = random_whisper_target(seed, layers=2, heads=2, vocab_size=8, max_length=40, init_std=0.3)
    else:
        target = random_prefix_target(family, seed, 2, 2, 8, 40, 0.3)
    memory = torch.randn(1, 40, target.d_model, generator=torch.Generator().manual_seed(seed))
    common = Counter(greedy_tokens(target, memory)).most_common(1)[0][0]
    draft = random_draft(target, seed=seed + 1)
    with torch.no_grad():  # a draft that mostly proposes the commonest token, with second choices
        draft.out_norm.weight.mul_(0.2)
        draft.out_norm.bias.copy_(3 * draft._frozen["lm_head"].weight[common])
    settings = Settings(draft="random", k=4, tree_width=3, tree_nodes=9)
    result = run_loop(target, draft, memory, 40, settings, captured=captured)
    assert result.tokens == greedy_tokens(target, memory)
    transcript = [*result.tokens, target.eot]
    assert max(r.accepted for r in result.rounds) >= 2 and min(r.accepted for r in result.rounds) == 0
    for r in result.rounds:
        nodes = [s for s in result.steps if s.round == r.index]
        assert [s.node for s in nodes] == list(range(len(nodes))) and len(nodes) <= 9
        assert all(s.parent is None or nodes[s.parent].depth == s.depth - 1 for s in nodes)
        path = [s for s in nodes if s.accepted]
        assert [s.depth for s in path] == list(range(1, r.accepted + 1))
        assert all(b.parent == a.node for a, b in itertools.pairwise(path))
        added = transcript[r.start : r.start + r.accepted + 1]
        assert [s.token for s in path] + [r.target_token] == added
        assert all(0 < s.probability <= 1 for s in nodes)


def test_a_tree_decode_leaves_the_targets_cache_as_a_teacher_forced_pass_does():
    target = random_whisper_target(seed=2, layers=2, heads=2, vocab_size=8, max_length=40, init_std=0.005)
    memory = torch.randn(1, 40, target.d_model, generator=torch.Generator().manual_seed(2))
    draft = random_draft(target, seed=3)
    settings = Settings(draft="random", k=4, tree_width=3, tree_nodes=9, verify_peaks=False)
    loop = _SpeculativeLoop(target, draft, memory, 40, LoopOptions.of(settings, target), None, Origin())
    with torch.inference_mode():
        tokens = loop.run().tokens
        cache = target.new_cache(memory, target.max_length)
        target.forward(torch.tensor([[*target.prompt, *tokens]]), cache)
    kept = loop.target_cache.length  # the prompt and every transcript token but the last, which no pass has read
    assert kept == len(target.prompt) + len(tokens) - 1
    for moved, expected in zip(
        loop.target_cache.self_keys + loop.target_cache.self_values, cache.self_keys + cache.self_values, strict=True
    ):
        assert torch.allclose(moved[..., :kept, :], expected[..., :kept, :], atol=1e-5)


def test_a_tree_trace_is_stored_exported_and_imported_whole(tmp_path):
    """Nodes, parents, probabilities and draft passes survive the store and an export; the stored rows give the same
    spine as the trace."""
    target = random_whisper_target(seed=0, layers=2, heads=2, vocab_size=8, max_length=40, init_std=0.3)
    memory = torch.randn(1, 40, target.d_model, generator=torch.Generator().manual_seed(0))
    settings = Settings(draft="random", k=4, tree_width=3, tree_nodes=9)
    result = run_loop(target, random_draft(target, seed=1), memory, 40, settings)
    segments = [Segment(0, 0, 40, 0, len(result.tokens))]
    trace = Trace("c1", settings, result.tokens, "", "hash-c1", 1.0, segments=segments, rounds=result.rounds)
    trace = replace(trace, steps=result.steps, verified=result.verified)
    store = Store(tmp_path / "runs.duckdb")
    run = store.write_run([trace], "decode")
    assert store.traces(run) == [trace]
    fresh = Store(tmp_path / "fresh.duckdb")
    import_runs(fresh, export_runs(store, [run], tmp_path / "export")[0].parent)
    assert fresh.traces(run) == [trace]
    columns = ["run_id", "decode", "round", "node", "parent", "depth", "accepted", "probability"]
    stored = spine_rows(store.rows("draft_steps", [run], columns))
    assert list(zip(stored["round"], stored.node, strict=True)) == [(s.round, s.node) for s in trace.spine]
    assert len(stored) < len(trace.steps)  # a tree's spine leaves nodes out
