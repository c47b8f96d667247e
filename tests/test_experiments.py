"""The experiment runner: grids kept in the store, resumed without duplicates, and tables equal to hand computations."""

import json
from collections import Counter
from dataclasses import replace

import pytest

from specasr.cli import main
from specasr.dataset import DEFAULT_SPEECH_DIR, evaluation_set, load_manifest, load_utterances, spread
from specasr.experiments import COMMAND, Grid, GridRuns, run_grid, stored_grid
from specasr.pipeline import Pipeline
from specasr.pooled import clip_results, weighting
from specasr.report import contrasts, tables
from specasr.store import Store, StoreError
from specasr.trace import DraftStep, Round, Settings, Timings, Trace, VerifiedToken

BASE = Settings(target="whisper-tiny.en")


def hand_trace(
    settings: Settings,
    clip: str,
    accepted: list[int],
    decode: float,
    tokens: list[int] | None = None,
    steps: list[DraftStep] = (),
    verified: list[VerifiedToken] = (),
    reference_frames: list[int | None] | None = None,
    round_seconds: tuple[float, float] = (0.0, 0.0),
    runtime_peaks: list[int] | None = None,
):
    """A trace on clip `clip` whose rounds accepted these counts of K = settings.k proposals (none for greedy)."""
    rounds = [Round(i, 0, 0, [7] * settings.k, a, 7, *round_seconds, settings.k) for i, a in enumerate(accepted)]
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
        steps=list(steps),
        verified=list(verified),
        reference_frames=reference_frames,
        runtime_peaks=runtime_peaks,
    )


def restarts(accepted: list[int], errors: list[int], reference: int = 100, centre: int | None = None) -> list:
    """Each round's depth-1 step, its draft peak `errors[i]` frames after the reference frame."""
    return [
        DraftStep(i, 1, 7, a >= 1, reference + e, centre, reference, node=0)
        for i, (a, e) in enumerate(zip(accepted, errors, strict=True))
    ]


def peaks_trace(clip: str, frames: list[int], offsets: list[int]) -> Trace:
    """Greedy with verification peaks: layer l attends offsets[l] frames after each token's reference frame."""
    verified = [VerifiedToken(i, 7, [f + o for o in offsets]) for i, f in enumerate(frames)]
    return hand_trace(PEAKS, clip, [], 1.0, [7] * len(frames), verified=verified, reference_frames=frames)


PEAKS = replace(BASE, k=0, verify_peaks=True, reference="always")


@pytest.fixture
def hand_grid(tmp_path):
    """Greedy and two drafts on clips u and v: control accepts more, and is twice as fast as greedy on u."""
    store = Store(tmp_path / "runs.duckdb")
    greedy, control, no_audio = replace(BASE, k=0), replace(BASE, draft="control"), replace(BASE, draft="no-audio")
    baseline = store.write_run(
        [hand_trace(greedy, "u", [], 2.0, [7] * 6), hand_trace(greedy, "v", [], 1.0, [7] * 2)], COMMAND
    )
    peaks = store.write_run([peaks_trace("u", [10, 20, 30], [0, 5]), peaks_trace("v", [5, 25], [0, 5])], COMMAND)
    cells = {
        control: store.write_run(
            [
                hand_trace(control, "u", [4, 1], 1.0, steps=restarts([4, 1], [0, 30])),
                hand_trace(control, "v", [2], 1.0, steps=restarts([2], [10])),
            ],
            COMMAND,
        ),
        no_audio: store.write_run(
            [hand_trace(no_audio, "u", [0, 0, 1, 2], 2.5), hand_trace(no_audio, "v", [0, 1], 1.5, [7, 7, 8])], COMMAND
        ),
    }
    return store, GridRuns(baseline, peaks, cells)


