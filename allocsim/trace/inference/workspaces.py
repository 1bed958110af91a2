"""Whether a trace already holds the cuBLAS workspaces of its run: ``cublas_workspaces_in_trace(trace.meta)``.

``run --gpu`` adds PyTorch's cuBLAS workspaces (one per handle and stream, ``allocsim.gpus``) to what
a trace reserves, because a CPU recording never makes them. A trace recorded on a GPU holds them
already (a snapshot's ``at::cuda::getNewWorkspace()`` blocks, inside the window or before it), and
so does a capture made by this version of ``allocsim capture`` (it inserts them where the CUDA run
would, ``version_hints["cublas_workspaces"] == "in trace"``): adding them again would count them twice.
"""

from __future__ import annotations

from typing import Any

#: Formats only a GPU run writes.
_GPU_FORMATS = frozenset({"pytorch-snapshot", "cupy-capture", "rmm-csv", "rmm"})


def cublas_workspaces_in_trace(meta: Any) -> bool:
    """True when the run's cuBLAS workspaces are (or were, before the window) in the trace itself."""
    hints = getattr(meta, "version_hints", None) or {}
    if hints.get("cublas_workspaces") == "in trace":
        return True
    if getattr(meta, "format", "") in _GPU_FORMATS or hints.get("source_format") in _GPU_FORMATS:
        return True
    if getattr(meta, "device_properties", None):
        return True                       # Kineto recorded on a GPU names its cards
    seen = hints.get("device_types_seen") or {}
    return isinstance(seen, dict) and any(str(kind).upper() in ("CUDA", "HIP") for kind in seen)
