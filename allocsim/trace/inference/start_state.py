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


import numpy as np
import pandas as pd

from ...settings.pytorch_sizes import K_MIN_BLOCK_SIZE, K_SMALL_SIZE
from ..schema import EventKind, Trace

# K_SMALL_SIZE: the largest unsplit remainder a large-pool block can carry; every block size and
# address inside a segment is a multiple of K_MIN_BLOCK_SIZE.


def repair_start_state(trace: Trace) -> list[str]:
    """Grow start-of-window blocks over the free bytes that really belonged to them; return notes.

    Changes ``trace.initial_blocks`` (and ``initial_allocs.block_size_bytes``) in place and appends
    one note per kind of repair to ``trace.meta.notes``. A trace without start blocks is left alone.
    """
    blocks = trace.initial_blocks
    if not len(blocks):
        return []
    plain_large = _plain_large_segments(trace.initial_segments)
    order = np.lexsort((blocks["addr"].to_numpy(), blocks["segment_addr"].to_numpy(), blocks["device"].to_numpy()))
    rows = _Rows({name: blocks[name].to_numpy()[order].tolist() for name in blocks.columns})
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
    keep, grown, grown_bytes, odd = _absorb_tails(rows, plain_large)
    if grown:
        notes.append(f"{grown} start-of-window large-pool blocks grown over the free gap of <= 1 MiB after "
                     f"them ({grown_bytes:,} bytes): such a gap is an unsplit tail (should_split)")
    if odd:
        notes.append(f"{odd} free gaps of <= 1 MiB in large segments could not be explained")
    if grown_by_placement or grown or len(keep) < len(order) or bool((order != np.arange(len(order))).any()):
        trace.initial_blocks = _frame_of(blocks, rows, keep)
    _sync_initial_alloc_sizes(trace)
    trace.meta.notes.extend(notes)
    return notes


class _Rows:
    """The start blocks as one list per column (sorted by device, segment, address)."""

    def __init__(self, columns: dict[str, list]):
        self.columns = columns
        self.device = columns["device"]
        self.segment_addr = columns["segment_addr"]
        self.addr = columns["addr"]
        self.size = columns["size_bytes"]
        self.alloc_id = columns["alloc_id"]

    def __len__(self) -> int:
        return len(self.addr)


def _frame_of(blocks: pd.DataFrame, rows: _Rows, keep: list[int]) -> pd.DataFrame:
    """The blocks table of the kept rows, in the dtypes of ``blocks``."""
    out = {}
    for name, dtype in blocks.dtypes.items():
        values = rows.columns[name]
        column = [values[k] for k in keep]
        out[name] = np.array(column, dtype=dtype) if isinstance(dtype, np.dtype) else pd.array(column, dtype=dtype)
    return pd.DataFrame(out, copy=False)


def _plain_large_segments(segments: pd.DataFrame) -> set[tuple[int, int]]:
    """(device, addr) of every large-pool segment that is not expandable."""
    return {(int(d), int(a)) for d, a, pool, exp in zip(
                segments["device"].to_numpy().tolist(), segments["addr"].to_numpy().tolist(),
                segments["pool"].to_numpy().tolist(), segments["is_expandable"].to_numpy().tolist())
            if pool == "large" and not exp}


