"""Check a columnar trace's semantics (ids, order, sizes); used for files users may have edited."""

from __future__ import annotations

import numpy as np

from ..errors import TraceFormatError
from .builder import MAX_SIZE_BYTES
from .schema import EventKind, Trace

_KINDS = {int(k) for k in EventKind}


def validate_events(trace: Trace, path: str, *, lenient: bool = False) -> None:
    """Raise ``TraceFormatError`` at the first bad event row; with ``lenient``, drop bad rows and report them."""
    ev = trace.events
    bad_rows: list[int] = []

    def problem(row: int, reason: str) -> None:
        if not lenient:
            raise TraceFormatError(path, f"event row {row}", reason)
        if len(bad_rows) < 200:
            trace.meta.repairs.append(f"event row {row}: {reason}; dropped the row")
        bad_rows.append(row)

    t_ns = ev["t_ns"].to_numpy()
    kind = ev["kind"].to_numpy()
    ids = ev["alloc_id"].to_numpy()
    size = ev["size_bytes"].to_numpy()
    for row in np.flatnonzero(~np.isin(kind, list(_KINDS))):
        problem(int(row), f"unknown event kind {int(kind[row])}")
    for row in np.flatnonzero((size < 0) | (size > MAX_SIZE_BYTES)):
        problem(int(row), f"size {int(size[row])} out of range")
    if len(t_ns) > 1:
        for row in np.flatnonzero(np.diff(t_ns) < 0)[:1000] + 1:
            problem(int(row), f"time goes back from {int(t_ns[row - 1])} to {int(t_ns[row])} ns")

    # Id life cycle: ALLOC -> FREE_REQUESTED -> FREE_COMPLETED; initial allocs start as allocated.
    state: dict[int, int] = {int(i): 0 for i in trace.initial_allocs["alloc_id"].to_numpy()}
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
        trace.events = ev.loc[keep].reset_index(drop=True)
        if len(bad_rows) > 200:
            trace.meta.repairs.append(f"... and {len(bad_rows) - 200} more rows dropped")
