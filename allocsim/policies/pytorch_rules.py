"""PyTorch CUDACachingAllocator's sizing rules as pure functions: test them one by one.

Every function mirrors one function of ``c10/cuda/CUDACachingAllocator.cpp`` (research notes
``pytorch.md`` §1.4-1.7); names match the C++ so the two can be read side by side.
"""

from __future__ import annotations

from typing import Sequence

from ..settings.divisions import K_ROUNDUP_POWER2_INTERVALS
from ..settings.pytorch_sizes import K_LARGE_BUFFER, K_MIN_BLOCK_SIZE, K_SMALL_SIZE
from ..units import SIZE_MAX, MiB
from .growth import pytorch_allocation_size

get_allocation_size = pytorch_allocation_size


def roundup_power2_next_division(size_bytes: int, divisions: int) -> int:
    """Round up to the next of ``divisions`` equal steps between two powers of two (1200, 4 -> 1280)."""
    if size_bytes & (size_bytes - 1) == 0:
        return size_bytes
    if divisions < 2:
        raise ValueError("Only 2 or more divisions are supported")
    power2_floor = 1 << (size_bytes.bit_length() - 1)
    # C++ shifts by floor(log2(divisions)): a non-power-of-two division count acts as the power below.
    power2_division = power2_floor >> (divisions.bit_length() - 1)
    if power2_division == 0:
        return power2_floor << 1
    round_size_floor = size_bytes & ~(power2_division - 1)
    return size_bytes if round_size_floor == size_bytes else round_size_floor + power2_division


def divisions_for(size_bytes: int, divisions: Sequence[int]) -> int:
    """Return the ``roundup_power2_divisions`` entry for ``size_bytes`` (interval of its power of two)."""
    log_size = size_bytes.bit_length() - 1
    index = log_size - 20 if log_size > 20 else 0
    return divisions[min(index, K_ROUNDUP_POWER2_INTERVALS - 1)]


def round_size(size_bytes: int, divisions: Sequence[int] | None = None) -> int:
    """PyTorch's ``round_size``: >= 512 B, a multiple of 512, or a power-of-two division when configured.

    The division rounding applies only when ``size_bytes > 512 * divisions`` (the C++ guard), so
    ``round_size(1200)`` with 4 divisions is 1536 even though ``roundup_power2_next_division(1200, 4)``
    (the docs' example) is 1280.
    """
    if size_bytes < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    if divisions is not None:
        div = divisions_for(size_bytes, divisions)
        if div > 1 and size_bytes > K_MIN_BLOCK_SIZE * div:
            return roundup_power2_next_division(size_bytes, div)
    return K_MIN_BLOCK_SIZE * ((size_bytes + K_MIN_BLOCK_SIZE - 1) // K_MIN_BLOCK_SIZE)


def should_split(block_bytes: int, size_bytes: int, *, small_pool: bool, max_split_size_bytes: int = SIZE_MAX,
                 expandable_segments: bool = False) -> bool:
    """PyTorch's ``should_split``: small pool (or expandable) keeps >= 512 B remainders; large needs > 1 MiB."""
    remaining = block_bytes - size_bytes
    if small_pool or expandable_segments:
        return remaining >= K_MIN_BLOCK_SIZE
    return size_bytes < max_split_size_bytes and remaining > K_SMALL_SIZE


def oversize_rejects(block_bytes: int, size_bytes: int, *, max_split_size_bytes: int = SIZE_MAX,
                     max_non_split_rounding_bytes: int = K_LARGE_BUFFER) -> bool:
    """Tell whether ``get_free_block`` refuses the best-fit block for a request of ``size_bytes``.

    Rule 1: a request below ``max_split_size`` never takes a block at or above it (such blocks are
    never split). Rule 2: a request at or above it takes a block only if the block is less than
    ``max_non_split_rounding`` larger than the request.
    """
    if size_bytes < max_split_size_bytes:
        return block_bytes >= max_split_size_bytes
    return block_bytes >= size_bytes + max_non_split_rounding_bytes


__all__ = [
    "K_MIN_BLOCK_SIZE", "SIZE_MAX", "MiB", "divisions_for", "get_allocation_size", "oversize_rejects",
    "round_size", "roundup_power2_next_division", "should_split",
]