def test_cells_and_contrasts_equal_a_hand_computation(hand_grid):
    store, runs = hand_grid
    found = tables(store, runs)
    control = found.cells.set_index("draft").loc["control"]
    # Rounds accepted 4, 1, 2 of K = 4: s_1 = 3/3, s_2 = 2/3, s_3 = 1/3, s_4 = 1/3.
    assert control.s == pytest.approx([1, 1, 2 / 3, 1 / 3, 1 / 3])
    assert (control.a1, control.a2c, control.L) == (pytest.approx(1.0), pytest.approx(2 / 3), pytest.approx(7 / 3))
    assert control.decode_speedup == pytest.approx(3.0 / 2.0) and control.total_speedup == pytest.approx(5.0 / 4.0)
    assert control.decode_speedup_low <= 1.5 <= control.decode_speedup_high
    no_audio = found.cells.set_index("draft").loc["no-audio"]
    assert (no_audio.clips, no_audio.lossless_clips) == (2, 1)  # v decoded another token than greedy
    assert no_audio.a1 == pytest.approx(3 / 6)
    assert no_audio["L"] == pytest.approx(4 / 6)
    assert no_audio.decode_speedup == pytest.approx(3.0 / 4.0)

    rows = found.contrasts.set_index("metric")
    assert set(found.contrasts.name) == {"control-no-audio"}
    assert set(found.contrasts.fixed) == {"unrestricted K=4 threshold=0"}
    assert rows.loc["L", "estimate"] == pytest.approx(7 / 3 - 4 / 6)
    assert rows.loc["a1", "estimate"] == pytest.approx(1.0 - 3 / 6)
    assert rows.loc["decode_speedup", "estimate"] == pytest.approx(1.5 - 0.75)
    assert (rows.clips == 2).all() and (rows.low <= rows.estimate).all() and (rows.estimate <= rows.high).all()

    sweep = found.sweep.set_index("draft")
    assert sweep.loc["control", "s2"] == pytest.approx(2 / 3) and sweep.fastest.all()  # one K per draft
    assert found.runtime.empty and found.outcomes.empty  # no runtime window; control rejected no restart


def test_evaluation_sets_are_weighted_equally(hand_grid):
    store, runs = hand_grid
    found = tables(store, runs, weighting({"hash-u": "A", "hash-v": "B"}, minimum=1))
    control = found.cells.set_index("draft").loc["control"]
    # u (set A): rounds 4, 1 -> L = 5/2, a2c = 1/2; v (set B): round 2 -> L = 2, a2c = 1
    assert control["L"] == pytest.approx((5 / 2 + 2) / 2) and control.a2c == pytest.approx((1 / 2 + 1) / 2)
    by_set = found.cells_by_set.set_index(["draft", "set"])
    assert by_set.loc[("control", "A"), "L"] == pytest.approx(5 / 2) and by_set.loc[("control", "B"), "L"] == 2
    assert by_set.loc[("control", "A"), "a2c"] == pytest.approx(1 / 2) and (by_set.set_clips == 1).all()
    assert by_set.loc[("no-audio", "B"), "decode_speedup"] == pytest.approx(1.0 / 1.5)  # v: greedy 1.0 s, 1.5 s
    # total time: u 3.0 / 2.0, v 2.0 / 2.0
    assert control.total_speedup == pytest.approx((1.5 + 1.0) / 2)
    no_audio_L = (3 / 4 + 1 / 2) / 2
    rows = found.contrasts.set_index("metric")
    assert rows.loc["L", "estimate"] == pytest.approx(9 / 4 - no_audio_L)


def test_peak_table_against_hand_frames(hand_grid):
    store, runs = hand_grid
    peaks = tables(store, runs).peaks.set_index("source")
    layer0, layer1 = peaks.loc["target layer 0 verification"], peaks.loc["target layer 1 verification"]
    assert layer0.tokens == 5 and layer0.median_error_ms == 0 and layer0.pooled_r == pytest.approx(1.0)
    assert layer1.median_error_ms == 5 * 20 and layer1.inside_window == 1.0
    assert layer0.runtime_layer and not layer1.runtime_layer  # earliest layer within 0.02 of the best
    restart = peaks.loc["control unrestricted K=4 threshold=0 restart"]
    assert restart.tokens == 3 and restart.median_error_ms == 10 * 20  # errors 0, 30, 10 frames
    assert restart.inside_window == pytest.approx(2 / 3)  # 30 frames > 400 ms
    assert "no-audio unrestricted K=4 threshold=0 restart" not in peaks.index  # no audio attention to compare


