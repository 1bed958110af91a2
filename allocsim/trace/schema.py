"""The one trace schema every reader produces: build a ``Trace`` and every later stage can use it.

A trace is columnar. ``Trace.events`` is a pandas DataFrame with exactly the columns of
``EVENT_DTYPES`` (about 36 bytes per event); side tables hold the state at the start of the window
and the real allocator's recorded decisions, kept apart from the program's requests.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

import numpy as np
import pandas as pd


class EventKind(enum.IntEnum):
    """What the program did at one event."""

    ALLOC = 1            #: allocation request of ``size_bytes`` under a fresh ``alloc_id``
    FREE_REQUESTED = 2   #: the program freed ``alloc_id`` (its stream may still use it)
    FREE_COMPLETED = 3   #: the memory of ``alloc_id`` is reusable (stream-ordered free done)
    EMPTY_CACHE = 4      #: the program asked the allocator to release its cache
    MARKER = 5           #: a label (step boundary, snapshot); ``alloc_id`` indexes ``Trace.labels``


#: Column name -> dtype of ``Trace.events``; order is the canonical column order.
EVENT_DTYPES: dict[str, np.dtype] = {
    "t_ns": np.dtype("int64"),
    "kind": np.dtype("uint8"),
    "alloc_id": np.dtype("int64"),
    "size_bytes": np.dtype("int64"),
    "stream": np.dtype("int64"),
    "device": np.dtype("int16"),
}

#: Allocations alive when recording began (``addr``/``block_size_bytes`` are -1 when unknown).
INITIAL_ALLOC_DTYPES: dict[str, np.dtype] = {
    "alloc_id": np.dtype("int64"),
    "size_bytes": np.dtype("int64"),
    "stream": np.dtype("int64"),
    "device": np.dtype("int16"),
    "addr": np.dtype("int64"),
    "block_size_bytes": np.dtype("int64"),
}

#: Device segments held by the real allocator at the start of the window (PyTorch snapshots).
SEGMENT_DTYPES: dict[str, np.dtype] = {
    "device": np.dtype("int16"),
    "addr": np.dtype("int64"),
    "size_bytes": np.dtype("int64"),
    "stream": np.dtype("int64"),
    "pool": np.dtype("object"),          # "small" | "large"
    "is_expandable": np.dtype("bool"),
}

#: Blocks inside those segments at the start of the window; ``alloc_id`` is -1 for free blocks.
BLOCK_DTYPES: dict[str, np.dtype] = {
    "device": np.dtype("int16"),
    "segment_addr": np.dtype("int64"),
    "addr": np.dtype("int64"),
    "size_bytes": np.dtype("int64"),
    "requested_bytes": np.dtype("int64"),
    "state": np.dtype("object"),         # "active_allocated" | "active_pending_free" | "inactive"
    "alloc_id": np.dtype("int64"),
}

#: What the real allocator did, as recorded by the source. ``event_index`` is the index in
#: ``Trace.events`` of the request this decision belongs to, or of the next request after it.
DECISION_DTYPES: dict[str, np.dtype] = {
    "event_index": np.dtype("int64"),
    "t_ns": np.dtype("int64"),
    "action": np.dtype("object"),        # alloc, free_requested, free_completed, segment_alloc, ...
    "addr": np.dtype("int64"),
    "size_bytes": np.dtype("int64"),
    "stream": np.dtype("int64"),
    "device": np.dtype("int16"),
    "alloc_id": np.dtype("int64"),
    "device_free_bytes": np.dtype("int64"),  # OOM entries only, else -1
}

DECISION_ACTIONS = (
    "alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
    "segment_map", "segment_unmap", "oom", "snapshot",
)


def empty_frame(dtypes: dict[str, np.dtype]) -> pd.DataFrame:
    """Return an empty DataFrame with the columns and dtypes of one schema table."""
    return pd.DataFrame({name: pd.Series([], dtype=dtype) for name, dtype in dtypes.items()})


def frame_from_columns(columns: dict[str, Any], dtypes: dict[str, np.dtype]) -> pd.DataFrame:
    """Build a schema table from column sequences, casting each to the schema dtype."""
    missing = set(dtypes) - set(columns)
    if missing:
        raise ValueError(f"missing columns: {sorted(missing)}")
    return pd.DataFrame({name: np.asarray(columns[name], dtype=dtype) for name, dtype in dtypes.items()})


@dataclasses.dataclass
class TraceMeta:
    """Where a trace came from and what the reader had to assume or repair."""

    format: str                                   #: "pytorch-snapshot", "kineto", "rmm-csv", "allocsim-parquet", ...
    source: str = ""                              #: file name the trace was read from
    devices: list[int] = dataclasses.field(default_factory=list)
    time_synthesized: bool = False                #: True when t_ns was made up from event order
    version_hints: dict[str, Any] = dataclasses.field(default_factory=dict)
    allocator_settings: dict[str, Any] | None = None
    repairs: list[str] = dataclasses.field(default_factory=list)   #: what --lenient changed, one line each
    notes: list[str] = dataclasses.field(default_factory=list)     #: facts a user should know (e.g. orphan frees)
    #: What the recording proves about the real run, per device (``str(device)`` -> the dict of
    #: ``allocsim.trace.recorded.RecordedRun``): real peaks and device calls, inferred capacity, OOMs.
    recorded: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-serialisable dict (inverse of ``from_dict``)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TraceMeta":
        """Rebuild from ``to_dict`` output, ignoring keys this version does not know."""
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclasses.dataclass
class Trace:
    """A validated allocation trace: requests in ``events``, start state and real decisions beside them.

    Events are ordered as they happened (by ``t_ns``, ties in recorded order); ``alloc_id`` is
    unique over the whole trace, including the ids of ``initial_allocs``.
    """

    events: pd.DataFrame
    meta: TraceMeta
    labels: list[str] = dataclasses.field(default_factory=list)
    initial_allocs: pd.DataFrame = dataclasses.field(default_factory=lambda: empty_frame(INITIAL_ALLOC_DTYPES))
    initial_segments: pd.DataFrame = dataclasses.field(default_factory=lambda: empty_frame(SEGMENT_DTYPES))
    initial_blocks: pd.DataFrame = dataclasses.field(default_factory=lambda: empty_frame(BLOCK_DTYPES))
    decisions: pd.DataFrame = dataclasses.field(default_factory=lambda: empty_frame(DECISION_DTYPES))

    def __len__(self) -> int:
        return len(self.events)

    @property
    def devices(self) -> list[int]:
        """Devices that appear anywhere in the trace, sorted."""
        found = set(int(d) for d in np.unique(self.events["device"].to_numpy()))
        found |= set(int(d) for d in self.initial_allocs["device"].unique())
        found |= set(int(d) for d in self.meta.devices)
        return sorted(found)

    def for_device(self, device: int) -> "Trace":
        """Return the part of this trace that happened on one device (indices renumbered)."""
        # Markers (step boundaries) belong to the whole run, so every device keeps them.
        keep = (self.events["device"].to_numpy() == device) | (self.events["kind"].to_numpy() == EventKind.MARKER)
        events = self.events.loc[keep].reset_index(drop=True)
        decisions = self.decisions.loc[self.decisions["device"] == device].copy()
        if len(decisions):
            # Point each decision at the next kept request at or after its old position.
            kept_positions = np.flatnonzero(keep)
            pos = np.searchsorted(kept_positions, decisions["event_index"].to_numpy())
            decisions["event_index"] = pos.astype(np.int64)
        kept_positions = np.flatnonzero(keep)
        recorded = {}
        if str(device) in self.meta.recorded:
            from .recorded import reindex_recorded

            recorded[str(device)] = reindex_recorded(self.meta.recorded[str(device)], kept_positions)
        meta = dataclasses.replace(self.meta, devices=[device], recorded=recorded)
        return Trace(
            events=events,
            meta=meta,
            labels=list(self.labels),
            initial_allocs=self.initial_allocs.loc[self.initial_allocs["device"] == device].reset_index(drop=True),
            initial_segments=self.initial_segments.loc[self.initial_segments["device"] == device].reset_index(drop=True),
            initial_blocks=self.initial_blocks.loc[self.initial_blocks["device"] == device].reset_index(drop=True),
            decisions=decisions.reset_index(drop=True),
        )

    def column(self, name: str) -> np.ndarray:
        """Return one event column as a numpy array (no copy)."""
        return self.events[name].to_numpy()


def check_schema(trace: Trace) -> None:
    """Raise ``ValueError`` if any table lacks a column or has the wrong dtype; readers call this last."""
    for name, frame, dtypes in (
        ("events", trace.events, EVENT_DTYPES),
        ("initial_allocs", trace.initial_allocs, INITIAL_ALLOC_DTYPES),
        ("initial_segments", trace.initial_segments, SEGMENT_DTYPES),
        ("initial_blocks", trace.initial_blocks, BLOCK_DTYPES),
        ("decisions", trace.decisions, DECISION_DTYPES),
    ):
        if list(frame.columns) != list(dtypes):
            raise ValueError(f"{name}: columns {list(frame.columns)} != {list(dtypes)}")
        for col, dtype in dtypes.items():
            if dtype == np.dtype("object") and pd.api.types.is_string_dtype(frame[col].dtype):
                continue  # pandas >= 3 stores text as its own string dtype
            if frame[col].dtype != dtype:
                raise ValueError(f"{name}.{col}: dtype {frame[col].dtype} != {dtype}")
