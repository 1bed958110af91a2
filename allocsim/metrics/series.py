"""Per-event samples: preallocated integer columns the engine fills, turned into one tidy DataFrame.

The engine writes only integers into preallocated int64 arrays (through memoryviews, the cheapest
store CPython has). Unless an observer is attached it writes a value only where the base ``Policy``
bookkeeping can change it (``requested``/``active`` in ``malloc`` and ``free_completed``, ``pending``
in the two free calls, ``reserved`` on every call, or not at all where a policy's ``replay_run``
knows it cannot change); the rest hold ``-1`` and are forward-filled here.

Memory: ``build_timeseries`` turns the sample arrays themselves into the table's columns (filled in
place, a chunk at a time), so a run holds its per-event data once, not twice.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

#: Marks "unchanged since the previous row" in fast-mode sample columns (every real value is >= 0).
UNCHANGED = -1
#: Rows handled at a time when filling columns in place (bounds the scratch memory).
FILL_CHUNK_ROWS = 1 << 16


class Samples:
    """One row per executed event; row 0 is the state after the initial allocations were placed."""

    def __init__(self, n_rows: int, *, timed: bool = False):
        self.n_rows = n_rows
        self.timed = timed
        self.requested = np.full(n_rows, UNCHANGED, dtype=np.int64)
        self.active = np.full(n_rows, UNCHANGED, dtype=np.int64)
        self.pending = np.full(n_rows, UNCHANGED, dtype=np.int64)
        self.reserved = np.full(n_rows, UNCHANGED, dtype=np.int64)
        # Event index of each row; None in fast mode, where row r is event r - 1.
        self.event_index: np.ndarray | None = None
        self.sim_t_ns: np.ndarray | None = None
        self.latency_ns: np.ndarray | None = None
        if timed:
            self.event_index = np.full(n_rows, -1, dtype=np.int64)
            self.sim_t_ns = np.zeros(n_rows, dtype=np.int64)
            self.latency_ns = np.zeros(n_rows, dtype=np.int64)
        self.rows = 0   # rows written so far (set by the engine)

    def views(self) -> tuple[memoryview, memoryview, memoryview, memoryview]:
        """Writable memoryviews of (requested, active, pending, reserved) for the engine's loop."""
        return (memoryview(self.requested), memoryview(self.active),
                memoryview(self.pending), memoryview(self.reserved))

    def timed_views(self) -> tuple[memoryview, memoryview, memoryview]:
        """Writable memoryviews of (event_index, sim_t_ns, latency_ns) for the SimPy loop (timed only)."""
        return memoryview(self.event_index), memoryview(self.sim_t_ns), memoryview(self.latency_ns)

    def write(self, row: int, policy, reserved: int) -> None:
        """Store the full state of ``policy`` in ``row`` (the generic, slower path)."""
        self.requested[row] = policy.requested_bytes
        self.active[row] = policy.allocated_bytes
        self.pending[row] = policy.pending_free_bytes
        self.reserved[row] = reserved


def forward_fill(values: np.ndarray) -> np.ndarray:
    """Replace each ``UNCHANGED`` entry by the last written value before it (row 0 is always written)."""
    written = values != UNCHANGED
    if written.all():
        return values
    index = np.where(written, np.arange(len(values)), 0)
    np.maximum.accumulate(index, out=index)
    return values[index]


def fill_forward_in_place(values: np.ndarray) -> np.ndarray:
    """``forward_fill`` that overwrites ``values`` (scratch memory: one chunk); return ``values``."""
    last = None
    for start in range(0, len(values), FILL_CHUNK_ROWS):
        part = values[start:start + FILL_CHUNK_ROWS]
        written = part != UNCHANGED
        if last is not None and not written[0]:
            part[0] = last   # carry the previous chunk's last value in
            written[0] = True
        if not written.all():
            index = np.where(written, np.arange(len(part)), 0)
            np.maximum.accumulate(index, out=index)
            part[:] = part[index]
        last = part[-1]
    return values


def _by_event(values: np.ndarray, event_index: np.ndarray, fill: int, dtype: type) -> np.ndarray:
    """``values[event_index]`` as ``dtype``, ``fill`` where the index is -1 (row 0), a chunk at a time."""
    out = np.empty(len(event_index), dtype=dtype)
    for start in range(0, len(event_index), FILL_CHUNK_ROWS):
        index = event_index[start:start + FILL_CHUNK_ROWS]
        valid = index >= 0
        picked = values[np.where(valid, index, 0)] if len(values) else 0
        out[start:start + len(index)] = np.where(valid, picked, fill)
    return out


def build_timeseries(samples: Samples, t_ns: np.ndarray, kind: np.ndarray, t0_ns: int) -> pd.DataFrame:
    """Return the tidy per-event table of a run (``samples.rows`` rows, execution order).

    Consumes ``samples``: its arrays are filled in place and become the table's columns (the
    pending column turns into ``allocated_bytes``), so nothing per event is copied.
    """
    n = samples.rows
    if samples.event_index is None:
        event_index = np.arange(-1, n - 1, dtype=np.int64)
    else:
        event_index = samples.event_index[:n]
    columns: dict[str, np.ndarray] = {
        "event_index": event_index,
        "t_ns": _by_event(t_ns, event_index, t0_ns, np.int64),
        "kind": _by_event(kind, event_index, 0, np.uint8),
    }
    if samples.timed:
        columns["sim_t_ns"] = samples.sim_t_ns[:n]
        columns["latency_ns"] = samples.latency_ns[:n]
    active = fill_forward_in_place(samples.active[:n])
    pending = fill_forward_in_place(samples.pending[:n])
    columns["requested_bytes"] = fill_forward_in_place(samples.requested[:n])
    columns["allocated_bytes"] = np.subtract(active, pending, out=pending)   # active - pending
    columns["active_bytes"] = active
    columns["reserved_bytes"] = fill_forward_in_place(samples.reserved[:n])
    return pd.DataFrame(columns, copy=False)


def with_derived(timeseries: pd.DataFrame) -> pd.DataFrame:
    """Add the columns that follow from the stored ones (what ``RunResult.save`` writes).

    ``pending_free_bytes`` = active - allocated (freed by the program, not yet reusable);
    ``inactive_bytes`` = reserved - active (cached free memory: external fragmentation);
    ``internal_fragmentation_bytes`` = active - requested (rounding inside handed-out blocks).
    """
    out = timeseries.copy()
    out["pending_free_bytes"] = out["active_bytes"] - out["allocated_bytes"]
    out["inactive_bytes"] = out["reserved_bytes"] - out["active_bytes"]
    out["internal_fragmentation_bytes"] = out["active_bytes"] - out["requested_bytes"]
    return out
