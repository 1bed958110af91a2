"""The one trace schema every reader produces: build a ``Trace`` and every later stage can use it.

A trace is columnar. ``Trace.events`` is a pandas DataFrame with exactly the columns of
``EVENT_DTYPES`` (40 bytes per event); side tables hold the state at the start of the window, the
real allocator's recorded decisions (kept apart from the program's requests), the allocator's own
recorded totals, and the stack frames of the program (one interned table, one stack id per event).
Readers hand each table over as numpy columns (``allocsim.trace.table.Table``); the DataFrame is
built on first use, and ``Trace.table(name)`` reads the columns without it (no pandas import).
"""

from __future__ import annotations

import dataclasses
import enum
import re
from typing import TYPE_CHECKING, Any

import numpy as np

from .table import OPTIONAL_COLUMNS, Table

if TYPE_CHECKING:
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
    "stack_id": np.dtype("int32"),       # row of ``Trace.stacks`` (-1: no frames recorded)
}

#: Allocations alive when recording began (``addr``/``block_size_bytes`` are -1 when unknown).
INITIAL_ALLOC_DTYPES: dict[str, np.dtype] = {
    "alloc_id": np.dtype("int64"),
    "size_bytes": np.dtype("int64"),
    "stream": np.dtype("int64"),
    "device": np.dtype("int16"),
    "addr": np.dtype("int64"),
    "block_size_bytes": np.dtype("int64"),
    "stack_id": np.dtype("int32"),
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
    "stack_id": np.dtype("int32"),
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
    "stack_id": np.dtype("int32"),           # the entry's frames (an ``oom``: the failed request's); -1: none
}

#: Interned stack frames: one row per distinct (filename, line, name).
FRAME_DTYPES: dict[str, np.dtype] = {
    "frame_id": np.dtype("int32"),
    "filename": np.dtype("object"),
    "line": np.dtype("int64"),
    "name": np.dtype("object"),
}

#: Interned stacks: ``stack_id`` is a run of rows, ``depth`` 0 the innermost frame.
STACK_DTYPES: dict[str, np.dtype] = {
    "stack_id": np.dtype("int32"),
    "depth": np.dtype("int32"),
    "frame_id": np.dtype("int32"),
}

#: The allocator's own running totals, as recorded (Kineto ``Total Allocated`` / ``Total Reserved``).
#: ``event_index`` is the index in ``Trace.events`` of the request the totals were recorded after
#: (-1 when the record made no request event, e.g. a free of a block from before the window that
#: the reader could not place).
RECORDED_SERIES_DTYPES: dict[str, np.dtype] = {
    "event_index": np.dtype("int64"),
    "t_ns": np.dtype("int64"),
    "device": np.dtype("int16"),
    "allocated_bytes": np.dtype("int64"),   # -1 when not recorded
    "reserved_bytes": np.dtype("int64"),    # -1 when not recorded
}

DECISION_ACTIONS = (
    "alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
    "segment_map", "segment_unmap", "oom", "snapshot",
)


def empty_frame(dtypes: dict[str, np.dtype]) -> pd.DataFrame:
    """Return an empty DataFrame with the columns and dtypes of one schema table."""
    return Table.empty(dtypes).frame()


def _text_dtype() -> Any:
    """The dtype pandas gives a column of Python strings (``str`` in pandas >= 3, else object)."""
    import pandas as pd

    return pd.Series(["x"]).dtype


def text_column(names: Any, codes: np.ndarray) -> Any:
    """The text column ``names[codes]`` as pandas would store the strings, built without one object per row.

    Pass the result in ``frame_from_columns``' columns for an object-dtype column.
    """
    codes = np.asarray(codes, dtype=np.intp)
    if not len(codes) or _text_dtype() == np.dtype(object):
        return np.asarray(list(names), dtype=object)[codes]
    import pandas as pd

    return pd.array(list(names), dtype=_text_dtype()).take(codes)


