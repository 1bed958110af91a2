"""PyTorch's ``expandable_segments:True``: one growing virtual segment per (stream, pool), mapped in pages.

Mirrors ``try_allocate_expandable_block`` / ``find_expandable_block`` / ``map_block`` /
``unmap_block`` of ``c10/cuda/CUDACachingAllocator.cpp`` (research notes ``pytorch.md`` §1.11):

* a segment is a virtual range reserved once (1.125 × device memory, as PyTorch does) whose pages
  (2 MiB small pool, 20 MiB large pool) are mapped on demand with ``device.map``;
* a request that no free block serves maps just enough pages at the lowest address where free
  plus unmapped space is big enough, merging the new pages with the free block before them;
* releasing cache unmaps every whole page inside a free block (``device.unmap``).

Free mapped blocks live in the pool's ``FreeList`` (the virtual range is its segment, so they
merge across pages); unmapped ranges live in ``UnmappedRanges`` beside it.
"""

from __future__ import annotations

from sortedcontainers import SortedList

from ..device import DeviceOutOfMemory
from ..units import GiB, align_up
from .freelist import ADDR_BITS, ADDR_MASK, FreeList

#: Address space reserved per expandable segment when the device has no capacity (80 GiB × 1.125).
DEFAULT_ADDRESS_SPACE_BYTES = 90 * GiB


class UnmappedRanges:
    """Unmapped page ranges of one pool's expandable segments, address-ordered per stream."""

    __slots__ = ("size_at", "start_ending_at", "by_stream", "stream_at", "total_bytes")

    def __init__(self) -> None:
        self.total_bytes = 0          # kept up to date: summing the ranges on every query is O(n)
        self.size_at: dict[int, int] = {}
        self.start_ending_at: dict[int, int] = {}
        self.stream_at: dict[int, int] = {}
        self.by_stream: dict[int, SortedList] = {}

    def add(self, addr: int, size_bytes: int, stream: int, pool: FreeList) -> None:
        """Add an unmapped range, merging with unmapped neighbours of the same segment of ``pool``."""
        if pool.segment_size(addr) is None:
            prev = self.start_ending_at.get(addr)
            if prev is not None:
                size_bytes += self.take(prev)
                addr = prev
        end = addr + size_bytes
        if pool.segment_size(end) is None and end in self.size_at:
            size_bytes += self.take(end)
        self.size_at[addr] = size_bytes
        self.total_bytes += size_bytes
        self.start_ending_at[addr + size_bytes] = addr
        self.stream_at[addr] = stream
        self.by_stream.setdefault(stream, SortedList()).add(addr)

    def take(self, addr: int) -> int:
        """Remove the unmapped range starting at ``addr``; return its size."""
        size_bytes = self.size_at.pop(addr)
        self.total_bytes -= size_bytes
        del self.start_ending_at[addr + size_bytes]
        self.by_stream[self.stream_at.pop(addr)].remove(addr)
        return size_bytes


