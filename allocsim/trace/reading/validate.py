"""Check a columnar trace's semantics (ids, order, sizes); used for files users may have edited."""

from __future__ import annotations

import numpy as np

from ...errors import TraceFormatError
from .builder import MAX_SIZE_BYTES
from .limits import DEFAULT_LIMITS, Limits, check_count
from ..schema import EventKind, Trace

#: Times beyond this (about 146 years in ns) are refused: later sums of times must not wrap.
MAX_ABS_TIME_NS = 1 << 62

_KINDS = {int(k) for k in EventKind}
_KIND_OK = np.zeros(256, dtype=bool)
_KIND_OK[list(_KINDS)] = True


def validate_events(trace: Trace, path: str, *, lenient: bool = False, limits: Limits = DEFAULT_LIMITS) -> None:
    """Raise ``TraceFormatError`` at the first bad event row; with ``lenient``, drop bad rows and report them.

    On the compiled route a one-pass check (``events_check``) answers for a clean table without the
    reference's temporaries; anything else runs the reference checks below.
    """
    ev = trace.table("events")
    check_count(path, "events", len(ev), limits, "events", "events")
    if _clean_compiled(trace, path, limits):
        return
    devices = ev["device"].astype(np.int64) + (1 << 15)
    check_count(path, "devices", int(np.count_nonzero(np.bincount(devices))) if len(devices) else 0, limits,
                "devices", "events")
    streams = ev["stream"]
    if len(streams) and int(streams.min()) != int(streams.max()):
        check_count(path, "streams", len(np.unique(streams)), limits, "streams", "events")
    check_time_range(path, ev["t_ns"])
    bad_rows: list[int] = []

    def problem(row: int, reason: str) -> None:
        if not lenient:
            raise TraceFormatError(path, f"event row {row}", reason)
        if len(bad_rows) < 200:
            trace.meta.repairs.append(f"event row {row}: {reason}; dropped the row")
        bad_rows.append(row)

    t_ns = ev["t_ns"]
    kind = ev["kind"]
    ids = ev["alloc_id"]
    size = ev["size_bytes"]
    for row in np.flatnonzero(~_KIND_OK[kind.astype(np.uint8)] if kind.dtype == np.uint8 else ~np.isin(kind, list(_KINDS))):
        problem(int(row), f"unknown event kind {int(kind[row])}")
    for row in np.flatnonzero((size < 0) | (size > MAX_SIZE_BYTES)):
        problem(int(row), f"size {int(size[row])} out of range")
    if len(t_ns) > 1:
        for row in np.flatnonzero(np.diff(t_ns) < 0)[:1000] + 1:
            problem(int(row), f"time goes back from {int(t_ns[row - 1])} to {int(t_ns[row])} ns")

    # Id life cycle: ALLOC -> FREE_REQUESTED -> FREE_COMPLETED; initial allocs start as allocated.
    if not bad_rows and _life_cycles_valid(trace):
        return
    state: dict[int, int] = {int(i): 0 for i in trace.table("initial_allocs")["alloc_id"]}
    seen = set(state)
    kind_list, id_list = kind.tolist(), ids.tolist()
    dropped = set(bad_rows)
    for row, (k, i) in enumerate(zip(kind_list, id_list)):
        if row in dropped:
            continue
        if k == EventKind.ALLOC:
            if i in seen:
                problem(row, f"allocation id {i} used twice")
                continue
            seen.add(i)
            state[i] = 0
        elif k == EventKind.FREE_REQUESTED:
            if state.get(i) != 0:
                problem(row, f"free request of id {i} which is not allocated")
                continue
            state[i] = 1
        elif k == EventKind.FREE_COMPLETED:
            if i not in state:
                problem(row, f"free completion of id {i} which is not allocated")
                continue
            del state[i]
        elif k == EventKind.MARKER and not 0 <= i < len(trace.labels):
            problem(row, f"marker label index {i} has no label")
    if bad_rows:
        keep = np.ones(len(ev), dtype=bool)
        keep[bad_rows] = False
        trace.events = trace.events.loc[keep].reset_index(drop=True)
        if len(bad_rows) > 200:
            trace.meta.repairs.append(f"... and {len(bad_rows) - 200} more rows dropped")


def _clean_compiled(trace: Trace, path: str, limits: Limits) -> bool:
    """True when the compiled check finds the events clean (caps on devices and streams applied)."""
    from . import compiled

    if not compiled.active():
        return False
    ev = trace.table("events")
    c = np.ascontiguousarray
    clean, n_devices, t_min, t_max = compiled.ext.events_check(
        c(ev["t_ns"], np.int64), c(ev["kind"], np.uint8), c(ev["alloc_id"], np.int64),
        c(ev["size_bytes"], np.int64), c(ev["device"], np.int16),
        c(trace.table("initial_allocs")["alloc_id"], np.int64), len(trace.labels))
    if not clean or not -MAX_ABS_TIME_NS <= t_min <= t_max <= MAX_ABS_TIME_NS:
        return False
    check_count(path, "devices", n_devices, limits, "devices", "events")
    streams = ev["stream"]
    if len(streams) and int(streams.min()) != int(streams.max()):
        check_count(path, "streams", len(np.unique(streams)), limits, "streams", "events")
    return True


