"""Keep one pool's free blocks with ``FreeList``: best-fit order per stream, coalescing inside a segment.

A *segment* is one device allocation (a cudaMalloc, or an expandable segment's virtual range). It
is tiled by blocks; the free ones live here, the allocated ones are the policy's (the base class
keeps their address and size). Free blocks are indexed three ways, all plain ints:

* ``size_at[start] -> size`` and ``start_ending_at[end] -> start``: the address neighbours a
  freed block may merge with, found in O(1) without any per-block object;
* one sorted plain ``list`` per stream key of packed ints ``size << 64 | addr``: ordered like
  PyTorch's ``BlockComparatorSize`` (stream, size, address), so the first key ``>= size << 64`` is
  the smallest block that fits, ties going to the lowest address.

Why a plain list and ``bisect`` rather than a balanced structure: a pool holds hundreds to a few
thousand free blocks, and for those ``bisect`` plus the memmove of ``list.insert``/``list.pop``
(both in C) cost less than any Python-level tree or ``SortedList`` method call. The price is
O(n) memmove per change, which only matters for pools of ~10^5 free blocks.

This class is the readable reference. The compiled kernel (``kernel.py``, ``csrc/kernel/``) has a
``FreeList`` with the same contents and methods (a B+ tree per stream and open-addressing address
maps: O(log n) whatever the pool holds); policies use only the methods below, never the dicts
directly, so either implementation serves them.

Blocks never merge across segments: an address that starts a segment is a hard boundary, because
two cudaMallocs that happen to be adjacent are still separate allocations.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from heapq import heapify, heappop, heappush
from typing import Callable, Iterator

#: Addresses live in the low 64 bits of a packed key; sizes above them.
ADDR_BITS = 64
ADDR_MASK = (1 << ADDR_BITS) - 1


def pack(size_bytes: int, addr: int) -> int:
    """Return the sort key of a free block: size first, then address."""
    return size_bytes << ADDR_BITS | addr


class FreeList:
    """Free blocks of one pool over many segments; every block belongs to one stream key.

    ``stream_key`` is the allocating stream for stream-bound pools and 0 for pools any stream may
    use; all blocks of a segment share the segment's key, so merges never mix streams.
    """

    __slots__ = ("by_stream", "size_at", "start_ending_at", "segment_size_at", "segment_stream_at",
                 "segment_bytes", "clock", "inserted_at", "count_of_size", "size_heap")

    def __init__(self, *, track_age: bool = False):
        self.by_stream: dict[int, list[int]] = {}   # stream key -> sorted packed keys
        self.size_at: dict[int, int] = {}
        self.start_ending_at: dict[int, int] = {}
        self.segment_size_at: dict[int, int] = {}
        self.segment_stream_at: dict[int, int] = {}
        self.segment_bytes = 0
        # PyTorch's garbage_collection_threshold ages free blocks by get_free_block calls: ``clock``
        # is that call count and ``inserted_at`` the clock when each free block entered the set.
        self.clock = 0
        self.inserted_at: dict[int, int] | None = {} if track_age else None
        # largest() is asked at every new peak: free blocks counted by size, and a max-heap of those
        # sizes (negated; an entry whose count fell to 0 is dropped when it reaches the top), so it
        # never walks every stream (60k streams took minutes).
        self.count_of_size: dict[int, int] = {}
        self.size_heap: list[int] = []

    # ------------------------------------------------------------------ byte counts
    # Derived on demand (O(free blocks)) instead of kept up to date: they are read by reports and
    # checks, while every malloc and free would pay for maintaining them.
    @property
    def free_bytes(self) -> int:
        """Bytes in free blocks."""
        return sum(self.size_at.values())

    @property
    def free_bytes_by_stream(self) -> dict[int, int]:
        """Stream key -> bytes in its free blocks (every key that ever held a free block)."""
        return {skey: sum(key >> ADDR_BITS for key in blocks) for skey, blocks in self.by_stream.items()}

    @property
    def track_age(self) -> bool:
        """Whether free blocks carry ages (``inserted_at``)."""
        return self.inserted_at is not None

    def stream_keys(self) -> list[int]:
        """Every stream key that ever held a free block, in first-use order."""
        return list(self.by_stream)

    def stream_bytes(self, stream_key: int) -> int:
        """Bytes in the free blocks of ``stream_key``."""
        return sum(key >> ADDR_BITS for key in self.by_stream.get(stream_key, ()))

    # ------------------------------------------------------------------ one-address lookups (None: absent)
    def block_size(self, addr: int) -> int | None:
        """Size of the free block starting at ``addr``."""
        return self.size_at.get(addr)

    def block_ending_at(self, end: int) -> int | None:
        """Start of the free block ending at ``end``."""
        return self.start_ending_at.get(end)

    def segment_size(self, addr: int) -> int | None:
        """Size of the segment starting at ``addr``."""
        return self.segment_size_at.get(addr)

    def segment_stream(self, addr: int) -> int | None:
        """Stream key of the segment starting at ``addr``."""
        return self.segment_stream_at.get(addr)

    def inserted_clock(self, addr: int) -> int | None:
        """The clock when the free block at ``addr`` entered the set (ages tracked only)."""
        return None if self.inserted_at is None else self.inserted_at.get(addr)

    # ------------------------------------------------------------------ segments
    def add_segment(self, addr: int, size_bytes: int, stream_key: int) -> None:
        """Register a new segment; it holds no free block until the caller adds one."""
        self.segment_size_at[addr] = size_bytes
        self.segment_stream_at[addr] = stream_key
        self.segment_bytes += size_bytes

    def is_whole_free(self, addr: int) -> bool:
        """Tell whether ``addr`` starts a segment that is one free block (PyTorch: an unsplit free block).

        False for any other address, such as a free piece inside a split segment: callers ask this of
        free blocks to find the ones a cudaFree could release.
        """
        segment_size = self.segment_size_at.get(addr)
        return segment_size is not None and self.size_at.get(addr) == segment_size

    def remove_segment(self, addr: int) -> int:
        """Forget the wholly free segment at ``addr`` and its free block; return its size."""
        size_bytes = self.segment_size_at.pop(addr)
        stream_key = self.segment_stream_at.pop(addr)
        self.take(stream_key, pack(size_bytes, addr))
        self.segment_bytes -= size_bytes
        return size_bytes

    def forget_segment(self, addr: int) -> int:
        """Drop the record of the segment at ``addr``, which holds no free block; return its size."""
        size_bytes = self.segment_size_at.pop(addr)
        del self.segment_stream_at[addr]
        self.segment_bytes -= size_bytes
        return size_bytes

    def whole_free_segments(self, stream_key: int | None = None) -> list[tuple[int, int, int]]:
        """Return ``(addr, size, stream_key)`` of every wholly free segment, in (stream, size, addr) order."""
        found = []
        keys = sorted(self.by_stream) if stream_key is None else [stream_key]
        seg_size_at = self.segment_size_at
        for skey in keys:
            for key in self.by_stream.get(skey, ()):
                addr = key & ADDR_MASK
                if seg_size_at.get(addr) == key >> ADDR_BITS:
                    found.append((addr, key >> ADDR_BITS, skey))
        return found

    # ------------------------------------------------------------------ placement
    def best_fit(self, stream_key: int, size_bytes: int) -> int:
        """Return the key of the smallest free block of ``stream_key`` with ``size >= size_bytes`` or -1."""
        blocks = self.by_stream.get(stream_key)
        if not blocks:
            return -1
        idx = bisect_left(blocks, size_bytes << ADDR_BITS)
        return blocks[idx] if idx < len(blocks) else -1

    def pop_best_fit(self, stream_key: int, size_bytes: int) -> int:
        """Remove and return the key of the best-fit block (as ``best_fit`` finds it), or -1."""
        blocks = self.by_stream.get(stream_key)
        if not blocks:
            return -1
        idx = bisect_left(blocks, size_bytes << ADDR_BITS)
        if idx == len(blocks):
            return -1
        key = blocks.pop(idx)
        self._forget(stream_key, key)
        return key

    def keys(self, stream_key: int) -> list[int] | tuple:
        """Return the sorted keys of one stream's free blocks (read-only use)."""
        return self.by_stream.get(stream_key, ())

    def next_key(self, stream_key: int, key: int) -> int:
        """Return the smallest key of ``stream_key``'s free blocks above ``key``, or -1."""
        blocks = self.by_stream.get(stream_key, ())
        idx = bisect_right(blocks, key)
        return blocks[idx] if idx < len(blocks) else -1

    def take(self, stream_key: int, key: int) -> None:
        """Remove the free block with sort key ``key`` (it is about to be handed out or released)."""
        blocks = self.by_stream[stream_key]
        idx = bisect_left(blocks, key)
        if idx == len(blocks) or blocks[idx] != key:
            raise ValueError(f"no free block with key {key:#x} in stream {stream_key}")
        del blocks[idx]
        self._forget(stream_key, key)

    def _forget(self, stream_key: int, key: int) -> None:
        """Drop the address indexes (and age) of a block just removed from its sorted list."""
        size_bytes = key >> ADDR_BITS
        addr = key & ADDR_MASK
        del self.size_at[addr]
        del self.start_ending_at[addr + size_bytes]
        self._uncount(size_bytes)
        if self.inserted_at is not None:
            self.inserted_at.pop(addr, None)

    # ------------------------------------------------------------------ returning blocks
    def add(self, addr: int, size_bytes: int, stream_key: int) -> None:
        """Insert a free block whose neighbours are known not to be free (a split remainder)."""
        self.size_at[addr] = size_bytes
        self.start_ending_at[addr + size_bytes] = addr
        blocks = self.by_stream.get(stream_key)
        if blocks is None:
            blocks = self.by_stream[stream_key] = []
        insort(blocks, size_bytes << ADDR_BITS | addr)
        self._count(size_bytes)
        if self.inserted_at is not None:
            self.inserted_at[addr] = self.clock

    def _count(self, size_bytes: int) -> None:
        n = self.count_of_size.get(size_bytes, 0)
        self.count_of_size[size_bytes] = n + 1
        if not n:
            heappush(self.size_heap, -size_bytes)
            if len(self.size_heap) > 2 * len(self.count_of_size) + 64:   # mostly gone sizes: rebuild
                self.size_heap = [-size for size in self.count_of_size]
                heapify(self.size_heap)

    def _uncount(self, size_bytes: int) -> None:
        n = self.count_of_size.pop(size_bytes)
        if n > 1:
            self.count_of_size[size_bytes] = n - 1

    def free(self, addr: int, size_bytes: int, stream_key: int) -> int:
        """Return a block, merging it with free neighbours of its segment; return the merge count.

        Hot path (once per completed free): the neighbours are taken out inline rather than through
        ``take`` and the result is inserted as ``add`` would.
        """
        size_at, start_ending_at, segment_size_at = self.size_at, self.start_ending_at, self.segment_size_at
        blocks = self.by_stream.get(stream_key)
        if blocks is None:
            blocks = self.by_stream[stream_key] = []
        inserted_at = self.inserted_at
        merges = 0
        if addr not in segment_size_at:   # a segment's start is a hard boundary
            prev_addr = start_ending_at.pop(addr, None)
            if prev_addr is not None:
                prev_size = size_at.pop(prev_addr)
                del blocks[bisect_left(blocks, prev_size << ADDR_BITS | prev_addr)]
                self._uncount(prev_size)
                addr = prev_addr
                size_bytes += prev_size
                merges = 1
        end = addr + size_bytes
        if end not in segment_size_at:
            next_size = size_at.pop(end, None)
            if next_size is not None:
                del start_ending_at[end + next_size]
                del blocks[bisect_left(blocks, next_size << ADDR_BITS | end)]
                self._uncount(next_size)
                if inserted_at is not None:
                    inserted_at.pop(end, None)
                size_bytes += next_size
                merges += 1
        size_at[addr] = size_bytes
        start_ending_at[addr + size_bytes] = addr
        insort(blocks, size_bytes << ADDR_BITS | addr)
        self._count(size_bytes)
        if inserted_at is not None:   # the merged block is new to the set: its age restarts
            inserted_at[addr] = self.clock
        return merges

    # ------------------------------------------------------------------ reporting
    def largest(self) -> int:
        """Return the size of the largest free block (0 when there is none)."""
        heap, count_of_size = self.size_heap, self.count_of_size
        while heap and -heap[0] not in count_of_size:
            heappop(heap)      # a size no free block has any more
        return -heap[0] if heap else 0

    def blocks(self) -> Iterator[tuple[int, int, int]]:
        """Yield ``(addr, size, stream_key)`` of every free block (for checks and reports)."""
        for skey, blocks in self.by_stream.items():
            for key in blocks:
                yield key & ADDR_MASK, key >> ADDR_BITS, skey

    def segment_of(self, addr: int) -> int:
        """Return the start of the segment holding ``addr`` (linear scan: for checks only)."""
        for start, size in self.segment_size_at.items():
            if start <= addr < start + size:
                return start
        raise KeyError(f"no segment holds {addr:#x}")

    def check(self) -> None:
        """Raise ``AssertionError`` if the indexes disagree or two free neighbours were left unmerged."""
        check_free_list(self)


