"""``bestfit``: a caching pool built from the reusable pieces; presets configure or extend it.

One request goes: round up to ``alignment_bytes`` → pick the pool (one, or small/large) → best fit
among the free blocks of the request's stream key → on a miss, grow by a new segment whose size
comes from the growth rule (on device OOM: release wholly free segments, retry) → split the block
when the remainder is at least ``min_split_remainder_bytes``. A completed free merges the block with
its free neighbours inside its segment. Nothing moves a live block.

The methods below are the readable reference. With the compiled kernel (``kernel.py``) the pools
are compiled ``FreeList``s and ``malloc``/``free_completed``/``replay_run`` run in C with the same
decisions; a miss still comes back here (``_find_elsewhere``, ``_grow``), and so do releases.
A subclass whose own ``__init__`` sets anything the kernel reads calls ``_attach_kernel()`` last.
"""

from __future__ import annotations

from typing import Any

from ..device import DeviceOutOfMemory
from ..errors import OutOfMemory
from ..units import MiB
from . import kernel
from .base import Policy
from .freelist import ADDR_BITS, ADDR_MASK, FreeList, segment_finder
from ..settings.pytorch_sizes import K_SMALL_SIZE
from .growth import make_growth

#: What a pool releases before retrying a failed device allocation, in order.
OOM_RELEASE_MODES = ("all", "stream-then-all", "none")