def table_from_columns(columns: dict[str, Any], dtypes: dict[str, np.dtype]) -> Table:
    """Build a schema table from column sequences, casting each to the schema dtype (no pandas).

    Optional columns (``stack_id``) that ``columns`` lacks are filled with their default. A text
    column may be given as ``text_column``'s result. Give the result to ``Trace``: its DataFrame is
    built when first asked for.
    """
    return Table.of(columns, dtypes)


def frame_from_columns(columns: dict[str, Any], dtypes: dict[str, np.dtype]) -> pd.DataFrame:
    """``table_from_columns`` as a pandas DataFrame."""
    return Table.of(columns, dtypes).frame()


_OBJECT = np.dtype("object")


def with_optional_columns(frame: pd.DataFrame, dtypes: dict[str, np.dtype]) -> pd.DataFrame:
    """Return ``frame`` with any missing optional column added (default value), in schema order."""
    if all(name in frame.columns for name in dtypes):
        return frame
    frame = frame.copy()
    for name, default in OPTIONAL_COLUMNS.items():
        if name in dtypes and name not in frame.columns:
            frame[name] = np.full(len(frame), default, dtype=dtypes[name])
    return frame[[c for c in dtypes if c in frame.columns] + [c for c in frame.columns if c not in dtypes]]


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
    #: ``allocsim.trace.inference.recorded.RecordedRun``): real peaks and device calls, inferred capacity, OOMs.
    recorded: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    #: What the file states of each GPU it was recorded on (``str(device)`` -> ``name``, ``total_bytes``:
    #: the CUDA totalGlobalMem of the real card), from Kineto's ``deviceProperties``; empty when it has none.
    device_properties: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    #: Why the recording stops before the program's end (an ``allocsim capture`` whose script raised,
    #: exited with an error, was interrupted or timed out), in one phrase; "" when it is complete.
    #: Every verdict on such a trace says so (``allocsim.trace.inference.completeness``).
    incomplete: str = ""

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
    initial_allocs: pd.DataFrame = None       # type: ignore[assignment]  # None: no rows
    initial_segments: pd.DataFrame = None     # type: ignore[assignment]
    initial_blocks: pd.DataFrame = None       # type: ignore[assignment]
    decisions: pd.DataFrame = None            # type: ignore[assignment]
    #: Interned stack frames (``frame_id``, ``filename``, ``line``, ``name``).
    frames: pd.DataFrame = None               # type: ignore[assignment]
    #: Interned stacks (``stack_id``, ``depth``, ``frame_id``), depth 0 innermost.
    stacks: pd.DataFrame = None               # type: ignore[assignment]
    #: The allocator's recorded totals after events (Kineto), empty when the source has none.
    recorded_series: pd.DataFrame = None      # type: ignore[assignment]

    def table(self, name: str) -> Table:
        """One table's numpy columns (``trace.table("events")["size_bytes"]``), without building its DataFrame."""
        held = self.__dict__[_HELD + name]
        if isinstance(held, Table):
            return held
        return Table.from_frame(held, TABLE_DTYPES[name])

    def __len__(self) -> int:
        return len(self.table("events"))

    def replace(self, **changes: Any) -> "Trace":
        """A new trace with ``changes`` (as ``dataclasses.replace``), the other tables passed on as held:
        columns stay columns, so no DataFrame (and no copy of the frame strings) is built for them."""
        fields = {f.name: (self.__dict__[_HELD + f.name] if f.name in TABLE_DTYPES else getattr(self, f.name))
                  for f in dataclasses.fields(self)}
        return Trace(**{**fields, **changes})

    @property
    def devices(self) -> list[int]:
        """Devices that appear anywhere in the trace, sorted."""
        found = set(int(d) for d in np.unique(self.column("device")))
        found |= set(int(d) for d in np.unique(self.table("initial_allocs")["device"]))
        found |= set(int(d) for d in self.meta.devices)
        return sorted(found)

    def for_device(self, device: int) -> "Trace":
        """Return the part of this trace that happened on one device (indices renumbered)."""
        # Markers (step boundaries) belong to the whole run, so every device keeps them.
        marker = self.events["kind"].to_numpy() == EventKind.MARKER
        keep = (self.events["device"].to_numpy() == device) | marker
        events = self.events.loc[keep].reset_index(drop=True)
        # ... and are this device's now: a marker left on another device (a Kineto trace puts them on its
        # first GPU) would make the part look like two devices, and --device N would be refused.
        events.loc[marker[keep], "device"] = device
        decisions = self.decisions.loc[self.decisions["device"] == device].copy()
        if len(decisions):
            # Point each decision at the next kept request at or after its old position.
            kept_positions = np.flatnonzero(keep)
            pos = np.searchsorted(kept_positions, decisions["event_index"].to_numpy())
            decisions["event_index"] = pos.astype(np.int64)
        kept_positions = np.flatnonzero(keep)
        recorded = {}
        if str(device) in self.meta.recorded:
            recorded[str(device)] = reindex_recorded(self.meta.recorded[str(device)], kept_positions)
        notes = [note for note in self.meta.notes if _note_device(note) in (None, device)]
        meta = dataclasses.replace(self.meta, devices=[device], recorded=recorded, notes=notes)
        return Trace(
            events=events,
            meta=meta,
            labels=list(self.labels),
            initial_allocs=self.initial_allocs.loc[self.initial_allocs["device"] == device].reset_index(drop=True),
            initial_segments=self.initial_segments.loc[self.initial_segments["device"] == device].reset_index(drop=True),
            initial_blocks=self.initial_blocks.loc[self.initial_blocks["device"] == device].reset_index(drop=True),
            decisions=decisions.reset_index(drop=True),
            frames=self.__dict__[_HELD + "frames"],     # as held: columns stay columns
            stacks=self.__dict__[_HELD + "stacks"],
            recorded_series=self._series_for(device, keep),
        )

    def _series_for(self, device: int, keep: np.ndarray) -> pd.DataFrame:
        series = self.recorded_series.loc[self.recorded_series["device"] == device].copy()
        if len(series):
            kept_positions = np.flatnonzero(keep)
            idx = series["event_index"].to_numpy()
            pos = np.searchsorted(kept_positions, idx)
            series["event_index"] = np.where(idx < 0, -1, pos).astype(np.int64)
        return series.reset_index(drop=True)

    def stack(self, stack_id: int) -> list[tuple[str, int, str]]:
        """The frames of stack ``stack_id`` as ``(filename, line, name)``, innermost first ([] for -1)."""
        if stack_id < 0:
            return []
        starts, rows = self._stack_index()
        if stack_id + 1 >= len(starts):
            raise ValueError(f"no stack {stack_id} in this trace ({len(starts) - 1} stacks)")
        frame_rows = rows[starts[stack_id]:starts[stack_id + 1]]
        fr = self.table("frames")
        names, files, lines = fr["name"], fr["filename"], fr["line"]
        return [(str(files[r]), int(lines[r]), str(names[r])) for r in frame_rows]

    def _stack_index(self) -> tuple[np.ndarray, np.ndarray]:
        """(first row of each stack id, frame rows in (stack, depth) order), cached per stacks table."""
        held = (self.__dict__[_HELD + "stacks"], self.__dict__[_HELD + "frames"])
        cached = getattr(self, "_stack_cache", None)
        if cached is not None and cached[0] is held[0] and cached[1] is held[1]:
            return cached[2]
        st = self.table("stacks")
        sid = st["stack_id"]
        order = np.lexsort((st["depth"], sid))
        sid_sorted = sid[order]
        n_stacks = int(sid_sorted[-1]) + 1 if len(sid_sorted) else 0
        starts = np.searchsorted(sid_sorted, np.arange(n_stacks))
        frame_ids = self.table("frames")["frame_id"]
        frame_pos = np.empty(int(frame_ids.max()) + 1 if len(frame_ids) else 0, dtype=np.int64)
        frame_pos[frame_ids] = np.arange(len(frame_ids))
        rows = frame_pos[st["frame_id"][order]] if len(order) else np.empty(0, np.int64)
        result = (np.append(starts, len(rows)), rows)
        self._stack_cache = (*held, result)
        return result

    def column(self, name: str) -> np.ndarray:
        """Return one event column as a numpy array (no copy)."""
        held = self.__dict__[_HELD + "events"]
        return held[name] if isinstance(held, Table) else held[name].to_numpy()


