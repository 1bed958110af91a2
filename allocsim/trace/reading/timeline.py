"""A Chrome-trace timeline's memory records as columns, framed by the ops around them and fed to the builder.

The Kineto and the Paddle readers share this back half: ``Rec`` (one record as it is read),
``RecColumns`` and ``OpColumns`` (the records and the CPU ops that may frame them, as columns),
``op_frames`` (each record's pseudo-frames: the ops that enclose it in time on its thread,
innermost first, on either route) and ``feed_records`` (the records into the builder, vectorised
when they are clean); ``running_total`` checks them against the allocator's running total first.
"""

from __future__ import annotations

import re

import numpy as np

from ..schema import DECISION_DTYPES, EVENT_DTYPES, INITIAL_ALLOC_DTYPES, Trace, table_from_columns, text_column
from . import compiled
from .builder import TraceBuilder
from .columnar import OP_ALLOC, OP_FREE, OP_MARKER, OP_NONE, Records, build_columns
from .frames import FrameTable, frame_tables
from .limits import Limits

#: A Python function as Kineto names it (``file.py(12): fn``): its file, line and name.
_PY_FUNCTION = re.compile(r"(.{1,4096}?)\((\d{1,9})\): (.{1,4096})")

MEM, OOM, STEP = 0, 1, 2      #: ``RecColumns.kind``: a [memory] event, an OOM, a step marker


class Rec:
    """One event to feed to the builder, kept small until the events are sorted."""

    __slots__ = ("t_ns", "pos", "kind", "device", "addr", "nbytes", "total_alloc", "total_reserved",
                 "label", "thread", "label_type", "label_index")

    def __init__(self, t_ns, pos, kind, device=0, addr=0, nbytes=0, total_alloc=None, label="",
                 total_reserved=None, thread=""):
        self.t_ns, self.pos, self.kind = t_ns, pos, kind
        self.device, self.addr, self.nbytes = device, addr, nbytes
        self.total_alloc, self.total_reserved, self.label = total_alloc, total_reserved, label
        self.thread = thread
        self.label_type = self.label_index = None


def op_frame(name: str) -> dict:
    """A frame for an op: Python functions (``file.py(12): fn``) keep their file and line."""
    m = _PY_FUNCTION.fullmatch(name)
    if m:
        return {"filename": m.group(1), "line": int(m.group(2)), "name": m.group(3)}
    return {"filename": "", "line": 0, "name": name}


class Threads:
    """Thread keys (``pid\\0tid`` text) numbered in order of first use."""

    def __init__(self, names: list[str] | None = None):
        self.names = list(names or [])
        self.index = {name: i for i, name in enumerate(self.names)}

    def id(self, key: str) -> int:
        found = self.index.get(key)
        if found is None:
            found = self.index[key] = len(self.names)
            self.names.append(key)
        return found


KINDS = {"mem": MEM, "oom": OOM, "step": STEP}


class RecColumns:
    """The records to feed, as columns (``kind``: 0 [memory], 1 OOM, 2 step; -1 totals: not recorded)."""

    def __init__(self, *, t_ns, pos, kind, device, addr, nbytes, total, reserved, thread, label, labels):
        self.t_ns, self.pos, self.kind, self.device = t_ns, pos, kind, device
        self.addr, self.nbytes, self.total, self.reserved = addr, nbytes, total, reserved
        self.thread, self.label = thread, label      # thread ids; step label: index in ``labels``
        self.labels = labels

    def __len__(self) -> int:
        return len(self.t_ns)

    @classmethod
    def of(cls, recs: list[Rec], threads: Threads) -> "RecColumns":
        labels = [r.label for r in recs if r.kind == "step"]
        step_index = iter(range(len(labels)))
        col = lambda values, dtype=np.int64: np.array(values, dtype=dtype)
        return cls(
            t_ns=col([r.t_ns for r in recs]), pos=col([r.pos for r in recs]),
            kind=col([KINDS[r.kind] for r in recs], np.int8), device=col([r.device for r in recs]),
            addr=col([r.addr for r in recs]), nbytes=col([r.nbytes for r in recs]),
            total=col([r.total_alloc if r.total_alloc is not None else -1 for r in recs]),
            reserved=col([r.total_reserved if r.total_reserved is not None else -1 for r in recs]),
            thread=col([threads.id(r.thread) if r.kind != "step" else -1 for r in recs]),
            label=col([next(step_index) if r.kind == "step" else 0 for r in recs]), labels=labels)

    @classmethod
    def concat(cls, a: "RecColumns", b: "RecColumns") -> "RecColumns":
        cat = lambda name: np.concatenate([getattr(a, name), getattr(b, name)])
        return cls(t_ns=cat("t_ns"), pos=cat("pos"), kind=cat("kind"), device=cat("device"), addr=cat("addr"),
                   nbytes=cat("nbytes"), total=cat("total"), reserved=cat("reserved"), thread=cat("thread"),
                   label=np.concatenate([a.label, b.label + len(a.labels)]), labels=a.labels + b.labels)

    def sorted(self) -> "RecColumns":
        """In feed order: by time, then position in the file."""
        order = np.lexsort((self.pos, self.t_ns))
        take = lambda values: values[order]
        return RecColumns(t_ns=take(self.t_ns), pos=take(self.pos), kind=take(self.kind), device=take(self.device),
                           addr=take(self.addr), nbytes=take(self.nbytes), total=take(self.total),
                           reserved=take(self.reserved), thread=take(self.thread), label=take(self.label),
                           labels=self.labels)