def segment_finder(pool) -> Callable[[int], int]:
    """Return ``segment_of`` for many lookups: the segments are sorted once, each lookup bisects.

    (``FreeList.segment_of`` scans every segment per call: checks over a start state of 40k
    segments took minutes with it.)
    """
    segment_size_at = dict(pool.segment_size_at)
    starts = sorted(segment_size_at)

    def segment_of(addr: int) -> int:
        k = bisect_right(starts, addr) - 1
        if k < 0 or addr >= starts[k] + segment_size_at[starts[k]]:
            raise KeyError(f"no segment holds {addr:#x}")
        return starts[k]

    return segment_of


def check_free_list(pool) -> None:
    """Check a ``FreeList`` (either implementation) through its public views: for tests and ``validate``."""
    total = 0
    count = 0
    size_at, start_ending_at, segment_size_at = pool.size_at, pool.start_ending_at, pool.segment_size_at
    segment_stream_at = pool.segment_stream_at
    segment_of = segment_finder(pool)
    for addr, size, skey in pool.blocks():
        assert size_at.get(addr) == size, f"free block {addr:#x} missing from size_at"
        assert start_ending_at.get(addr + size) == addr, f"free block {addr:#x} missing from start_ending_at"
        seg = segment_of(addr)
        assert addr + size <= seg + segment_size_at[seg], f"free block {addr:#x} overruns its segment"
        assert segment_stream_at[seg] == skey, f"free block {addr:#x} filed under the wrong stream"
        end = addr + size
        if end not in segment_size_at and end in size_at:
            raise AssertionError(f"free blocks at {addr:#x} and {end:#x} were not merged")
        total += size
        count += 1
    assert count == len(size_at) == len(start_ending_at), "free-block indexes differ in size"
    for skey, blocks in pool.by_stream.items():
        assert all(a < b for a, b in zip(blocks, blocks[1:])), f"free blocks of stream {skey} are not sorted"
    assert total == pool.free_bytes, f"free_bytes {pool.free_bytes} != {total}"
    largest = max((size for _addr, size, _skey in pool.blocks()), default=0)
    assert pool.largest() == largest, f"largest() {pool.largest()} != {largest}"
    assert pool.segment_bytes == sum(segment_size_at.values()), "segment_bytes drifted"