#: Each table of a ``Trace`` and its schema.
TABLE_DTYPES: dict[str, dict[str, np.dtype]] = {
    "events": EVENT_DTYPES,
    "initial_allocs": INITIAL_ALLOC_DTYPES,
    "initial_segments": SEGMENT_DTYPES,
    "initial_blocks": BLOCK_DTYPES,
    "decisions": DECISION_DTYPES,
    "frames": FRAME_DTYPES,
    "stacks": STACK_DTYPES,
    "recorded_series": RECORDED_SERIES_DTYPES,
}
#: The tables whose optional columns (``stack_id``) a ``Trace`` fills in when they are missing.
_WITH_OPTIONAL = ("events", "initial_allocs", "initial_blocks", "decisions")
#: Where a ``Trace`` keeps a table: a ``Table`` until its DataFrame is asked for, then the DataFrame.
_HELD = "_table_"


def _table_attribute(name: str) -> property:
    """``trace.<name>``: the table's DataFrame, built from its columns on first use (pandas is imported then)."""
    dtypes = TABLE_DTYPES[name]
    key = _HELD + name
    fill_optional = name in _WITH_OPTIONAL

    def get(trace: "Trace") -> pd.DataFrame:
        held = trace.__dict__[key]
        if isinstance(held, Table):
            held = trace.__dict__[key] = held.frame()
        return held

    def put(trace: "Trace", value: Any) -> None:
        # Traces built by code that predates stack ids get them as -1 ("no frames").
        if value is None:
            value = Table.empty(dtypes)
        elif fill_optional:
            value = value.with_optional_columns() if isinstance(value, Table) else with_optional_columns(value, dtypes)
        trace.__dict__[key] = value

    return property(get, put, doc=f"The trace's ``{name}`` table as a pandas DataFrame (see ``Trace.table``).")