@pytest.fixture
def runtime_grid(tmp_path):
    """AnchorDraft unrestricted and with the runtime window on clips u and v, every round timed alike."""
    store = Store(tmp_path / "runs.duckdb")
    greedy, base = replace(BASE, k=0), replace(BASE, draft="anchordraft")
    runtime = replace(base, window="runtime")
    baseline = store.write_run([hand_trace(greedy, "u", [], 2.0), hand_trace(greedy, "v", [], 2.0)], COMMAND)
    peaks = store.write_run([peaks_trace("u", [1, 2, 3], [0]), peaks_trace("v", [4, 5], [0])], COMMAND)
    timed = (0.05, 0.2)  # draft and verification seconds of every uncorrected round
    base_rounds = {"u": [0, 1, 0], "v": [2]}  # restart errors (frames): accepted 5, 20; rejected 2, 15
    base_errors = {"u": [2, 5, 15], "v": [20]}
    cells = {
        base: store.write_run(
            [
                hand_trace(
                    base, c, base_rounds[c], 1.0, steps=restarts(base_rounds[c], base_errors[c]), round_seconds=timed
                )
                for c in "uv"
            ],
            COMMAND,
        ),
        runtime: store.write_run(
            [
                hand_trace(
                    runtime,
                    "u",
                    [1, 1],
                    1.5,
                    steps=[
                        *restarts([1, 1], [0, 0], centre=103),
                        DraftStep(0, 2, 7, False, 100, 106, 100, node=1, parent=0),
                    ],
                    round_seconds=(0.06, 0.25),
                    reference_frames=[10, 20, None],
                    runtime_peaks=[12, 21, 40],
                ),
                hand_trace(
                    runtime,
                    "v",
                    [3],
                    0.5,
                    steps=[
                        *restarts([3], [0], centre=96),
                        DraftStep(0, 2, 7, True, 100, 91, 100, node=1, parent=0),
                        DraftStep(0, 3, 7, True, 100, 88, 100, node=2, parent=1),
                    ],
                    round_seconds=(0.05, 0.3),
                    reference_frames=[5, 25, 45],
                    runtime_peaks=[5, 29, 44],
                ),
            ],
            COMMAND,
        ),
    }
    return store, GridRuns(baseline, peaks, cells)


