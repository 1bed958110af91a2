"""Pick how big a new segment is with a growth rule: ``exact``, ``chunk`` or ``pytorch``.

A growth rule maps the rounded request a pool could not serve to the size of the device
allocation it makes. Rules are plain callables ``rule(size_bytes) -> segment_bytes`` so a pool
calls them without knowing which one it has.
"""

from __future__ import annotations

from typing import Callable

# PyTorch CUDACachingAllocator constants (c10/cuda/CUDACachingAllocator.cpp, research notes §1.1);
# the policies import them from here.
from ..settings.pytorch_sizes import K_LARGE_BUFFER, K_MIN_LARGE_ALLOC, K_ROUND_LARGE, K_SMALL_BUFFER, K_SMALL_SIZE
from ..units import align_up

GrowthRule = Callable[[int], int]


def exact(size_bytes: int) -> int:
    """Allocate exactly the rounded request (CuPy; Paddle auto_growth with chunk size 0)."""
    return size_bytes


class FixedChunk:
    """Allocate ``max(request, chunk_bytes)``: Paddle's ``FLAGS_auto_growth_chunk_size_in_mb`` rule."""

    __slots__ = ("chunk_bytes",)

    def __init__(self, chunk_bytes: int):
        self.chunk_bytes = chunk_bytes

    def __call__(self, size_bytes: int) -> int:
        return size_bytes if size_bytes > self.chunk_bytes else self.chunk_bytes

    def __repr__(self) -> str:
        return f"FixedChunk({self.chunk_bytes})"


class RoundUp:
    """Allocate the request rounded up to a multiple of ``granularity_bytes`` (a pool growing in steps)."""

    __slots__ = ("granularity_bytes",)

    def __init__(self, granularity_bytes: int):
        self.granularity_bytes = granularity_bytes

    def __call__(self, size_bytes: int) -> int:
        return align_up(size_bytes, self.granularity_bytes)

    def __repr__(self) -> str:
        return f"RoundUp({self.granularity_bytes})"


def pytorch_allocation_size(size_bytes: int) -> int:
    """PyTorch's ``get_allocation_size``: 2 MiB for small, 20 MiB for 1-10 MiB, else rounded to 2 MiB."""
    if size_bytes <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size_bytes < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return K_ROUND_LARGE * ((size_bytes + K_ROUND_LARGE - 1) // K_ROUND_LARGE)


GROWTH_RULES = ("exact", "chunk", "round", "pytorch")


def make_growth(rule: str, chunk_bytes: int) -> GrowthRule:
    """Return the growth rule named ``rule`` (``chunk_bytes`` is the chunk or rounding step)."""
    if rule == "exact":
        return exact
    if rule == "chunk":
        return FixedChunk(chunk_bytes)
    if rule == "round":
        return RoundUp(chunk_bytes)
    if rule == "pytorch":
        return pytorch_allocation_size
    raise ValueError(f"unknown growth rule {rule!r}; known: {', '.join(GROWTH_RULES)}")
