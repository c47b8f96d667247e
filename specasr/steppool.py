"""The loops' static steps (specasr.graphs), kept between decodes and lent to one decode at a time."""

import threading
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager


class StepPool:
    """The loops' static steps, kept between decodes and lent to one decode at a time, so that decodes running at
    once (the dashboard's sessions, each in a thread of its own, share one pipeline) never step over each other's
    static tensors.

    A pool rather than one lock around the steps: a decode alone reuses one set of steps as before, and one that
    starts while another holds the steps it needs makes a set of its own and runs beside it instead of waiting for
    the other to end (under a lock, a 3 s clip waited 5 s behind a 60 s one). That set is kept for the next time two
    run at once: it costs its static tensors (23-29 MiB for tiny.en) and, captured, its graphs' memory
    (docs/measurements/cpu-2026-12-06/concurrency.md)."""

    def __init__(self) -> None:
        self._free: dict[tuple, list] = {}
        self._made: list = []
        self._lock = threading.Lock()

    @contextmanager
    def lend(self) -> Iterator[MutableMapping]:
        """Where one decode keeps its steps (the `captured` of `loops.loop_for`): the steps for a key are taken from
        the free ones the first time the decode asks for them, or made where none are free, and all are given back
        when the decode ends."""
        loan = _Loan(self)
        try:
            yield loan
        finally:
            for key in list(loan):
                del loan[key]

    def made(self) -> list:
        """Every set of steps made so far, lent or free."""
        with self._lock:
            return list(self._made)


class _Loan(MutableMapping):
    """One decode's steps by key, lent by a StepPool."""

    def __init__(self, pool: StepPool):
        self._pool, self._held = pool, {}

    def __getitem__(self, key: tuple):
        if key not in self._held:
            with self._pool._lock:
                free = self._pool._free.get(key)
                if not free:
                    raise KeyError(key)
                self._held[key] = free.pop()
        return self._held[key]

    def __setitem__(self, key: tuple, steps) -> None:
        """Steps this decode made: lent to it now, and kept by the pool after."""
        self._held[key] = steps
        with self._pool._lock:
            self._pool._made.append(steps)

    def __delitem__(self, key: tuple) -> None:
        """The steps given back to the pool, free for the next decode."""
        steps = self._held.pop(key)
        with self._pool._lock:
            self._pool._free.setdefault(key, []).append(steps)

    def __iter__(self) -> Iterator[tuple]:
        return iter(self._held)

    def __len__(self) -> int:
        return len(self._held)