def test_outcome_and_runtime_tables_against_hand_computation(runtime_grid):
    found = tables(*runtime_grid)

    outcome = found.outcomes.set_index("cell").loc["anchordraft unrestricted K=4 threshold=0"]
    assert (outcome.accepted, outcome.rejected) == (2, 2)
    assert (outcome.accepted_median_ms, outcome.rejected_median_ms) == (12.5 * 20, 8.5 * 20)
    # large (> 200 ms = 10 frames): accepted 20 of (5, 20); rejected 15 of (2, 15)
    assert (outcome.large_at_accept, outcome.large_at_reject, outcome.odds_ratio) == (0.5, 0.5, 1.0)  # 1.5 per cell

    row = found.runtime.iloc[0]
    assert (row.draft, row.window, row.k) == ("anchordraft", "runtime", 4)
    # uncorrected: rounds 0, 1, 0, 2 -> L = 3/4; corrected: 1, 1, 3 -> L = 5/3
    assert row.d_L == pytest.approx(5 / 3 - 3 / 4) and row.d_a1 == pytest.approx(1 - 2 / 4)
    assert row.gross == pytest.approx((5 / 3 - 3 / 4) / (1 + 3 / 4))
    # added per round: verification (0.25 + 0.25 + 0.3) / 3 - 0.2 s, draft 4 proposals x ((0.06 + 0.06 + 0.05) / 12
    # - 0.05 / 4) s; in verifications of 0.2 s
    assert row.cost == pytest.approx((0.8 / 3 - 0.2 + 4 * (0.17 / 12 - 0.05 / 4)) / 0.2)
    assert row.rho == pytest.approx((0.05 / 4) / 0.2)
    # The readout against the reference frames: u 12, 21 vs 10, 20 (its third token has none), v 5, 29, 44 vs 5, 25,
    # 45: errors 2, 1, 0, 4, 1 frames.
    assert (row.readout_error_frames, row.readout_error_ms) == (1, 20)
    # The centres against reference 100: depth 1 at 103, 103, 96; depth 2 at 106, 91; depth 3 at 88.
    assert row.centre_error_by_depth == [3, 7.5, 12, None]
    assert (row.centre_error_frames, row.centre_error_ms) == (5, 100)  # errors 3, 3, 4, 6, 9, 12
    assert (row.predicted_change > 0) == (row.gross > row.cost / (1 + 4 * row.rho))  # eq. 4 and eq. 5 agree
    # Eq. 4: L = 3/4, dL = 11/12, K = 4 proposals per round, rho = 0.0625, the cost above.
    cost = (0.8 / 3 - 0.2 + 4 * (0.17 / 12 - 0.05 / 4)) / 0.2
    predicted = (1 + 4 * 0.0625) * (1 + 3 / 4 + 11 / 12) / ((1 + 3 / 4) * (1 + 4 * 0.0625 + cost)) - 1
    assert row.predicted_change == pytest.approx(predicted) and predicted > 0
    # Over two clips the interval reaches below 0 (v alone: its cost outweighs its dL): the rule cannot tell.
    assert row.predicted_change_low < 0 < row.predicted_change_high and row.predicted_pays == "undetermined"
    assert row.cost_low <= row.cost <= row.cost_high and row.rho_low <= row.rho <= row.rho_high
    assert row.net_decode == pytest.approx(0.0) and not row.measured_pays  # 2.0 s in both loops
    assert row.agrees is None  # sign agreement is counted over determined predictions only
    assert row.net_total == pytest.approx(0.0) and row.net_decode_low <= 0 <= row.net_decode_high


def test_a_stored_grid_pairs_its_runtime_cells_with_the_uncorrected_ones(runtime_grid):
    """A stored run names the runtime layer it resolved, and only under a runtime window (stored_grid's keys)."""
    store, runs = runtime_grid
    stored = {replace(s, runtime_layer=3) if s.window == "runtime" else s: run for s, run in runs.cells.items()}
    assert tables(store, replace(runs, cells=stored)).runtime.equals(tables(store, runs).runtime)


def test_runtime_table_weights_evaluation_sets_equally(runtime_grid):
    found = tables(*runtime_grid, weighting({"hash-u": "A", "hash-v": "B"}, minimum=1))
    row = found.runtime.iloc[0]
    by_set = found.runtime_by_set.set_index("set")
    assert by_set.loc["A", "d_L"] == pytest.approx(1 - 1 / 3) and by_set.loc["B", "d_L"] == pytest.approx(3 - 2)
    # uncorrected L: u (A) 1/3, v (B) 2 -> 7/6; corrected: u 1, v 3 -> 2
    assert row.d_L == pytest.approx(2 - 7 / 6) and row.gross == pytest.approx((2 - 7 / 6) / (1 + 7 / 6))
    # added per round: u 0.05 s verification + 4 x 0.01 / 4 s draft, v 0.1 s verification; in verifications of 0.2 s
    assert row.cost == pytest.approx(((0.05 + 0.01) / 0.2 + 0.1 / 0.2) / 2)
    assert row.rho == pytest.approx((0.05 / 4) / 0.2)