def _first_placements(trace: Trace, rows: _Rows, plain_large: set[tuple[int, int]]) -> dict[int, int]:
    """Row index of a free region -> address of the first allocation placed in it while its
    predecessor block was still allocated (regions never placed into that way are absent)."""
    regions: dict[int, list[tuple[int, int, int, int]]] = {}   # device -> [(start, end, row, prev_id)]
    dev, seg, addr, size, aid = rows.device, rows.segment_addr, rows.addr, rows.size, rows.alloc_id
    for k in range(1, len(rows)):
        if aid[k] >= 0 or aid[k - 1] < 0 or seg[k - 1] != seg[k] or dev[k - 1] != dev[k]:
            continue
        if (dev[k], seg[k]) not in plain_large:
            continue
        regions.setdefault(dev[k], []).append((addr[k], addr[k] + size[k], k, aid[k - 1]))
    if not regions:
        return {}
    freed_at = _free_completed_index(trace, {r[3] for rs in regions.values() for r in rs})
    dec = trace.decisions
    is_alloc = (dec["action"] == "alloc").to_numpy(dtype=bool)
    dec_device = dec["device"].to_numpy()[is_alloc]
    dec_index = dec["event_index"].to_numpy()[is_alloc]
    dec_addr = dec["addr"].to_numpy()[is_alloc]
    never = np.iinfo(np.int64).max
    found: dict[int, int] = {}
    for device, items in regions.items():
        items.sort()
        starts = np.array([r[0] for r in items], dtype=np.int64)
        ends = np.array([r[1] for r in items], dtype=np.int64)
        mine = dec_device == device
        index, at = dec_index[mine], dec_addr[mine]
        # The first allocation (in recorded order) inside each region decides it.
        j = np.searchsorted(starts, at, side="right") - 1
        inside = (j >= 0) & (at < ends[np.maximum(j, 0)])
        regions_hit, first = np.unique(j[inside], return_index=True)
        for region, pos in zip(regions_hit.tolist(), first.tolist()):
            _start, _end, row, prev_id = items[region]
            hit_index, hit_addr = int(index[inside][pos]), int(at[inside][pos])
            # The predecessor freed first: the region merged, nothing to learn (-1).
            found[row] = -1 if hit_index > freed_at.get(prev_id, never) else hit_addr
    return {row: a for row, a in found.items() if a >= 0}


def _free_completed_index(trace: Trace, alloc_ids: set[int]) -> dict[int, int]:
    """alloc_id -> event index of its FREE_COMPLETED (the block becomes free there)."""
    kind = trace.events["kind"].to_numpy()
    ids = trace.events["alloc_id"].to_numpy()
    index = np.flatnonzero((kind == EventKind.FREE_COMPLETED) & np.isin(ids, np.fromiter(alloc_ids, np.int64)))
    out: dict[int, int] = {}
    for i, aid in zip(index.tolist(), ids[index].tolist()):
        out.setdefault(aid, i)
    return out


def _apply_placements(rows: _Rows, placed: dict[int, int]) -> tuple[tuple[int, int] | None, int]:
    """Move each region's start to its first placement; the predecessor takes the gap."""
    count = total = unexplained = 0
    for row, addr in sorted(placed.items()):
        gap = addr - rows.addr[row]
        if gap <= 0:
            continue
        if gap > K_SMALL_SIZE or gap % K_MIN_BLOCK_SIZE:
            unexplained += 1
            continue
        rows.size[row - 1] += gap
        rows.addr[row] += gap
        rows.size[row] -= gap
        count += 1
        total += gap
    return ((count, total) if count else None), unexplained


def _absorb_tails(rows: _Rows, plain_large: set[tuple[int, int]]) -> tuple[list[int], int, int, int]:
    """Apply the tail rule; return the rows kept (free rows that became empty, or absorbed, go)."""
    keep: list[int] = []
    grown = grown_bytes = odd = 0
    dev, seg, size, aid = rows.device, rows.segment_addr, rows.size, rows.alloc_id
    for k in range(len(rows)):
        if size[k] <= 0:
            continue
        prev = keep[-1] if keep else -1
        same_segment = prev >= 0 and seg[prev] == seg[k] and dev[prev] == dev[k]
        if aid[k] < 0 and size[k] <= K_SMALL_SIZE and (dev[k], seg[k]) in plain_large:
            if same_segment and aid[prev] >= 0:
                size[prev] += size[k]
                grown += 1
                grown_bytes += size[k]
                continue
            odd += 1
        keep.append(k)
    return keep, grown, grown_bytes, odd


def _sync_initial_alloc_sizes(trace: Trace) -> None:
    """Give ``initial_allocs.block_size_bytes`` the repaired block sizes."""
    blocks = trace.initial_blocks
    ids = blocks["alloc_id"].to_numpy()
    live = ids >= 0
    if not live.any() or not len(trace.initial_allocs):
        return
    size_of = dict(zip(ids[live].tolist(), blocks["size_bytes"].to_numpy()[live].tolist()))
    ia = trace.initial_allocs
    current = ia["block_size_bytes"].to_numpy()
    ia_ids = ia["alloc_id"].to_numpy().tolist()
    synced = np.array([size_of.get(a, c) for a, c in zip(ia_ids, current.tolist())], dtype=np.int64)
    if not np.array_equal(synced, current):
        ia["block_size_bytes"] = synced
