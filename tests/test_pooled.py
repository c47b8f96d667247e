"""Pooling a cell's clips: bootstrap intervals of known cases, and evaluation sets weighted equally."""

from collections import Counter
from dataclasses import replace

import numpy as np
import pytest

from specasr.intervals import bootstrap, pooled_bootstrap
from specasr.pooled import clip_results, weighting
from tests.test_experiments import BASE, hand_trace


def test_bootstrap_interval_of_a_known_case():
    # Resampling two utterances valued 0 and 1: the mean is 0, 0.5 or 1 with probabilities 1/4, 1/2, 1/4.
    interval = bootstrap(lambda values: sum(values) / len(values), [[0.0, 1.0]], draws=4000, seed=0)
    assert (interval.estimate, interval.low, interval.high) == (0.5, 0.0, 1.0)
    narrow = bootstrap(lambda values: sum(values) / len(values), [[0.0, 1.0]], draws=4000, seed=0, level=0.4)
    assert (narrow.low, narrow.high) == (0.5, 0.5)
    pooled = pooled_bootstrap(lambda sums: sums["x"] / 2, [{"x": np.array([0.0, 1.0])}], draws=4000, seed=0)
    assert (pooled.estimate, pooled.low, pooled.high) == (0.5, 0.0, 1.0)
    with pytest.raises(ValueError, match="undefined"):
        pooled_bootstrap(lambda sums: sums["x"] / 0, [{"x": np.array([0.0, 1.0])}], draws=100)
    # Sets weighted equally: set A (0, 1) resamples to a mean of 0, 0.5 or 1; set B (2) is always 2.
    columns = {"x": np.array([0.0, 1.0, 2.0]), "n": np.ones(3)}
    sets = pooled_bootstrap(lambda sums: sums["x"] / sums["n"], [columns], draws=4000, seed=0, strata=["A", "A", "B"])
    assert (sets.estimate, sets.low, sets.high) == (1.25, 1.0, 1.5)
    # The sets resampled too: two draws of {A, B}, each mean over its own resample. Both A (1/4): the mean of two A
    # means is 0 with probability 1/64 and at most 0.25 with 5/64; both B (1/4): 2. So 2.5% and 97.5% fall there.
    wider = pooled_bootstrap(
        lambda sums: sums["x"] / sums["n"], [columns], draws=4000, seed=0, strata=["A", "A", "B"], resample_strata=True
    )
    assert (wider.estimate, wider.low, wider.high) == (1.25, 0.25, 2.0)


def test_sets_of_the_minimum_are_weighted_equally_and_smaller_ones_merge_or_stand_apart():
    names = ["a"] * 70 + ["b"] * 70 + ["c"] * 8 + ["d"] * 4 + ["e"] * 2 + ["f", "g"]  # ../shared/data/speech's sizes
    speech = {f"c{i}": name for i, name in enumerate(names)}
    apart = weighting(speech)  # 16 clips in small sets make no set of 20: reported apart, out of the estimate
    assert Counter(apart.groups.values()) == {"a": 70, "b": 70, None: 16} and apart.sets == speech
    assert apart.rule == (
        "sets of at least 20 clips weighted equally: a (70), b (70); sets under 20 clips left out of the weighted "
        "estimate and reported apart, as together they make no set of 20: c (8), d (4), e (2), f (1), g (1); "
        "intervals resample the sets too"
    )
    merged = weighting(speech, minimum=10)
    assert Counter(merged.groups.values()) == {"a": 70, "b": 70, "other": 16}
    assert "sets under 10 clips merged into one set, other (16 clips): c (8), d (4), e (2), f (1), g (1)" in merged.rule
    assert weighting(speech, minimum=1).groups == speech
    one = weighting({"c1": "a", "c2": "a", "c3": "b"})  # no set reaches the minimum: the clips pooled as one
    assert set(one.groups.values()) == {"all"}
    assert one.rule.startswith("no set reaches 20 clips: pooled over all 3 clips as one set")
    conditioned = weighting(speech, resample_sets=False)
    assert conditioned.groups == apart.groups and conditioned.rule.endswith("intervals condition on the sets")
    assert weighting(speech).each_set().groups == speech


def test_clips_of_sets_left_out_count_in_the_per_set_tables_only():
    greedy = [hand_trace(replace(BASE, k=0), clip, [], 1.0, [7, 7]) for clip in "uvw"]
    cell = [hand_trace(replace(BASE, draft="control"), clip, [1], 0.5) for clip in "uvw"]
    weights = weighting({"hash-u": "big", "hash-v": "big", "hash-w": "small"}, minimum=2)
    assert [r.trace.clip_hash for r in clip_results(greedy, cell, weights)] == ["hash-u", "hash-v"]
    assert [r.group for r in clip_results(greedy, cell, weights.each_set())] == ["big", "big", "small"]