class ExpandableSegments:
    """The expandable segments of one pool (small or large) of a ``PyTorchPolicy``."""

    def __init__(self, policy, pool: FreeList, page_bytes: int):
        self.policy = policy
        self.pool = pool
        self.page_bytes = page_bytes
        self.unmapped = UnmappedRanges()
        capacity = policy.device.capacity_bytes
        total = capacity if capacity else DEFAULT_ADDRESS_SPACE_BYTES * 8 // 9
        self.address_space_bytes = align_up(total + total // 8, page_bytes)

    # ------------------------------------------------------------------ best fit
    def expandable_size(self, key: int) -> int:
        """Size a free block could grow to: itself plus the unmapped range right after it."""
        size = key >> ADDR_BITS
        end = (key & ADDR_MASK) + size
        if self.pool.segment_size(end) is not None:
            return size
        return size + self.unmapped.size_at.get(end, 0)

    def get_free_block(self, stream: int, size_bytes: int) -> int:
        """Best fit that prefers blocks whose growth room is smaller (keeps the unmapped tail intact)."""
        pool = self.pool
        key = pool.best_fit(stream, size_bytes)
        if key < 0:
            return -1
        best = key
        best_room = self.expandable_size(key)
        candidate = pool.next_key(stream, key)
        while candidate >= 0:   # the blocks after the best fit, in order
            room = self.expandable_size(candidate)
            if room >= best_room:
                break
            best, best_room = candidate, room
            candidate = pool.next_key(stream, candidate)
        return best

    # ------------------------------------------------------------------ growing
    def allocate(self, stream: int, size_bytes: int) -> int:
        """Map pages so a free block of ``size_bytes`` exists; take it and return its key, or -1 on OOM."""
        pool = self.pool
        addr, mapped = self._find(stream, size_bytes)
        if mapped:
            size = pool.block_size(addr)
        else:
            addr, size = self._map(addr, min(self.unmapped.size_at[addr], size_bytes), stream)
            if addr < 0:
                return -1
        while size < size_bytes:
            # Invariant (as in C++): the candidate is free and followed by an unmapped range.
            nxt = addr + size
            addr, size = self._map(nxt, min(size_bytes - size, self.unmapped.size_at[nxt]), stream)
            if addr < 0:
                return -1
        key = size << ADDR_BITS | addr
        pool.take(stream, key)
        return key

    def _find(self, stream: int, size_bytes: int) -> tuple[int, bool]:
        pool = self.pool
        for start in list(self.unmapped.by_stream.get(stream, ())):
            candidate, mapped = start, False
            prev = pool.block_ending_at(start)
            if prev is not None and pool.segment_size(start) is None:
                candidate, mapped = prev, True
            if self._room(candidate) >= size_bytes:
                return candidate, mapped
        base = self.policy.device.reserve_address_space(self.address_space_bytes)
        pool.add_segment(base, self.address_space_bytes, stream)
        self.unmapped.add(base, self.address_space_bytes, stream, pool)
        return base, False

    def _room(self, addr: int) -> int:
        # Free and unmapped space from addr onward inside one segment (free -> unmapped -> free ...).
        pool, unmapped = self.pool, self.unmapped
        room = 0
        first = True
        while True:
            if not first and pool.segment_size(addr) is not None:
                return room
            first = False
            size = pool.block_size(addr) or unmapped.size_at.get(addr)
            if not size:
                return room
            room += size
            addr += size

    def _map(self, addr: int, size_bytes: int, stream: int) -> tuple[int, int]:
        """Map whole pages covering ``size_bytes`` at the unmapped range ``addr``; return the merged free block."""
        policy, pool = self.policy, self.pool
        available = self.unmapped.size_at[addr]
        mapped_bytes = min(align_up(size_bytes, self.page_bytes), available)
        try:
            policy.device.map(addr, mapped_bytes)
        except DeviceOutOfMemory:
            return -1, 0
        self.unmapped.take(addr)
        if mapped_bytes < available:
            self.unmapped.add(addr + mapped_bytes, available - mapped_bytes, stream, pool)
        policy.on_device_memory("segment_map", addr, mapped_bytes, stream)
        start = addr
        if pool.segment_size(addr) is None:
            prev = pool.block_ending_at(addr)
            start = addr if prev is None else prev
        pool.free(addr, mapped_bytes, stream)
        return start, pool.block_size(start)

    # ------------------------------------------------------------------ releasing
    def release(self) -> int:
        """Unmap every whole page inside a free block (``release_blocks`` for expandable); return bytes."""
        pool, unmapped = self.pool, self.unmapped
        released = 0
        for addr, size, stream in sorted(pool.blocks(), key=lambda b: (b[2], b[1], b[0])):
            base = pool.segment_of(addr)
            page = self.page_bytes
            begin = base + align_up(addr - base, page)
            end = base + (addr + size - base) // page * page
            if begin >= end:
                continue
            pool.take(stream, size << ADDR_BITS | addr)
            if begin > addr:
                pool.add(addr, begin - addr, stream)
            if end < addr + size:
                pool.add(end, addr + size - end, stream)
            self.policy.device.unmap(begin, end - begin)
            self.policy.on_device_memory("segment_unmap", begin, end - begin, stream)
            unmapped.add(begin, end - begin, stream, pool)
            released += end - begin
            if unmapped.size_at.get(base) == pool.segment_size(base):
                # Newer PyTorch frees a fully unmapped segment's address space (release_expandable_segment).
                unmapped.take(base)
                pool.forget_segment(base)   # its size may differ from address_space_bytes (load_state)
                self.policy.device.release_address_space(base)
        return released

    def mapped_bytes(self) -> int:
        """Bytes of this pool's segments that are mapped (segment bytes minus unmapped ranges)."""
        return self.pool.segment_bytes - self.unmapped.total_bytes
