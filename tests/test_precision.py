"""Numerical exactness checks: agreement counts and float32 argmax flips of a transcript."""

from dataclasses import replace

from specasr.precision import argmax_flips, token_agreement
from specasr.trace import Settings


def test_token_agreement_counts_equal_positions_over_the_longer_transcript():
    assert token_agreement([1, 2, 3], [1, 2, 3]) == (3, 3)
    assert token_agreement([1, 2, 3, 4], [1, 5, 3]) == (2, 4)
    assert token_agreement([], [7]) == (0, 1)


def test_a_float32_greedy_transcript_has_no_flips_and_a_changed_token_has_one(pipeline, tiny_en, sample_clips):
    clip = sample_clips[0].clip()
    trace = pipeline.decode(clip, Settings(target="whisper-tiny.en", verify_peaks=False))
    flips = argmax_flips(tiny_en, clip, trace)
    assert flips.positions == len(trace.tokens) + 1 and flips.flips == 0 and flips.margins == []

    changed = list(trace.tokens)
    changed[3] = changed[3] + 1
    flips = argmax_flips(tiny_en, clip, replace(trace, tokens=changed))
    # position 3 flips back; what follows is conditioned on the changed token and may flip too
    assert flips.flips >= 1 and all(margin > 0 for margin in flips.margins)


def test_precision_command_prints_one_row_per_low_precision_loop(capsys, speech):
    import json

    from specasr.cli import main

    assert main(["precision", "--clips", "1", "--draft", "random", "--k", "2", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [row["arm"] for row in rows] == ["greedy bfloat16", "random K=2 bfloat16"]
    assert all(row["dtype"] == "bfloat16" and row["clips"] == 1 and row["positions"] > 0 for row in rows)
    assert all(0 <= row["token_exact"] <= 1 and 0 <= row["flip_rate"] <= 1 for row in rows)
    assert main(["precision", "--data", "/nonexistent/manifest.tsv"]) == 2
    assert "no manifest" in capsys.readouterr().err