@pytest.mark.parametrize("corrected_decode, agrees", [(1.0, True), (3.0, False)])
def test_a_shifted_draft_corrected_gains_accepted_length_and_the_sign_test_can_fail(tmp_path, corrected_decode, agrees):
    """Shifted, the draft accepts nothing; the runtime window wins back L = 2 at no added cost per round, so the rule
    predicts a gain on every clip. Measured faster (1.0 s against 2.0) the sign agrees; measured slower, it does not."""
    store = Store(tmp_path / "runs.duckdb")
    greedy, shift = replace(BASE, k=0), replace(BASE, draft="anchordraft", window="shift")
    runtime = replace(shift, window="runtime")
    clips = [f"c{i}" for i in range(6)]
    baseline = store.write_run([hand_trace(greedy, c, [], 2.0) for c in clips], COMMAND)
    peaks = store.write_run([peaks_trace(c, [1, 2], [0]) for c in clips], COMMAND)

    def cell(settings: Settings, rounds: list[int], decode: float) -> str:
        steps = restarts(rounds, [0] * len(rounds))
        traces = [hand_trace(settings, c, rounds, decode, steps=steps, round_seconds=(0.05, 0.2)) for c in clips]
        return store.write_run(traces, COMMAND)

    cells = {shift: cell(shift, [0, 0, 0, 0, 0, 0], 2.0), runtime: cell(runtime, [2, 2], corrected_decode)}
    row = tables(store, GridRuns(baseline, peaks, cells)).runtime.set_index("uncorrected").loc["shift"]
    assert row.window == "runtime" and row.d_L == pytest.approx(2) and row.d_L_low > 0
    assert row.cost == pytest.approx(0) and row.predicted_change == pytest.approx(3 / 1 - 1)
    assert row.predicted_pays == "yes" and row.agrees == agrees
    assert row.net_decode == pytest.approx(2.0 / corrected_decode - 1)


def test_window_contrasts_pair_cells_that_differ_only_in_window(hand_grid):
    store, runs = hand_grid
    control = next(s for s in runs.cells if s.draft == "control")
    shifted = replace(control, window="shift")
    runs.cells[shifted] = store.write_run(
        [
            hand_trace(shifted, "u", [0, 1, 0], 1.5, steps=restarts([0, 1, 0], [25, 25, 25])),
            hand_trace(shifted, "v", [1], 1.0, steps=restarts([1], [25])),
        ],
        COMMAND,
    )
    greedy = store.traces(runs.baseline)
    results = {settings: clip_results(greedy, store.traces(run_id)) for settings, run_id in runs.cells.items()}
    found = {(c.name, c.metric): c for c in contrasts(results)}
    assert found["unrestricted-shift", "L"].estimate == pytest.approx(7 / 3 - 2 / 4)
    assert found["unrestricted-shift", "L"].fixed == "control K=4 threshold=0"
    assert ("correct-shift", "L") not in found  # no correct cell
    no_audio = next(s for s in runs.cells if s.draft == "no-audio")
    runs.cells[replace(no_audio, window="shift")] = runs.cells[no_audio]
    results = {settings: clip_results(greedy, store.traces(run_id)) for settings, run_id in runs.cells.items()}
    assert all("no-audio" not in c.fixed for c in contrasts(results))  # a window changes nothing without audio


def test_a_tree_is_contrasted_with_the_chain_of_its_draft_window_and_k(hand_grid):
    store, runs = hand_grid
    control = next(s for s in runs.cells if s.draft == "control")
    tree = replace(control, tree_width=2, tree_nodes=6)
    runs.cells[tree] = store.write_run(
        [hand_trace(tree, "u", [4, 2], 1.0, steps=restarts([4, 2], [0, 0])), hand_trace(tree, "v", [3], 0.5)], COMMAND
    )
    found = tables(store, runs)
    rows = found.contrasts[found.contrasts.name == "tree 2x6-chain"].set_index("metric")
    assert set(rows.fixed) == {"control unrestricted K=4"}
    assert rows.loc["L", "estimate"] == pytest.approx(9 / 3 - 7 / 3)  # rounds 4, 2, 3 against 4, 1, 2
    assert rows.loc["decode_speedup", "estimate"] == pytest.approx(3.0 / 1.5 - 1.5)
    cells = found.cells.set_index(["draft", "tree_width"])
    assert cells.loc[("control", 2), "tree_nodes"] == 6 and cells.loc[("control", 1), "tree_nodes"] == 4


