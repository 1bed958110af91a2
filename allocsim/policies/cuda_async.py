"""``cuda-async``: the driver's stream-ordered pool (cudaMallocAsync) with a release threshold.

What is modelled (research notes ``rmm_peers.md`` §2, ``paddle_cupy.md`` §3.6):

* one pool for all streams: a completed free is reusable by any stream (the driver's reuse
  policies after a synchronisation make every completed free available);
* best fit with splitting and coalescing at 512 B granularity (CuPy's ``MemoryAsyncPool``
  rounding; the driver's own sub-allocation rules are not documented);
* the pool grows in steps of ``growth_granularity_bytes`` (32 MiB: CuPy's observation that "the
  first allocation will bump the size to 32n MiB"; an inference about undocumented driver code);
* ``release_threshold_bytes`` (``cudaMemPoolAttrReleaseThreshold``, CUDA default 0): when the pool
  holds more than the threshold, the driver returns memory at the next synchronisation.

Simplification: every completed free is treated as a synchronisation point, where wholly free
segments are released, largest first, until the pool holds at most the threshold (what
``cudaMemPoolTrimTo(pool, threshold)`` does). ``empty_cache`` trims to 0. A failed growth
releases every free segment and retries, as PyTorch's cudaMallocAsync backend does after a sync.
"""

from __future__ import annotations

from typing import Any

from ..units import MiB
from .pool import PoolPolicy


class CudaAsyncPolicy(PoolPolicy):
    """cudaMallocAsync pool: memory held above ``release_threshold_bytes`` goes back at each sync (each completed free)."""

    name = "cuda-async"

    def __init__(self, upstream: Any, *, release_threshold_bytes: int = 0, alignment_bytes: int = 512,
                 growth_granularity_bytes: int = 32 * MiB):
        super().__init__(upstream, alignment_bytes=alignment_bytes, growth="round",
                         chunk_bytes=growth_granularity_bytes, min_split_remainder_bytes=alignment_bytes,
                         stream_bound=False, oom_release="all")
        self.release_threshold_bytes = release_threshold_bytes
        self.growth_granularity_bytes = growth_granularity_bytes
        self._idle: set[int] = set()   # starts of segments that were wholly free after a free
        self.n_trims = 0
        self._attach_kernel()

    def _do_free(self, alloc_id: int, addr: int, allocated_bytes: int, stream: int) -> None:
        if allocated_bytes == 0:
            return
        pool = self.large
        start = addr
        if pool.segment_size(addr) is None:
            prev = pool.block_ending_at(addr)
            start = addr if prev is None else prev
        self.n_merges += pool.free(addr, allocated_bytes, 0)
        if pool.block_size(start) == pool.segment_size(start):
            self._idle.add(start)
        if pool.segment_bytes > self.release_threshold_bytes:
            self.trim_to(self.release_threshold_bytes)

    def trim_to(self, keep_bytes: int) -> int:
        """``cudaMemPoolTrimTo``: release wholly free segments, largest first, until at most ``keep_bytes`` are held."""
        pool = self.large
        idle = [a for a in self._idle if pool.segment_size(a) is not None and pool.is_whole_free(a)]
        idle.sort(key=lambda a: (-pool.segment_size(a), a))
        released = 0
        for addr in idle:
            if pool.segment_bytes <= keep_bytes:
                break
            released += self._release_segment(pool, addr)
        self._idle = {a for a in idle if pool.segment_size(a) is not None}
        if released:
            self.n_trims += 1
        return released

    def release_free_segments(self, stream_key: int | None = None) -> int:
        self._idle.clear()
        return super().release_free_segments(stream_key)

    def empty_cache(self) -> None:
        """Trim the pool to nothing (``cudaMemPoolTrimTo(pool, 0)``)."""
        for addr, _size, _ in self.large.whole_free_segments():
            self._idle.add(addr)
        self.trim_to(0)

    def params(self) -> dict[str, Any]:
        return {"release_threshold_bytes": self.release_threshold_bytes, "alignment_bytes": self.alignment_bytes,
                "growth_granularity_bytes": self.growth_granularity_bytes}

