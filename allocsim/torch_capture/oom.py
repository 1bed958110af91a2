"""The out-of-memory error a ``--gpu`` capture raises in the script, worded as PyTorch words it: ``oom_message(...)``.

PyTorch's caching allocator (``c10/cuda/CUDACachingAllocator.cpp``, ``DeviceCachingAllocator::malloc``)
raises ``torch.cuda.OutOfMemoryError`` once a request finds no cached block, ``cudaMalloc`` of the
segment fails, and the retry after releasing every cached segment fails too (the model in the
parent, ``pytorch`` policy on a ``SimulatedDevice`` of the card's memory for tensors, follows the same
path). Its message names the segment it tried to get (``alloc_size = get_allocation_size(round_size(size))``),
the card's total (``cudaMemGetInfo``), what is free after the release, what NVML says this process
holds (``reportProcessMemoryInfo``), and the allocator's allocated and reserved-but-unallocated bytes,
each through ``format_size`` (two decimals, ``bytes`` up to 1 KiB, then KiB, MiB up to 1 GiB, GiB).
"""

from __future__ import annotations

from ..policies.pytorch_rules import get_allocation_size, round_size

_KiB, _MiB, _GiB = 1 << 10, 1 << 20, 1 << 30


def format_size(size_bytes: int) -> str:
    """c10's ``format_size``: ``1024 bytes``, ``1.50 KiB``, ``20.00 MiB``, ``79.18 GiB``."""
    if size_bytes <= _KiB:
        return f"{size_bytes} bytes"
    if size_bytes <= _MiB:
        return f"{size_bytes / _KiB:.2f} KiB"
    if size_bytes <= _GiB:
        return f"{size_bytes / _MiB:.2f} MiB"
    return f"{size_bytes / _GiB:.2f} GiB"


def oom_message(size_bytes: int, total_bytes: int, free_bytes: int, allocated_bytes: int,
                reserved_bytes: int) -> str:
    """What ``torch.cuda.OutOfMemoryError`` says on a card of ``total_bytes`` when a request of ``size_bytes`` fails.

    ``free_bytes``: what ``cudaMemGetInfo`` would report after the allocator released its cache (the
    card's memory for tensors less the reserved bytes); the process's use is the rest of the card
    (the CUDA context and libraries count there, as NVML counts them).
    """
    alloc_size = get_allocation_size(round_size(size_bytes))
    in_use = max(0, total_bytes - free_bytes)
    return (f"CUDA out of memory. Tried to allocate {format_size(alloc_size)}. GPU 0 has a total capacity of "
            f"{format_size(total_bytes)} of which {format_size(free_bytes)} is free. Including non-PyTorch memory, "
            f"this process has {format_size(in_use)} memory in use. Of the allocated memory "
            f"{format_size(allocated_bytes)} is allocated by PyTorch, and "
            f"{format_size(max(0, reserved_bytes - allocated_bytes))} is reserved by PyTorch but unallocated. If "
            "reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
            "to avoid fragmentation.  See documentation for Memory Management  "
            "(https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)"
            " [allocsim capture: the card modelled by allocsim]")
