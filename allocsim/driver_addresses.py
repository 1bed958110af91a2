"""Give new cudaMalloc segments the addresses the CUDA driver gives them on Linux: ``DriverAddresses``.

PyTorch's caching allocator breaks ties between free blocks of equal size by address
(``BlockComparatorSize`` in ``c10/cuda/CUDACachingAllocator.cpp``: stream, then size, then
``ptr``), so which of two equal free blocks a request takes depends on where the driver put their
segments. The rule below is learned from the segment addresses of real snapshots (every
``segment_alloc`` of the shared ones; ``python -m validate addresses`` measures it, and
``docs/addresses.md`` has the counts):

1. **Top down.** A cudaMalloc that fits in no free range gets a fresh *chunk* of virtual address
   space below every range in use: the request rounded up to ``CHUNK_BYTES`` (32 MiB), aligned to
   it, the segment at the chunk's bottom. The rest of the chunk (a 20 MiB segment leaves 12 MiB)
   stays free for later segments.
2. **Freed ranges are reused.** cudaFree returns the range; touching free ranges merge.
3. **Where in the free ranges.** A small segment (``SMALL_SEGMENT_BYTES``, PyTorch's 2 MiB
   small-pool segment, or less) takes the bottom of the lowest free range; a larger one the top of
   the highest free range it fits in.
4. **Another driver.** Real segments below ``LOW_DRIVER_TOP_ADDR`` come from drivers (WSL,
   Windows) whose layouts are packed upwards: with such a range in use, ``place`` declines and the
   device puts the segment above everything, as in creation order.

Addresses are fake (they start below ``TOP_ADDR``); only their order matters to a policy. Every
query here is O(log n) in the free ranges (a treap keyed by start address whose nodes carry the
largest free size below them), so no trace can make placement quadratic.
"""

from __future__ import annotations

import random
from typing import Callable

from .units import MiB, align_up

#: Fresh virtual address space comes in chunks of this size and alignment (real snapshots: a new
#: 196 MiB segment lands 224 MiB below the previous one, a 20 MiB one 32 MiB below).
CHUNK_BYTES = 32 * MiB
#: Segments of at most this size fill free ranges from the lowest address up (PyTorch's small pool
#: segment, ``kSmallBuffer``); larger ones take the highest free range that fits.
SMALL_SEGMENT_BYTES = 2 * MiB
#: The first chunk ends here (Linux user space ends at 2**47; real segments sit just below it).
TOP_ADDR = 1 << 47
#: No chunk goes below this. Real segments at lower addresses (0x3..., 0x7..., 0xb...: WSL and
#: Windows, whose drivers pack segments upwards) mean another driver: with such a range in use, or
#: once chunks would pass it, the device hands out addresses above everything instead.
LOW_DRIVER_TOP_ADDR = 1 << 44


class _Node:
    __slots__ = ("start", "size", "prio", "left", "right", "largest")

    def __init__(self, start: int, size: int, prio: float):
        self.start, self.size, self.prio = start, size, prio
        self.left: _Node | None = None
        self.right: _Node | None = None
        self.largest = size


def _fix(node: _Node) -> _Node:
    largest = node.size
    if node.left is not None and node.left.largest > largest:
        largest = node.left.largest
    if node.right is not None and node.right.largest > largest:
        largest = node.right.largest
    node.largest = largest
    return node


def _split(node: _Node | None, key: int) -> tuple[_Node | None, _Node | None]:
    """Split into (starts < key, starts >= key)."""
    if node is None:
        return None, None
    if node.start < key:
        node.right, right = _split(node.right, key)
        return _fix(node), right
    left, node.left = _split(node.left, key)
    return left, _fix(node)


def _merge(left: _Node | None, right: _Node | None) -> _Node | None:
    """Join two treaps whose every start in ``left`` is below every start in ``right``."""
    if left is None:
        return right
    if right is None:
        return left
    if left.prio > right.prio:
        left.right = _merge(left.right, right)
        return _fix(left)
    right.left = _merge(left, right.left)
    return _fix(right)


