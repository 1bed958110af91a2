"""``pytorch``: PyTorch's CUDACachingAllocator, rule for rule (research notes ``pytorch.md`` §1).

``malloc`` = ``round_size`` → small pool (<= 1 MiB) or large → best fit among the free blocks of
the request's stream (ordered stream, size, address) subject to the two oversize rules → on a
miss: garbage collection (only with a memory fraction), ``alloc_block`` (a segment of
``get_allocation_size``), else ``release_available_cached_blocks`` (only with ``max_split_size``)
and retry, else ``release_cached_blocks`` and retry, else ``OutOfMemory`` → ``should_split`` keeps
the low part and re-inserts the remainder. A completed free merges with its free neighbours.

``garbage_collection_threshold`` acts only with ``memory_fraction`` (PyTorch needs
``set_per_process_memory_fraction``) and a device capacity: the allowed maximum is
``memory_fraction × capacity``, and ``alloc_block`` refuses growth beyond it. Without both, GC is
off, as in PyTorch.

With ``record_decisions=True`` every device call is kept in ``decisions`` as ``(action, addr,
size_bytes, stream)`` tuples (``segment_alloc`` / ``segment_free`` / ``segment_map`` /
``segment_unmap`` / ``oom``), the same vocabulary as a snapshot's trace, for fidelity checks.

``_do_malloc`` / ``_do_free`` below are the reference. With the compiled kernel (``kernel.py``) a
request is rounded, searched, split and booked in C, and a miss calls ``_alloc_with_retries``
here (growth, page mapping with expandable segments, releases, retries).
"""

from __future__ import annotations

from typing import Any, Mapping

from ..device import DeviceOutOfMemory
from ..errors import OutOfMemory
from .expandable import ExpandableSegments
from .freelist import ADDR_BITS, ADDR_MASK, FreeList
from ..settings.pytorch_sizes import K_LARGE_BUFFER, K_SMALL_BUFFER, K_SMALL_SIZE
from .growth import pytorch_allocation_size
from .pool import PoolPolicy
from ..settings.divisions import parse_roundup_power2_divisions
from ..settings.recorded import allocator_settings_to_kwargs
from .pytorch_rules import (
    K_MIN_BLOCK_SIZE,
    SIZE_MAX,
    round_size,
)


