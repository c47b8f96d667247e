"""What two sessions decoding at once through one pipeline cost, under the static steps' guard (steppool.StepPool) and
under its alternative, one lock held for a decode around one set of steps.

Off CUDA the captured steps run eagerly over the same static tensors (as the tests run them): the pipeline is made
to keep them on. Each repeat decodes the clip on N threads started together, after one decode alone has made the
first set of steps; it reports the wall time until all are done, when each thread finished, and the bytes of the
static tensors the pool made beyond the first set. Then a short clip's decode started once a long clip's decode
(utterances one after another, in windows) has its first round: how long the short one takes beside it.

    .venv/bin/python scripts/concurrency_costs.py --threads 2 --repeats 7
"""

import argparse
import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

import numpy as np
from torch import Tensor, nn

from specasr import graphs
from specasr import pipeline as pipeline_module
from specasr.audio import Clip
from specasr.dataset import load_manifest
from specasr.loops import loop_for
from specasr.pipeline import Pipeline
from specasr.steppool import StepPool
from specasr.trace import Settings

SETTINGS = {
    "greedy": Settings(),
    "speculative": Settings(draft="whisper-tiny.en/anchordraft", k=3, window="runtime"),
}


class OneSet:
    """The alternative to the pool: one set of steps, lent to one decode at a time under a lock."""

    def __init__(self):
        self.kept, self.lock = {}, threading.Lock()

    @contextmanager
    def lend(self) -> Iterator[dict]:
        with self.lock:
            yield self.kept

    def made(self) -> list:
        return list(self.kept.values())


def static_steps_kept_on() -> None:
    """The pipeline's loops run their static steps off CUDA too, eagerly."""
    pipeline_module.loop_for = lambda target, draft, settings, captured=None: loop_for(
        target, draft, replace(settings, graphs=True), captured
    )


def static_bytes(steps: object) -> int:
    """Bytes of the tensors a set of steps owns: caches, state, window tables (not its target's or draft's)."""
    seen, total, stack = set(), 0, [steps]
    while stack:
        item = stack.pop()
        if isinstance(item, Tensor):
            storage = item.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
        elif isinstance(item, (list, tuple)):
            stack += item
        elif isinstance(item, dict):
            stack += item.values()
        elif hasattr(item, "__dict__") and not isinstance(item, (nn.Module, graphs.CapturedStep)):
            stack += [value for name, value in vars(item).items() if name not in ("target", "draft")]
    return total


def together(pipeline: Pipeline, clip, settings: Settings, threads: int) -> tuple[float, list[float]]:
    """Wall seconds until every thread's decode is done, and each thread's own seconds, soonest first."""
    start, done = threading.Barrier(threads + 1), []

    def decode() -> None:
        start.wait()
        pipeline.decode(clip, settings)
        done.append(time.perf_counter())

    workers = [threading.Thread(target=decode) for _ in range(threads)]
    for worker in workers:
        worker.start()
    start.wait()
    began = time.perf_counter()
    for worker in workers:
        worker.join()
    return max(done) - began, sorted(t - began for t in done)


def behind(pipeline: Pipeline, long: Clip, short: Clip, settings: Settings) -> float:
    """Seconds the short clip's decode takes when it starts during the long clip's."""
    started = threading.Event()
    first = threading.Thread(target=lambda: pipeline.decode(long, settings, lambda _: started.set()))
    first.start()
    started.wait()
    began = time.perf_counter()
    pipeline.decode(short, settings)
    seconds = time.perf_counter() - began
    first.join()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--clip", default="cathy-arctic-a0025")
    parser.add_argument("--long-seconds", type=float, default=60.0)
    args = parser.parse_args()
    static_steps_kept_on()
    speech = load_manifest()
    clip = next(u for u in speech if u.id == args.clip).clip()
    audio = np.concatenate([u.clip().audio for u in speech[: int(args.long_seconds)]])  # utterances of 1 s or more
    long = Clip("long", audio[: round(args.long_seconds * len(clip.audio) / clip.seconds)])
    print(
        f"{clip.id} ({clip.seconds:.1f} s), {args.threads} threads, medians of {args.repeats} repeats, arms interleaved"
    )
    pipeline = Pipeline()
    for name, settings in SETTINGS.items():
        guards = {"pool": StepPool(), "lock": OneSet()}
        first = {}
        for guard, steps in guards.items():
            pipeline._steps = steps
            pipeline.decode(clip, settings)  # the first set of steps made, by a decode alone
            first[guard] = together(pipeline, clip, settings, args.threads)[0]  # the pool makes its others here
        alone, runs = [], {guard: [] for guard in guards}
        for _ in range(args.repeats):
            pipeline._steps = guards["pool"]
            alone.append(together(pipeline, clip, settings, 1)[0])
            for guard, steps in guards.items():
                pipeline._steps = steps
                runs[guard].append(together(pipeline, clip, settings, args.threads))
        print(f"{name}: alone {statistics.median(alone):.2f} s")
        for guard, steps in guards.items():
            made = steps.made()
            extra = sum(static_bytes(kept) for kept in made[1:]) / 2**20
            finished = [statistics.median(run[1][i] for run in runs[guard]) for i in range(args.threads)]
            print(
                f"  {guard}: together {statistics.median(r[0] for r in runs[guard]):.2f} s (first time "
                f"{first[guard]:.2f} s), threads done at {', '.join(f'{s:.2f}' for s in finished)} s; "
                f"{len(made)} set(s) of steps, {extra:.1f} MiB beyond the first"
            )
    settings = SETTINGS["speculative"]
    for guard, steps in {"pool": StepPool(), "lock": OneSet()}.items():
        pipeline._steps = steps
        pipeline.decode(clip, settings)
        waits = [behind(pipeline, long, clip, settings) for _ in range(3)]
        print(
            f"{clip.id} beside a {long.seconds:.0f} s decode, {guard}: {statistics.median(waits):.2f} s (median of 3)"
        )


if __name__ == "__main__":
    main()
