"""The vectorised back half of every reader: address-keyed records in, trace columns out, in numpy.

``build_columns`` does what ``TraceBuilder`` does one record at a time (map reused addresses to
fresh allocation ids, turn frees of blocks allocated before the window into initial allocations,
check time order, sizes, double frees) as a handful of sorts and array expressions, with no hash
table keyed by anything a file controls. It handles the valid file. When it finds anything a
reader must report or repair (a double free, time going back, a size mismatch...), it returns
``None`` and the reader replays the records through ``TraceBuilder``, the sequential reference,
which names the first bad record exactly as before and makes the documented repairs.

On the compiled route (``allocsim.trace.reading.compiled``) the same work is one pass in C
(``build_records``, with a randomly keyed hash of (device, address)): same columns, same hand-backs.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .builder import MAX_SIZE_BYTES
from ..schema import EventKind

#: Operation codes of ``Records.op``.
OP_ALLOC = 1          #: allocation request at ``addr`` of ``size``
OP_FREE_REQUESTED = 2  #: the program freed ``addr`` (``size``: what the source says, -1 unknown)
OP_FREE_COMPLETED = 3  #: the block at ``addr`` is reusable
OP_FREE = 4           #: requested and completed at once (sources that do not split frees)
OP_MARKER = 5         #: a label; ``label`` indexes the labels list
OP_EMPTY_CACHE = 6    #: the program's cache release
OP_NONE = 7           #: no request event (a recorded decision only); keeps its position

_A, _R, _C = OP_ALLOC, OP_FREE_REQUESTED, OP_FREE_COMPLETED


@dataclasses.dataclass
class Records:
    """One row per source record, in the order the source feeds them (time order)."""

    t_ns: np.ndarray      # int64
    op: np.ndarray        # uint8, OP_*
    device: np.ndarray    # int64 (checked to fit int16 by the reader)
    stream: np.ndarray    # int64
    addr: np.ndarray      # int64
    size: np.ndarray      # int64; -1: not given (frees only)
    stack_id: np.ndarray  # int32, -1: no frames
    label: np.ndarray     # int64, marker label index (else 0)

    def __len__(self) -> int:
        return len(self.t_ns)


@dataclasses.dataclass
class Built:
    """What ``build_columns`` produced."""

    events: dict[str, np.ndarray]           # EVENT_DTYPES columns
    initial: dict[str, np.ndarray]          # INITIAL_ALLOC_DTYPES columns (orphan frees)
    row_event: np.ndarray                   # per record: index of its (last) event, or of the next event for OP_NONE
    row_alloc_id: np.ndarray                # per record: allocation id (-1 for non-requests)
    row_alloc_size: np.ndarray              # per record: the size the allocation was made with
    orphan_frees: int


def _expand_frees(rec: Records) -> tuple[np.ndarray, np.ndarray]:
    """Micro-ops: OP_FREE becomes a request then a completion; returns (row index, op) per micro-op."""
    op = rec.op
    is_free = op == OP_FREE
    reps = np.where(is_free, 2, 1)
    rows = np.repeat(np.arange(len(op)), reps)
    mop = op[rows].astype(np.int8)
    if is_free.any():
        first = np.ones(len(rows), dtype=bool)
        first[1:] = rows[1:] != rows[:-1]
        both = is_free[rows]
        mop[both & first] = _R
        mop[both & ~first] = _C
    return rows, mop


def _group_order(rec: Records, rows: np.ndarray, req: np.ndarray) -> np.ndarray:
    """Positions in ``req`` (request micro-ops) sorted by (device, addr), feed order within each.

    Sorting the source rows and expanding them is cheaper than sorting the micro-ops: a row's
    micro-ops (request, then completion) are adjacent in feed order anyway.
    """
    op = rec.op
    row_req = (op == _A) | (op == _R) | (op == _C) | (op == OP_FREE)
    src = np.flatnonzero(row_req)
    dev, addr = rec.device[src], rec.addr[src]
    if len(dev) and int(dev.min()) == int(dev.max()):
        row_order = np.argsort(addr, kind="stable")       # one device: a stable sort keeps feed order
    else:
        row_order = np.lexsort((src, addr, dev))
    sorted_rows = src[row_order]
    reps = np.where(op == OP_FREE, 2, 1)
    first_micro = np.cumsum(reps) - reps                   # micro-op index of each row's first micro-op
    counts = reps[sorted_rows]
    starts = np.cumsum(counts) - counts
    micro = np.repeat(first_micro[sorted_rows], counts) + (np.arange(int(counts.sum())) - np.repeat(starts, counts))
    position_in_req = np.empty(len(rows), dtype=np.int64)
    position_in_req[req] = np.arange(len(req))
    return position_in_req[micro]


def build_columns(rec: Records, *, first_alloc_id: int = 0) -> Built | None:
    """Turn ``rec`` into trace columns, or return None when the records need the sequential builder."""
    from . import compiled

    if compiled.active():
        return _build_compiled(rec, first_alloc_id)
    return build_columns_reference(rec, first_alloc_id=first_alloc_id)


def _build_compiled(rec: Records, first_alloc_id: int) -> Built | None:
    from . import compiled

    c = np.ascontiguousarray
    out = compiled.ext.build_records(
        c(rec.t_ns, np.int64), c(rec.op, np.uint8), c(rec.device, np.int64), c(rec.stream, np.int64),
        c(rec.addr, np.int64), c(rec.size, np.int64), c(rec.stack_id, np.int32), c(rec.label, np.int64),
        int(first_alloc_id), _BUILD_MEMORY_BYTES)
    if out is None:
        return None
    (t, kind, ids, size, stream, device, stack), (o_id, o_size, o_stream, o_device, o_addr), row_event, \
        row_id, row_size, orphans = out
    i64 = lambda b: np.frombuffer(b, dtype=np.int64)
    n_orphans = len(o_id) // 8
    return Built(
        events={"t_ns": i64(t), "kind": np.frombuffer(kind, np.uint8), "alloc_id": i64(ids), "size_bytes": i64(size),
                "stream": i64(stream), "device": np.frombuffer(device, np.int16),
                "stack_id": np.frombuffer(stack, np.int32)},
        initial={"alloc_id": i64(o_id), "size_bytes": i64(o_size), "stream": i64(o_stream),
                 "device": np.frombuffer(o_device, np.int16), "addr": i64(o_addr),
                 "block_size_bytes": np.full(n_orphans, -1, dtype=np.int64),
                 "stack_id": np.full(n_orphans, -1, dtype=np.int32)},
        row_event=i64(row_event), row_alloc_id=i64(row_id), row_alloc_size=i64(row_size), orphan_frees=int(orphans))


#: Working memory the compiled builder may take (its use is linear in the records it is given).
_BUILD_MEMORY_BYTES = 1 << 46


def build_columns_reference(rec: Records, *, first_alloc_id: int = 0) -> Built | None:
    """``build_columns`` in numpy: the reference the compiled builder is held to."""
    n = len(rec)
    t = rec.t_ns
    rows, mop = _expand_frees(rec)
    is_req = (mop == _A) | (mop == _R) | (mop == _C)
    # Time order: requests never go back; a decision-only row is not before the request before it.
    req_rows = np.flatnonzero(is_req | (mop == OP_MARKER) | (mop == OP_EMPTY_CACHE))
    t_req = t[rows[req_rows]]
    if len(t_req) > 1 and bool((np.diff(t_req) < 0).any()):
        return None
    none_rows = np.flatnonzero(mop == OP_NONE)
    if len(none_rows) and len(req_rows):
        before = np.searchsorted(req_rows, none_rows) - 1
        ok = before < 0
        prev_t = t_req[np.maximum(before, 0)]
        if bool(((~ok) & (t[rows[none_rows]] < prev_t)).any()):
            return None

    size = rec.size[rows]
    alloc_mask = mop == _A
    if bool(((size[alloc_mask] < 0) | (size[alloc_mask] > MAX_SIZE_BYTES)).any()):
        return None

    # Group the request micro-ops by (device, addr), in feed order inside each group.
    req = np.flatnonzero(is_req)
    order = _group_order(rec, rows, req)
    dev_r = rec.device[rows[req]]
    addr_r = rec.addr[rows[req]]
    g_dev, g_addr = dev_r[order], addr_r[order]
    g_op = mop[req][order]
    g_size = size[req][order]
    new_group = np.ones(len(order), dtype=bool)
    new_group[1:] = (g_dev[1:] != g_dev[:-1]) | (g_addr[1:] != g_addr[:-1])
    prev_op = np.empty(len(order), dtype=np.int8)
    prev_op[0:1] = 0
    prev_op[1:] = g_op[:-1]
    prev_op[new_group] = 0
    # The life cycle of an address: (orphan R | orphan C | A) R C A R C ...
    valid = ((prev_op == 0) | ((prev_op == _A) & (g_op == _R)) | ((prev_op == _R) & (g_op == _C))
             | ((prev_op == _C) & (g_op == _A)))
    valid &= ~((prev_op == 0) & (g_op == _R) & ((g_size < 0) | (g_size > MAX_SIZE_BYTES)))
    valid &= ~((prev_op == 0) & (g_op == _C) & ((g_size < 0) | (g_size > MAX_SIZE_BYTES)))
    if not bool(valid.all()):
        return None
    # Frees of an allocation made in the window must carry its size (when they carry one).
    after_alloc = (prev_op == _A) & (g_op == _R)
    prev_size = np.empty_like(g_size)
    prev_size[0:1] = 0
    prev_size[1:] = g_size[:-1]
    if bool((after_alloc & (g_size >= 0) & (g_size != prev_size)).any()):
        return None

    creation = new_group | (g_op == _A)          # every group starts with A or an orphan free
    orphan = new_group & (g_op != _A)
    orphan_complete = orphan & (g_op == _C)      # completion whose request fell before the window
    # Allocation ids in feed order of the creating micro-op.
    cre_sorted_pos = np.flatnonzero(creation)
    cre_feed = req[order[cre_sorted_pos]]
    id_rank = np.empty(len(cre_feed), dtype=np.int64)
    id_rank[np.argsort(cre_feed, kind="stable")] = np.arange(len(cre_feed))
    owner = np.maximum.accumulate(np.where(creation, np.arange(len(order)), 0))
    cre_index_of = np.empty(len(order), dtype=np.int64)
    cre_index_of[cre_sorted_pos] = np.arange(len(cre_sorted_pos))
    g_alloc_id = first_alloc_id + id_rank[cre_index_of[owner]]
    g_alloc_size = g_size[owner]

    # Back to feed order of micro-ops.
    m = len(mop)
    alloc_id = np.full(m, -1, dtype=np.int64)
    alloc_size = np.zeros(m, dtype=np.int64)
    extra = np.zeros(m, dtype=np.int64)            # an orphan completion emits its request first
    req_ord = req[order]
    alloc_id[req_ord] = g_alloc_id
    alloc_size[req_ord] = g_alloc_size
    extra[req_ord[orphan_complete]] = 1
    emits = np.where(mop == OP_NONE, 0, 1) + extra
    ends = np.cumsum(emits)
    n_events = int(ends[-1]) if m else 0

    kinds = np.zeros(m, dtype=np.uint8)
    kinds[mop == _A] = EventKind.ALLOC
    kinds[mop == _R] = EventKind.FREE_REQUESTED
    kinds[mop == _C] = EventKind.FREE_COMPLETED
    kinds[mop == OP_MARKER] = EventKind.MARKER
    kinds[mop == OP_EMPTY_CACHE] = EventKind.EMPTY_CACHE
    emitting = emits > 0
    pos_last = ends - 1                     # index of the micro-op's own (last) event
    ev_t = np.empty(n_events, dtype=np.int64)
    ev_kind = np.empty(n_events, dtype=np.uint8)
    ev_id = np.empty(n_events, dtype=np.int64)
    ev_size = np.empty(n_events, dtype=np.int64)
    ev_stream = np.empty(n_events, dtype=np.int64)
    ev_device = np.empty(n_events, dtype=np.int16)
    ev_stack = np.empty(n_events, dtype=np.int32)
    src = rows[emitting]
    p = pos_last[emitting]
    ev_t[p] = t[src]
    ev_kind[p] = kinds[emitting]
    ids_here = np.where(is_req, alloc_id, np.where(mop == OP_MARKER, rec.label[rows], -1))
    ev_id[p] = ids_here[emitting]
    sizes_here = np.where(is_req, alloc_size, np.where(mop == OP_MARKER, np.maximum(size, 0), 0))
    ev_size[p] = sizes_here[emitting]
    ev_stream[p] = rec.stream[src]
    ev_device[p] = rec.device[src]
    ev_stack[p] = np.where(is_req[emitting], rec.stack_id[src], -1)    # markers carry no stack
    oc = np.flatnonzero(extra > 0)
    if len(oc):
        q = pos_last[oc] - 1
        ev_t[q] = t[rows[oc]]
        ev_kind[q] = EventKind.FREE_REQUESTED
        ev_id[q] = alloc_id[oc]
        ev_size[q] = alloc_size[oc]
        ev_stream[q] = rec.stream[rows[oc]]
        ev_device[q] = rec.device[rows[oc]]
        ev_stack[q] = rec.stack_id[rows[oc]]

    # Per source record: its last micro-op's event (OP_NONE: the next event's index).
    last_micro = np.empty(n, dtype=np.int64)
    last_micro[rows] = np.arange(m)            # later micro-ops of a row overwrite earlier ones
    row_event = np.where(mop[last_micro] == OP_NONE, ends[last_micro], pos_last[last_micro])
    row_alloc_id = alloc_id[last_micro]
    row_alloc_size = alloc_size[last_micro]

    # Initial allocations: orphans, in feed order of their creation.
    orph_feed = req_ord[orphan]
    o_order = np.argsort(orph_feed, kind="stable")
    orph_feed = orph_feed[o_order]
    o_rows = rows[orph_feed]
    initial = {
        "alloc_id": alloc_id[orph_feed],
        "size_bytes": alloc_size[orph_feed],
        "stream": rec.stream[o_rows],
        "device": rec.device[o_rows].astype(np.int16),
        "addr": rec.addr[o_rows],
        "block_size_bytes": np.full(len(o_rows), -1, dtype=np.int64),
        "stack_id": np.full(len(o_rows), -1, dtype=np.int32),
    }
    return Built(
        events={"t_ns": ev_t, "kind": ev_kind, "alloc_id": ev_id, "size_bytes": ev_size,
                "stream": ev_stream, "device": ev_device, "stack_id": ev_stack},
        initial=initial,
        row_event=row_event,
        row_alloc_id=row_alloc_id,
        row_alloc_size=row_alloc_size,
        orphan_frees=int(orphan.sum()),
    )


def match_keys(dev_a: np.ndarray, addr_a: np.ndarray, dev_b: np.ndarray, addr_b: np.ndarray) -> np.ndarray:
    """For each (dev_b, addr_b), the index of the equal key in the unique keys (dev_a, addr_a), else -1.

    A sort-based join: its cost does not depend on how the keys hash.
    """
    na, nb = len(dev_a), len(dev_b)
    if nb == 0:
        return np.empty(0, dtype=np.int64)
    if na == 0:
        return np.full(nb, -1, dtype=np.int64)
    dev = np.concatenate([np.asarray(dev_a, np.int64), np.asarray(dev_b, np.int64)])
    addr = np.concatenate([np.asarray(addr_a, np.int64), np.asarray(addr_b, np.int64)])
    tag = np.concatenate([np.zeros(na, np.int8), np.ones(nb, np.int8)])
    order = np.lexsort((tag, addr, dev))
    s_dev, s_addr, s_tag = dev[order], addr[order], tag[order]
    new_group = np.ones(len(order), dtype=bool)
    new_group[1:] = (s_dev[1:] != s_dev[:-1]) | (s_addr[1:] != s_addr[:-1])
    head = np.maximum.accumulate(np.where(new_group, np.arange(len(order)), 0))
    head_is_a = s_tag[head] == 0
    match_sorted = np.where(head_is_a, order[head], -1)
    out = np.empty(nb, dtype=np.int64)
    b_pos = s_tag == 1
    out[order[b_pos] - na] = match_sorted[b_pos]
    return out
