"""``paddle``: PaddlePaddle's default ``auto_growth`` best-fit allocator, one pool per stream.

Rules (research notes ``paddle_cupy.md`` §1.2, §1.4, §5):

* sizes round up to 256 B (``GpuMinChunkSize``); a miss allocates ``max(request, chunk)`` with
  ``chunk = FLAGS_auto_growth_chunk_size_in_mb`` (default 0, so exactly the request);
* best fit over ``(size, ptr)``; the allocation is carved from the **high** end of the block and
  any remainder stays free at the low end (no minimum split size);
* one allocator per stream (StreamSafeCUDAAllocator): a block returns to its own stream's pool,
  and only once its free has completed; ``stream_safe=False`` (``FLAGS_use_stream_safe_cuda_allocator=false``)
  shares one pool among all streams;
* on cudaMalloc failure: free this stream's idle chunks and retry, then every stream's, retry,
  then ``OutOfMemory`` (the RetryAllocator's 10 s wait frees nothing in a replay).

``free_idle_chunk`` and ``free_when_no_cache_hit`` are Paddle's debug flags of the same names.
"""

from __future__ import annotations

from typing import Any

from ..units import align_up
from .freelist import FreeList
from .pool import PoolPolicy

#: ``platform::GpuMinChunkSize()``: Paddle's allocation alignment on CUDA.
GPU_MIN_CHUNK_SIZE = 256


class PaddlePolicy(PoolPolicy):
    """Paddle auto_growth: 256 B alignment, high-end carving, per-stream pools, chunk = max(request, chunk_size)."""

    name = "paddle"

    def __init__(self, upstream: Any, *, chunk_size_bytes: int = 0, alignment_bytes: int = GPU_MIN_CHUNK_SIZE,
                 free_idle_chunk: bool = False, free_when_no_cache_hit: bool = False, stream_safe: bool = True):
        if alignment_bytes <= 0:   # checked before it divides the chunk size below
            raise ValueError(f"alignment_bytes must be > 0, got {alignment_bytes}")
        # chunk_size_(std::max(AlignedSize(chunk_size, alignment), alignment))
        chunk = max(align_up(chunk_size_bytes, alignment_bytes), alignment_bytes)
        super().__init__(upstream, alignment_bytes=alignment_bytes, growth="chunk", chunk_bytes=chunk,
                         min_split_remainder_bytes=1, stream_bound=stream_safe, carve_from_high_end=True,
                         oom_release="stream-then-all")
        self.chunk_size_bytes = chunk_size_bytes
        self.free_idle_chunk = free_idle_chunk
        self.free_when_no_cache_hit = free_when_no_cache_hit
        self.stream_safe = stream_safe
        self._has_after_free = free_idle_chunk
        self._attach_kernel()

    def _grow(self, pool: FreeList, stream_key: int, size: int, size_bytes: int) -> int:
        if self.free_when_no_cache_hit:
            self.release_free_segments(stream_key)
        return super()._grow(pool, stream_key, size, size_bytes)

    def _after_free(self, pool: FreeList, stream_key: int) -> None:
        self.release_free_segments(stream_key)

    def params(self) -> dict[str, Any]:
        return {"chunk_size_bytes": self.chunk_size_bytes, "alignment_bytes": self.alignment_bytes,
                "free_idle_chunk": self.free_idle_chunk, "free_when_no_cache_hit": self.free_when_no_cache_hit,
                "stream_safe": self.stream_safe}
