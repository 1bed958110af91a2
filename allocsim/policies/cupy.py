"""``cupy``: CuPy's default ``MemoryPool``: 512 B units, one arena per stream, exact-size segments.

Rules (research notes ``paddle_cupy.md`` §3.1-3.5, §5):

* sizes round up to 512 B (``ALLOCATION_UNIT_SIZE``); 0 bytes never reaches the pool;
* each stream has its own arena; a chunk returns to the arena it came from; no cross-stream reuse;
* best fit (smallest free chunk that fits); the low part is allocated, the remainder stays free.
  Real CuPy breaks size ties arbitrarily (v13) or by Python object address (v14.1+); here the
  lowest address wins, so replays are deterministic;
* a miss cudaMallocs exactly the rounded size (a new segment);
* on cudaMalloc failure (or when ``limit_bytes`` would be exceeded) ``free_all_blocks()``
  releases every wholly merged free chunk of **all** arenas and the malloc is retried once
  (CuPy retries again after ``gc.collect()``, which frees nothing more in a replay).
"""

from __future__ import annotations

from typing import Any

from .pool import PoolPolicy

#: ``ALLOCATION_UNIT_SIZE``: "cudaMalloc() is aligned to at least 512 bytes".
ALLOCATION_UNIT_SIZE = 512


class CuPyPolicy(PoolPolicy):
    """CuPy MemoryPool: per-stream arenas of exact cudaMallocs, free_all_blocks then retry on OOM."""

    name = "cupy"

    def __init__(self, upstream: Any, *, limit_bytes: int = 0):
        super().__init__(upstream, alignment_bytes=ALLOCATION_UNIT_SIZE, growth="exact",
                         min_split_remainder_bytes=ALLOCATION_UNIT_SIZE, stream_bound=True, oom_release="all")
        self.limit_bytes = limit_bytes
        self._attach_kernel()

    def _device_malloc(self, segment_bytes: int) -> int:
        # set_limit: CuPy counts its own cudaMalloc'd bytes (total_bytes), not the driver's rounding.
        if self.limit_bytes and self.segment_bytes() + segment_bytes > self.limit_bytes:
            self.release_free_segments(None)
            if self.segment_bytes() + segment_bytes > self.limit_bytes:
                return -1
        return super()._device_malloc(segment_bytes)

    def params(self) -> dict[str, Any]:
        return {"limit_bytes": self.limit_bytes}