def check_time_range(path: str, t_ns: np.ndarray) -> None:
    """Refuse times beyond +-2**62 ns, so that spans and sums of times cannot wrap around int64."""
    if len(t_ns) and (int(t_ns.min()) < -MAX_ABS_TIME_NS or int(t_ns.max()) > MAX_ABS_TIME_NS):
        row = int(np.flatnonzero(np.abs(t_ns.astype(np.float64)) > MAX_ABS_TIME_NS)[0])
        raise TraceFormatError(path, f"event row {row}", f"time {int(t_ns[row])} ns is beyond +-2**62 ns "
                               "(about 146 years): not a real time")


def _life_cycles_valid(trace: Trace) -> bool:
    """True when every id goes ALLOC -> FREE_REQUESTED -> FREE_COMPLETED (initial ids start allocated)
    and every marker names a label: checked with sorts, no hash table keyed by file values."""
    ev = trace.table("events")
    kind = ev["kind"]
    ids = ev["alloc_id"]
    markers = kind == EventKind.MARKER
    if markers.any() and (int(ids[markers].min()) < 0 or int(ids[markers].max()) >= len(trace.labels)):
        return False
    req = (kind >= EventKind.ALLOC) & (kind <= EventKind.FREE_COMPLETED)
    initial = trace.table("initial_allocs")["alloc_id"]
    dense = _dense_life_cycles_valid(kind, ids, req, initial)
    if dense is not None:
        return dense
    all_ids = np.concatenate([initial, ids[req]])
    code = np.concatenate([np.full(len(initial), EventKind.ALLOC, dtype=np.int64), kind[req].astype(np.int64)])
    pos = np.arange(len(all_ids))
    order = np.lexsort((pos, all_ids))
    s_id, s_code = all_ids[order], code[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = s_id[1:] != s_id[:-1]
    prev = np.roll(s_code, 1)
    ok_first = s_code[first] == EventKind.ALLOC
    nxt = ~first
    ok_next = ((prev[nxt] == EventKind.ALLOC) & (s_code[nxt] == EventKind.FREE_REQUESTED)) | (
        (prev[nxt] == EventKind.FREE_REQUESTED) & (s_code[nxt] == EventKind.FREE_COMPLETED))
    return bool(ok_first.all()) and bool(ok_next.all())


#: Live bytes beyond this (4 EiB) are refused: no device holds them, and later int64 sums must not wrap.
MAX_LIVE_BYTES = 1 << 62


def check_live_bytes(path: str, trace: Trace) -> None:
    """Refuse a trace whose live bytes pass ``MAX_LIVE_BYTES`` (checked exactly, only when they could)."""
    from ..inference.stats import _exact_sum, live_bytes_series

    kind = trace.column("kind")
    sizes = trace.column("size_bytes")
    initial = trace.table("initial_allocs")["size_bytes"]
    # Cheap bound first: allocations times the largest size (Python ints, cannot wrap).
    n_allocs = int(np.count_nonzero(kind == EventKind.ALLOC))
    largest = max(int(sizes.max()) if len(sizes) else 0, 0)
    if n_allocs * largest + _exact_sum(initial) <= MAX_LIVE_BYTES:
        return
    bound = _exact_sum(np.where(kind == EventKind.ALLOC, sizes, 0)) + _exact_sum(initial)
    if bound <= MAX_LIVE_BYTES:
        return
    _, total = live_bytes_series(trace)
    over = [i for i, v in enumerate(total.tolist()) if v > MAX_LIVE_BYTES]
    if over:
        raise TraceFormatError(path, f"event row {over[0]}", f"live bytes reach {int(total[over[0]]):,}, more "
                               "than 2**62 (4 EiB): not a real trace")


def _dense_life_cycles_valid(kind: np.ndarray, ids: np.ndarray, req: np.ndarray,
                             initial: np.ndarray) -> bool | None:
    """``_life_cycles_valid`` in O(n) when ids are dense (0..~n), as every reader numbers them; else None.

    Each (id, stage) pair gets one slot of a table indexed by ``3 * id + stage``: a slot used twice,
    a stage without the one before it, or stages out of order is a broken life cycle.
    """
    all_requests = bool(req.all())
    used = ids if all_requests else ids[req]
    if not len(used) and not len(initial):
        return True
    top = max(int(used.max()) if len(used) else -1, int(initial.max()) if len(initial) else -1)
    low = min(int(used.min()) if len(used) else 0, int(initial.min()) if len(initial) else 0)
    if low < 0 or top > 2 * (len(used) + len(initial)) + 1024:
        return None
    size = top + 1
    stage = (kind if all_requests else kind[req]).astype(np.int64) - int(EventKind.ALLOC)
    slot = used * 3 + stage
    counts = np.bincount(slot, minlength=3 * size)
    if len(initial):
        counts[initial * 3] += 1
    if int(counts.max(initial=0)) > 1:
        return False
    at = np.full(3 * size, -2, dtype=np.int64)          # -2: never; -1: before the trace (initial)
    at[slot] = np.arange(len(used)) if all_requests else np.flatnonzero(req)
    if len(initial):
        at[initial * 3] = -1
    at = at.reshape(size, 3)
    alloc, request, done = at[:, 0], at[:, 1], at[:, 2]
    has_request, has_done = request > -2, done > -2
    if bool((has_request & ((alloc == -2) | (request < alloc))).any()):
        return False
    if bool((has_done & (~has_request | (done < request))).any()):
        return False
    return True
