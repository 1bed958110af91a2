"""Predict where a scaled trace's start-of-window allocations sit: ``steady_start(trace)`` for a periodic window.

A recording that opens in the middle of a run (a ring buffer's tail) starts with the layout the
program's own earlier steps left behind: weights where they were placed first, the activations of
the step in progress in the free blocks and cached segments of the steps before. Placing those
allocations anew, in id order, packs them as no step did, and peak reserved then differs by what
that packing wastes (on a real GPT-2-medium series at ctx 1024: +6.3%).

When the window repeats itself (its events, by kind and size, repeat with a period of ``L``
events) and reaches a step boundary within its first period (only the allocations alive all window
are alive: the weights), ``steady_start`` rebuilds that history: the weights placed first, then one
whole step from the boundary and the part of the next up to where the window opened (events
``b .. 2L-1``). Each block alive then stands for the start allocation whose free came ``2L``
events before its own, and the trace starts from that layout (segments, free blocks and all). A
window with no such period keeps the fresh placement (``None``).

Start allocations whose size does not scale (weights) need no history: ``carried_layout`` keeps
them where the reference run had them, in the segments that hold them. A prediction is laid out by
both (``as_predicted``). What a process ran before the program (segments another run in the same
process left cached) no input of this kind can tell.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd

from ..trace.schema import BLOCK_DTYPES, SEGMENT_DTYPES, EventKind, Trace

#: The smallest window that can show a period: events.
MIN_PERIOD_EVENTS = 2


def fresh_start(trace: Trace) -> Trace:
    """``trace`` with its start-of-window allocations to be placed anew (its recorded layout dropped), as a prediction is."""
    initial = trace.initial_allocs.copy()
    initial["addr"] = -1
    initial["block_size_bytes"] = -1
    return Trace(events=trace.events, meta=trace.meta, labels=list(trace.labels), initial_allocs=initial,
                 frames=trace.frames, stacks=trace.stacks)


def find_period(trace: Trace) -> int | None:
    """The least ``L`` with event ``i`` and ``i + L`` alike (kind and size) for the whole window, at most half of it."""
    kind = trace.events["kind"].to_numpy().astype(np.int64)
    size = trace.events["size_bytes"].to_numpy().astype(np.int64)
    n = len(kind)
    if n < 2 * MIN_PERIOD_EVENTS:
        return None
    _, key = np.unique(np.stack([kind, size], axis=1), axis=0, return_inverse=True)
    # The least period of a sequence is its length less its longest proper border (the prefix
    # function of Knuth-Morris-Pratt): linear, whatever a hostile trace repeats.
    key = key.reshape(-1).tolist()
    border = [0] * n
    for i in range(1, n):
        b = border[i - 1]
        while b and key[i] != key[b]:
            b = border[b - 1]
        border[i] = b + 1 if key[i] == key[b] else b
    period = n - border[-1]
    return period if MIN_PERIOD_EVENTS <= period <= n // 2 else None


def step_boundary(trace: Trace) -> int | None:
    """How many events pass before only the start allocations never freed in the window are alive (None: never)."""
    ev = trace.events
    kind, ids = ev["kind"].to_numpy(), ev["alloc_id"].to_numpy()
    start_ids = set(trace.initial_allocs["alloc_id"].tolist())
    completed = ids[kind == EventKind.FREE_COMPLETED]
    transient = len(start_ids & set(completed.tolist()))
    delta = np.zeros(len(kind), dtype=np.int64)
    delta[kind == EventKind.ALLOC] = 1
    delta[kind == EventKind.FREE_COMPLETED] = -1
    # Frees of allocations the window never saw allocated (or saw twice) make the count meaningless.
    alive = transient + np.cumsum(delta)
    if (alive < 0).any():
        return None
    hit = np.flatnonzero(alive == 0)
    return int(hit[0]) + 1 if len(hit) else None


def _stands_for(trace: Trace, end: int, shift: int) -> dict[int, int] | None:
    """Allocation alive after event ``end - 1`` -> the start allocation ``shift`` events earlier (None: not one)."""
    ev = trace.events
    kind, ids = ev["kind"].to_numpy(), ev["alloc_id"].to_numpy()
    start_ids = set(trace.initial_allocs["alloc_id"].tolist())
    freed_at: dict[int, int] = {}
    for i in np.flatnonzero(kind == EventKind.FREE_REQUESTED).tolist():
        freed_at.setdefault(int(ids[i]), i)
    allocated = np.flatnonzero(kind[:end] == EventKind.ALLOC)
    out: dict[int, int] = {}
    taken: set[int] = set()
    for aid in ids[allocated].tolist():
        j = freed_at.get(aid)
        if j is not None and j < end:
            continue
        if j is None or j - shift < 0 or kind[j - shift] != EventKind.FREE_REQUESTED:
            return None   # alive to the end of the window: it stands for no start allocation
        stands_for = int(ids[j - shift])
        if stands_for not in start_ids or stands_for in taken:
            return None
        out[aid] = stands_for
        taken.add(stands_for)
    freed_start = {int(a) for a in ids[kind == EventKind.FREE_REQUESTED].tolist() if a in start_ids}
    return out if taken == freed_start else None


def steady_start(trace: Trace, policy: str = "pytorch") -> Trace | None:
    """``trace`` started from the layout its own steps leave behind (see module doc), or None."""
    if not len(trace.initial_allocs) or len(trace.devices) != 1:
        return None
    boundary = step_boundary(trace)
    start_ids = set(trace.initial_allocs["alloc_id"].tolist())
    n = len(trace.events)
    if boundary == n and not _any_freed(trace, start_ids):
        # The window is one whole step (only the allocations alive all window are alive at both
        # ends): the same step ran before it.
        layout = _layout_after(_warm_up(trace, 0, n), n, {}, start_ids, policy)
        return None if layout is None else _with_layout(trace, *layout)
    period = find_period(trace)
    if period is None:
        return None
    if boundary is None or boundary > period or 2 * period > len(trace.events):
        return None
    # One whole step from the boundary, then the part of the next one up to where the window opened.
    end = 2 * period
    partners = _stands_for(trace, end, end)
    if partners is None:
        return None
    layout = _layout_after(_warm_up(trace, boundary, end), end - boundary, partners, start_ids, policy)
    if layout is None:
        return None
    return _with_layout(trace, *layout)


def _any_freed(trace: Trace, ids: set[int]) -> bool:
    ev = trace.events
    freed = ev["alloc_id"].to_numpy()[ev["kind"].to_numpy() == EventKind.FREE_REQUESTED]
    return bool(np.isin(freed, np.fromiter(ids, dtype=np.int64, count=len(ids))).any())


def _warm_up(trace: Trace, first: int, end: int) -> Trace:
    """Events ``first..end-1`` of ``trace`` from a start that holds only the allocations alive all window.

    Those that sit in ``trace``'s (partial) start layout stay there; the blocks of the others become free.
    """
    ev = trace.events
    freed = set(ev["alloc_id"].to_numpy()[ev["kind"].to_numpy() == EventKind.FREE_REQUESTED].tolist())
    initial = trace.initial_allocs
    initial = initial[~initial["alloc_id"].isin(list(freed))].copy()
    segments, blocks = trace.initial_segments, trace.initial_blocks
    if len(segments):
        blocks = _freed(blocks, blocks["alloc_id"].isin(list(freed)).to_numpy())
    else:
        initial["addr"] = -1
        initial["block_size_bytes"] = -1
    return Trace(events=ev.iloc[first:end].reset_index(drop=True), meta=trace.meta, labels=list(trace.labels),
                 initial_allocs=initial, initial_segments=segments, initial_blocks=blocks,
                 frames=trace.frames, stacks=trace.stacks)


def _freed(blocks: pd.DataFrame, which: np.ndarray) -> pd.DataFrame:
    """``blocks`` with the rows ``which`` made free blocks (the engine merges free neighbours)."""
    out = blocks.copy()
    out.loc[which, "alloc_id"] = -1
    out.loc[which, "requested_bytes"] = 0
    out.loc[which, "state"] = "inactive"
    return out


def carried_layout(trace: Trace, recorded: Trace, keep_cached: bool = False) -> Trace:
    """``trace`` with its start allocations that kept their size where ``recorded`` (the reference run) had them.

    A scaled trace's start allocations are the reference's, resized by their laws. Those whose size
    did not change and that stay alive all window (weights) sit where the reference run placed them: every segment of its recorded
    layout that holds one stays, with the blocks of resized allocations made free. Segments that
    hold none (cached by the reference's own sizes) are dropped unless ``keep_cached`` (one process
    runs the target after the reference and keeps its cache: ``one_cache``); the resized allocations
    have no address and are placed after the layout. A reference with no recorded layout changes nothing.
    """
    segments, blocks = recorded.initial_segments, recorded.initial_blocks
    if not len(segments) or not len(blocks) or not len(trace.initial_allocs):
        return trace
    new_size = dict(zip(trace.initial_allocs["alloc_id"].tolist(), trace.initial_allocs["size_bytes"].tolist()))
    old = recorded.initial_allocs
    old_size = dict(zip(old["alloc_id"].tolist(), old["size_bytes"].tolist()))
    ids = blocks["alloc_id"].tolist()
    # Only allocations alive all window (an activation of the step in progress is laid out by the step).
    ev = trace.events
    freed = set(ev["alloc_id"].to_numpy()[ev["kind"].to_numpy() == EventKind.FREE_REQUESTED].tolist())
    kept = np.array([a >= 0 and a not in freed and a in new_size and new_size[a] == old_size.get(a) for a in ids],
                    dtype=bool)
    if not kept.any() and not keep_cached:
        return trace
    holding = set((blocks if keep_cached else blocks[kept])["segment_addr"].tolist())
    in_kept_segment = blocks["segment_addr"].isin(list(holding)).to_numpy()
    blocks = _freed(blocks, ~kept & (blocks["alloc_id"].to_numpy() >= 0))[in_kept_segment].reset_index(drop=True)
    segments = segments[segments["addr"].isin(list(holding))].reset_index(drop=True)
    where = dict(zip(blocks["alloc_id"].tolist(), zip(blocks["addr"].tolist(), blocks["size_bytes"].tolist())))
    initial = trace.initial_allocs.copy()
    initial["addr"] = np.array([where.get(a, (-1, -1))[0] for a in initial["alloc_id"].tolist()], dtype=np.int64)
    initial["block_size_bytes"] = np.array([where.get(a, (-1, -1))[1] for a in initial["alloc_id"].tolist()],
                                           dtype=np.int64)
    return Trace(events=trace.events, meta=trace.meta, labels=list(trace.labels), initial_allocs=initial,
                 initial_segments=segments, initial_blocks=blocks, frames=trace.frames, stacks=trace.stacks)


def _layout_after(trace: Trace, period: int, partners: dict[int, int], start_ids: set[int], policy: str
                  ) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    """The allocator's segments and blocks after ``period`` events, live blocks named by the start allocations."""
    from ..engine import run_fast

    taken: dict[str, tuple] = {}

    def observe(i: int, p) -> None:
        if i == period - 1:
            taken["state"] = _state_of(p)

    result = run_fast(trace, policy, observer=observe)
    if len(result.ooms) or "state" not in taken or taken["state"] is None:
        return None
    device = int(trace.devices[0])
    seg_rows, block_rows = taken["state"]
    named = []
    for seg_addr, addr, size, req, aid in block_rows:
        if aid >= 0:
            aid = partners.get(aid, aid)
            if aid not in start_ids:
                return None
        named.append((seg_addr, addr, size, req, aid))
    segments = pd.DataFrame({
        "device": np.full(len(seg_rows), device, dtype=SEGMENT_DTYPES["device"]),
        "addr": np.array([r[0] for r in seg_rows], dtype=np.int64),
        "size_bytes": np.array([r[1] for r in seg_rows], dtype=np.int64),
        "stream": np.array([r[2] for r in seg_rows], dtype=np.int64),
        "pool": np.array([r[3] for r in seg_rows], dtype=object),
        "is_expandable": np.zeros(len(seg_rows), dtype=bool)})
    blocks = pd.DataFrame({
        "device": np.full(len(named), device, dtype=BLOCK_DTYPES["device"]),
        "segment_addr": np.array([r[0] for r in named], dtype=np.int64),
        "addr": np.array([r[1] for r in named], dtype=np.int64),
        "size_bytes": np.array([r[2] for r in named], dtype=np.int64),
        "requested_bytes": np.array([r[3] for r in named], dtype=np.int64),
        "state": np.array(["active_allocated" if r[4] >= 0 else "inactive" for r in named], dtype=object),
        "alloc_id": np.array([r[4] for r in named], dtype=np.int64),
        "stack_id": np.full(len(named), -1, dtype=np.int32)})
    return segments, blocks


