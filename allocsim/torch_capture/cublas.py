"""The cuBLAS workspaces PyTorch asks the caching allocator for: ``Workspaces(gpu).needed(handle, stream)``.

What a CUDA run does (``aten/src/ATen/cuda/CublasHandlePool.cpp``): each thread that runs a cuBLAS
operator takes a handle from a per-thread pool, and the first time a (handle, stream) pair is used
``getCurrentCUDABlasHandle`` binds it to a workspace from ``getNewWorkspace()``, a request of
``getChosenWorkspaceSize()`` bytes to the caching allocator that is kept for the life of the process
(until ``torch._C._cuda_clearCublasWorkspaces()``). A training step therefore holds one for the
script's thread and one for the autograd engine's device thread, which runs the backward pass; a
forward-only run holds one. The size is ``CUBLAS_WORKSPACE_CONFIG`` (``:SIZE_KIB:COUNT`` pairs,
summed as SIZE x COUNT KiB) or the default: ``:4096:2:16:8`` (8 MiB + 128 KiB), or 32 MiB on compute
capability 9.x, 10.x, 11.x and 12.x (Hopper, Blackwell).
"""

from __future__ import annotations

import os
from typing import Any, Hashable

import torch

from ..gpus import cublas_workspace_bytes

#: The frame a workspace request carries (the name a GPU snapshot's C++ frame has).
LABEL = "at::cuda::getNewWorkspace()"
#: Operators that take a cuBLAS handle on a CUDA device (matrix products; ``linear`` and ``matmul``
#: reach the device as these).
OPERATORS = frozenset(getattr(torch.ops.aten, name).default for name in (
    "mm", "addmm", "bmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot", "addr", "_addmm_activation")
    if hasattr(torch.ops.aten, name))


class Workspaces:
    """Which (handle, stream) pairs already hold a workspace; ``needed`` says the bytes of a new one."""

    def __init__(self, gpu: dict[str, Any]):
        self.bytes = cublas_workspace_bytes(gpu.get("major", 8), os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
        self._bound: set[tuple[Hashable, int]] = set()

    def needed(self, handle: Hashable, stream: int) -> int:
        """Bytes to request now for ``handle`` on ``stream`` (0 when the pair already has its workspace)."""
        key = (handle, stream)
        if key in self._bound or self.bytes <= 0:
            return 0
        self._bound.add(key)
        return self.bytes