for _name in TABLE_DTYPES:
    setattr(Trace, _name, _table_attribute(_name))


_DEVICE_NOTE = re.compile(r"device (-?\d+): ")


def _note_device(note: str) -> int | None:
    """The device a reader's note is about (``"device 1: ..."``), or None for a note about the whole trace."""
    m = _DEVICE_NOTE.match(note)
    return int(m.group(1)) if m else None


def check_schema(trace: Trace) -> None:
    """Raise ``ValueError`` if any table lacks a column or has the wrong dtype; readers call this last."""
    for name, dtypes in TABLE_DTYPES.items():
        held = trace.__dict__[_HELD + name]
        if isinstance(held, Table):
            held.check(name)
            continue
        if list(held.columns) != list(dtypes):
            raise ValueError(f"{name}: columns {list(held.columns)} != {list(dtypes)}")
        for (col, dtype), got in zip(dtypes.items(), held.dtypes.tolist()):
            if got == dtype:
                continue
            from pandas.api.types import is_string_dtype

            if dtype == _OBJECT and is_string_dtype(got):
                continue  # pandas >= 3 stores text as its own string dtype
            raise ValueError(f"{name}.{col}: dtype {got} != {dtype}")


def reindex_recorded(data: dict[str, Any], kept_positions: np.ndarray) -> dict[str, Any]:
    """A copy of one device's recorded dict with event indices renumbered for the kept events."""
    out = dict(data)
    for key in ("ooms", "release_points"):
        items = []
        for item in data.get(key) or []:
            item = dict(item)
            item["event_index"] = int(np.searchsorted(kept_positions, item["event_index"]))
            items.append(item)
        out[key] = items
    return out
