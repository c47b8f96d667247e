"""Many users at once: the dashboard shares one Pipeline between its sessions, each running in a thread of its own.
Decodes that run together must give what each gives alone, whatever loop they run, and each model or clip's
reference frames must load once however many sessions ask for them at the same moment."""

import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest

from specasr import graphs
from specasr import pipeline as pipeline_module
from specasr.loops import loop_for
from specasr.pipeline import Pipeline
from specasr.steppool import StepPool
from specasr.store import Store
from specasr.trace import Settings
from tests.test_store import speculative_trace

SPECULATIVE = Settings(draft="whisper-tiny.en/anchordraft", k=3, window="runtime")
JOBS = ((0, Settings()), (3, Settings()), (0, SPECULATIVE), (3, SPECULATIVE))  # (sample clip, settings)
LOADER_WAITS = 1.0  # seconds a loader waits for a second caller to come in beside it (a guard makes it wait them all)


def together(calls: list) -> list:
    """Each call in a thread of its own, all started at the same moment; their results in order."""
    start = threading.Barrier(len(calls))

    def run(call):
        start.wait(timeout=60)
        return call()

    with ThreadPoolExecutor(len(calls)) as threads:
        return [future.result() for future in [threads.submit(run, call) for call in calls]]


def outcome(trace) -> tuple:
    """What a decode found, without its timings: tokens, rounds, and where the target and draft attended."""
    rounds = [(r.start, r.proposed, r.accepted, r.target_token) for r in trace.rounds]
    steps = [(s.token, s.depth, s.accepted, s.draft_peak, s.window_centre) for s in trace.steps]
    return trace.tokens, rounds, [v.verify_peaks for v in trace.verified], steps, trace.runtime_peaks


@pytest.fixture(scope="module")
def jobs(sample_clips) -> list:
    return [(sample_clips[index].clip(), settings) for index, settings in JOBS]


@pytest.fixture(scope="module")
def alone(pipeline, jobs) -> list[tuple]:
    return [outcome(pipeline.decode(clip, settings)) for clip, settings in jobs]


def test_host_loops_decode_together_as_each_alone(pipeline, jobs, alone):
    traces = together([lambda job=job: pipeline.decode(*job) for job in jobs])
    assert [outcome(t) for t in traces] == alone


def test_static_steps_are_never_shared_by_decodes_running_together(pipeline, jobs, alone, monkeypatch):
    """The captured steps CUDA replays, run eagerly here: every decode loads its segment before any steps through
    it, so that two decodes on one set of static tensors would decode whichever clip loaded last."""
    static = lambda target, draft, settings, captured=None: loop_for(  # noqa: E731
        target, draft, replace(settings, graphs=True), captured
    )
    monkeypatch.setattr(pipeline_module, "loop_for", static)
    for index in (0, 2):  # the greedy and speculative steps made beforehand, each by one decode alone
        assert outcome(pipeline.decode(*jobs[index])) == alone[index]
    loaded, loads, in_use, shared, guard = threading.Barrier(len(jobs)), [], set(), [], threading.Lock()

    def instrumented(steps_class):
        load, run = steps_class.load, steps_class.run

        def loaded_together(steps, *args):
            with guard:
                loads.append(type(steps).__name__)
                if steps in in_use:
                    shared.append(type(steps).__name__)
                in_use.add(steps)
            load(steps, *args)
            with contextlib.suppress(threading.BrokenBarrierError):  # a guard that has decodes take turns never
                loaded.wait(timeout=60)  # lets them meet

        def run_then_free(steps, *args):
            try:
                return run(steps, *args)
            finally:
                with guard:
                    in_use.discard(steps)

        monkeypatch.setattr(steps_class, "load", loaded_together)
        monkeypatch.setattr(steps_class, "run", run_then_free)

    instrumented(graphs.GreedySteps)
    instrumented(graphs.RoundSteps)
    traces = together([lambda job=job: pipeline.decode(*job) for job in jobs])
    assert sorted(loads) == ["GreedySteps"] * 2 + ["RoundSteps"] * 2 and shared == []
    assert [outcome(t) for t in traces] == alone


def test_a_decode_alone_reuses_one_set_of_steps_and_one_beside_it_gets_its_own():
    pool, key, first, second = StepPool(), ("round", 1), object(), object()
    with pool.lend() as alone:
        assert key not in alone
        alone[key] = first
    with pool.lend() as later, pool.lend() as beside:
        assert later[key] is first and key not in beside
        beside[key] = second
    with pool.lend() as later:
        assert later[key] in (first, second) and list(later) == [key]
    assert pool.made() == [first, second]


class Loading:
    """A loader that counts its calls and waits a moment for a second one to come in beside it."""

    def __init__(self, made: object):
        self.made, self.calls, self.second = made, 0, threading.Event()

    def __call__(self, *args, **kwargs) -> object:
        self.calls += 1
        if self.calls > 1:
            self.second.set()
        self.second.wait(timeout=LOADER_WAITS)
        return self.made


class FakeDraft:
    name = "fake"

    def weights_hash(self) -> str:
        return "0" * 64


@pytest.mark.parametrize("what", ["target", "draft", "peer", "aligner", "reference"])
def test_sessions_asking_at_once_load_each_model_and_reference_once(what, sample_clips, monkeypatch):
    pipeline = Pipeline()
    made = FakeDraft() if what == "draft" else object()
    loading = Loading(made)
    settings = Settings(decoder="transformers") if what == "peer" else Settings(draft="random")
    monkeypatch.setattr(pipeline_module, "load_target", lambda *a: "target" if what != "target" else loading())
    monkeypatch.setattr(pipeline_module, "resolve_draft", loading)
    monkeypatch.setattr(pipeline_module, "load_peer", loading)
    monkeypatch.setattr(pipeline_module, "get_aligner", loading)
    monkeypatch.setattr(pipeline, "_align", loading)
    clip = sample_clips[0].clip()
    ask = {
        "target": lambda: pipeline.target(settings),
        "draft": lambda: pipeline.draft(settings),
        "peer": lambda: pipeline.peer(settings),
        "aligner": lambda: pipeline.aligner("pocketsphinx"),
        "reference": lambda: pipeline.reference(clip, settings),
    }[what]
    assert together([ask] * 3) == [made] * 3
    assert loading.calls == 1


def test_runs_written_together_to_one_store_all_land(tmp_path):
    store = Store(tmp_path / "runs.duckdb")
    trace = speculative_trace("c1", [3, 1, 0, 2])  # one clip for all: its shared rows are inserted by every run

    def writer(n: int) -> list[str]:
        return [store.write_run([trace], f"writer {n} run {run}") for run in range(5)]

    written = together([lambda n=n: writer(n) for n in range(3)])
    history = store.runs()
    assert sorted(history.run_id) == sorted(run for runs in written for run in runs)
    assert all(store.traces(run) == [trace] for run in history.run_id)