def _state_of(p) -> tuple[list, list] | None:
    """(segments, blocks) of a pytorch-preset policy: ``(addr, size, stream, pool)`` and
    ``(segment_addr, addr, size, requested, alloc_id)``; None for a state this cannot describe."""
    pools = {"large": getattr(p, "large", None), "small": getattr(p, "small", None)}
    if pools["large"] is None or getattr(p, "_expandable", None) is not None or len(p.pending):
        return None
    segs = []
    for name, pool in pools.items():
        if name == "small" and pool is pools["large"]:
            continue
        streams = pool.segment_stream_at
        for addr, size in pool.segment_size_at.items():
            segs.append((int(addr), int(size), int(streams[addr]), name))
    segs.sort()
    starts = np.array([s[0] for s in segs], dtype=np.int64)

    def segment_of(addr: int) -> int:
        return int(starts[np.searchsorted(starts, addr, side="right") - 1])

    blocks = []
    for name, pool in pools.items():
        if name == "small" and pool is pools["large"]:
            continue
        for addr, size, _skey in pool.blocks():
            blocks.append((segment_of(int(addr)), int(addr), int(size), 0, -1))
    for aid, (addr, req, size, _stream) in p.live.items():
        blocks.append((segment_of(int(addr)), int(addr), int(size), int(req), int(aid)))
    blocks.sort(key=lambda r: r[1])
    return segs, blocks