class PoolPolicy(Policy):
    """Best-fit pool with splitting, coalescing, a growth rule and release-and-retry on device OOM.

    Knobs: ``alignment_bytes`` (request rounding), ``growth`` (``exact`` / ``chunk`` = max(request,
    ``chunk_bytes``) / ``round`` = up to a multiple of ``chunk_bytes`` / ``pytorch`` = PyTorch's
    ``get_allocation_size``), ``min_split_remainder_bytes``, ``small_pool_max_bytes`` (requests up to
    it use a separate small pool; None = one pool; ``growth="pytorch"`` defaults it to 1 MiB),
    ``stream_bound`` (free blocks are reused only by their segment's stream), ``carve_from_high_end``
    (Paddle hands out the top of a block), ``oom_release`` (what to release before the retry).
    A zero-byte request returns address 0 without touching the pool (PyTorch and CuPy do the same).
    """

    name = "bestfit"

    def __init__(self, upstream: Any, *, alignment_bytes: int = 512, growth: str = "exact",
                 chunk_bytes: int = 2 * MiB, min_split_remainder_bytes: int = 512,
                 small_pool_max_bytes: int | None = None, stream_bound: bool = False,
                 carve_from_high_end: bool = False, oom_release: str = "all"):
        super().__init__(upstream)
        if alignment_bytes <= 0:
            raise ValueError(f"alignment_bytes must be > 0, got {alignment_bytes}")
        if oom_release not in OOM_RELEASE_MODES:
            raise ValueError(f"oom_release must be one of {OOM_RELEASE_MODES}, got {oom_release!r}")
        if growth in ("chunk", "round") and chunk_bytes <= 0:
            raise ValueError(f"chunk_bytes must be > 0 for growth={growth!r}")
        if small_pool_max_bytes is None and growth == "pytorch":
            small_pool_max_bytes = K_SMALL_SIZE
        self.alignment_bytes = alignment_bytes
        self.address_alignment_bytes = alignment_bytes
        self.growth_name = growth
        self.chunk_bytes = chunk_bytes
        self.segment_size = make_growth(growth, chunk_bytes)
        self.min_split_remainder_bytes = max(min_split_remainder_bytes, 1)
        self.small_pool_max_bytes = small_pool_max_bytes
        self.stream_bound = stream_bound
        self.carve_from_high_end = carve_from_high_end
        self.oom_release = oom_release
        self._compiled_route = kernel.active()
        self._kernel = None
        self.live, self.pending = kernel.new_live_state(compiled_route=self._compiled_route)
        self.large = self._new_free_list()
        self.small = self._new_free_list() if small_pool_max_bytes is not None else self.large
        self.pools = (self.large,) if self.small is self.large else (self.small, self.large)
        # addr -> pool of a live block, kept only when there are two pools to choose between.
        self._pool_of: dict[int, FreeList] = {}
        # addr -> owning stream key of a live block taken from another stream's free blocks.
        self._foreign: dict[int, int] = {}
        self._has_after_free = False
        self.last_stream = 0
        self.n_released_segments = 0
        self.released_bytes = 0
        if type(self).__init__ is PoolPolicy.__init__:
            self._attach_kernel()

    # ------------------------------------------------------------------ the compiled kernel
    def _new_free_list(self, *, track_age: bool = False) -> FreeList:
        """A free list of this policy's route (compiled or the Python reference)."""
        return kernel.new_free_list(compiled_route=self._compiled_route, track_age=track_age)

    def _attach_kernel(self) -> None:
        """Let the compiled kernel serve this policy's hot path if it can (call once, at the end of ``__init__``)."""
        kernel.attach(self)

    def _kernel_config(self) -> dict[str, Any] | None:
        """What the kernel may serve for this policy and the rules it needs (see ``kernel.attach``).

        It serves ``malloc`` while ``_do_malloc`` and ``_round`` are this class's, ``free_completed``
        while ``_do_free`` is, and calls the Python hooks a subclass defines: ``_find_elsewhere``
        and ``_grow`` on a miss, ``_after_free`` after a free when ``_has_after_free``.
        """
        cls = type(self)
        config = self._kernel_common()
        config.update(
            serve_malloc=config["serve_malloc"] and cls._do_malloc is PoolPolicy._do_malloc
            and cls._round is PoolPolicy._round,
            serve_free=config["serve_free"] and cls._do_free is PoolPolicy._do_free,
            flavor="pool", pool_of=self._pool_of, foreign=self._foreign, miss=self._grow,
            find_elsewhere=self._find_elsewhere if cls._find_elsewhere is not PoolPolicy._find_elsewhere else None,
            after_free=self._after_free if self._has_after_free else None,
            alignment=self.alignment_bytes,
            small_max=self.small_pool_max_bytes if self.small is not self.large else None,
            stream_bound=self.stream_bound, carve_from_high_end=self.carve_from_high_end,
            min_split_remainder=self.min_split_remainder_bytes, max_split=0, max_non_split_rounding=0)
        return config

    def _kernel_common(self) -> dict[str, Any]:
        """The kernel settings every pool flavour shares (the policy's state and the reference methods)."""
        cls = type(self)
        plain_calls = (cls.malloc is Policy.malloc and cls.free_completed is Policy.free_completed
                       and cls.free_requested is Policy.free_requested)
        return {
            "serve_malloc": plain_calls, "serve_free": plain_calls, "serve_runs": True,
            "live": self.live, "small": self.small, "large": self.large,
            "generic_malloc": Policy.malloc, "generic_free_completed": Policy.free_completed,
            "out_of_memory": OutOfMemory, "gc": False, "serve_requests": not self._hooks_free_requested,
        }

    # ------------------------------------------------------------------ request path
    def _round(self, size_bytes: int) -> int:
        align = self.alignment_bytes
        return -(-size_bytes // align) * align

    def _do_malloc(self, alloc_id: int, size_bytes: int, stream: int) -> tuple[int, int]:
        self.last_stream = stream
        if size_bytes == 0:
            return 0, 0
        size = self._round(size_bytes)
        pool = self.small if size <= (self.small_pool_max_bytes or 0) else self.large
        skey = stream if self.stream_bound else 0
        owner = skey
        key = pool.pop_best_fit(skey, size)
        if key >= 0:
            self.n_pool_hits += 1
        else:
            found = self._find_elsewhere(pool, skey, size)
            if found is not None:
                key, owner = found
                pool.take(owner, key)
                self.n_pool_hits += 1
            else:
                key = self._grow(pool, skey, size, size_bytes)
        block_size = key >> ADDR_BITS
        addr = key & ADDR_MASK
        remaining = block_size - size
        if remaining >= self.min_split_remainder_bytes:
            self.n_splits += 1
            if self.carve_from_high_end:
                pool.add(addr, remaining, owner)
                addr += remaining
            else:
                pool.add(addr + size, remaining, owner)
            block_size = size
        if owner != skey:
            self._foreign[addr] = owner
        if len(self.pools) > 1:
            self._pool_of[addr] = pool
        return addr, block_size

    def _find_elsewhere(self, pool: FreeList, stream_key: int, size_bytes: int) -> tuple[int, int] | None:
        """Hook: serve a miss from another stream's free blocks; return ``(key, owner)`` or None."""
        return None

    def _grow(self, pool: FreeList, stream_key: int, size: int, size_bytes: int) -> int:
        """Make a new segment for ``size`` (releasing cache and retrying on device OOM); return its key."""
        segment_bytes = self.segment_size(size)
        addr = self._device_malloc(segment_bytes)
        if addr < 0:
            if self.oom_release == "stream-then-all":
                scopes: tuple[int | None, ...] = (stream_key, None)
            elif self.oom_release == "all":
                scopes = (None,)
            else:
                scopes = ()
            for scope in scopes:
                self.release_free_segments(scope)
                addr = self._device_malloc(segment_bytes)
                if addr >= 0:
                    break
            else:
                raise OutOfMemory(size_bytes, f"{self.name} cannot grow by {segment_bytes} bytes: "
                                              f"{self.device.reserved_bytes} bytes reserved, "
                                              f"capacity {self.device.capacity_bytes}")
        pool.add_segment(addr, segment_bytes, stream_key)
        return segment_bytes << ADDR_BITS | addr

    def _device_malloc(self, segment_bytes: int) -> int:
        """Ask the device for a segment; return its address or -1 when the device is out of memory."""
        try:
            return self.device.malloc(segment_bytes)
        except DeviceOutOfMemory:
            return -1

    # ------------------------------------------------------------------ free path
    def _do_free(self, alloc_id: int, addr: int, allocated_bytes: int, stream: int) -> None:
        if allocated_bytes == 0:
            return
        pool = self._pool_of.pop(addr) if len(self.pools) > 1 else self.large
        if self._foreign and addr in self._foreign:
            skey = self._foreign.pop(addr)
        else:
            skey = stream if self.stream_bound else 0
        self.n_merges += pool.free(addr, allocated_bytes, skey)
        if self._has_after_free:
            self._after_free(pool, skey)

    def _after_free(self, pool: FreeList, stream_key: int) -> None:
        """Hook run after every completed free when ``_has_after_free`` is set (idle-chunk release)."""

    # ------------------------------------------------------------------ releasing cache
    def release_free_segments(self, stream_key: int | None = None) -> int:
        """Return every wholly free segment (of one stream key, or all) to the device; return the bytes."""
        released = 0
        for pool in self.pools:
            for addr, _size, _skey in pool.whole_free_segments(stream_key):
                released += self._release_segment(pool, addr)
        return released

    def _release_segment(self, pool: FreeList, addr: int) -> int:
        size = pool.remove_segment(addr)
        self.device.free(addr)
        self.n_released_segments += 1
        self.released_bytes += size
        return size

    def empty_cache(self) -> None:
        """Release every wholly free segment (``torch.cuda.empty_cache()``, CuPy ``free_all_blocks``)."""
        self.release_free_segments(None)

    # ------------------------------------------------------------------ reporting
    def segment_bytes(self) -> int:
        """Bytes of device allocations as the pool sizes them (the device may round them up)."""
        return sum(pool.segment_bytes for pool in self.pools)

    def pool_free_bytes(self) -> int:
        """Bytes in free blocks of the pool (excludes the device's rounding of segments)."""
        return sum(pool.free_bytes for pool in self.pools)

    def cached_free_bytes(self) -> int:
        """Bytes reserved but not handed out: free blocks plus the device's rounding of segments."""
        return self.pool_free_bytes() + self.device.reserved_bytes - self.segment_bytes()

    def largest_free_block_bytes(self) -> int:
        return max(pool.largest() for pool in self.pools)

    def stranded_bytes(self, stream: int | None = None) -> int:
        """Free cached bytes only other streams may reuse (0 unless stream-bound); default: the last request's stream."""
        if not self.stream_bound:
            return 0
        stream = self.last_stream if stream is None else stream
        return sum(pool.free_bytes - pool.stream_bytes(stream) for pool in self.pools)

    def params(self) -> dict[str, Any]:
        return {
            "alignment_bytes": self.alignment_bytes, "growth": self.growth_name,
            "chunk_bytes": self.chunk_bytes, "min_split_remainder_bytes": self.min_split_remainder_bytes,
            "small_pool_max_bytes": self.small_pool_max_bytes, "stream_bound": self.stream_bound,
            "carve_from_high_end": self.carve_from_high_end, "oom_release": self.oom_release,
        }

    def check_invariants(self) -> None:
        """Check the free lists and that live and free blocks tile every segment exactly."""
        super().check_invariants()
        pieces: list[tuple[FreeList, int, int]] = []
        for pool in self.pools:
            pool.check()
            pieces.extend((pool, addr, size) for addr, size, _ in pool.blocks())
        for addr, _req, allocated, _stream in self.live.values():
            if allocated and not self._is_outside_pools(addr):
                pieces.append((self._pool_of_live(addr, allocated), addr, allocated))
        pieces.extend(self._other_pieces())
        check_tiling(self.pools, pieces)
        assert self.device.reserved_bytes >= self.segment_bytes(), "device holds less than the pool's segments"

    def _pool_of_live(self, addr: int, allocated_bytes: int) -> FreeList:
        """The pool a live block came from (for checks)."""
        return self._pool_of[addr] if len(self.pools) > 1 else self.large

    def _other_pieces(self) -> list[tuple[FreeList, int, int]]:
        """Hook: further ``(pool, addr, size)`` ranges that tile segments (unmapped pages)."""
        return []

    def _is_outside_pools(self, addr: int) -> bool:
        """Hook for blocks that live outside the free lists' segments (Paddle's huge chunks)."""
        return False


def check_tiling(pools: tuple[FreeList, ...], pieces: list[tuple[FreeList, int, int]]) -> None:
    """Assert that ``pieces`` (pool, addr, size) tile every segment of ``pools`` with no gap or overlap."""
    tiles: dict[tuple[int, int], list[tuple[int, int]]] = {}
    segments = {id(pool): pool.segment_size_at for pool in pools}
    for pool in pools:
        for start in segments[id(pool)]:
            tiles[id(pool), start] = []
    finders = {id(pool): segment_finder(pool) for pool in pools}
    for pool, addr, size in pieces:
        tiles[id(pool), finders[id(pool)](addr)].append((addr, size))
    for pool in pools:
        for start, size in segments[id(pool)].items():
            cursor = start
            for addr, length in sorted(tiles[id(pool), start]):
                assert addr == cursor, f"segment {start:#x}: gap or overlap at {cursor:#x}"
                cursor += length
            assert cursor == start + size, f"segment {start:#x} is not tiled to its end"