class FreeRanges:
    """Disjoint free address ranges, each ``start -> size``; touching ranges are kept merged.

    ``lowest_fit`` / ``highest_fit`` find the lowest / highest range of at least a size in O(log n)
    (expected: a treap with random priorities from a private generator).
    """

    def __init__(self) -> None:
        self._root: _Node | None = None
        self.size_at: dict[int, int] = {}
        self.start_ending_at: dict[int, int] = {}
        self._rng = random.Random(0x5EED)

    def __len__(self) -> int:
        return len(self.size_at)

    def _insert(self, start: int, size: int) -> None:
        left, right = _split(self._root, start)
        self._root = _merge(_merge(left, _Node(start, size, self._rng.random())), right)
        self.size_at[start] = size
        self.start_ending_at[start + size] = start

    def _delete(self, start: int) -> int:
        left, rest = _split(self._root, start)
        _gone, right = _split(rest, start + 1)
        self._root = _merge(left, right)
        size = self.size_at.pop(start)
        del self.start_ending_at[start + size]
        return size

    def add(self, start: int, size: int) -> None:
        """Free ``[start, start + size)``, merging touching neighbours (a part already free stays free once)."""
        self.carve(start, size)
        end = start + size
        before = self.start_ending_at.get(start)
        if before is not None:
            self._delete(before)
            start = before
        after = self.size_at.get(end)
        if after is not None:
            self._delete(end)
            end += after
        self._insert(start, end - start)

    def take(self, start: int, size: int) -> None:
        """Mark ``[start, start + size)`` in use; it must lie inside one free range."""
        base = self.containing(start)
        if base is None or start + size > base + self.size_at[base]:
            raise ValueError(f"[{start:#x}, +{size}) is not inside one free range")
        self.carve(start, size)

    def carve(self, start: int, size: int) -> None:
        """Drop ``[start, start + size)`` from the free ranges, whatever part of it is free."""
        end = start + size
        base = self.containing(start)
        cursor = base if base is not None else start
        while True:
            first = self._first_at_or_after(cursor)
            if first is None or first >= end:
                break
            length = self._delete(first)
            if first < start:
                self._insert(first, start - first)
            if first + length > end:
                self._insert(end, first + length - end)
                break
            cursor = first + length

    def containing(self, addr: int) -> int | None:
        """Start of the free range holding ``addr``, or None."""
        node, found = self._root, None
        while node is not None:
            if node.start <= addr:
                found = node
                node = node.right
            else:
                node = node.left
        if found is not None and addr < found.start + found.size:
            return found.start
        return None

    def _first_at_or_after(self, addr: int) -> int | None:
        node, found = self._root, None
        while node is not None:
            if node.start >= addr:
                found = node
                node = node.left
            else:
                node = node.right
        return None if found is None else found.start

    def lowest_fit(self, size: int) -> int | None:
        """Start of the lowest free range of at least ``size`` bytes, or None."""
        node = self._root
        if node is None or node.largest < size:
            return None
        while True:
            if node.left is not None and node.left.largest >= size:
                node = node.left
            elif node.size >= size:
                return node.start
            else:
                node = node.right

    def highest_fit(self, size: int) -> int | None:
        """Start of the highest free range of at least ``size`` bytes, or None."""
        node = self._root
        if node is None or node.largest < size:
            return None
        while True:
            if node.right is not None and node.right.largest >= size:
                node = node.right
            elif node.size >= size:
                return node.start
            else:
                node = node.left


class DriverAddresses:
    """The driver's placement of cudaMalloc segments (module docstring): ``place`` / ``release`` / ``carve``."""

    def __init__(self) -> None:
        self.free = FreeRanges()
        self.lowest_chunk: int | None = None   # base of the lowest chunk made so far

    def place(self, footprint: int, lowest_in_use: int | None, overlaps: Callable[[int, int], bool]) -> int | None:
        """The address for a new segment of ``footprint`` bytes, or None when no chunk fits above ``LOW_DRIVER_TOP_ADDR``.

        ``lowest_in_use`` is the lowest start of any range the device holds (None: none);
        ``overlaps(addr, size)`` tells whether a range collides with one. The device carves every
        range it adopts or is told to use out of the free ranges, so a collision is not expected:
        should one happen anyway, that free range is dropped and the search goes on.
        """
        free = self.free
        while True:
            small = footprint <= SMALL_SEGMENT_BYTES
            start = free.lowest_fit(footprint) if small else free.highest_fit(footprint)
            if start is None:
                break
            addr = start if small else start + free.size_at[start] - footprint
            if not overlaps(addr, footprint):
                free.take(addr, footprint)
                return addr
            free.carve(start, free.size_at[start])
        below = TOP_ADDR
        for bound in (self.lowest_chunk, lowest_in_use):
            if bound is not None and bound < below:
                below = bound
        chunk = align_up(footprint, CHUNK_BYTES)
        base = (below - chunk) // CHUNK_BYTES * CHUNK_BYTES
        if base < LOW_DRIVER_TOP_ADDR:
            return None
        self.lowest_chunk = base
        if footprint < chunk:
            free.add(base + footprint, chunk - footprint)
        return base

    def release(self, addr: int, size: int) -> None:
        """cudaFree of ``[addr, addr + size)``: the range is free again."""
        self.free.add(addr, size)

    def carve(self, addr: int, size: int) -> None:
        """The device holds ``[addr, addr + size)`` (adopted or recorded): it is no longer free."""
        self.free.carve(addr, size)