def test_a_grid_runs_once_and_resumes_without_duplicates(sample_clips, tmp_path):
    store = Store(tmp_path / "runs.duckdb")
    pipeline = Pipeline(store)
    clips = [u.clip() for u in sample_clips[:2]]
    grid = Grid(BASE, ("random",), ("unrestricted", "correct"), (2,))
    runs = run_grid(pipeline, store, grid, clips, repeats=1)
    assert len(runs.cells) == 2 and set(runs.cells) == set(grid.cells())
    history = store.runs()  # the baseline and its second copy (the A/A check), the peaks pass, two cells
    assert len(history) == 5 and (history.decodes == 2).all() and set(history.command) == {COMMAND}
    copies = [store.traces(run_id)[0].settings for run_id in (runs.baseline, runs.second_baseline)]
    assert runs.second_baseline not in (None, runs.baseline) and copies[0] == copies[1]
    rows = {table: _rows(store, table) for table in ("decodes", "rounds", "draft_steps", "verified_tokens")}

    again = run_grid(Pipeline(store), store, grid, clips, repeats=1)
    assert again == runs
    assert store.runs().run_id.tolist() == history.run_id.tolist()  # nothing run or written twice
    assert {table: _rows(store, table) for table in rows} == rows

    more = Grid(BASE, ("random",), ("unrestricted", "shift"), (2,))
    grown = run_grid(pipeline, store, more, clips, repeats=1)
    assert len(store.runs()) == 9  # timings compare within a batch: the baseline, its copy and both cells again
    assert grown.peaks == runs.peaks and grown.baseline != runs.baseline
    assert set(grown.cells.values()).isdisjoint(runs.cells.values())
    stored = stored_grid(store, BASE.target)  # the latest baseline with the cells decoded beside it
    assert (stored.baseline, stored.peaks, set(stored.cells.values()), stored.second_baseline) == (
        grown.baseline,
        grown.peaks,
        set(grown.cells.values()),
        grown.second_baseline,
    )
    peaks = store.traces(runs.peaks)
    assert all(t.verified and t.reference_frames for t in peaks)  # every layer's verification peak, per token


def test_a_grid_the_store_refuses_keeps_its_decodes_and_tables(sample_clips, tmp_path, monkeypatch):
    store = Store(tmp_path / "runs.duckdb")
    clips = [sample_clips[0].clip()]
    first = run_grid(Pipeline(store), store, Grid(BASE, ("random",), ("unrestricted",), (2,)), clips, repeats=1)
    assert first.not_stored == [] and None not in (first.baseline, first.peaks, *first.cells.values())
    held = store.runs().run_id.tolist()

    def refuse(*args, **kwargs):
        raise StoreError(f"{store.path} is busy: another process is writing to it\n(waited 60 s)")

    monkeypatch.setattr(store, "write_runs", refuse)
    grid = Grid(BASE, ("random",), ("unrestricted", "correct"), (2,))
    runs = run_grid(Pipeline(store), store, grid, clips, repeats=1)
    assert runs.not_stored == [
        f"4 runs of the grid (the baseline, its copy and 2 cells) not stored: {store.path} is busy: another process "
        "is writing to it (waited 60 s)"
    ]
    assert (runs.baseline, runs.second_baseline, set(runs.cells.values())) == (None, None, {None})
    assert runs.peaks == first.peaks and store.runs().run_id.tolist() == held  # the peaks pass reused, none written
    found = tables(store, runs)
    assert len(found.cells) == 2 and found.cells.run_id.isna().all() and (found.cells.lossless_clips == 1).all()
    assert found.cells.window.tolist() == ["unrestricted", "correct"]
    assert found.peaks.source.str.endswith("verification").sum() == 4  # read back from the stored peaks pass
    assert found.aa.phase.tolist() == ["decode", "total"]


