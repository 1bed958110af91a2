"""``paddle-naive``: PaddlePaddle's ``naive_best_fit`` (BuddyAllocator): a big slice of the GPU up front.

Rules (research notes ``paddle_cupy.md`` §1.3, §5):

* a request costs ``align(size + 64 B header, 256)`` (the header is the ``MemoryBlock::Desc``
  PaddlePaddle reserves in each block; 64 B is the notes' count of its fields: an inference);
* the first refill takes ``max(init, request)`` with ``init = fraction × 0.95 × free memory``
  (``FLAGS_fraction_of_gpu_memory_to_use`` = 0.92, 5 % held back); later refills take
  ``max(realloc, request)`` from what is free then; ``initial_gpu_memory_bytes`` /
  ``reallocate_gpu_memory_bytes`` replace the fraction (Paddle's ``*_in_mb`` flags);
* requests above the largest chunk (``max(init, realloc)`` at start) bypass the pool: a direct
  cudaMalloc, cudaFree'd on free;
* best fit by (size, address) over one pool for all streams; the low part is allocated; blocks
  merge with free neighbours on free;
* nothing goes back to the device except on ``empty_cache`` (whole free chunks): a failed refill
  is ``OutOfMemory`` at once (the "can't use most of memory" issue, Paddle#15644).

``free memory`` is the device's capacity minus what it holds; on a device without capacity
``gpu_memory_bytes`` (default 80 GiB) stands in for it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..device import DeviceOutOfMemory
from ..errors import OutOfMemory
from ..units import GiB
from .paddle import GPU_MIN_CHUNK_SIZE
from .pool import PoolPolicy

#: ``fraction_reserve_gpu_memory`` (a C++ float): share of free memory Paddle never takes.
FRACTION_RESERVE_GPU_MEMORY = np.float32(0.05)
DEFAULT_GPU_MEMORY_BYTES = 80 * GiB


class PaddleNaivePolicy(PoolPolicy):
    """Paddle naive_best_fit: one pool of big refill chunks sized as a fraction of free GPU memory."""

    name = "paddle-naive"

    def __init__(self, upstream: Any, *, fraction_of_gpu_memory_to_use: float = 0.92,
                 initial_gpu_memory_bytes: int = 0, reallocate_gpu_memory_bytes: int = 0,
                 gpu_memory_bytes: int | None = None, block_header_bytes: int = 64):
        if not 0.0 < fraction_of_gpu_memory_to_use <= 1.0:
            raise ValueError("fraction_of_gpu_memory_to_use must be in (0, 1]")
        # MemoryBlock::Split refuses when the remainder is <= header + padding (no room for a Desc).
        super().__init__(upstream, alignment_bytes=GPU_MIN_CHUNK_SIZE, growth="exact",
                         min_split_remainder_bytes=block_header_bytes + 1, stream_bound=False,
                         oom_release="none")
        self.fraction_of_gpu_memory_to_use = fraction_of_gpu_memory_to_use
        self.initial_gpu_memory_bytes = initial_gpu_memory_bytes
        self.reallocate_gpu_memory_bytes = reallocate_gpu_memory_bytes
        self.gpu_memory_bytes = gpu_memory_bytes
        self.block_header_bytes = block_header_bytes
        self.segment_size = self._refill_size
        self.max_chunk_bytes: int | None = None
        self._huge: dict[int, int] = {}   # addr -> bytes of direct (HUGE_CHUNK) allocations
        self._attach_kernel()

    # ------------------------------------------------------------------ sizing
    def _round(self, size_bytes: int) -> int:
        size = size_bytes + self.block_header_bytes
        return -(-size // GPU_MIN_CHUNK_SIZE) * GPU_MIN_CHUNK_SIZE

    def _free_device_bytes(self) -> int:
        capacity = self.device.capacity_bytes
        if capacity is None:
            capacity = self.gpu_memory_bytes or DEFAULT_GPU_MEMORY_BYTES
        return max(capacity - self.device.reserved_bytes, 0)

    def _gpu_alloc_size(self, flag_bytes: int) -> int:
        """``GpuAllocSize``: the flag's bytes, or fraction × (free − 5 %) in Paddle's float arithmetic."""
        if flag_bytes > 0:
            return flag_bytes
        available = self._free_device_bytes()
        reserving = int(FRACTION_RESERVE_GPU_MEMORY * np.float32(available))
        available_to_alloc = available - reserving
        if available_to_alloc < GPU_MIN_CHUNK_SIZE:
            return 0
        return int(available_to_alloc * self.fraction_of_gpu_memory_to_use)

    def _refill_size(self, size: int) -> int:
        first = self.allocated_bytes == 0 and self.pool_free_bytes() == 0 and not self._huge
        chunk = self._gpu_alloc_size(self.initial_gpu_memory_bytes if first else self.reallocate_gpu_memory_bytes)
        return max(chunk, size)

    # ------------------------------------------------------------------ requests
    def _do_malloc(self, alloc_id: int, size_bytes: int, stream: int) -> tuple[int, int]:
        if size_bytes == 0:
            return 0, 0
        if self.max_chunk_bytes is None:
            # GpuMaxChunkSize() = max(init, realloc), fixed when the BuddyAllocator is built.
            self.max_chunk_bytes = max(self._gpu_alloc_size(self.initial_gpu_memory_bytes),
                                       self._gpu_alloc_size(self.reallocate_gpu_memory_bytes))
        size = self._round(size_bytes)
        if size > self.max_chunk_bytes:
            try:
                addr = self.device.malloc(size)
            except DeviceOutOfMemory as exc:
                raise OutOfMemory(size_bytes, f"paddle-naive huge chunk: {exc}") from None
            self._huge[addr] = size
            return addr, size
        return super()._do_malloc(alloc_id, size_bytes, stream)

    def _do_free(self, alloc_id: int, addr: int, allocated_bytes: int, stream: int) -> None:
        if addr in self._huge:
            del self._huge[addr]
            self.device.free(addr)
            return
        super()._do_free(alloc_id, addr, allocated_bytes, stream)

    def _is_outside_pools(self, addr: int) -> bool:
        return addr in self._huge

    def segment_bytes(self) -> int:
        return super().segment_bytes() + sum(self._huge.values())

    def huge_chunks(self) -> dict[int, int]:
        """``addr -> bytes`` of the direct cudaMallocs that bypass the pool (for reports; a copy)."""
        return dict(self._huge)

    def params(self) -> dict[str, Any]:
        return {
            "fraction_of_gpu_memory_to_use": self.fraction_of_gpu_memory_to_use,
            "initial_gpu_memory_bytes": self.initial_gpu_memory_bytes,
            "reallocate_gpu_memory_bytes": self.reallocate_gpu_memory_bytes,
            "gpu_memory_bytes": self.gpu_memory_bytes, "block_header_bytes": self.block_header_bytes,
        }
