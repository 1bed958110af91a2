"""Make a snapshot's start-of-window blocks exact: call ``repair_start_state(trace)`` after reading.

The snapshot reader reconstructs the allocator state at the start of the recorded window by
walking the final ``segments`` back through the window. A block the window only sees being freed
(allocated before the ring buffer began) gets the size PyTorch's ``round_size`` gives its request:
a lower bound, because a large-pool block is not split when the remainder would be at most
``kSmallSize`` (1 MiB, ``should_split`` in ``c10/cuda/CUDACachingAllocator.cpp``), so the real block
can be up to 1 MiB bigger. The free region after such a block then looks bigger than it was, and a
replay's best fit can pick another block. Two facts of the real allocator fix the sizes:

1. **Placement rule.** The allocator always hands out the *start* of the free block it picks. So
   the first allocation the trace records inside a start-of-window free region, while the block
   before the region is still allocated, sits where that free block really began. If that is after
   the reconstructed start, the gap (at most 1 MiB, and only in the large pool of a plain segment)
   is the unsplit tail of the block before it.
2. **Tail rule.** In the large pool of a plain segment every free block is bigger than 1 MiB
   (``should_split`` leaves more than ``kSmallSize`` or nothing, large requests are bigger than it
   and merging only grows blocks). A free gap of at most 1 MiB right after an allocated block can
   only be that block's unsplit tail.

Both rules only grow allocated blocks over free bytes; segments and live addresses never move.
Small-pool and expandable-segment blocks are always split exactly (a remainder of at least 512 B
is split off), so they need no repair.
"""

from __future__ import annotations

import bisect
from typing import Any

import numpy as np
import pandas as pd

from .schema import EventKind, Trace

#: PyTorch's ``kSmallSize``: the largest unsplit remainder a large-pool block can carry.
K_SMALL_SIZE = 1 << 20
#: Every block size and address inside a segment is a multiple of PyTorch's ``kMinBlockSize``.
K_MIN_BLOCK_SIZE = 512


def repair_start_state(trace: Trace) -> list[str]:
    """Grow start-of-window blocks over the free bytes that really belonged to them; return notes.

    Changes ``trace.initial_blocks`` (and ``initial_allocs.block_size_bytes``) in place and appends
    one note per kind of repair to ``trace.meta.notes``. A trace without start blocks is left alone.
    """
    blocks = trace.initial_blocks
    if not len(blocks):
        return []
    plain_large = _plain_large_segments(trace.initial_segments)
    rows = blocks.sort_values(["device", "segment_addr", "addr"], kind="stable").to_dict("records")
    notes: list[str] = []
    placed = _first_placements(trace, rows, plain_large)
    grown_by_placement, unexplained = _apply_placements(rows, placed)
    if grown_by_placement:
        notes.append(f"{grown_by_placement[0]} start-of-window blocks grown by {grown_by_placement[1]:,} bytes "
                     "to where the trace's first allocation in the free region after them was placed "
                     "(the allocator hands out the start of a free block; the rest was an unsplit tail)")
    if unexplained:
        notes.append(f"{unexplained} first allocations in a start-of-window free region were placed more "
                     "than 1 MiB after its reconstructed start: the reconstruction left them alone")
    rows, grown, grown_bytes, odd = _absorb_tails(rows, plain_large)
    if grown:
        notes.append(f"{grown} start-of-window large-pool blocks grown over the free gap of <= 1 MiB after "
                     f"them ({grown_bytes:,} bytes): such a gap is an unsplit tail (should_split)")
    if odd:
        notes.append(f"{odd} free gaps of <= 1 MiB in large segments could not be explained")
    fixed = pd.DataFrame(rows, columns=list(blocks.columns)).astype(blocks.dtypes.to_dict())
    trace.initial_blocks = fixed.reset_index(drop=True)
    _sync_initial_alloc_sizes(trace)
    trace.meta.notes.extend(notes)
    return notes


def _plain_large_segments(segments: pd.DataFrame) -> set[tuple[int, int]]:
    """(device, addr) of every large-pool segment that is not expandable."""
    return {(int(d), int(a)) for d, a, pool, exp in zip(segments["device"], segments["addr"], segments["pool"],
                                                        segments["is_expandable"])
            if pool == "large" and not exp}