class PyTorchPolicy(PoolPolicy):
    """PyTorch's caching allocator; build one from a trace with ``PyTorchPolicy.from_allocator_settings``."""

    name = "pytorch"

    def __init__(self, upstream: Any, *, max_split_size_bytes: int | None = None,
                 max_non_split_rounding_bytes: int = K_LARGE_BUFFER,
                 roundup_power2_divisions: Any = None, garbage_collection_threshold: float = 0.0,
                 memory_fraction: float | None = None, expandable_segments: bool = False,
                 record_decisions: bool = False):
        super().__init__(upstream, alignment_bytes=K_MIN_BLOCK_SIZE, growth="pytorch",
                         small_pool_max_bytes=K_SMALL_SIZE, stream_bound=True, oom_release="all")
        # PyTorch breaks best-fit ties by address (BlockComparatorSize: stream, size, ptr), so the
        # driver's placement of segments decides them: ask the device for it (docs/addresses.md).
        prefer = getattr(self.device, "prefer_address_order", None)
        if prefer is not None:
            prefer("driver")
        if max_split_size_bytes is not None and max_split_size_bytes < 0:
            max_split_size_bytes = None   # a snapshot's -1
        if max_split_size_bytes is not None and max_split_size_bytes < K_LARGE_BUFFER:
            # CUDAAllocatorConfig::parseMaxSplitSize refuses values under kLargeBuffer (20 MB): below it a
            # 20 MiB segment would be oversize yet split, which the allocator's rules never produce.
            raise ValueError(f"max_split_size must be at least {K_LARGE_BUFFER} bytes (20MiB), as in PyTorch; "
                             f"got {max_split_size_bytes}")
        if not 0.0 <= garbage_collection_threshold < 1.0:
            raise ValueError("garbage_collection_threshold must be in [0, 1)")
        if memory_fraction is not None and not 0.0 <= memory_fraction <= 1.0:
            raise ValueError("memory_fraction must be in [0, 1]")
        self.max_split_size_bytes = max_split_size_bytes
        self._max_split = SIZE_MAX if max_split_size_bytes is None else max_split_size_bytes
        self.max_non_split_rounding_bytes = max_non_split_rounding_bytes
        self.roundup_power2_divisions = parse_roundup_power2_divisions(roundup_power2_divisions)
        self.garbage_collection_threshold = garbage_collection_threshold
        self.memory_fraction = memory_fraction
        capacity = self.device.capacity_bytes
        # allowed_memory_maximum exists only after set_per_process_memory_fraction.
        self.allowed_memory_maximum = (int(memory_fraction * capacity)
                                       if memory_fraction is not None and capacity is not None else None)
        self.gc_enabled = self.allowed_memory_maximum is not None and garbage_collection_threshold > 0.0
        self.expandable_segments = expandable_segments
        self.record_decisions = record_decisions
        self.decisions: list[tuple[str, int, int, int]] = []
        self.total_allocated_memory = 0    # PyTorch's name for reserved (cudaMalloc'd + mapped) bytes
        self.num_alloc_retries = 0
        self.small = self._new_free_list(track_age=self.gc_enabled)
        self.large = self._new_free_list(track_age=self.gc_enabled)
        self.pools = (self.small, self.large)
        self._expandable = ({id(self.small): ExpandableSegments(self, self.small, K_SMALL_BUFFER),
                             id(self.large): ExpandableSegments(self, self.large, K_LARGE_BUFFER)}
                            if expandable_segments else None)
        self._plain_best_fit = self._expandable is None and max_split_size_bytes is None
        self._attach_kernel()

    def _kernel_config(self) -> dict[str, Any] | None:
        """The kernel serves requests and completed frees; page mapping (a miss) stays here."""
        cls = type(self)
        config = self._kernel_common()
        if self._expandable is not None:   # get_free_block reads how far each block could grow
            config.update(unmapped_small=self._expandable[id(self.small)].unmapped.size_at,
                          unmapped_large=self._expandable[id(self.large)].unmapped.size_at)
        config.update(
            serve_malloc=config["serve_malloc"] and cls._do_malloc is PyTorchPolicy._do_malloc
            and cls._get_free_block is PyTorchPolicy._get_free_block,
            serve_free=config["serve_free"] and cls._do_free is PyTorchPolicy._do_free,
            flavor="pytorch", miss=self._alloc_with_retries, alignment=K_MIN_BLOCK_SIZE, small_max=K_SMALL_SIZE,
            stream_bound=True, carve_from_high_end=False, min_split_remainder=K_MIN_BLOCK_SIZE,
            max_split=self._max_split, max_non_split_rounding=self.max_non_split_rounding_bytes,
            divisions=self.roundup_power2_divisions, gc=self.gc_enabled)
        return config

    @classmethod
    def from_allocator_settings(cls, settings: Mapping[str, Any] | None) -> dict[str, Any]:
        """Return constructor kwargs from a snapshot's ``allocator_settings`` (``max_split_size`` -1 = unlimited)."""
        return allocator_settings_to_kwargs(settings)

    # ------------------------------------------------------------------ start state
    def load_state(self, segments: Any, blocks: Any) -> None:
        """Start from an existing allocator state: a snapshot's ``initial_segments`` / ``initial_blocks``.

        ``segments`` and ``blocks`` are tables (DataFrames or row dicts) with the columns of
        ``allocsim.trace.schema.SEGMENT_DTYPES`` / ``BLOCK_DTYPES`` for ONE device. Every segment
        is adopted by the device at its real address (reserved, not a device call); blocks with
        ``alloc_id >= 0`` become live allocations of that id (freed later by the trace), the others
        free blocks of their segment's stream and pool. Blocks must tile their segments exactly.
        Expandable segments (``is_expandable``) are mapped ranges: those of one (stream, pool) share
        one reserved virtual range starting at the lowest of them, and the gaps are unmapped.

        Free pieces that touch are merged, since PyTorch never leaves two free neighbours apart
        (``free_block`` -> ``try_merge_blocks``); nothing else here is a policy rule.
        """
        if self.live or self.segment_bytes() or self.device.n_mallocs or self.device.n_maps:
            raise ValueError("load_state needs a fresh policy")
        seg_rows = _rows(segments, ("addr", "size_bytes", "stream", "pool", "is_expandable"))
        by_segment: dict[int, list[tuple[int, int, int, int, str]]] = {}
        for seg_addr, addr, size, req, state, aid in _rows(
                blocks, ("segment_addr", "addr", "size_bytes", "requested_bytes", "state", "alloc_id")):
            by_segment.setdefault(int(seg_addr), []).append((int(addr), int(size), int(req), int(aid), str(state)))
        plain = [r for r in seg_rows if not bool(r[4])]
        expandable = [r for r in seg_rows if bool(r[4])]
        if expandable and self._expandable is None:
            raise ValueError("the start state has expandable segments but the policy has expandable_segments off")
        if plain and self._expandable is not None:
            # PyTorch with expandable_segments:True makes only expandable segments (no mixing).
            raise ValueError("the start state has plain segments but the policy has expandable_segments on")
        for addr, size, stream, pool_name, _exp in plain:
            addr, size, stream = int(addr), int(size), int(stream)
            pool = self.small if pool_name == "small" else self.large
            self.device.adopt(addr, size)
            pool.add_segment(addr, size, stream)
            self.total_allocated_memory += size
            self._load_blocks(pool, addr, size, stream, by_segment.pop(addr, None))
        if expandable:
            self._load_expandable(expandable, by_segment)
        if by_segment:
            raise ValueError(f"blocks of unknown segments {sorted(by_segment)[:3]}")

    def _load_blocks(self, pool: FreeList, seg_addr: int, seg_size: int, stream: int,
                     rows: list[tuple[int, int, int, int, str]] | None) -> None:
        if not rows:
            raise ValueError(f"segment {seg_addr:#x} has no blocks (blocks must tile every segment)")
        # Called for a cudaMalloc'd segment or for one mapped range of an expandable segment.
        cursor = seg_addr
        small = pool is self.small
        for addr, size, req, aid, state in sorted(rows):
            if addr != cursor or size <= 0:
                raise ValueError(f"segment {seg_addr:#x}: blocks do not tile it at {cursor:#x}")
            cursor += size
            if aid < 0:
                pool.free(addr, size, stream)   # merges touching free pieces, as PyTorch keeps them
                continue
            if small != (size <= K_SMALL_SIZE):
                raise ValueError(f"live block {addr:#x} of {size} bytes cannot be in the "
                                 f"{'small' if small else 'large'} pool")
            if aid in self.live:
                raise ValueError(f"allocation id {aid} appears twice in the start state")
            self.live[aid] = (addr, req, size, stream)
            self.requested_bytes += req
            self.allocated_bytes += size
            if state in ("active_pending_free", "active_awaiting_free"):
                self.pending.add(aid)
                self.pending_free_bytes += size
        if cursor != seg_addr + seg_size:
            raise ValueError(f"segment {seg_addr:#x}: blocks end at {cursor:#x}, not at its end")

    def _load_expandable(self, rows: list, by_segment: dict) -> None:
        groups: dict[tuple[int, str], list[tuple[int, int]]] = {}
        for addr, size, stream, pool_name, _exp in rows:
            groups.setdefault((int(stream), str(pool_name)), []).append((int(addr), int(size)))
        bases = sorted((min(a for a, _ in ranges), key) for key, ranges in groups.items())
        for k, (base, (stream, pool_name)) in enumerate(bases):
            pool = self.small if pool_name == "small" else self.large
            segs = self._expandable[id(pool)]
            ranges = sorted(groups[(stream, pool_name)])
            span = ranges[-1][0] + ranges[-1][1] - base
            va_size = max(segs.address_space_bytes, span)
            if k + 1 < len(bases):
                va_size = min(va_size, bases[k + 1][0] - base)   # never overlap the next range
            if va_size < span:
                raise ValueError(f"expandable segments of stream {stream} overlap another stream's")
            self.device.adopt_address_space(base, va_size)
            pool.add_segment(base, va_size, stream)
            cursor = base
            for addr, size in ranges:
                if addr > cursor:
                    segs.unmapped.add(cursor, addr - cursor, stream, pool)
                self.device.adopt_mapped(addr, size)
                self.total_allocated_memory += size
                # Blocks tile each mapped range; free ones cannot merge across the unmapped gaps
                # because unmapped pages are not in the free list.
                self._load_blocks(pool, addr, size, stream, by_segment.pop(addr, None))
                cursor = addr + size
            if cursor < base + va_size:
                segs.unmapped.add(cursor, base + va_size - cursor, stream, pool)

    # ------------------------------------------------------------------ malloc
    def rounded_size(self, size_bytes: int) -> int:
        """``round_size`` with this policy's ``roundup_power2_divisions``."""
        if size_bytes < K_MIN_BLOCK_SIZE:
            return K_MIN_BLOCK_SIZE
        if self.roundup_power2_divisions is None:
            return -(-size_bytes // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE
        return round_size(size_bytes, self.roundup_power2_divisions)

    def would_reuse(self, size_bytes: int, stream: int) -> bool:
        """Tell (changing nothing) whether a request would be served from cached free blocks.

        The first step of ``DeviceCachingAllocator::malloc`` (``c10/cuda/CUDACachingAllocator.cpp``):
        ``round_size`` -> ``get_pool`` -> ``get_free_block`` with its oversize rules. A replay uses it
        to tell an ``empty_cache()`` from the cudaMalloc-failure path (which needs a miss here).
        """
        if size_bytes == 0:
            return True
        size = self.rounded_size(size_bytes)
        pool = self.small if size <= K_SMALL_SIZE else self.large
        return self._get_free_block(pool, stream, size) >= 0

    def _do_malloc(self, alloc_id: int, size_bytes: int, stream: int) -> tuple[int, int]:
        self.last_stream = stream
        if size_bytes == 0:
            return 0, 0   # PyTorch returns nullptr for 0 bytes without touching the allocator
        if size_bytes < K_MIN_BLOCK_SIZE:
            size = K_MIN_BLOCK_SIZE
        elif self.roundup_power2_divisions is None:
            size = -(-size_bytes // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE
        else:
            size = round_size(size_bytes, self.roundup_power2_divisions)
        small = size <= K_SMALL_SIZE
        pool = self.small if small else self.large
        if self.gc_enabled:
            pool.clock += 1
        if self._plain_best_fit:
            # No oversize rule can refuse the best fit when max_split_size is unlimited.
            key = pool.pop_best_fit(stream, size)
        else:
            key = self._get_free_block(pool, stream, size)
            if key >= 0:
                pool.take(stream, key)
        if key >= 0:
            self.n_pool_hits += 1
        else:
            key = self._alloc_with_retries(pool, stream, size, size_bytes)
        block_size = key >> ADDR_BITS
        addr = key & ADDR_MASK
        remaining = block_size - size
        if small or self._expandable is not None:
            split = remaining >= K_MIN_BLOCK_SIZE
        else:
            split = size < self._max_split and remaining > K_SMALL_SIZE
        if split:
            pool.add(addr + size, remaining, stream)
            self.n_splits += 1
            block_size = size
        return addr, block_size

    def _get_free_block(self, pool: FreeList, stream: int, size: int) -> int:
        if self._expandable is not None:
            key = self._expandable[id(pool)].get_free_block(stream, size)
        else:
            key = pool.best_fit(stream, size)
        if key < 0:
            return -1
        block_size = key >> ADDR_BITS
        max_split = self._max_split
        # The two oversize rules (get_free_block): the best fit is the only candidate tried.
        if size < max_split:
            if block_size >= max_split:
                return -1
        elif block_size >= size + self.max_non_split_rounding_bytes:
            return -1
        return key

    def _alloc_with_retries(self, pool: FreeList, stream: int, size: int, size_bytes: int) -> int:
        if self.gc_enabled:
            self.garbage_collect_cached_blocks()
        alloc_size = pytorch_allocation_size(size)
        key = self._alloc_block(pool, stream, size, alloc_size)
        if key < 0 and self._release_available_cached_blocks(pool, stream, size):
            key = self._alloc_block(pool, stream, size, alloc_size)
        if key < 0:
            self.release_cached_blocks()
            self.num_alloc_retries += 1
            key = self._alloc_block(pool, stream, size, alloc_size)
        if key < 0:
            self.on_device_memory("oom", -1, size, stream)
            raise OutOfMemory(size_bytes, f"CUDA out of memory. Tried to allocate {alloc_size} bytes; "
                                          f"{self.total_allocated_memory} bytes reserved by PyTorch, "
                                          f"{self.allocated_bytes} allocated")
        return key

    def _alloc_block(self, pool: FreeList, stream: int, size: int, alloc_size: int) -> int:
        """``alloc_block``: a new segment (or mapped pages); return its free block's key or -1."""
        if (self.allowed_memory_maximum is not None
                and self.total_allocated_memory + alloc_size > self.allowed_memory_maximum):
            return -1
        if self._expandable is not None:
            return self._expandable[id(pool)].allocate(stream, size)
        try:
            addr = self.device.malloc(alloc_size)
        except DeviceOutOfMemory:
            return -1
        pool.add_segment(addr, alloc_size, stream)
        self.on_device_memory("segment_alloc", addr, alloc_size, stream)
        return alloc_size << ADDR_BITS | addr

    def on_device_memory(self, action: str, addr: int, size_bytes: int, stream: int) -> None:
        """Account one device call (and record it when ``record_decisions`` is on)."""
        if action in ("segment_alloc", "segment_map"):
            self.total_allocated_memory += size_bytes
        elif action in ("segment_free", "segment_unmap"):
            self.total_allocated_memory -= size_bytes
        if self.record_decisions:
            self.decisions.append((action, addr, size_bytes, stream))

    # ------------------------------------------------------------------ releasing cache
    def _release_segment(self, pool: FreeList, addr: int) -> int:
        stream = pool.segment_stream(addr)
        size = super()._release_segment(pool, addr)
        self.on_device_memory("segment_free", addr, size, stream)
        return size

    def _release_available_cached_blocks(self, pool: FreeList, stream: int, size: int) -> bool:
        """Free one cached block big enough, else oversize blocks from the largest down (needs max_split_size).

        Only a wholly free segment can be released (cudaFree takes a segment's base), so free pieces
        of split segments are passed over. PyTorch's own rules never leave such a piece at or above
        max_split_size, but a start state recorded under other settings (a snapshot taken without
        max_split_size, replayed with it) does: a 230 MiB free piece of a partly used segment must
        not be taken for a segment.
        """
        max_split = self._max_split
        if max_split == SIZE_MAX or self._expandable is not None:
            return False
        key_size = max_split if size < max_split else size
        key = pool.best_fit(stream, key_size)
        while key >= 0 and not pool.is_whole_free(key & ADDR_MASK):
            key = pool.next_key(stream, key)
        if key >= 0:
            self._release_segment(pool, key & ADDR_MASK)
            return True
        released = 0
        for key in reversed(list(pool.keys(stream))):
            block_size = key >> ADDR_BITS
            if released >= key_size or block_size < max_split:
                break
            addr = key & ADDR_MASK
            if pool.is_whole_free(addr):
                released += self._release_segment(pool, addr)
        return released >= key_size

    def release_cached_blocks(self) -> None:
        """``release_cached_blocks``: free every unsplit free block (large pool, then small); unmap pages."""
        if self._expandable is not None:
            for pool in (self.large, self.small):
                self._expandable[id(pool)].release()
            return
        for pool in (self.large, self.small):
            for addr, _size, _stream in pool.whole_free_segments():
                self._release_segment(pool, addr)

    def release_free_segments(self, stream_key: int | None = None) -> int:
        before = self.total_allocated_memory
        if stream_key is None:
            self.release_cached_blocks()
        else:
            for pool in (self.large, self.small):
                for addr, _size, _stream in pool.whole_free_segments(stream_key):
                    self._release_segment(pool, addr)
        return before - self.total_allocated_memory

    def empty_cache(self) -> None:
        """``torch.cuda.empty_cache()`` = ``release_cached_blocks``."""
        self.release_cached_blocks()

    def garbage_collect_cached_blocks(self) -> None:
        """Free old unsplit large-pool blocks until reserved is under threshold × allowed maximum."""
        gc_threshold = int(self.garbage_collection_threshold * self.allowed_memory_maximum)
        if self.total_allocated_memory <= gc_threshold:
            return
        target = self.total_allocated_memory - gc_threshold
        pool = self.large
        clock = pool.clock
        candidates = [(addr, size, clock - (pool.inserted_clock(addr) or 0))
                      for addr, size, _ in pool.whole_free_segments()]
        if not candidates:
            return
        total_age = sum(age for _, _, age in candidates)
        count = len(candidates)
        reclaimed = 0
        freed = True
        while reclaimed < target and freed and count > 0:
            threshold = total_age / count
            freed = False
            # Free every block at least as old as the average; do not stop at the target (as PyTorch).
            for item in list(candidates):
                addr, size, age = item
                if age >= threshold:
                    freed = True
                    reclaimed += size
                    total_age -= age
                    count -= 1
                    candidates.remove(item)
                    self._release_segment(pool, addr)
        if reclaimed:
            self.n_gc_batches += 1

    # ------------------------------------------------------------------ reporting
    def _do_free(self, alloc_id: int, addr: int, allocated_bytes: int, stream: int) -> None:
        if allocated_bytes == 0:
            return
        # Small-pool blocks are at most 1 MiB and large-pool blocks above it, so the size names the pool.
        pool = self.small if allocated_bytes <= K_SMALL_SIZE else self.large
        self.n_merges += pool.free(addr, allocated_bytes, stream)

    def segment_bytes(self) -> int:
        if self._expandable is not None:
            return sum(e.mapped_bytes() for e in self._expandable.values())
        return self.small.segment_bytes + self.large.segment_bytes

    def params(self) -> dict[str, Any]:
        return {
            "max_split_size_bytes": self.max_split_size_bytes,
            "max_non_split_rounding_bytes": self.max_non_split_rounding_bytes,
            "roundup_power2_divisions": list(self.roundup_power2_divisions or ()) or None,
            "garbage_collection_threshold": self.garbage_collection_threshold,
            "memory_fraction": self.memory_fraction,
            "expandable_segments": self.expandable_segments,
            "record_decisions": self.record_decisions,
        }

    def _pool_of_live(self, addr: int, allocated_bytes: int) -> FreeList:
        return self.small if allocated_bytes <= K_SMALL_SIZE else self.large

    def _other_pieces(self) -> list[tuple[FreeList, int, int]]:
        if self._expandable is None:
            return []
        return [(e.pool, addr, size) for e in self._expandable.values()
                for addr, size in e.unmapped.size_at.items()]

    def check_invariants(self) -> None:
        """Check pools and tiling, and that PyTorch's reserved counter matches the device."""
        super().check_invariants()
        assert self.total_allocated_memory == self.segment_bytes(), "total_allocated_memory drifted"
        assert self.device.reserved_bytes == self.total_allocated_memory, "device and PyTorch disagree on reserved"
        for _a, _r, allocated, _s in self.live.values():
            assert allocated % K_MIN_BLOCK_SIZE == 0, "block size not a multiple of 512"


def _rows(table: Any, columns: tuple[str, ...]) -> list[tuple]:
    """Rows of a DataFrame (or a list of dicts) as tuples of ``columns``."""
    if hasattr(table, "columns"):
        return list(zip(*(table[c].tolist() for c in columns)))
    return [tuple(row[c] for c in columns) for row in table]