class OpColumns:
    """CPU ops that may frame [memory] events: thread id, start and end (ns), name."""

    def __init__(self, *, thread: np.ndarray, start: np.ndarray, end: np.ndarray, name: list[str]):
        self.thread, self.start, self.end, self.name = thread, start, end, name

    @classmethod
    def of(cls, ops: list[tuple[str, int, int, str]], threads: Threads) -> "OpColumns":
        return cls(thread=np.array([threads.id(o[0]) for o in ops], dtype=np.int64),
                   start=[o[1] for o in ops], end=[o[2] for o in ops], name=[o[3] for o in ops])


def op_frames(path: str, cols: RecColumns, ops: OpColumns, thread_names: list[str],
              limits: Limits) -> tuple[list[int] | None, dict, int]:
    """Each [memory] event's pseudo-frame stack on either route: (stack ids, frame tables, stack count).

    The Kineto and the Paddle readers share it: both frame an event by the ops enclosing it in time.
    """
    stacks = _op_stacks_compiled(cols, ops, thread_names, limits) if compiled.active() else None
    if stacks is not None:
        return stacks
    frames = FrameTable(path, limits)
    stack_ids = _op_stacks(cols, ops, thread_names, frames)
    return stack_ids, frames.tables(), frames.n_stacks


def _op_stacks(cols: RecColumns, ops: OpColumns, thread_names: list[str], frames: FrameTable) -> list[int] | None:
    """Stack id of each record: the ops that contain it in time on its thread, innermost first.

    One sweep per thread over ops sorted by start (outer first on ties) with a stack of open ops;
    ops on one thread nest (a call tree), so the open stack at a [memory] event is its context.
    """
    if not len(ops.thread):
        return None
    by_thread: dict[int, list[tuple[int, int, str]]] = {}
    for thread, start, end, name in zip(ops.thread.tolist(), list(ops.start), list(ops.end), ops.name):
        by_thread.setdefault(thread, []).append((int(start), -int(end), name))
    mem_rows = np.flatnonzero(cols.kind == MEM)
    mem_by_thread: dict[int, list[int]] = {}
    for row, thread in zip(mem_rows.tolist(), cols.thread[mem_rows].tolist()):
        mem_by_thread.setdefault(thread, []).append(row)
    out = [-1] * len(cols)
    t_col = cols.t_ns.tolist()
    frame_of: dict[str, dict] = {}
    for thread, rec_rows in mem_by_thread.items():
        thread_ops = by_thread.get(thread)
        if not thread_ops:
            continue
        thread_ops.sort()
        record = f"thread {thread_names[thread].replace(chr(0), '/')}"
        ends: list[int] = []        # open ops, outermost first
        sids: list[int] = []        # stack id with each open op innermost
        k = 0
        n_ops = len(thread_ops)
        for row in rec_rows:        # records are in time order
            t = t_col[row]
            while k < n_ops and thread_ops[k][0] <= t:
                start, neg_end, name = thread_ops[k]
                k += 1
                while ends and ends[-1] < start:
                    ends.pop()
                    sids.pop()
                frame = frame_of.get(name)
                if frame is None:
                    frame = frame_of[name] = op_frame(name)
                sids.append(frames.child_stack(sids[-1] if sids else -1, frame, record))
                ends.append(-neg_end)
            while ends and ends[-1] < t:
                ends.pop()
                sids.pop()
            out[row] = sids[-1] if sids else -1
    return out


