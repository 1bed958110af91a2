"""Read ``roundup_power2_divisions`` in any of its spellings: ``parse_roundup_power2_divisions(value)``.

A recorded snapshot, ``--alloc-conf`` and policy parameters spell the table differently; the
policies and the recorded-settings check all normalise it here (research notes ``pytorch.md`` §1.5).
"""

from __future__ import annotations

from typing import Any, Mapping

#: ``roundup_power2_divisions`` has one entry per power-of-two interval from 1 MiB up to 64 GiB.
K_ROUNDUP_POWER2_INTERVALS = 16


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
