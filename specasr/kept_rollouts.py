"""Matched rounds kept in the run store clip by clip, as each clip is rolled out: a `matched` stopped half way keeps
every finished clip, and running it again rolls out only the clips the store lacks. A condition is keyed by its
settings (as the pipeline resolves them) and its round starts; nothing of it is timed, so clips kept from another
session pool with the new ones as if rolled out in one."""

import io
import json
import warnings
from collections.abc import Mapping
from dataclasses import asdict

import numpy as np

from specasr.store import Store, StoreError
from specasr.trace import Settings


class MatchedInterrupted(KeyboardInterrupt):
    """Ctrl-C while matched rounds roll out; its message says what the store kept and how to resume."""


class KeptRollouts:
    """One matched command's rollouts in the store, clip by clip, each condition's as named arrays. After a write the
    store refuses (a warning says why), the rest stay in memory only."""

    def __init__(self, store: Store | None, conditions: Mapping[tuple, Settings], starts: str):
        self.store, self.failure = store, None
        self.keys = {cell: json.dumps(asdict(s) | {"starts": starts}, sort_keys=True) for cell, s in conditions.items()}
        self.held = store.rollouts(list(self.keys.values())) if store is not None else {}
        self.stored = {clip_hash for clip_hash, _ in self.held if self.get(clip_hash) is not None}

    def get(self, clip_hash: str) -> dict[tuple, dict[str, np.ndarray]] | None:
        """Every condition's arrays of the clip, where the store holds them all."""
        if any((clip_hash, key) not in self.held for key in self.keys.values()):
            return None
        return {cell: _unpack(self.held[clip_hash, key]) for cell, key in self.keys.items()}

    def put(self, clip_hash: str, arrays: Mapping[tuple, dict[str, np.ndarray]]) -> None:
        """Store every condition's arrays of the clip, in one transaction."""
        if self.store is None or self.failure is not None:
            return
        try:
            self.store.save_rollouts(clip_hash, {self.keys[cell]: _pack(found) for cell, found in arrays.items()})
            self.stored.add(clip_hash)
        except StoreError as error:
            self.failure = error
            warnings.warn(f"rollouts not kept in {self.store.path}: {error}", stacklevel=2)

    def interrupted(self, clips: list[str]) -> MatchedInterrupted:
        """What Ctrl-C leaves: how many of these clips the store holds."""
        kept = f"{len(self.stored & set(clips))} of {len(set(clips))} clips' rollouts stored"
        return MatchedInterrupted(f"{kept}; run the same command again to roll out the rest")


def pack_clip(rolled: tuple[str, Mapping[tuple, Mapping]], cells: list[tuple]) -> bytes:
    """One clip's hash and every condition's arrays (of `cells`, in their order) as one numpy archive."""
    clip_hash, arrays = rolled
    named = {f"{i}.{name}": value for i, cell in enumerate(cells) for name, value in arrays[cell].items()}
    return _pack({"clip_hash": np.array(clip_hash), **named})


def unpack_clip(data: bytes, cells: list[tuple]) -> tuple[str, dict[tuple, dict[str, np.ndarray]]]:
    named = _unpack(data)
    arrays = {cell: {} for cell in cells}
    for key, value in named.items():
        if key != "clip_hash":
            index, name = key.split(".", 1)
            arrays[cells[int(index)]][name] = value
    return named["clip_hash"], arrays


def _pack(arrays: Mapping[str, np.ndarray | float]) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def _unpack(data: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(data)) as arrays:
        return {name: arrays[name].item() if arrays[name].ndim == 0 else arrays[name] for name in arrays.files}