def _negatable_int64(values) -> bool:
    """Whether every value is an int64 whose negation is one too (the sweep sorts ops by -end)."""
    if isinstance(values, np.ndarray):
        return values.dtype == np.int64 and (not len(values) or int(values.min()) > -(1 << 63))
    return not len(values) or (min(values) > -(1 << 63) and max(values) < (1 << 63))


def _op_stacks_compiled(cols: RecColumns, ops: OpColumns, thread_names: list[str], limits: Limits
                        ) -> tuple[list[int] | None, dict, int] | None:
    """``_op_stacks`` and the frame tables it fills, with the sweep and the interning in C
    (``op_sweep``, ``intern_stacks``): the same stacks and ids; None when a cap is exceeded (the
    Python route then raises it, naming the thread)."""
    if not len(ops.thread):
        return None, frame_tables([], np.empty(0, np.int64), [], np.empty(0, np.int32), np.zeros(1, np.int64)), 0
    if not (_negatable_int64(ops.start) and _negatable_int64(ops.end)):
        return None     # times past int64 (a file's ts can be any integer): the Python sweep takes them
    mem_rows = np.flatnonzero(cols.kind == MEM)
    mem_thread = cols.thread[mem_rows]
    # Threads in the order their first [memory] event comes (the Python sweep's dict order).
    threads, first = np.unique(mem_thread, return_index=True)
    threads = threads[np.argsort(first, kind="stable")]
    rank_of = np.full(int(max(threads.max(initial=-1), ops.thread.max(initial=-1))) + 2, -1, dtype=np.int64)
    rank_of[threads] = np.arange(len(threads))
    op_rank = rank_of[ops.thread]
    start, end = np.asarray(ops.start, dtype=np.int64), np.asarray(ops.end, dtype=np.int64)
    distinct = sorted(set(ops.name))
    name_rank = {name: i for i, name in enumerate(distinct)}
    names = np.array([name_rank[n] for n in ops.name], dtype=np.int64)
    keep = np.flatnonzero(op_rank >= 0)
    # Ops in sweep order: by thread, then (start, -end, name) as the Python sweep sorts them.
    order = keep[np.lexsort((names[keep], -end[keep], start[keep], op_rank[keep]))]
    op_groups = np.searchsorted(op_rank[order], np.arange(len(threads) + 1)).astype(np.int64)
    mem_order = np.lexsort((np.arange(len(mem_rows)), rank_of[mem_thread]))
    mem_groups = np.searchsorted(rank_of[mem_thread][mem_order], np.arange(len(threads) + 1)).astype(np.int64)
    parent, top = compiled.ext.op_sweep(start[order], end[order], op_groups,
                                        cols.t_ns[mem_rows][mem_order].astype(np.int64), mem_groups)
    parent, top = np.frombuffer(parent, np.int64), np.frombuffer(top, np.int64)
    # Pushed ops in push order; each one's frame, numbered as frames are first met in that order.
    pushed = np.flatnonzero(parent != -2)
    at = np.full(len(order), -1, dtype=np.int64)
    at[pushed] = np.arange(len(pushed))
    pushed_parent = np.where(parent[pushed] >= 0, at[np.maximum(parent[pushed], 0)], -1)
    pushed_name = names[order[pushed]]
    content_index: dict[tuple, int] = {}
    contents: list[tuple] = []
    content_of_name = np.full(len(distinct), -1, dtype=np.int64)
    for k in np.unique(pushed_name).tolist():
        frame = op_frame(distinct[k])
        key = (frame["filename"], frame["line"], frame["name"])
        if key not in content_index:
            content_index[key] = len(contents)
            contents.append(key)
        content_of_name[k] = content_index[key]
    content = content_of_name[pushed_name]
    seen, first_at = np.unique(content, return_index=True)
    if len(seen) > limits.frames:
        return None
    ranked = seen[np.argsort(first_at, kind="stable")]
    fid_of = np.empty(len(contents), dtype=np.int64)
    fid_of[ranked] = np.arange(len(ranked))
    interned = compiled.ext.intern_stacks(pushed_parent.astype(np.int64), fid_of[content].astype(np.int64),
                                          limits.frames, limits.frames * 8)
    if interned is None:
        return None
    pushed_sid = np.frombuffer(interned[0], np.int64)
    sid = np.full(len(order), -1, dtype=np.int64)
    sid[pushed] = pushed_sid
    out = np.full(len(cols), -1, dtype=np.int64)
    if len(sid):
        out[mem_rows[mem_order]] = np.where(top >= 0, sid[np.maximum(top, 0)], -1)
    frame_rows = [contents[c] for c in ranked.tolist()]
    starts = np.frombuffer(interned[2], np.int64)
    tables = frame_tables([f[0] for f in frame_rows], np.array([f[1] for f in frame_rows], dtype=np.int64),
                          [f[2] for f in frame_rows], np.frombuffer(interned[1], np.int32), starts)
    return out.tolist(), tables, len(starts) - 1


