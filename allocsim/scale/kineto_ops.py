"""Operator attribution for Kineto captures: which CPU ops enclose each allocation of a ``Trace``.

Use ``op_paths(path, trace)``. The Kineto reader keeps only memory events and step markers, so this
module reads the ``cpu_op`` duration events (``ph == "X"``) of the same file itself and, in one
sweep per thread, gives every allocation the chain of op instances open at its time (outermost
first). Allocation k of the file (``Bytes > 0``, in the reader's (ts, file position) order) is
allocation k of the trace; the sizes and times of both are compared one by one, and any
disagreement (a ``--lenient`` repair, a different file) means "no attribution" rather than a
wrong one.

The file is untrusted: its decompressed length is capped, and an op or memory event with a
non-numeric field is skipped, never trusted.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import re
import zlib
from typing import Any

import numpy as np

from ..trace.kineto import ts_to_ns
from ..trace.schema import EventKind, Trace

#: Larger decompressed files are not read for attribution (a gzip bomb must not fill memory).
MAX_JSON_BYTES = 2 << 30
OP_CATEGORIES = ("cpu_op",)
MEMORY_EVENT = "[memory]"
#: Only the innermost this-many enclosing ops name an allocation (real chains are ~10 deep); a file
#: cannot make the attribution cost more than this per allocation.
MAX_OP_DEPTH = 32
_INT_RE = re.compile(r"[+-]?\d{1,30}")


@dataclasses.dataclass
class OpPaths:
    """Per allocation (in trace order) the tuple of enclosing op instance ids, outermost first."""

    names: list[str]                 #: op instance id -> op name
    paths: list[tuple[int, ...]]     #: allocation k -> op instance ids (empty: no op was open)


def _read_json(path: str) -> Any | None:
    with open(path, "rb") as fh:
        magic = fh.read(2)
    opener = gzip.open if magic == b"\x1f\x8b" else open
    try:
        with opener(path, "rb") as fh:
            data = fh.read(MAX_JSON_BYTES + 1)
    except (OSError, EOFError, zlib.error):
        return None
    if len(data) > MAX_JSON_BYTES:
        return None
    keep = (MEMORY_EVENT,)

    def hook(obj: dict) -> Any:
        if "ph" in obj and "name" in obj and obj.get("name") not in keep and obj.get("cat") not in OP_CATEGORIES:
            return None
        return obj

    try:
        return json.loads(data, object_hook=hook, parse_float=str, parse_constant=str)
    except (ValueError, RecursionError):
        return None


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and _INT_RE.fullmatch(value):
        return int(value)
    return None


def op_paths(path: str, trace: Trace) -> OpPaths | None:
    """The op chain of every allocation of ``trace`` (read from ``path``), or None if unavailable."""
    doc = _read_json(str(path))
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc if isinstance(doc, list) else None
    if not isinstance(events, list):
        return None
    names: list[str] = []
    # Sweep items per thread: (t_ns, order, tiebreak, payload). At equal times a span opens
    # before, and closes after, the memory events it contains.
    sweeps: dict[tuple, list[tuple]] = {}
    allocs: list[tuple[int, int, int]] = []   # (t_ns, file position, size) of Bytes > 0 events
    for pos, ev in enumerate(events):
        if not isinstance(ev, dict):
            continue
        thread = (str(ev.get("pid")), str(ev.get("tid")))
        if ev.get("name") == MEMORY_EVENT:
            args = ev.get("args")
            t_ns = ts_to_ns(ev.get("ts"))
            size = _int(args.get("Bytes")) if isinstance(args, dict) else None
            if t_ns is None or size is None or size <= 0:
                continue
            allocs.append((t_ns, pos, size))
            sweeps.setdefault(thread, []).append((t_ns, 1, pos, len(allocs) - 1))
        elif ev.get("ph") == "X" and ev.get("cat") in OP_CATEGORIES and isinstance(ev.get("name"), str):
            start, dur = ts_to_ns(ev.get("ts")), ts_to_ns(ev.get("dur"))
            if start is None or dur is None or dur < 0:
                continue
            op_id = len(names)
            names.append(ev["name"])
            items = sweeps.setdefault(thread, [])
            items.append((start, 0, -(start + dur), op_id))   # longer spans open first
            items.append((start + dur, 2, -start, op_id))     # ...and close last
    del events, doc
    if not names:
        return None   # no op events in this file: nothing to attribute
    order = sorted(range(len(allocs)), key=lambda k: (allocs[k][0], allocs[k][1]))
    rank = np.empty(len(allocs), dtype=np.int64)
    rank[order] = np.arange(len(allocs))
    if not _matches_trace(trace, [allocs[k] for k in order]):
        return None
    paths: list[tuple[int, ...]] = [()] * len(allocs)
    for items in sweeps.values():
        items.sort()
        for k, path in _sweep(items):
            paths[int(rank[k])] = path
    return OpPaths(names=names, paths=paths)


def _sweep(items: list[tuple]):
    """Yield (allocation k, enclosing op ids) from one thread's sorted sweep items.

    Spans that close out of nesting order are closed lazily (marked, then skipped), so a hostile
    file costs at most ``MAX_OP_DEPTH`` work per allocation and amortised O(1) per span.
    """
    stack: list[int] = []
    closed: set[int] = set()
    for _, kind, _, payload in items:
        if kind == 0:
            stack.append(payload)
        elif kind == 2:
            if stack and stack[-1] == payload:
                stack.pop()
                while stack and stack[-1] in closed:
                    closed.discard(stack.pop())
            else:
                closed.add(payload)
        else:
            path: list[int] = []
            for op in reversed(stack[-4 * MAX_OP_DEPTH:]):   # bounded even with many buried closed spans
                if op not in closed:
                    path.append(op)
                    if len(path) == MAX_OP_DEPTH:
                        break
            yield payload, tuple(reversed(path))


def _matches_trace(trace: Trace, allocs: list[tuple[int, int, int]]) -> bool:
    kind = trace.column("kind")
    is_alloc = kind == EventKind.ALLOC
    sizes = trace.column("size_bytes")[is_alloc]
    times = trace.column("t_ns")[is_alloc]
    if len(sizes) != len(allocs):
        return False
    if not allocs:
        return True
    return bool(np.array_equal(sizes, np.array([a[2] for a in allocs], dtype=np.int64))
                and np.array_equal(times, np.array([a[0] for a in allocs], dtype=np.int64)))
