"""Grids that resume: an interrupted experiment keeps every finished clip, and running it again decodes only the
clips its batch lacks and gives the tables of a run never interrupted."""

import json
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import duckdb
import pytest
from test_experiments import BASE, hand_trace

from specasr.cli.matched import matched_tables
from specasr.experiments import Grid, GridInterrupted, run_grid, stored_grid
from specasr.kept_rollouts import MatchedInterrupted
from specasr.matched import run_matched
from specasr.migrations import SCHEMA_VERSION, migrate
from specasr.pipeline import Pipeline
from specasr.pooled import weighting
from specasr.report import tables
from specasr.store import Store, StoreError
from specasr.trace import Settings

GRID = Grid(Settings(target="whisper-tiny.en"), ("random",), ("unrestricted",), (2, 3))
WARM_UP, PER_CLIP = 4, 5  # greedy, two cells, the peaks pass; and those with the greedy copy
ACCEPTANCE = ["draft", "window", "k", "clips", "lossless_clips", "a1", "a2c", "L"]


class CountingPipeline(Pipeline):
    """A pipeline that counts its decodes by clip and stops (Ctrl-C) at decode number `stop`."""

    def __init__(self, store: Store, stop: int | None = None):
        super().__init__(store)
        self.decoded: list[str] = []
        self.stop = stop

    def decode(self, clip, settings, *args, **kwargs):
        if len(self.decoded) == self.stop:
            raise KeyboardInterrupt
        self.decoded.append(clip.id)
        return super().decode(clip, settings, *args, **kwargs)


@pytest.fixture
def clips(sample_clips):
    return [u.clip() for u in sample_clips[:2]]


def acceptance(store: Store, runs) -> dict:
    found = tables(store, runs)
    speed = found.contrasts.metric.str.contains("speedup")
    return {
        "cells": found.cells[ACCEPTANCE].to_json(orient="records"),
        "contrasts": found.contrasts[~speed].to_json(orient="records"),
        "peaks": found.peaks.to_json(orient="records"),
        "outcomes": found.outcomes.to_json(orient="records"),
    }


def test_an_interrupted_grid_keeps_its_finished_clips_and_resumes_to_the_same_tables(clips, tmp_path):
    whole = Store(tmp_path / "whole.duckdb")
    expected = acceptance(whole, run_grid(Pipeline(whole), whole, GRID, clips, repeats=1))

    store = Store(tmp_path / "runs.duckdb")
    stopped = CountingPipeline(store, stop=WARM_UP + PER_CLIP + 2)  # half way through the second clip
    with pytest.raises(GridInterrupted, match=r"^1 of 2 clips stored in batch \w+; run the same command again"):
        run_grid(stopped, store, GRID, clips, repeats=1)
    kept = store.runs()
    assert len(kept) == PER_CLIP and (kept.decodes == 1).all() and kept.batch.nunique() == 1
    assert stored_grid(store, GRID.base.target) is None  # a batch part way is no experiment to show

    again = CountingPipeline(store)
    runs = run_grid(again, store, GRID, clips, repeats=1)
    assert clips[0].id not in again.decoded  # only the clips the batch lacked, warm-up included
    assert len(again.decoded) == WARM_UP + PER_CLIP
    history = store.runs()
    assert sorted(history.run_id) == sorted(kept.run_id) and (history.decodes == 2).all()  # one batch, completed
    assert acceptance(store, runs) == expected
    read_back = runs.__class__(runs.baseline, runs.peaks, runs.cells, runs.second_baseline)
    assert acceptance(store, read_back) == expected  # the stored runs, in the clips' order
    stored = stored_grid(store, GRID.base.target)  # its cells keyed by the settings the runs resolved
    assert (stored.baseline, stored.peaks, stored.second_baseline) == (runs.baseline, runs.peaks, runs.second_baseline)
    assert sorted(stored.cells.values()) == sorted(runs.cells.values())

    idle = CountingPipeline(store)
    assert run_grid(idle, store, GRID, clips, repeats=1) == runs and idle.decoded == []


def test_a_grid_without_a_store_decodes_every_clip_and_its_interrupt_says_nothing_was_kept(clips):
    runs = run_grid(Pipeline(), None, GRID, clips, repeats=1)  # the store did not open: the CLI tells why
    assert (runs.baseline, runs.peaks, runs.not_stored) == (None, None, [])
    assert [t.clip_id for t in runs.traces.baseline] == [clip.id for clip in clips]
    with pytest.raises(GridInterrupted, match=r"^nothing stored: the store did not open$"):
        run_grid(CountingPipeline(None, stop=WARM_UP + 1), None, GRID, clips, repeats=1)


def test_a_store_from_before_clip_by_clip_batches_is_migrated_and_its_batches_count_as_whole(tmp_path):
    path = tmp_path / "old.duckdb"
    with duckdb.connect(str(path)) as con:
        migrate(con, 0, target=SCHEMA_VERSION - 1)
    store = Store(path)
    store.write_run([hand_trace(replace(BASE, k=0), "u", [], 1.0)], "experiment")
    (run,) = store.decoded("experiment")
    assert run.batch_clips is None  # written whole: never taken for a batch to complete
    with store._connect() as con:
        assert con.execute("SELECT * FROM schema_version").fetchall() == [("specasr", SCHEMA_VERSION)]
        assert con.execute("SELECT count(*) FROM rollouts").fetchall() == [(0,)]