def feed_records(builder: TraceBuilder, cols: RecColumns, where: str, marker_device: int,
          stack_ids: list[int] | None) -> tuple[np.ndarray, Trace | None]:
    """Feed the records: (event index of each record, the Trace) from the vectorised builder when
    the records are clean; else the sequential builder's indices and None (call ``finish``)."""
    n = len(cols)
    kind = cols.kind
    op = np.where(kind == MEM, np.where(cols.nbytes > 0, OP_ALLOC, OP_FREE),
                  np.where(kind == OOM, OP_NONE, OP_MARKER)).astype(np.uint8)
    size = np.where(kind == MEM, np.abs(cols.nbytes), np.where(kind == OOM, cols.nbytes, 0)).astype(np.int64)
    # Step labels in the order the markers come.
    steps = np.flatnonzero(kind == STEP)
    labels: list[str] = []
    label_index: dict[str, int] = {}
    label = np.zeros(n, dtype=np.int64)
    for row, k in zip(steps.tolist(), cols.label[steps].tolist()):
        name = cols.labels[k]
        if name not in label_index:
            label_index[name] = len(labels)
            labels.append(name)
        label[row] = label_index[name]
    device = np.where(kind == STEP, marker_device, cols.device).astype(np.int64)
    records = Records(
        t_ns=cols.t_ns.astype(np.int64), op=op, device=device, stream=np.zeros(n, dtype=np.int64),
        addr=cols.addr.astype(np.int64), size=size,
        stack_id=np.array(stack_ids if stack_ids is not None else [-1] * n, dtype=np.int32), label=label)
    built = build_columns(records)
    if built is not None:
        oom = np.flatnonzero(op == OP_NONE)
        decisions = {
            "event_index": built.row_event[oom], "t_ns": records.t_ns[oom],
            "action": text_column(["oom"], np.zeros(len(oom), np.intp)), "addr": np.full(len(oom), -1, np.int64),
            "size_bytes": size[oom], "stream": np.zeros(len(oom), np.int64), "device": records.device[oom],
            "alloc_id": np.full(len(oom), -1, np.int64), "device_free_bytes": np.full(len(oom), -1, np.int64)}
        if built.orphan_frees:
            builder.meta.notes.append(
                f"{built.orphan_frees} frees of blocks allocated before the trace began; "
                "they are in the initial state with the size the free reported")
        trace = Trace(events=table_from_columns(built.events, EVENT_DTYPES), meta=builder.meta, labels=labels,
                      initial_allocs=table_from_columns(built.initial, INITIAL_ALLOC_DTYPES),
                      decisions=table_from_columns(decisions, DECISION_DTYPES))
        return np.where(op == OP_NONE, -1, built.row_event), trace
    index = np.full(n, -1, dtype=np.int64)
    sids = records.stack_id.tolist()
    for i, (k, t, pos, dev, addr, nbytes) in enumerate(zip(
            kind.tolist(), records.t_ns.tolist(), cols.pos.tolist(), cols.device.tolist(), records.addr.tolist(),
            cols.nbytes.tolist())):
        where_ = where.format(pos)
        if k == MEM:
            if nbytes > 0:
                builder.alloc(where_, t, dev, 0, addr, nbytes, stack_id=sids[i])
                index[i] = builder.next_event_index - 1
            else:
                done = builder.free(where_, t, dev, 0, addr, -nbytes, stack_id=sids[i])
                index[i] = builder.next_event_index - 1 if done is not None else -1
        elif k == OOM:
            builder.decision(builder.next_event_index, max(t, builder.last_t_ns), "oom", -1, nbytes, 0, dev)
        else:
            builder.marker(where_, t, cols.labels[cols.label[i]], device=marker_device)
    return index, None
