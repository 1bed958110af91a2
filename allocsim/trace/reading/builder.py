"""Turn address-keyed allocation records into a ``Trace``: the shared back half of every reader.

Readers parse their format and call ``alloc`` / ``free`` / ``free_requested`` / ``free_completed``
with the record number they came from. The builder maps reused addresses to fresh allocation ids,
turns frees of blocks allocated before the window into the trace's initial state, and rejects (or,
when lenient, repairs and reports) double frees, size mismatches, absurd sizes and time going back.
"""

from __future__ import annotations

import os
import struct
from typing import Any

import numpy as np

from ...errors import TraceFormatError, quote
from ..schema import (
    DECISION_DTYPES,
    EVENT_DTYPES,
    INITIAL_ALLOC_DTYPES,
    EventKind,
    Trace,
    TraceMeta,
    check_schema,
    table_from_columns,
)

#: Sizes above this are treated as corrupt: no device today has a petabyte of memory.
MAX_SIZE_BYTES = 1 << 50
#: Reports keep this many repair lines, then a count of the rest.
MAX_REPORTED_REPAIRS = 200

_LIVE, _PENDING = 0, 1
_KEY = struct.Struct("<qq")
#: Address keys are salted bytes: bytes hash with the per-process random key, so a file cannot
#: choose addresses whose hashes collide (ints hash to themselves).
_SALT = os.urandom(8)


def _key(device: int, addr: int) -> bytes:
    return _SALT + _KEY.pack(device, addr)


def _unkey(key: bytes) -> tuple[int, int]:
    return _KEY.unpack(key[len(_SALT):])


