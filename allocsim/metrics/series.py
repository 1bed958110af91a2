"""Per-event samples: preallocated integer columns the engine fills, turned into one tidy DataFrame.

The engine writes only integers into preallocated int64 arrays (through memoryviews, the cheapest
store CPython has). In fast mode it writes a value only where the base ``Policy`` bookkeeping can
change it (``requested``/``active`` in ``malloc`` and ``free_completed``, ``pending`` in the two free
calls, ``reserved`` on every call); the rest hold ``-1`` and are forward-filled here.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

#: Marks "unchanged since the previous row" in fast-mode sample columns (every real value is >= 0).
UNCHANGED = -1


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


def build_timeseries(samples: Samples, t_ns: np.ndarray, kind: np.ndarray, t0_ns: int) -> pd.DataFrame:
    """Return the tidy per-event table of a run (``samples.rows`` rows, execution order)."""
    n = samples.rows
    if samples.event_index is None:
        event_index = np.arange(-1, n - 1, dtype=np.int64)
    else:
        event_index = samples.event_index[:n].copy()
    valid = event_index >= 0
    safe = np.where(valid, event_index, 0)
    columns: dict[str, np.ndarray] = {
        "event_index": event_index,
        "t_ns": np.where(valid, t_ns[safe] if len(t_ns) else 0, t0_ns).astype(np.int64),
        "kind": np.where(valid, kind[safe] if len(kind) else 0, 0).astype(np.uint8),
    }
    if samples.timed:
        columns["sim_t_ns"] = samples.sim_t_ns[:n].copy()
        columns["latency_ns"] = samples.latency_ns[:n].copy()
    active = forward_fill(samples.active[:n])
    pending = forward_fill(samples.pending[:n])
    columns["requested_bytes"] = forward_fill(samples.requested[:n])
    columns["allocated_bytes"] = active - pending
    columns["active_bytes"] = active
    columns["reserved_bytes"] = forward_fill(samples.reserved[:n])
    return pd.DataFrame({k: np.ascontiguousarray(v) for k, v in columns.items()})


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
