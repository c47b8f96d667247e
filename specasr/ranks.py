"""One command shared by the processes torchrun starts: each takes its share of the work, and the first gathers what
the others made. Payloads travel as bytes in tensors (JSON or numpy archives, never pickles), through gloo for the
CPU: they are small next to the work that makes them.
"""

import heapq
import json
import os
import socket
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import TypeVar

import torch
import torch.distributed as dist

from specasr.trace import SettingsError, code_version

T = TypeVar("T")


@dataclass(frozen=True)
class Ranks:
    """This process's place among the processes of one command: rank `rank` of `size` (alone: 0 of 1)."""

    rank: int = 0
    size: int = 1

    @property
    def first(self) -> bool:
        return self.rank == 0

    def shares(self, sizes: Sequence[float]) -> list[list[int]]:
        """Every rank's share of items of these sizes (their indices, in order): the largest item first, each to the
        rank with the least so far, so that the shares are disjoint and about equal in size. The same on every rank."""
        loads = [(0.0, rank) for rank in range(self.size)]
        shares: list[list[int]] = [[] for _ in range(self.size)]
        for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
            load, rank = heapq.heappop(loads)
            shares[rank].append(i)
            heapq.heappush(loads, (load + sizes[i], rank))
        return [sorted(share) for share in shares]

    def broadcast(self, value: T) -> T:
        """The first rank's value (anything JSON holds) on every rank."""
        return self.everyones(value if self.first else None)[0]

    def everyones(self, value: T) -> list[T]:
        """Every rank's value (anything JSON holds) on every rank, in rank order."""
        if self.size == 1:
            return [value]
        return [json.loads(data) for data in self._all_bytes(json.dumps(value).encode())]

    def check_timed_alike(self, device: str) -> None:
        """Refuse processes that would time one grid apart from each other's code or on a shared GPU: a batch is
        one code version, and a process timed beside another on its GPU times both. Every rank raises alike."""
        if self.size == 1:
            return
        if len({json.dumps(version) for version in self.everyones(asdict(code_version()))}) > 1:
            raise SettingsError("the processes run different code (commit or uncommitted changes): one batch, one code")
        if device.startswith("cuda"):
            places = self.everyones([socket.gethostname(), torch.cuda.current_device()])
            if len({tuple(place) for place in places}) < self.size:
                raise SettingsError(f"{self.size} processes share GPUs: give each its own (--nproc-per-node <= GPUs)")

    def gathered(
        self, own: Iterable[T], rounds: int, encode: Callable[[T], bytes], decode: Callable[[bytes], T]
    ) -> Iterator[tuple[int, T]]:
        """Every rank's items, each with the rank that made it, on the first rank: `rounds` times, each rank makes its
        next item of `own` (or none, once its share is done) and sends it; the first rank yields them as the round
        ends. The other ranks yield nothing. Alone, `own` passes through as it is. Every rank receives every item:
        simpler than a gather, and small next to the decodes that make them."""
        if self.size == 1:
            yield from ((0, item) for item in own)
            return
        own = iter(own)
        for _ in range(rounds):
            item = next(own, None)
            payloads = self._all_bytes(b"" if item is None else encode(item))
            if self.first:
                yield from ((rank, decode(payload)) for rank, payload in enumerate(payloads) if payload)

    def _all_bytes(self, data: bytes) -> list[bytes]:
        """Every rank's bytes on every rank, in rank order."""
        lengths = [torch.zeros(1, dtype=torch.int64) for _ in range(self.size)]
        dist.all_gather(lengths, torch.tensor([len(data)]))
        longest = max(int(n) for n in lengths)
        found = [torch.empty(max(longest, 1), dtype=torch.uint8) for _ in range(self.size)]
        dist.all_gather(found, _tensor(data, longest))
        return [bytes(t[: int(n)].numpy()) for t, n in zip(found, lengths, strict=True)]


ALONE = Ranks()


def _tensor(data: bytes, length: int) -> torch.Tensor:
    """`data` padded to `length` bytes (at least one: gloo sends no empty tensor)."""
    buffer = torch.zeros(max(length, 1), dtype=torch.uint8)
    if data:
        buffer[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return buffer


def joined() -> Ranks:
    """This process's ranks: several processes under torchrun (joined into one process group here), else one. Where
    CUDA is, each process takes the GPU of its LOCAL_RANK and CUDA tensors go through NCCL; CPU tensors always go
    through gloo."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if local_rank < torch.cuda.device_count():
            torch.cuda.set_device(local_rank)
        dist.init_process_group("cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo")
    return Ranks(dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else ALONE


def leave() -> None:
    """End this process's part in the process group, where it joined one."""
    if dist.is_initialized():
        dist.destroy_process_group()