MATCHED = Settings(target="whisper-tiny.en", draft="random", k=2)


def matched(pipeline: Pipeline, clips: list) -> dict:
    weights = weighting({clip.hash: "all" for clip in clips})
    conditions = run_matched(pipeline, MATCHED, ["random"], ["unrestricted", "correct"], clips, weights)
    found = matched_tables(conditions, "loop")
    return {name: table.to_json(orient="records") for name, table in vars(found).items() if name != "protocol"}


def test_interrupted_matched_rounds_keep_their_finished_clips_and_resume_to_the_same_tables(clips, tmp_path):
    whole = Store(tmp_path / "whole.duckdb")
    expected = matched(Pipeline(whole), clips)

    store = Store(tmp_path / "runs.duckdb")
    per_clip = 2  # the greedy transcript and the real loop's round starts
    with pytest.raises(MatchedInterrupted, match=r"^1 of 2 clips' rollouts stored; run the same command again"):
        matched(CountingPipeline(store, stop=per_clip + 1), clips)
    again = CountingPipeline(store)
    assert matched(again, clips) == expected
    assert again.decoded == [clips[1].id] * per_clip  # only the clip the store lacked
    idle = CountingPipeline(store)
    assert matched(idle, clips) == expected and idle.decoded == []


COMMAND = ["experiment", "--clips", "5", "--repeats", "1", "--draft", "random", "--draft-dtype", "float16", "--k", "2"]


# The command line, its grid held still once the store keeps a clip: the test's signal then lands half way, however
# fast the machine decodes the rest (unheld, 5 clips could all be stored before the signal came).
HELD_AFTER_FIRST_CLIP = """
import signal, sys, time
from specasr.cli import main
from specasr.pipeline import Pipeline
from specasr.store import Store

stored, decode, write_runs = [], Pipeline.decode, Store.write_runs

def write_and_note(self, *args, **kwargs):
    result = write_runs(self, *args, **kwargs)
    stored.append(True)
    return result

def decode_held(self, *args, **kwargs):
    if stored:
        time.sleep(600)
    return decode(self, *args, **kwargs)

Store.write_runs, Pipeline.decode = write_and_note, decode_held
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal: a shell's background job ignores it
sys.exit(main(sys.argv[1:]))
"""


def start_experiment(
    db: Path, command: Sequence[str] = (*COMMAND, "--window", "unrestricted"), env: dict | None = None
) -> subprocess.Popen:
    """The experiment `command` in a process of its own, held once the store keeps its first clip."""
    args = [sys.executable, "-c", HELD_AFTER_FIRST_CLIP, *command, "--db", str(db)]
    return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def stored_clips(db: Path, process: subprocess.Popen) -> int:
    """Wait until the store holds the grid's first clip (every run of it), then say how many clips it holds (one:
    the grid is held there)."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and process.poll() is None:
        try:
            runs = Store(db, timeout=1).runs() if db.is_file() else []
        except StoreError:  # the experiment is writing: look again
            runs = []
        if len(runs):
            return int(runs.decodes.min())
        time.sleep(0.2)
    raise AssertionError(f"the experiment stored nothing: {process.communicate()[1][-2000:]}")


def test_ctrl_c_half_way_exits_130_with_one_line_and_the_rerun_completes_the_batch(speech, tmp_path):
    db = tmp_path / "runs.duckdb"
    process = start_experiment(db)
    assert stored_clips(db, process) == 1
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130 and "Traceback" not in err
    (line,) = [line for line in err.splitlines() if "interrupted" in line]
    kept = Store(db).runs()
    assert line == (
        f"interrupted: {kept.decodes.min()} of 5 clips stored in batch {kept.batch[0]}; run the same command again "
        "to decode the rest"
    )
    assert_rerun_completes(db, kept)


def test_a_kill_half_way_leaves_a_store_that_opens_and_the_rerun_completes_the_batch(speech, tmp_path):
    db = tmp_path / "runs.duckdb"
    process = start_experiment(db)
    assert stored_clips(db, process) == 1
    process.kill()
    process.communicate(timeout=60)
    kept = Store(db).runs()  # every run holds the same clips: no clip written part way
    assert len(kept) == 4 and kept.decodes.nunique() == 1 and kept.batch.nunique() == 1
    assert_rerun_completes(db, kept)


def assert_rerun_completes(db: Path, kept) -> None:
    args = [sys.executable, "-m", "specasr", *COMMAND, "--window", "unrestricted", "--db", str(db), "--json"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads(done.stdout)
    history = Store(db).runs()
    assert sorted(history.run_id) == sorted(kept.run_id) and (history.decodes == 5).all()
    assert record["baseline_run"] in set(kept.run_id) and record["cells"][0]["clips"] == 5
