"""GPU models for ``allocsim run --gpu NAME``: what besides the caching allocator's segments takes a GPU's memory.

A GPU's memory during a PyTorch training run is

* the CUDA context (``context_bytes``): the driver's per-process state, there before the first tensor;
* what the libraries load and keep once the first kernels run (``library_bytes``): lazily loaded
  kernel modules, cuDNN and cuBLAS handles, which a run on the CPU cannot see (cuDNN's convolution
  workspaces go through the caching allocator: ``allocsim capture`` puts them in the trace, see
  ``allocsim.torch_capture.cudnn``, so they are in the simulated segments);
* cuBLAS workspaces (``workspace_bytes``): PyTorch gives each (cuBLAS handle, stream) its own
  workspace from the caching allocator, and a training step uses two handles (the forward runs in
  the script's thread, the backward in the autograd engine's device thread);
* the caching allocator's segments: ``peak_reserved_bytes`` of the simulation.

``gpu_estimate`` adds them up; the verdict compares the total with the GPU's memory. Each figure says
where it comes from in ``sources``; ``library_bytes`` is calibrated on measured runs only (see
``validate/xmem_calibration.json``) and ``context_bytes`` is an estimate that no ground truth here
includes, so the verdict near the limit has that uncertainty.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .errors import AllocsimError

GiB = 1 << 30
MiB = 1 << 20
#: PyTorch's default cuBLAS workspace (``CUBLAS_WORKSPACE_CONFIG`` unset): ``:4096:2:16:8`` before
#: Hopper, ``:4096:8`` on sm90 (aten/src/ATen/cuda/CublasHandlePool.cpp, parseChosenWorkspaceSize).
CUBLAS_WORKSPACE_BYTES = 4096 * 1024 * 2 + 16 * 1024 * 8
CUBLAS_WORKSPACE_BYTES_SM90 = 4096 * 1024 * 8
#: cuBLAS handles a training step uses: the script's thread (forward, optimizer) and the autograd
#: engine's device thread (backward), each with its own workspace on the current stream.
TRAINING_CUBLAS_HANDLES = 2
#: The caching allocator rounds a large request to 2 MiB; a workspace is its own segment.
_ROUND_LARGE = 2 * MiB
#: The primary context with lazy module loading (CUDA >= 12 default): an estimate, not calibrated here.
CONTEXT_BYTES_ESTIMATE = 400 * MiB
#: Calibrated on xMem's 001-Anova rows (RTX 3060): the median of ground truth minus allocsim's
#: simulated reserved peak and cuBLAS workspaces; validate/xmem_calibration.json has the rows.
LIBRARY_BYTES_CALIBRATED = 0


@dataclasses.dataclass(frozen=True)
class GpuModel:
    """One GPU: its memory, compute capability and where each figure comes from."""

    name: str
    aliases: tuple[str, ...]
    total_bytes: int
    sm: int                                  # compute capability, e.g. 86 for 8.6
    total_source: str
    context_bytes: int = CONTEXT_BYTES_ESTIMATE
    library_bytes: int = LIBRARY_BYTES_CALIBRATED

    @property
    def cublas_workspace_bytes(self) -> int:
        """One cuBLAS workspace as PyTorch sizes it for this architecture."""
        return CUBLAS_WORKSPACE_BYTES_SM90 if self.sm == 90 else CUBLAS_WORKSPACE_BYTES

    def sources(self) -> dict[str, str]:
        """Where each figure of this GPU model comes from."""
        return {
            "total_bytes": self.total_source,
            "context_bytes": "estimate of a CUDA >= 12 primary context with lazy module loading; "
                             "not calibrated (xMem's ground truth excludes the context)",
            "library_bytes": "calibrated: median of (xMem 001-Anova ground - allocsim reserved peak - cuBLAS "
                             "workspaces) over the rows in validate/xmem_calibration.json",
            "workspace_bytes": "PyTorch CublasHandlePool.cpp default CUBLAS_WORKSPACE_CONFIG "
                               f"({'4096 KiB x 8' if self.sm == 90 else '4096 KiB x 2 + 16 KiB x 8'}) per "
                               f"handle, {TRAINING_CUBLAS_HANDLES} handles, each a segment rounded to 2 MiB",
        }


_SPEC = "NVIDIA product specification (nominal)"
GPUS: tuple[GpuModel, ...] = (
    GpuModel("RTX 3060", ("3060", "GeForce RTX 3060", "NVIDIA GeForce RTX 3060"), 12622168064, 86,
             "total_gpu_memory of xMem's RTX 3060 runs (NVML), Stone-ResearchLife/xMem evaluation_result.json"),
    GpuModel("RTX 4060", ("4060", "GeForce RTX 4060", "NVIDIA GeForce RTX 4060"), 8 * GiB, 89, _SPEC + ", 8 GB"),
    GpuModel("RTX 4090", ("4090", "GeForce RTX 4090"), 24 * GiB, 89, _SPEC + ", 24 GB"),
    GpuModel("T4", ("Tesla T4",), 16 * GiB, 75, _SPEC + ", 16 GB"),
    GpuModel("V100 16GB", ("V100",), 16 * GiB, 70, _SPEC + ", 16 GB"),
    GpuModel("V100 32GB", (), 32 * GiB, 70, _SPEC + ", 32 GB"),
    GpuModel("L4", (), 24 * GiB, 89, _SPEC + ", 24 GB"),
    GpuModel("A10", ("A10G",), 24 * GiB, 86, _SPEC + ", 24 GB"),
    GpuModel("A100 40GB", ("A100-40GB", "A100"), 40 * GiB, 80, _SPEC + ", 40 GB"),
    GpuModel("A100 80GB", ("A100-80GB",), 80 * GiB, 80, _SPEC + ", 80 GB"),
    GpuModel("H100", ("H100 80GB", "H100-80GB", "H100 SXM"), 80 * GiB, 90, _SPEC + ", 80 GB"),
    GpuModel("H200", ("H200 141GB",), 141 * 10**9, 90, _SPEC + ", 141 GB"),
)


def _key(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())


def find_gpu(name: str) -> GpuModel:
    """The GPU model named ``name`` (case, spaces and dashes ignored); ``AllocsimError`` lists the known ones."""
    wanted = _key(name)
    for gpu in GPUS:
        if wanted in {_key(n) for n in (gpu.name, *gpu.aliases)}:
            return gpu
    raise AllocsimError(f"unknown GPU {name!r}; known: {', '.join(g.name for g in GPUS)} (allocsim gpus)")


def workspace_bytes(gpu: GpuModel) -> int:
    """cuBLAS workspaces a training step keeps: one segment per handle, rounded as the allocator rounds."""
    one = -(-gpu.cublas_workspace_bytes // _ROUND_LARGE) * _ROUND_LARGE
    return TRAINING_CUBLAS_HANDLES * one


def allocator_capacity(gpu: GpuModel) -> int:
    """The memory left to the caching allocator's tensors once context, libraries and workspaces are in."""
    return gpu.total_bytes - gpu.context_bytes - gpu.library_bytes - workspace_bytes(gpu)


def gpu_estimate(gpu: GpuModel, reserved_peak_bytes: int) -> dict[str, Any]:
    """The GPU memory the run needs at its peak, part by part, and whether it fits ``gpu``."""
    workspaces = workspace_bytes(gpu)
    total = reserved_peak_bytes + workspaces + gpu.library_bytes + gpu.context_bytes
    return {
        "gpu": gpu.name,
        "gpu_total_bytes": gpu.total_bytes,
        "reserved_peak_bytes": int(reserved_peak_bytes),
        "workspace_bytes": workspaces,
        "library_bytes": gpu.library_bytes,
        "context_bytes": gpu.context_bytes,
        "total_bytes": int(total),
        "fits": total <= gpu.total_bytes,
        "sources": gpu.sources(),
    }


def gpu_rows() -> list[dict[str, Any]]:
    """Every GPU model as a JSON-ready row (for ``allocsim gpus``)."""
    return [{"name": g.name, "aliases": list(g.aliases), "total_bytes": g.total_bytes, "sm": g.sm,
             "context_bytes": g.context_bytes, "library_bytes": g.library_bytes,
             "workspace_bytes": workspace_bytes(g), "allocator_capacity_bytes": allocator_capacity(g),
             "sources": g.sources()} for g in GPUS]
