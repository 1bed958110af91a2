"""What one rank's capture learns of the job, for the rule that picks the other ranks to capture: ``Facts(send)``.

The child sends each fact to ``allocsim capture`` as ``["X", {"fact": NAME, ...}]`` (see
``channel``): ``world`` (this rank, the world size, the backend the script asked for), ``group``
(the ranks of every process group created: every rank creates every group, slices of a device
mesh included, so the first rank's capture sees them all), ``stage`` (a pipeline stage this rank
holds, with the ranks of its pipeline group), ``spawn`` (the script started its ranks itself) and,
at the end, ``shards`` (ranks whose shards of some DTensor differ in shape, from the DTensors the
run made). ``allocsim.torch_capture.distributed.roles`` turns them into roles. Every fact is
bounded: group records stop after ``MAX_GROUP_RANKS`` ranks in all, shard specs after
``MAX_SHARD_SPECS``.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

#: Ranks recorded over all ``group`` facts; past this the rule falls back to the ranks it was told.
MAX_GROUP_RANKS = 1 << 20
#: Distinct uneven DTensor layouts kept for the ``shards`` fact.
MAX_SHARD_SPECS = 4096


class Facts:
    """The facts of one rank's run, sent as they are learned (``shards`` at ``finish``)."""

    def __init__(self, send: Callable[[list[Any]], None]):
        self._send = send
        self._lock = threading.Lock()
        self.group_ranks = 0
        self.groups_dropped = 0
        # (mesh slices as a tuple of tuples, placements repr, global shape) -> (slices, mesh shape, placements, shape)
        self._uneven: dict[tuple, tuple] = {}
        self.rank = 0
        self.world_size = 1

    def send(self, fact: str, **fields: Any) -> None:
        self._send(["X", {"fact": fact, **fields}])

    def world(self, rank: int, world_size: int, backend: str) -> None:
        self.rank, self.world_size = rank, world_size
        self.send("world", rank=rank, world_size=world_size, backend=backend)

    def group(self, ranks: list[int], desc: str) -> None:
        with self._lock:
            if self.group_ranks + len(ranks) > MAX_GROUP_RANKS:
                self.groups_dropped += 1
                return
            self.group_ranks += len(ranks)
        self.send("group", ranks=[int(r) for r in ranks], desc=str(desc or ""))

    def stage(self, stage_index: int, num_stages: int, group_ranks: list[int]) -> None:
        self.send("stage", stage_index=int(stage_index), num_stages=int(num_stages),
                  group_ranks=[int(r) for r in group_ranks])

    def spawn(self, nprocs: int, index: int, how: str) -> None:
        self.send("spawn", nprocs=int(nprocs), index=int(index), how=how)

    @property
    def has_uneven(self) -> bool:
        return bool(self._uneven)

    def uneven_shard(self, key: tuple, value: tuple) -> None:
        """A DTensor layout whose shards differ in shape between ranks (kept once)."""
        with self._lock:
            if key not in self._uneven and len(self._uneven) < MAX_SHARD_SPECS:
                self._uneven[key] = value

    def finish(self, local_shape: Callable[[tuple, tuple, tuple, list[int]], tuple]) -> None:
        """Send ``shards``: a class per rank, equal for ranks whose local shapes of every uneven layout agree.

        ``local_shape(shape, mesh_shape, placements, coordinate)`` is DTensor's own rule.
        """
        if not self._uneven:
            return
        signature: dict[int, list[tuple]] = {}
        for slices, mesh_shape, placements, shape in self._uneven.values():
            for flat in slices:
                for index, rank in enumerate(flat):
                    coordinate = _unravel(index, mesh_shape)
                    signature.setdefault(rank, []).append(local_shape(shape, mesh_shape, placements, coordinate))
        classes: dict[tuple, int] = {}
        class_of_rank = [0] * self.world_size
        for rank in range(self.world_size):
            key = tuple(signature.get(rank, ()))
            class_of_rank[rank] = classes.setdefault(key, len(classes))
        self.send("shards", class_of_rank=class_of_rank, layouts=len(self._uneven))


def _unravel(index: int, shape: tuple[int, ...]) -> list[int]:
    coordinate = []
    for size in reversed(shape):
        coordinate.append(index % size)
        index //= size
    return coordinate[::-1]