def _rows(store: Store, table: str) -> int:
    with store._connect() as con:
        return con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def test_experiment_command_prints_the_tables_as_json(capsys, sample_clips, tmp_path):
    db = str(tmp_path / "runs.duckdb")
    command = ["experiment", "--clips", "2", "--draft", "random", "--k", "2,3", "--repeats", "1"]
    assert main([*command, "--window", "unrestricted", "--db", db, "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert {(c["draft"], c["k"]) for c in record["cells"]} == {("random", 2), ("random", 3)}
    for cell in record["cells"]:
        assert cell["clips"] == cell["lossless_clips"] == 2 and len(cell["s"]) == cell["k"] + 1
        assert {"a1", "a2c", "L", "decode_speedup", "total_speedup", "threshold", "window"} <= set(cell)
    assert record["contrasts"] == [] and record["runtime"] == []  # cells that differ only in K
    assert record["best_run"] in {c["run_id"] for c in record["cells"]}
    assert {row["k"] for row in record["sweep"]} == {2, 3} and sum(row["fastest"] for row in record["sweep"]) == 1
    layers = [row for row in record["peaks"] if row["source"].endswith("verification")]
    assert len(layers) == 4 and sum(row["runtime_layer"] for row in layers) == 1  # tiny.en: four decoder layers
    assert record["aggregation"].startswith("no set reaches 20 clips: pooled over all 2 clips as one set (")
    assert record["protocol"].startswith("real loop")
    assert [row["phase"] for row in record["aa"]] == ["decode", "total"] and record["second_baseline_run"]
    assert record["timing_note"] == "one timing repetition per clip: a clip's time is one run, stalls included"
    verdict = record["timing"]["aa"]  # the A/A verdict beside the speed figures
    assert verdict["tolerance"] == 0.03 and verdict["reliable"] == (record["aa_warning"] is None)
    assert verdict["ratio"] == record["aa"][0]["ratio"] and len(verdict["interval"]) == 2
    assert main([*command, "--window", "sideways", "--db", db]) == 2
    assert "unknown window" in capsys.readouterr().err


def test_spread_takes_even_steps_through_the_whole_manifest():
    rows = load_manifest()
    taken = spread(rows, 40)
    assert len(taken) == len(set(taken)) == 40 and taken[0] == rows[0]
    assert len(rows) - rows.index(taken[-1]) <= -(-len(rows) // 40)  # within a step of the end, not 3/4 of the way
    assert {evaluation_set(u.id) for u in taken} == {evaluation_set(u.id) for u in rows}  # every source shows up
    assert spread(rows[:3], 5) == rows[:3]


def test_evaluation_sets_come_from_the_manifest(tmp_path):
    assert evaluation_set("ls-test-other-1688-142285-0000") == "ls-test-other"
    assert evaluation_set("cathy-arctic-a0021") == "cathy-arctic"
    assert evaluation_set("librivox-sense-and-sensibility-01-0880") == "librivox-sense-and-sensibility"
    assert evaluation_set("plain") == "plain"
    (tmp_path / "manifest.tsv").write_text(
        "id\tpath\tduration_s\tspeaker\tsubset\na-1\ta.wav\t1.0\ts\tclean\nb-2\tb.wav\t1.0\ts\t\n"
    )
    assert [u.subset for u in load_manifest(tmp_path / "manifest.tsv")] == ["clean", "b"]
    with pytest.raises(FileNotFoundError, match="no manifest"):
        load_manifest(tmp_path / "elsewhere")


def test_the_fleurs_clips_are_a_set_of_their_own_beside_the_speech_sets():
    speech = DEFAULT_SPEECH_DIR
    both = load_utterances(f"{speech},{speech.parent / 'speech-sets'}")
    sizes = Counter(u.subset for u in both)
    assert sizes["fleurs-en"] == 10 and sum(sizes.values()) == len(load_manifest()) + 10
    rule = weighting({u.id: u.subset for u in both}).rule  # with the speech's 16 clips of small sets they make 26
    assert "merged into one set, other (26 clips): fleurs-en (10), ls-dev-clean (7)" in rule
    with pytest.raises(ValueError, match="more than once"):
        load_utterances(f"{speech},{speech}")
