"""``direct``: every request is a cudaMalloc and every completed free a cudaFree, as with no caching."""

from __future__ import annotations

from ..device import DeviceOutOfMemory
from ..errors import OutOfMemory
from .base import Policy


class DirectPolicy(Policy):
    """No pool at all: what ``PYTORCH_NO_CUDA_MEMORY_CACHING=1`` does; the device's granularity is the only rounding."""

    name = "direct"

    def _do_malloc(self, alloc_id: int, size_bytes: int, stream: int) -> tuple[int, int]:
        try:
            addr = self.device.malloc(size_bytes)
        except DeviceOutOfMemory as exc:
            raise OutOfMemory(size_bytes, str(exc)) from None
        return addr, self.device.footprint(size_bytes)

    def _do_free(self, alloc_id: int, addr: int, allocated_bytes: int, stream: int) -> None:
        self.device.free(addr)