def _first_placements(trace: Trace, rows: list[dict[str, Any]],
                      plain_large: set[tuple[int, int]]) -> dict[int, int]:
    """Row index of a free region -> address of the first allocation placed in it while its
    predecessor block was still allocated (regions never placed into that way are absent)."""
    regions: dict[int, list[tuple[int, int, int, int]]] = {}   # device -> [(start, end, row, prev_id)]
    for k, row in enumerate(rows):
        if k == 0 or row["alloc_id"] >= 0:
            continue
        prev = rows[k - 1]
        if (prev["alloc_id"] < 0 or prev["segment_addr"] != row["segment_addr"] or prev["device"] != row["device"]
                or (int(row["device"]), int(row["segment_addr"])) not in plain_large):
            continue
        start = int(row["addr"])
        regions.setdefault(int(row["device"]), []).append((start, start + int(row["size_bytes"]), k,
                                                           int(prev["alloc_id"])))
    if not regions:
        return {}
    freed_at = _free_completed_index(trace, {r[3] for rs in regions.values() for r in rs})
    dec = trace.decisions
    allocs = dec[dec["action"] == "alloc"]
    found: dict[int, int] = {}
    for device, items in regions.items():
        items.sort()
        starts = [r[0] for r in items]
        mine = allocs[allocs["device"] == device]
        resolved = 0
        for index, addr in zip(mine["event_index"].to_numpy().tolist(), mine["addr"].to_numpy().tolist()):
            j = bisect.bisect_right(starts, addr) - 1
            if j < 0:
                continue
            start, end, row, prev_id = items[j]
            if addr >= end or row in found:
                continue
            if index > freed_at.get(prev_id, np.iinfo(np.int64).max):
                found[row] = -1   # the predecessor was freed first: the region merged, nothing to learn
            else:
                found[row] = addr
            resolved += 1
            if resolved == len(items):
                break
    return {row: addr for row, addr in found.items() if addr >= 0}


def _free_completed_index(trace: Trace, alloc_ids: set[int]) -> dict[int, int]:
    """alloc_id -> event index of its FREE_COMPLETED (the block becomes free there)."""
    kind = trace.events["kind"].to_numpy()
    ids = trace.events["alloc_id"].to_numpy()
    index = np.flatnonzero((kind == EventKind.FREE_COMPLETED) & np.isin(ids, np.fromiter(alloc_ids, np.int64)))
    out: dict[int, int] = {}
    for i, aid in zip(index.tolist(), ids[index].tolist()):
        out.setdefault(aid, i)
    return out


def _apply_placements(rows: list[dict[str, Any]], placed: dict[int, int]) -> tuple[tuple[int, int] | None, int]:
    """Move each region's start to its first placement; the predecessor takes the gap."""
    count = total = unexplained = 0
    for row, addr in sorted(placed.items()):
        region = rows[row]
        gap = addr - int(region["addr"])
        if gap <= 0:
            continue
        if gap > K_SMALL_SIZE or gap % K_MIN_BLOCK_SIZE:
            unexplained += 1
            continue
        rows[row - 1]["size_bytes"] += gap
        region["addr"] += gap
        region["size_bytes"] -= gap
        count += 1
        total += gap
    return ((count, total) if count else None), unexplained


def _absorb_tails(rows: list[dict[str, Any]], plain_large: set[tuple[int, int]]
                  ) -> tuple[list[dict[str, Any]], int, int, int]:
    """Apply the tail rule; drop free rows that became empty."""
    out: list[dict[str, Any]] = []
    grown = grown_bytes = odd = 0
    for row in rows:
        if row["size_bytes"] <= 0:
            continue
        prev = out[-1] if out else None
        same_segment = (prev is not None and prev["segment_addr"] == row["segment_addr"]
                        and prev["device"] == row["device"])
        if (row["alloc_id"] < 0 and row["size_bytes"] <= K_SMALL_SIZE
                and (int(row["device"]), int(row["segment_addr"])) in plain_large):
            if same_segment and prev["alloc_id"] >= 0:
                prev["size_bytes"] += row["size_bytes"]
                grown += 1
                grown_bytes += int(row["size_bytes"])
                continue
            odd += 1
        out.append(dict(row))
    return out, grown, grown_bytes, odd


def _sync_initial_alloc_sizes(trace: Trace) -> None:
    """Give ``initial_allocs.block_size_bytes`` the repaired block sizes."""
    blocks = trace.initial_blocks
    live = blocks[blocks["alloc_id"] >= 0]
    if not len(live) or not len(trace.initial_allocs):
        return
    size_of = dict(zip(live["alloc_id"].to_numpy().tolist(), live["size_bytes"].to_numpy().tolist()))
    ia = trace.initial_allocs
    current = ia["block_size_bytes"].to_numpy()
    ids = ia["alloc_id"].to_numpy().tolist()
    ia["block_size_bytes"] = np.array([size_of.get(a, c) for a, c in zip(ids, current.tolist())], dtype=np.int64)
