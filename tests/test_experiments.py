"""The experiment runner: grids kept in the store, resumed without duplicates, and tables equal to hand computations."""

import json
from dataclasses import replace

import numpy as np
import pytest

from specasr.cli import main
from specasr.experiments import COMMAND, Grid, clip_results, contrasts, run_grid, tables
from specasr.metrics import bootstrap, pooled_bootstrap
from specasr.pipeline import Pipeline
from specasr.store import Store
from specasr.trace import Round, Settings, Timings, Trace

BASE = Settings(target="whisper-tiny.en")


def hand_trace(settings: Settings, clip: str, accepted: list[int], decode: float, tokens: list[int] | None = None):
    """A trace on clip `clip` whose rounds accepted these counts of K = settings.k proposals (none for greedy)."""
    rounds = [Round(i, 0, 0, [7] * settings.k, a, 7, 0.0, 0.0) for i, a in enumerate(accepted)]
    if tokens is None:
        tokens = [7] * (sum(1 + a for a in accepted) - 1)
    return Trace(
        clip,
        settings,
        tokens,
        "",
        clip_hash=f"hash-{clip}",
        timings=Timings(features=0.5, encoder=0.5, decode=decode),
        rounds=rounds,
    )


@pytest.fixture
def hand_grid(tmp_path):
    """Greedy and two drafts on clips u and v: control accepts more, and is twice as fast as greedy on u."""
    store = Store(tmp_path / "runs.duckdb")
    greedy, control, no_audio = replace(BASE, k=0), replace(BASE, draft="control"), replace(BASE, draft="no-audio")
    baseline = store.write_run(
        [hand_trace(greedy, "u", [], 2.0, [7] * 6), hand_trace(greedy, "v", [], 1.0, [7] * 2)], COMMAND
    )
    runs = {
        control: store.write_run([hand_trace(control, "u", [4, 1], 1.0), hand_trace(control, "v", [2], 1.0)], COMMAND),
        no_audio: store.write_run(
            [hand_trace(no_audio, "u", [0, 0, 1, 2], 2.5), hand_trace(no_audio, "v", [0, 1], 1.5, [7, 7, 8])], COMMAND
        ),
    }
    return store, baseline, runs


def test_cells_and_contrasts_equal_a_hand_computation(hand_grid):
    store, baseline, runs = hand_grid
    cells, contrast_table = tables(store, baseline, runs)
    control = cells.set_index("draft").loc["control"]
    # Rounds accepted 4, 1, 2 of K = 4: s_1 = 3/3, s_2 = 2/3, s_3 = 1/3, s_4 = 1/3.
    assert control.s == pytest.approx([1, 1, 2 / 3, 1 / 3, 1 / 3])
    assert (control.a1, control.a2c, control.L) == (pytest.approx(1.0), pytest.approx(2 / 3), pytest.approx(7 / 3))
    assert control.decode_speedup == pytest.approx(3.0 / 2.0) and control.total_speedup == pytest.approx(5.0 / 4.0)
    assert control.decode_speedup_low <= 1.5 <= control.decode_speedup_high
    no_audio = cells.set_index("draft").loc["no-audio"]
    assert (no_audio.clips, no_audio.lossless_clips) == (2, 1)  # v decoded another token than greedy
    assert no_audio.a1 == pytest.approx(3 / 6)
    assert no_audio["L"] == pytest.approx(4 / 6)
    assert no_audio.decode_speedup == pytest.approx(3.0 / 4.0)

    rows = contrast_table.set_index("metric")
    assert set(contrast_table.name) == {"control-no-audio"} and set(contrast_table.fixed) == {
        "unrestricted K=4 threshold=0"
    }
    assert rows.loc["L", "estimate"] == pytest.approx(7 / 3 - 4 / 6)
    assert rows.loc["a1", "estimate"] == pytest.approx(1.0 - 3 / 6)
    assert rows.loc["decode_speedup", "estimate"] == pytest.approx(1.5 - 0.75)
    assert (rows.clips == 2).all() and (rows.low <= rows.estimate).all() and (rows.estimate <= rows.high).all()


def test_window_contrasts_pair_cells_that_differ_only_in_window(hand_grid):
    store, baseline, runs = hand_grid
    control = next(s for s in runs if s.draft == "control")
    shifted = replace(control, window="shift")
    runs[shifted] = store.write_run(
        [hand_trace(shifted, "u", [0, 1, 0], 1.5), hand_trace(shifted, "v", [1], 1.0)], COMMAND
    )
    greedy = store.traces(baseline)
    results = {settings: clip_results(greedy, store.traces(run_id)) for settings, run_id in runs.items()}
    found = {(c.name, c.metric): c for c in contrasts(results)}
    assert found["unrestricted-shift", "L"].estimate == pytest.approx(7 / 3 - 2 / 4)
    assert found["unrestricted-shift", "L"].fixed == "control K=4 threshold=0"
    assert ("correct-shift", "L") not in found  # no correct cell


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


def test_a_grid_runs_once_and_resumes_without_duplicates(sample_clips, tmp_path):
    store = Store(tmp_path / "runs.duckdb")
    pipeline = Pipeline(store)
    clips = [u.clip() for u in sample_clips[:2]]
    grid = Grid(BASE, ("random",), ("unrestricted", "correct"), (2,))
    baseline, runs = run_grid(pipeline, store, grid, clips)
    assert len(runs) == 2 and set(runs) == set(grid.cells())
    history = store.runs()
    assert len(history) == 3 and (history.decodes == 2).all() and set(history.command) == {COMMAND}

    again = run_grid(Pipeline(store), store, grid, clips)
    assert again == (baseline, runs)
    assert store.runs().run_id.tolist() == history.run_id.tolist()  # nothing run or written twice

    more = Grid(BASE, ("random",), ("unrestricted", "shift"), (2,))
    _, grown = run_grid(pipeline, store, more, clips)
    assert grown[more.cells()[0]] == runs[grid.cells()[0]] and len(store.runs()) == 4  # only the new cell ran


def test_experiment_command_prints_cells_and_contrasts_as_json(capsys, sample_clips, tmp_path):
    db = str(tmp_path / "runs.duckdb")
    command = ["experiment", "--clips", "2", "--draft", "random", "--k", "2,3"]
    assert main([*command, "--window", "unrestricted", "--db", db, "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert {(c["draft"], c["k"]) for c in record["cells"]} == {("random", 2), ("random", 3)}
    for cell in record["cells"]:
        assert cell["clips"] == cell["lossless_clips"] == 2 and len(cell["s"]) == cell["k"] + 1
        assert {"a1", "a2c", "L", "decode_speedup", "total_speedup", "threshold", "window"} <= set(cell)
    assert record["contrasts"] == []  # cells that differ only in K are not one of the paper's contrasts
    assert record["best_run"] in {c["run_id"] for c in record["cells"]}
    assert main([*command, "--window", "sideways", "--db", db]) == 2
    assert "unknown window" in capsys.readouterr().err