class TraceBuilder:
    """Accumulate one source's records column by column and validate them as they come."""

    def __init__(self, path: str, fmt: str, *, lenient: bool = False):
        self.path = str(path)
        self.meta = TraceMeta(format=fmt, source=self.path.rsplit("/", 1)[-1])
        self.lenient = lenient
        self._cols: dict[str, list[int]] = {name: [] for name in EVENT_DTYPES}
        self._initial: dict[str, list[int]] = {name: [] for name in INITIAL_ALLOC_DTYPES}
        self._stack = -1   # stack id given to the events of the call in progress
        self._decisions: dict[str, list[Any]] = {name: [] for name in DECISION_DTYPES}
        self.labels: list[str] = []
        self._label_index: dict[str, int] = {}
        # _key(device, addr) -> [alloc_id, size_bytes, state]
        self._live: dict[bytes, list[int]] = {}
        self._freed_addrs: set[bytes] = set()
        self._next_id = 0
        self._last_t_ns: int | None = None
        self._repair_count = 0
        self.orphan_frees = 0

    # ----------------------------------------------------------------- checks and repairs
    def fail(self, record: int | str | None, reason: str) -> TraceFormatError:
        """Return the error to raise for a bad record (readers ``raise builder.fail(...)``)."""
        return TraceFormatError(self.path, record, reason)

    def repair(self, record: int | str | None, what: str) -> None:
        """Note a repair made under --lenient; the report keeps the first lines and a count."""
        self._repair_count += 1
        if self._repair_count <= MAX_REPORTED_REPAIRS:
            self.meta.repairs.append(f"record {record}: {what}")

    def problem(self, record: int | str | None, reason: str, repair: str) -> None:
        """Raise for ``reason`` unless lenient, in which case record ``repair`` and go on."""
        if not self.lenient:
            raise self.fail(record, reason)
        self.repair(record, f"{reason}; {repair}")

    def check_size(self, record: int | str | None, size_bytes: int) -> int:
        """Reject negative or absurd sizes (a corrupt file must not make us allocate petabytes)."""
        if size_bytes < 0:
            raise self.fail(record, f"negative size {quote(size_bytes)}")
        if size_bytes > MAX_SIZE_BYTES:
            raise self.fail(record, f"absurd size {quote(size_bytes)} bytes (> {MAX_SIZE_BYTES})")
        return size_bytes

    def _check_time(self, record: int | str | None, t_ns: int) -> int:
        if self._last_t_ns is not None and t_ns < self._last_t_ns:
            self.problem(record, f"time goes back from {self._last_t_ns} ns to {t_ns} ns",
                         "clamped to the previous time")
            t_ns = self._last_t_ns
        self._last_t_ns = t_ns
        return t_ns

    # ----------------------------------------------------------------- events
    def _emit(self, t_ns: int, kind: EventKind, alloc_id: int, size_bytes: int, stream: int, device: int) -> int:
        cols = self._cols
        cols["t_ns"].append(t_ns)
        cols["kind"].append(int(kind))
        cols["alloc_id"].append(alloc_id)
        cols["size_bytes"].append(size_bytes)
        cols["stream"].append(stream)
        cols["device"].append(device)
        cols["stack_id"].append(self._stack)
        return len(cols["t_ns"]) - 1

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    def alloc(self, record, t_ns: int, device: int, stream: int, addr: int, size_bytes: int,
              *, record_decision: bool = False, stack_id: int = -1) -> int:
        """Record an allocation request at ``addr``; return its fresh allocation id."""
        t_ns = self._check_time(record, t_ns)
        self.check_size(record, size_bytes)
        self._stack = stack_id
        key = _key(device, addr)
        if key in self._live:
            self.problem(record, f"allocation at address {addr:#x} which is still allocated",
                         "treated the old allocation as freed here")
            old_id, old_size, _ = self._live.pop(key)
            self._emit(t_ns, EventKind.FREE_REQUESTED, old_id, old_size, stream, device)
            self._emit(t_ns, EventKind.FREE_COMPLETED, old_id, old_size, stream, device)
        alloc_id = self._new_id()
        self._live[key] = [alloc_id, size_bytes, _LIVE]
        self._freed_addrs.discard(key)
        index = self._emit(t_ns, EventKind.ALLOC, alloc_id, size_bytes, stream, device)
        self._stack = -1
        if record_decision:
            self.decision(index, t_ns, "alloc", addr, size_bytes, stream, device, alloc_id, stack_id=stack_id)
        return alloc_id

    def _lookup_for_free(self, record, t_ns: int, device: int, stream: int, addr: int,
                         size_bytes: int | None) -> list[int] | None:
        key = _key(device, addr)
        entry = self._live.get(key)
        if entry is None:
            if key in self._freed_addrs:
                self.problem(record, f"double free of address {addr:#x}", "dropped the second free")
                return None
            if size_bytes is None:
                self.problem(record, f"free of unknown address {addr:#x} with no size",
                             "dropped the free (its size is unknowable)")
                return None
            # Allocated before the window began: part of the initial state.
            self.check_size(record, size_bytes)
            alloc_id = self._new_id()
            self._add_initial(alloc_id, size_bytes, stream, device, addr)
            self.orphan_frees += 1
            entry = [alloc_id, size_bytes, _LIVE]
            self._live[key] = entry
        elif size_bytes is not None and size_bytes != entry[1]:
            self.problem(record, f"free of {size_bytes} bytes at {addr:#x} allocated with {entry[1]} bytes",
                         "kept the allocated size")
        return entry

    def _add_initial(self, alloc_id: int, size_bytes: int, stream: int, device: int, addr: int,
                     block_size_bytes: int = -1, stack_id: int = -1) -> None:
        init = self._initial
        init["alloc_id"].append(alloc_id)
        init["size_bytes"].append(size_bytes)
        init["stream"].append(stream)
        init["device"].append(device)
        init["addr"].append(addr)
        init["block_size_bytes"].append(block_size_bytes)
        init["stack_id"].append(stack_id)

    def initial_alloc(self, device: int, stream: int, addr: int, size_bytes: int,
                      block_size_bytes: int = -1, stack_id: int = -1) -> int:
        """Declare an allocation alive before the window (e.g. from a snapshot's final state)."""
        alloc_id = self._new_id()
        self._add_initial(alloc_id, size_bytes, stream, device, addr, block_size_bytes, stack_id)
        self._live[_key(device, addr)] = [alloc_id, size_bytes, _LIVE]
        return alloc_id

    def free_requested(self, record, t_ns: int, device: int, stream: int, addr: int,
                       size_bytes: int | None = None, *, record_decision: bool = False,
                       stack_id: int = -1) -> int | None:
        """Record that the program freed the block at ``addr`` (reuse may wait for its stream)."""
        t_ns = self._check_time(record, t_ns)
        self._stack = stack_id
        entry = self._lookup_for_free(record, t_ns, device, stream, addr, size_bytes)
        if entry is None:
            return None
        if entry[2] == _PENDING:
            self.problem(record, f"second free request of address {addr:#x}", "dropped it")
            return None
        entry[2] = _PENDING
        index = self._emit(t_ns, EventKind.FREE_REQUESTED, entry[0], entry[1], stream, device)
        self._stack = -1
        if record_decision:
            self.decision(index, t_ns, "free_requested", addr, entry[1], stream, device, entry[0],
                          stack_id=stack_id)
        return entry[0]

    def free_completed(self, record, t_ns: int, device: int, stream: int, addr: int,
                       size_bytes: int | None = None, *, record_decision: bool = False,
                       stack_id: int = -1) -> int | None:
        """Record that the block at ``addr`` is reusable again."""
        t_ns = self._check_time(record, t_ns)
        self._stack = stack_id
        key = _key(device, addr)
        entry = self._live.get(key)
        if entry is None or entry[2] != _PENDING:
            if entry is None and key not in self._freed_addrs and size_bytes is not None:
                # A free completing whose request fell before the window: both are orphans.
                entry = self._lookup_for_free(record, t_ns, device, stream, addr, size_bytes)
                assert entry is not None
                entry[2] = _PENDING
                self._emit(t_ns, EventKind.FREE_REQUESTED, entry[0], entry[1], stream, device)
            elif entry is not None:
                self.problem(record, f"free completed at {addr:#x} without a free request",
                             "inserted the request at the same time")
                entry[2] = _PENDING
                self._emit(t_ns, EventKind.FREE_REQUESTED, entry[0], entry[1], stream, device)
            else:
                self._stack = -1
                self.problem(record, f"free completed at {addr:#x} which is not allocated", "dropped it")
                return None
        del self._live[key]
        self._freed_addrs.add(key)
        index = self._emit(t_ns, EventKind.FREE_COMPLETED, entry[0], entry[1], stream, device)
        self._stack = -1
        if record_decision:
            self.decision(index, t_ns, "free_completed", addr, entry[1], stream, device, entry[0],
                          stack_id=stack_id)
        return entry[0]

    def free(self, record, t_ns: int, device: int, stream: int, addr: int,
             size_bytes: int | None = None, *, stack_id: int = -1) -> int | None:
        """Record a free the source does not split in two: requested and completed at once."""
        alloc_id = self.free_requested(record, t_ns, device, stream, addr, size_bytes, stack_id=stack_id)
        if alloc_id is None:
            return None
        return self.free_completed(record, t_ns, device, stream, addr, stack_id=stack_id)

    def empty_cache(self, record, t_ns: int, device: int, stream: int = 0) -> None:
        """Record the program's explicit cache release."""
        t_ns = self._check_time(record, t_ns)
        self._stack = -1
        self._emit(t_ns, EventKind.EMPTY_CACHE, -1, 0, stream, device)

    def marker(self, record, t_ns: int, label: str, device: int = 0, stream: int = 0, size_bytes: int = 0) -> None:
        """Record a label such as a step boundary."""
        t_ns = self._check_time(record, t_ns)
        if label not in self._label_index:
            self._label_index[label] = len(self.labels)
            self.labels.append(label)
        self._stack = -1
        self._emit(t_ns, EventKind.MARKER, self._label_index[label], size_bytes, stream, device)

    def decision(self, event_index: int, t_ns: int, action: str, addr: int, size_bytes: int,
                 stream: int, device: int, alloc_id: int = -1, device_free_bytes: int = -1,
                 stack_id: int = -1) -> None:
        """Keep one of the real allocator's decisions, apart from the program's requests (``stack_id``: its frames)."""
        d = self._decisions
        d["event_index"].append(event_index)
        d["t_ns"].append(t_ns)
        d["action"].append(action)
        d["addr"].append(addr)
        d["size_bytes"].append(size_bytes)
        d["stream"].append(stream)
        d["device"].append(device)
        d["alloc_id"].append(alloc_id)
        d["device_free_bytes"].append(device_free_bytes)
        d["stack_id"].append(stack_id)

    @property
    def next_event_index(self) -> int:
        """Index the next emitted event will get (for decisions recorded before their request)."""
        return len(self._cols["t_ns"])

    @property
    def last_t_ns(self) -> int:
        """Time of the latest event so far (0 before any)."""
        return self._last_t_ns or 0

    def set_stack_id(self, event_index: int, stack_id: int) -> None:
        """Give event ``event_index`` another stack (a reader that learns more about an allocation later)."""
        self._cols["stack_id"][event_index] = stack_id

    def live_items(self):
        """(device, addr) -> (alloc_id, size_bytes, pending) for allocations alive now."""
        return {_unkey(key): (v[0], v[1], v[2] == _PENDING) for key, v in self._live.items()}

    # ----------------------------------------------------------------- result
    def finish(self, **side_tables) -> Trace:
        """Return the validated ``Trace``; ``side_tables`` may give initial_segments / initial_blocks."""
        if self._repair_count > MAX_REPORTED_REPAIRS:
            self.meta.repairs.append(f"... and {self._repair_count - MAX_REPORTED_REPAIRS} more repairs")
        if self.orphan_frees:
            self.meta.notes.append(
                f"{self.orphan_frees} frees of blocks allocated before the trace began; "
                "they are in the initial state with the size the free reported")
        events = table_from_columns(self._cols, EVENT_DTYPES)
        if not self.meta.devices:
            self.meta.devices = sorted(set(int(d) for d in np.unique(events["device"]))
                                       | set(int(d) for d in self._initial["device"]))
        trace = Trace(
            events=events,
            meta=self.meta,
            labels=self.labels,
            initial_allocs=table_from_columns(self._initial, INITIAL_ALLOC_DTYPES),
            decisions=table_from_columns(self._decisions, DECISION_DTYPES),
            **side_tables,
        )
        check_schema(trace)
        return trace
