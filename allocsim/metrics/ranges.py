"""Who last owned each byte of an address range: ``RangeOwners.assign(start, end, owner)`` / ``.pieces``.

Non-overlapping ``[start, end)`` intervals in a sorted list; a new assignment cuts the ones it
overlaps and merges with equal-owner neighbours, so the map holds at most one interval per change
of owner along the address space. Every operation is logarithmic plus the intervals it touches.

``LastOwners`` answers the same question from a log of writes, resolved only over the ranges asked
about: keeping a log costs one append per write, where a map costs a sorted insert.
"""

from __future__ import annotations

from typing import Hashable

import numpy as np
from sortedcontainers import SortedList


class RangeOwners:
    """Address ranges and their owners; unassigned bytes have none."""

    def __init__(self) -> None:
        self._starts = SortedList()
        self._span: dict[int, tuple[int, Hashable]] = {}   # start -> (end, owner)

    def __len__(self) -> int:
        return len(self._starts)

    def _overlapping(self, start: int, end: int) -> list[int]:
        """Starts of the intervals that overlap ``[start, end)``, in address order."""
        first = max(self._starts.bisect_right(start) - 1, 0)
        out = []
        for s in self._starts.islice(first):
            if s >= end:
                break
            if self._span[s][0] > start:
                out.append(s)
        return out

    def clear(self, start: int, end: int) -> None:
        """``[start, end)`` belongs to no one now."""
        for s in self._overlapping(start, end):
            e, o = self._span.pop(s)
            self._starts.remove(s)
            if s < start:
                self._put(s, start, o)
            if e > end:
                self._put(end, e, o)

    def assign(self, start: int, end: int, owner: Hashable) -> None:
        """``[start, end)`` now belongs to ``owner`` (whatever owned parts of it before)."""
        if end <= start:
            return
        self.clear(start, end)
        left = self._starts.bisect_left(start) - 1
        if left >= 0:
            s = self._starts[left]
            e, o = self._span[s]
            if e == start and o == owner:
                self._starts.remove(s)
                del self._span[s]
                start = s
        right = self._span.get(end)
        if right is not None and right[1] == owner:
            self._starts.remove(end)
            del self._span[end]
            end = right[0]
        self._put(start, end, owner)

    def _put(self, start: int, end: int, owner: Hashable) -> None:
        self._starts.add(start)
        self._span[start] = (end, owner)

    def pieces(self, start: int, end: int) -> list[tuple[int, Hashable | None]]:
        """``[(bytes, owner)]`` covering ``[start, end)`` in address order; gaps have owner None."""
        out: list[tuple[int, Hashable | None]] = []
        cursor = start
        for s in self._overlapping(start, end):
            e, o = self._span[s]
            lo, hi = max(s, start), min(e, end)
            if lo > cursor:
                out.append((lo - cursor, None))
            out.append((hi - lo, o))
            cursor = hi
        if end > cursor:
            out.append((end - cursor, None))
        return out


class LastOwners:
    """The last writer of each byte, from ``log`` rows ``(start, end, owner)`` in write order.

    Call ``resolve(queries)`` with every ``(start, end)`` to be asked, then ``pieces`` over them.
    The log is scanned newest first, only the writes that overlap a query, and stops once every
    queried byte has its writer.
    """

    def __init__(self, log: np.ndarray):
        self.log = np.asarray(log, dtype=np.int64).reshape(-1, 3)
        self._found = RangeOwners()

    def resolve(self, queries: list[tuple[int, int]]) -> None:
        """Find the last writer of every byte of ``queries``."""
        todo = RangeOwners()
        for start, end in queries:
            todo.assign(start, end, True)
        if not len(todo) or not len(self.log):
            return
        q_starts = np.array(list(todo._starts), dtype=np.int64)
        q_ends = np.array([todo._span[s][0] for s in q_starts.tolist()], dtype=np.int64)
        left = int((q_ends - q_starts).sum())
        starts, ends, owners = self.log[:, 0], self.log[:, 1], self.log[:, 2]
        nxt = np.searchsorted(q_ends, starts, side="right")
        inside = nxt < len(q_starts)
        inside[inside] = q_starts[nxt[inside]] < ends[inside]
        for i in np.flatnonzero(inside)[::-1].tolist():
            start, end = int(starts[i]), int(ends[i])
            cursor = start
            for size, open_ in todo.pieces(start, end):
                if open_:
                    self._found.assign(cursor, cursor + size, int(owners[i]))
                    todo.clear(cursor, cursor + size)
                    left -= size
                cursor += size
            if left <= 0:
                break

    def pieces(self, start: int, end: int) -> list[tuple[int, Hashable | None]]:
        """As ``RangeOwners.pieces``, over ranges given to ``resolve``."""
        return self._found.pieces(start, end)
