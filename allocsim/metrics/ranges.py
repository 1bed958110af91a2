"""Who last owned each byte of an address range: ``RangeOwners.assign(start, end, owner)`` / ``.pieces``.

Non-overlapping ``[start, end)`` intervals in a sorted list; a new assignment cuts the ones it
overlaps and merges with equal-owner neighbours, so the map holds at most one interval per change
of owner along the address space. Every operation is logarithmic plus the intervals it touches.
"""

from __future__ import annotations

from typing import Hashable

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

    def assign(self, start: int, end: int, owner: Hashable) -> None:
        """``[start, end)`` now belongs to ``owner`` (whatever owned parts of it before)."""
        if end <= start:
            return
        for s in self._overlapping(start, end):
            e, o = self._span.pop(s)
            self._starts.remove(s)
            if s < start:
                self._put(s, start, o)
            if e > end:
                self._put(end, e, o)
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