def _with_layout(trace: Trace, segments: pd.DataFrame, blocks: pd.DataFrame) -> Trace:
    """``trace`` whose start allocations sit in ``blocks`` (addresses and block sizes from there)."""
    live = blocks[blocks["alloc_id"] >= 0]
    where = dict(zip(live["alloc_id"].tolist(), zip(live["addr"].tolist(), live["size_bytes"].tolist())))
    initial = trace.initial_allocs.copy()
    ids = initial["alloc_id"].tolist()
    initial["addr"] = np.array([where.get(a, (-1, -1))[0] for a in ids], dtype=np.int64)
    initial["block_size_bytes"] = np.array([where.get(a, (-1, -1))[1] for a in ids], dtype=np.int64)
    return Trace(events=trace.events, meta=trace.meta, labels=list(trace.labels), initial_allocs=initial,
                 initial_segments=segments, initial_blocks=blocks,
                 frames=trace.frames, stacks=trace.stacks)


def one_cache(traces: list[Trace]) -> bool:
    """Whether the inputs (in order of value) look like one process that ran them in turn and kept its cache.

    A caching allocator returns no segment unless asked (``empty_cache``), so a process that runs
    the sizes one after another starts each with every segment the earlier ones held: each input's
    recorded start segments (pool and size) include all of the smaller input's.
    """
    if len(traces) < 2 or any(not len(t.initial_segments) for t in traces):
        return False
    held = [Counter(zip(t.initial_segments["pool"].tolist(), t.initial_segments["size_bytes"].tolist()))
            for t in traces]
    return all(not (smaller - larger) for smaller, larger in zip(held, held[1:]))


def as_predicted(trace: Trace, recorded: Trace | None = None, keep_cached: bool = False) -> tuple[Trace, bool]:
    """``(trace laid out, steady)``: the start layout dropped and laid out as a prediction lays it out.

    Start allocations whose size ``recorded`` (the reference run; ``trace`` itself when None) shares
    stay where it had them (``carried_layout``, with its cached segments if ``keep_cached``); the
    rest follow the window's period (``steady_start``, ``steady`` True) or are placed anew.
    """

    carried = carried_layout(fresh_start(trace), trace if recorded is None else recorded, keep_cached)
    steady = None if keep_cached else steady_start(carried)
    return (carried, False) if steady is None else (steady, True)
