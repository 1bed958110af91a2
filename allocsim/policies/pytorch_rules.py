"""PyTorch CUDACachingAllocator's sizing rules as pure functions: test them one by one.

Every function mirrors one function of ``c10/cuda/CUDACachingAllocator.cpp`` (research notes
``pytorch.md`` §1.4-1.7); names match the C++ so the two can be read side by side.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..units import MiB
from .growth import K_LARGE_BUFFER, K_SMALL_SIZE, pytorch_allocation_size

K_MIN_BLOCK_SIZE = 512
#: ``roundup_power2_divisions`` has one entry per power-of-two interval from 1 MiB up to 64 GiB.
K_ROUNDUP_POWER2_INTERVALS = 16
#: What "unlimited" ``max_split_size`` is in C++ (``std::numeric_limits<size_t>::max()``).
SIZE_MAX = (1 << 64) - 1

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


def parse_roundup_power2_divisions(value: Any) -> tuple[int, ...] | None:
    """Normalise ``roundup_power2_divisions`` to 16 ints, or None when every entry is 0 (off).

    Accepts None, one int (all intervals), a snapshot's ``allocator_settings`` dict (``{'1': 0,
    '2': 0, ..., '32768': 0}``, keys are MB interval starts), a config string ``"4"`` or
    ``"[256:1,512:2,1024:4,>:8]"`` (PYTORCH_CUDA_ALLOC_CONF syntax: the first key's value also
    covers the intervals below it, ``>`` covers those after the last key), or a sequence of 16 ints.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"roundup_power2_divisions must be a number, list or mapping, got {value!r}")
    if isinstance(value, int):
        table = [_check_division(value)] * K_ROUNDUP_POWER2_INTERVALS
    elif isinstance(value, str):
        text = value.strip()
        if text.startswith("[") and text.endswith("]"):
            table = _parse_division_list(text[1:-1])
        elif text.lower() in ("", "none", "off"):
            return None
        else:
            table = [_check_division(int(text))] * K_ROUNDUP_POWER2_INTERVALS
    elif isinstance(value, Mapping):
        table = [0] * K_ROUNDUP_POWER2_INTERVALS
        for key, divisions in value.items():
            table[_interval_index(int(key))] = _check_division(int(divisions))
    else:
        table = [_check_division(int(v)) for v in value]
        if len(table) != K_ROUNDUP_POWER2_INTERVALS:
            raise ValueError(f"roundup_power2_divisions needs {K_ROUNDUP_POWER2_INTERVALS} entries, got {len(table)}")
    return tuple(table) if any(table) else None


def _check_division(divisions: int) -> int:
    if divisions < 0 or (divisions and divisions & (divisions - 1)):
        raise ValueError(f"roundup_power2_divisions values must be 0 or a power of 2, got {divisions}")
    return divisions


def _interval_index(megabytes: int) -> int:
    if megabytes <= 0 or megabytes & (megabytes - 1):
        raise ValueError(f"roundup_power2_divisions keys must be powers of 2 (MB), got {megabytes}")
    # C++ clamps keys to [1 MB, 64 GB] before taking log2.
    return min(megabytes.bit_length() - 1, K_ROUNDUP_POWER2_INTERVALS - 1)


def _parse_division_list(body: str) -> list[int]:
    # Follows AllocatorConfig's parser as far as the notes allow (they give only the lookup): the
    # first key's value also covers every interval below it, later keys set their own interval
    # only, and ">" sets every interval after the last key.
    table = [0] * K_ROUNDUP_POWER2_INTERVALS
    last_index = 0
    first = True
    for item in filter(None, (part.strip() for part in body.split(","))):
        key, _, val = item.partition(":")
        divisions = _check_division(int(val))
        if key.strip() == ">":
            start = 0 if first else last_index + 1
            table[start:] = [divisions] * (K_ROUNDUP_POWER2_INTERVALS - start)
            continue
        index = _interval_index(int(key))
        if first:
            table[:index] = [divisions] * index
            first = False
        table[index] = divisions
        last_index = index
    return table


def allocator_settings_to_kwargs(settings: Mapping[str, Any] | None) -> dict[str, Any]:
    """Turn a snapshot's ``allocator_settings`` into ``PyTorchPolicy`` keyword arguments.

    Reads ``max_split_size`` (bytes, -1 = unlimited), ``garbage_collection_threshold``,
    ``expandable_segments`` and ``roundup_power2_divisions``; other keys (pinned-memory and locking
    options) do not change placement and are ignored.
    """
    if not settings:
        return {}
    from ..settings.recorded import setting_problem

    for key in ("max_split_size", "garbage_collection_threshold", "expandable_segments",
                "roundup_power2_divisions"):
        if key in settings:
            problem = setting_problem(key, settings[key])
            if problem is not None:
                raise ValueError(f"allocator setting {key} {problem}")
    kwargs: dict[str, Any] = {}
    if "max_split_size" in settings:
        value = int(settings["max_split_size"])
        kwargs["max_split_size_bytes"] = None if value < 0 or value >= SIZE_MAX else value
    if "garbage_collection_threshold" in settings:
        kwargs["garbage_collection_threshold"] = float(settings["garbage_collection_threshold"])
    if "expandable_segments" in settings:
        kwargs["expandable_segments"] = bool(settings["expandable_segments"])
    if "roundup_power2_divisions" in settings:
        kwargs["roundup_power2_divisions"] = parse_roundup_power2_divisions(settings["roundup_power2_divisions"])
    return kwargs


__all__ = [
    "K_MIN_BLOCK_SIZE", "SIZE_MAX", "MiB", "allocator_settings_to_kwargs", "divisions_for",
    "get_allocation_size", "oversize_rejects", "parse_roundup_power2_divisions", "round_size",
    "roundup_power2_next_division", "should_split",
]
