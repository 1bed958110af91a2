"""Read PyTorch memory snapshots (``torch.cuda.memory._dump_snapshot`` pickles) with ``read_snapshot``.

A snapshot holds the program's requests (``alloc`` / ``free_requested`` / ``free_completed`` trace
entries), what PyTorch's caching allocator did about them (``segment_*`` and ``oom`` entries, kept
as ``Trace.decisions``) and the allocator state at the END of the window (``segments`` with every
block). The trace window is a ring buffer's tail, so the reader walks the final state back through
the window to the state at its START (``initial_allocs``, ``initial_segments``, ``initial_blocks``):

* initial allocations = final live blocks at addresses the window never touches (declared up front,
  block size from the final segment) + "orphan" frees of blocks allocated before the window (found
  by the builder; block size = PyTorch's ``round_size`` of the request, a lower bound because a
  large block that was not split can be bigger);
* initial segments = final segments, minus ``segment_alloc``s in the window, plus ``segment_free``s
  (pool from the size: exactly 2 MiB = kSmallBuffer = small pool, anything else large);
* expandable segments (``segment_map`` / ``segment_unmap``) are modelled as mapped address ranges:
  start ranges = final mapped ranges minus maps plus unmaps, walked backwards, then merged into one
  segment per contiguous range of one (stream, pool) -- the way snapshots report them. A range that
  only exists before an unmap takes the pool of the nearest mapped range of its stream;
* initial blocks tile each initial segment: live initial allocations, free gaps between them.

Nothing in the file is trusted. On the compiled route (``allocsim.trace.reading.compiled``) the bytes are
read by a data-only pickle interpreter in C that builds no Python object and calls nothing: it
models only the opcodes of plain data, its memory is a fixed multiple of the file size and capped
by ``limits.memory_bytes``, and it reads well-formed files straight into columns
(``_SnapshotReader.read_scanned``). Anything else it hands back, and the file takes the reference
route: the pickle is loaded with every global refused, in a forked child under an address-space cap
and a deadline (``isolate``; the C unpickler first, the pure-Python one of ``safe_pickle`` when that
fails or is stopped). An entry dict referenced twice through the pickle's memo is refused on
both routes before any entry is read. Every entry is type- and range-checked and a bad one raises
``TraceFormatError`` naming ``device D entry I`` (under ``lenient`` it is skipped and listed in
``meta.repairs``). A final state that does not fit the window is reported in ``meta.notes`` and
leaves ``initial_blocks`` empty instead of failing.

Well-formed files take a columnar path (the compiled scan, or ``fast`` reading the
unpickled entries as columns; ``columnar.build_columns`` builds the events); anything to report or
repair goes through the entry-by-entry reference path below. Both keep every entry's and block's stack frames
(``Trace.frames`` / ``Trace.stacks``, one ``stack_id`` per event, initial allocation, block and decision).
Work on the assembled trace (inference of the real run) belongs in ``finish_snapshot_trace``.
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
import os
import signal
from typing import Any, Callable, NamedTuple

import numpy as np
from sortedcontainers import SortedDict, SortedList

from ....errors import TraceFormatError
from ....units import format_bytes
from ...reading import compiled, isolate
from ...reading.builder import MAX_SIZE_BYTES, TraceBuilder
from ...inference.recorded import infer_from_snapshot
from ...reading.columnar import build_columns, match_keys
from ...inference.final_state import check_final_state
from ...reading.frames import FrameTable, frame_tables, frame_text_cap
from ...reading.headroom import headroom
from ...reading.limits import DEFAULT_LIMITS, Limits, LimitExceeded, check_count, check_regular_file, read_bytes, read_head
from ...reading.safe_pickle import loads_data, loads_fast, not_a_pickle, short_repr
from ...schema import (
    BLOCK_DTYPES,
    DECISION_DTYPES,
    EVENT_DTYPES,
    FRAME_DTYPES,
    INITIAL_ALLOC_DTYPES,
    RECORDED_SERIES_DTYPES,
    SEGMENT_DTYPES,
    STACK_DTYPES,
    Trace,
    check_schema,
    empty_frame,
    frame_from_columns,
    table_from_columns,
    text_column,
)
from ....settings.pytorch_sizes import K_MIN_BLOCK_SIZE, K_SMALL_BUFFER
from ....settings.recorded import checked_allocator_settings
from .fast import ACTION_NAMES, DeviceEntries, entry_columns, merged_records
from ...transport import payload_to_trace, trace_to_payload

FORMAT = "pytorch-snapshot"


#: Time given to the i-th entry of a device when the file has no ``time_us`` (older PyTorch).
SYNTHETIC_STEP_NS = 1000

ACTIONS = frozenset({
    "alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
    "segment_map", "segment_unmap", "oom", "snapshot",
})
_NEEDS_ADDR = frozenset({
    "alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
    "segment_map", "segment_unmap",
})
_REQUESTS = frozenset({"alloc", "free_requested", "free_completed"})
_LIVE_STATES = frozenset({"active_allocated", "active_pending_free", "active_awaiting_free"})
_BLOCK_STATES = _LIVE_STATES | {"inactive"}

_INT64_MAX = (1 << 63) - 1
_INT64_MIN = -(1 << 63)
_MAX_TIME_US = _INT64_MAX // 1000
#: Optional keys whose presence dates the PyTorch version that wrote the file.
_ENTRY_HINTS = ("time_us", "user_metadata", "compile_context")
_TOP_HINTS = ("allocator_settings", "external_annotations")
_SEGMENT_HINTS = ("is_expandable", "segment_pool_id")
#: Bounds on copying ``allocator_settings`` (a hostile pickle can nest shared lists exponentially).
_SETTINGS_MAX_NODES = 10_000
_MAX_NOTED = 5


def round_size(size: int) -> int:
    """PyTorch's default ``round_size``: at least 512 bytes, rounded up to a multiple of 512."""
    if size < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    return K_MIN_BLOCK_SIZE * ((size + K_MIN_BLOCK_SIZE - 1) // K_MIN_BLOCK_SIZE)


def _pool_for_segment_size(size: int) -> str:
    """Pool of a (non-expandable) segment from its size: small-pool segments are exactly 2 MiB."""
    return "small" if size == K_SMALL_BUFFER else "large"


def _is_int(value: Any) -> bool:
    return type(value) is int  # bool is an int subclass but never a size, address or stream


def _describe(value: Any) -> str:
    return f"{type(value).__name__} {short_repr(value)}"


class _Entry(NamedTuple):
    t_ns: int
    device: int
    seq: int           # position in the device's list (tie-break, keeps recorded order)
    action: str
    addr: int
    size: int
    stream: int
    extra: int         # oom: device_free bytes (-1 when absent); else unused
    record: str
    stack: int = -1    # stack id of the entry's frames (-1: none)


class _Block(NamedTuple):
    addr: int
    size: int
    requested: int
    state: str
    stack: int = -1


class _Segment(NamedTuple):
    device: int
    addr: int
    size: int
    stream: int
    pool: str
    expandable: bool
    blocks: list


#: Block states of a snapshot; ``SegmentColumns.block_state`` indexes this tuple, live states first.
BLOCK_STATES = ("active_allocated", "active_pending_free", "active_awaiting_free", "inactive")
_N_LIVE_STATES = 3
_ALLOCATED, _INACTIVE = BLOCK_STATES.index("active_allocated"), BLOCK_STATES.index("inactive")
POOLS = ("small", "large")


@dataclasses.dataclass
class SegmentColumns:
    """A snapshot's final segments and their blocks as columns (what both routes read them into)."""

    device: np.ndarray           # int64, per segment
    addr: np.ndarray
    size: np.ndarray
    stream: np.ndarray
    pool: np.ndarray             # int8: index in POOLS
    expandable: np.ndarray       # bool
    block_segment: np.ndarray    # int64, per block: index of its segment
    block_addr: np.ndarray
    block_size: np.ndarray
    block_requested: np.ndarray
    block_state: np.ndarray      # int8: index in BLOCK_STATES
    block_stack: np.ndarray      # int32

    @classmethod
    def from_segments(cls, segments: list[_Segment]) -> "SegmentColumns":
        """Columns of parsed ``_Segment`` records (the reference route)."""
        col = lambda values, dtype: np.array(values, dtype=dtype)
        blocks = [(i, b) for i, seg in enumerate(segments) for b in seg.blocks]
        return cls(
            device=col([s.device for s in segments], np.int64), addr=col([s.addr for s in segments], np.int64),
            size=col([s.size for s in segments], np.int64), stream=col([s.stream for s in segments], np.int64),
            pool=col([POOLS.index(s.pool) for s in segments], np.int8),
            expandable=col([s.expandable for s in segments], bool),
            block_segment=col([i for i, _ in blocks], np.int64), block_addr=col([b.addr for _, b in blocks], np.int64),
            block_size=col([b.size for _, b in blocks], np.int64),
            block_requested=col([b.requested for _, b in blocks], np.int64),
            block_state=col([BLOCK_STATES.index(b.state) for _, b in blocks], np.int8),
            block_stack=col([b.stack for _, b in blocks], np.int32))

    def rows(self) -> list[_Segment]:
        """One ``_Segment`` per segment, without blocks (for the start-state walk)."""
        return [_Segment(d, a, s, st, POOLS[p], bool(e), [])
                for d, a, s, st, p, e in zip(self.device.tolist(), self.addr.tolist(), self.size.tolist(),
                                             self.stream.tolist(), self.pool.tolist(), self.expandable.tolist())]


class _Holder:
    """A box for the unpickled data, so the reader can let go of it while it still runs."""

    def __init__(self, value: Any):
        self.value = value


class _Skip(Exception):
    """An entry that lenient mode drops (the repair has already been recorded)."""


def read_snapshot(path: str | os.PathLike, *, lenient: bool = False, max_bytes: int | None = None,
                  limits: Limits | None = None, frames: bool = True) -> Trace:
    """Read a PyTorch memory snapshot pickle (plain or gzip) into a ``Trace``.

    Raises ``UnsafePickleError`` for pickles that reference code and ``TraceFormatError`` (naming the
    file, the record such as ``device 0 entry 17`` and the reason) for anything malformed. With
    ``lenient=True`` malformed entries are skipped and listed in ``trace.meta.repairs``. With
    ``frames=False`` stack frames are not read (every ``stack_id`` is -1, the frame tables empty).

    On Linux the file is parsed in a forked child process under ``limits.memory_bytes`` of address
    space and ``limits.seconds`` of wall time, first with CPython's C unpickler (refusing every
    global), and only if that fails or is stopped, with the pure-Python data-only unpickler.
    """
    path = os.fspath(path)
    limits = limits or DEFAULT_LIMITS
    if max_bytes is not None:
        limits = dataclasses.replace(limits, decompressed_bytes=max_bytes)
    check_regular_file(path)
    other = not_a_pickle(read_head(path, 16))
    if other is not None:
        raise TraceFormatError(path, None, other)
    data = None
    trace = None
    if compiled.active():
        data = read_bytes(path, limits)
        trace = _read_compiled(path, data, lenient, limits, frames)
    if trace is None:
        if isolate.available():
            trace = _read_isolated(path, lenient, limits, data, frames)
        else:
            trace = _parse(path, lenient, limits, use_c=False, phase=lambda _name: None, data=data, frames=frames)
    finish_snapshot_trace(trace)
    return trace


#: Building the trace from the scan's columns takes about twice what the scan held at its peak
#: (measured: 2M live blocks, a 480 MB scan, 1.5 GB for the whole read): the scan gets a third.
_SCAN_SHARE_OF_HEADROOM = 3


def _read_compiled(path: str, data: bytes, lenient: bool, limits: Limits, frames: bool = True) -> Trace | None:
    """The trace from the compiled scan, or None when the file must take the reference route.

    The scan's budget is ``limits.memory_bytes`` or, under a tighter process limit (``ulimit -v``,
    a cgroup), a third of what the process may still take. A file over a budget set by the process
    limit is refused at once, naming that limit: the reference route needs more memory still.
    """
    room = headroom()
    budget = limits.memory_bytes
    if room is not None and room.bytes // _SCAN_SHARE_OF_HEADROOM < budget:
        budget = room.bytes // _SCAN_SHARE_OF_HEADROOM
    else:
        room = None      # memory_bytes is the tighter cap: the reference route reports it
    scan = compiled.ext.snapshot_scan(
        data, budget, limits.frames, limits.string_chars, limits.segments, limits.devices,
        limits.events, _MAX_TIME_US, SYNTHETIC_STEP_NS, int(frames), frame_text_cap(limits, len(data)))
    if isinstance(scan, tuple):         # ("shared entry", device, entry, first device, first entry)
        _, device, index, first_device, first_index = scan
        raise TraceFormatError(path, f"device {device} entry {index}", _shared_entry_reason(first_device, first_index))
    if isinstance(scan, int):
        if room is not None:
            raise TraceFormatError(path, None, f"reading it needs more memory than this process may take: over "
                                   f"{format_bytes(scan)} just to scan it, which may use a third of the "
                                   f"{format_bytes(room.bytes)} left under {room.limit}; raise that limit")
        return None
    if scan is None:
        return None
    reader = _SnapshotReader(path, lenient, budget=len(data), limits=limits, frames=frames)
    return reader.read_scanned(scan)


def _shared_entry_reason(first_device: int, first_index: int) -> str:
    return (f"the same dict as device {first_device} entry {first_index} (a pickle memo reference): PyTorch "
            "writes each entry once, and a file that repeats one is refused rather than read as copies")


def _first_shared_entry(raw_traces: list) -> tuple[int, int, int, int] | None:
    """(device, entry, first device, first entry) of the first entry dict met twice, or None.

    A 20 MB pickle can reference one dict 10^7 times through its memo: read as copies it took
    minutes. Only a file with a repeat pays for the walk that finds it."""
    ids = np.sort(np.fromiter((id(e) for tr in raw_traces if isinstance(tr, list) for e in tr
                               if isinstance(e, dict)), np.uint64))       # 8 bytes an entry, not a set's 70
    if not np.any(ids[1:] == ids[:-1]):
        return None
    first: dict[int, tuple[int, int]] = {}
    for device, tr in enumerate(raw_traces):
        if not isinstance(tr, list):
            continue
        for index, e in enumerate(tr):
            if isinstance(e, dict):
                seen = first.setdefault(id(e), (device, index))
                if seen != (device, index):
                    return device, index, *seen
    return None


def finish_snapshot_trace(trace: Trace) -> None:
    """Work done on the assembled ``Trace`` of a snapshot, in this process (inference of the real run)."""
    infer_from_snapshot(trace)
    check_schema(trace)


def _parse(path: str, lenient: bool, limits: Limits, *, use_c: bool, phase: Callable[[str], None],
           data: bytes | None = None, frames: bool = True,
           on_size: Callable[[int], None] = lambda n_bytes: None) -> Trace:
    if data is None:
        data = read_bytes(path, limits)
    n_bytes = len(data)
    on_size(n_bytes)
    obj = None
    if use_c:
        phase("unpickling (C)")
        try:
            obj = loads_fast(data, path)
        except TraceFormatError:
            raise
        except Exception:  # noqa: BLE001 - let the reference unpickler name what is wrong
            obj = None
    if obj is None:
        phase("unpickling")
        obj = loads_data(data, path)
    del data   # the objects are built: the file's bytes are no longer needed
    phase("parsing")
    reader = _SnapshotReader(path, lenient, budget=n_bytes, limits=limits, frames=frames)
    return reader.read(_Holder(obj))


def _c_unpickle_seconds(n_bytes: int, limits: Limits) -> int:
    """Time allowed to the C unpickler before the reader falls back (a hash bomb never finishes).

    Sized from the pickle's bytes after decompression: a small gzip file can hold 64 MiB of
    opcodes, which the C unpickler needs seconds for and the fallback minutes.
    """
    return int(min(limits.seconds, 3 + n_bytes // 2_000_000))


#: Memory the C unpickler may take per byte of pickle (real snapshots: 3 to 13 times their size; a
#: file of one-byte empty sets or dicts: 56 to 216 times), and at least this much in all. Past it the
#: pure-Python unpickler takes over, which refuses sets at their first opcode.
_C_UNPICKLE_BYTES_PER_BYTE = 32
_C_UNPICKLE_FLOOR_BYTES = 256 << 20


def _c_unpickle_bytes(n_bytes: int) -> int:
    """Memory allowed to the C unpickler for a pickle of ``n_bytes`` (see ``_C_UNPICKLE_BYTES_PER_BYTE``)."""
    return max(_C_UNPICKLE_FLOOR_BYTES, _C_UNPICKLE_BYTES_PER_BYTE * n_bytes)


def _read_isolated(path: str, lenient: bool, limits: Limits, data: bytes | None = None,
                   frames: bool = True) -> Trace:
    def work(use_c: bool) -> Callable[[Callable[[str], None]], dict]:
        def run(phase: Callable[[str], None]) -> dict:
            n_bytes = [0]

            def timed_phase(name: str) -> None:
                phase(name)
                if name == "unpickling (C)":
                    signal.alarm(max(1, _c_unpickle_seconds(n_bytes[0], limits)))
                    isolate.cap_phase(_c_unpickle_bytes(n_bytes[0]))
                elif name in ("unpickling", "parsing"):
                    signal.alarm(max(1, int(limits.seconds)))
                    isolate.cap_phase(None)
            return trace_to_payload(_parse(path, lenient, limits, use_c=use_c, phase=timed_phase, data=data,
                                           frames=frames, on_size=lambda n: n_bytes.__setitem__(0, n)))
        return run

    for use_c in (True, False):
        try:
            return payload_to_trace(isolate.run_isolated(path, limits, work(use_c)))
        except isolate.ChildFailed as failed:
            if use_c and failed.phase == "unpickling (C)":
                continue   # the reference unpickler keeps its memo small and refuses hash bombs
            if failed.why == "time":
                raise LimitExceeded(path, None, "seconds", limits.seconds,
                                    f"parsing took too long ({failed.phase})") from None
            room = headroom()
            if room is not None and room.bytes < limits.memory_bytes:   # the child was capped by this limit
                raise TraceFormatError(path, None, f"parsing needs more memory ({failed.phase}) than this process "
                                       f"may take: {format_bytes(room.bytes)} left under {room.limit}; "
                                       "raise that limit") from None
            raise LimitExceeded(path, None, "memory_bytes", limits.memory_bytes,
                                f"parsing needs more memory ({failed.phase})") from None
    raise AssertionError("unreachable")


class _SnapshotReader:
    def __init__(self, path: str, lenient: bool, budget: int, limits: Limits = DEFAULT_LIMITS, frames: bool = True):
        self.path = path
        self.lenient = lenient
        self.limits = limits
        # Every list element costs at least one pickle byte unless lists are shared through the
        # memo; more elements than bytes means repeated lists (a CPU bomb), never a real snapshot.
        self.budget = budget
        self.b = TraceBuilder(path, FORMAT, lenient=lenient)
        self.notes = self.b.meta.notes
        self.consistent = True  # False once the start-state reconstruction hit a contradiction
        self.frames = FrameTable(path, limits, input_bytes=budget)
        self.keep_frames = frames

    # ------------------------------------------------------------------ helpers
    def _bad(self, record: str, reason: str, repair: str = "skipped it") -> None:
        """Raise for a malformed record, or (lenient) note the repair and skip it."""
        if not self.lenient:
            raise self.b.fail(record, reason)
        self.b.repair(record, f"{reason}; {repair}")
        raise _Skip

    def _spend(self, record: str, n: int) -> None:
        self.budget -= n
        if self.budget < 0:
            raise self.b.fail(record, "more list elements than the file has bytes: the pickle repeats "
                              "shared lists (corrupt or hostile)")

    def _inconsistent(self, what: str) -> None:
        self.consistent = False
        self.notes.append(f"start-state reconstruction: {what}")

    def _stack(self, record: str, frames: Any) -> int:
        """Stack id of an entry's or block's frames; bad frames are an error (lenient: dropped)."""
        if frames is None or not self.keep_frames:
            return -1
        try:
            return self.frames.stack_id(frames, record)
        except LimitExceeded:
            raise
        except TraceFormatError as exc:
            if not self.lenient:
                raise
            self.b.repair(record, f"{exc.reason}; dropped the frames")
            return -1

    # ------------------------------------------------------------------ top level
    def read(self, holder: Any) -> Trace:
        # The holder lets the reader drop the (large) unpickled data as soon as it has its columns.
        data = holder.value if isinstance(holder, _Holder) else holder
        b = self.b
        hints: dict[str, Any] = {}
        if isinstance(data, list):
            raw_segments, raw_traces = data, []
            hints["segments_only"] = True
            self.notes.append("pre-2.0 snapshot (a bare list of segments): no trace events, "
                              "the segments are the initial state")
        elif isinstance(data, dict):
            raw_segments = data.get("segments")
            raw_traces = data.get("device_traces")
            hints["segments_only"] = False
            if not isinstance(raw_segments, list):
                if not self.lenient:
                    raise b.fail("top level", "'segments' is missing or not a list"
                                 f" (got {_describe(raw_segments)})")
                b.repair("top level", "'segments' missing or not a list; assumed no segments")
                raw_segments = []
            if raw_traces is None:
                if not self.lenient:
                    raise b.fail("top level", "no 'device_traces' (a snapshot without history?)")
                b.repair("top level", "no 'device_traces'; loaded the segments only")
                raw_traces = []
                hints["segments_only"] = True
            if not isinstance(raw_traces, list):
                raise b.fail("top level", f"'device_traces' is not a list (got {_describe(raw_traces)})")
        else:
            raise b.fail("top level", "not a PyTorch memory snapshot: expected a dict with 'segments' "
                         f"and 'device_traces' or a list of segments, got {_describe(data)}")

        self._spend("top level", len(raw_traces))
        self._spend("top level", sum(len(tr) for tr in raw_traces if isinstance(tr, list)))
        check_count(self.path, "segments", len(raw_segments), self.limits, "segments", "top level")
        check_count(self.path, "devices", len(raw_traces), self.limits, "device traces", "top level")
        check_count(self.path, "events", sum(len(tr) for tr in raw_traces if isinstance(tr, list)),
                    self.limits, "trace entries", "top level")
        shared = _first_shared_entry(raw_traces)
        if shared is not None:
            device, index, first_device, first_index = shared
            raise b.fail(f"device {device} entry {index}", _shared_entry_reason(first_device, first_index))
        segments = self._parse_segments(raw_segments)
        check_final_state(self.path, segments, _N_LIVE_STATES, POOLS.index("small"))

        # Version fingerprint: which optional keys appear anywhere.
        for key in _TOP_HINTS:
            hints[key] = isinstance(data, dict) and key in data
        for key in _SEGMENT_HINTS:
            hints[key] = any(isinstance(s, dict) and key in s for s in raw_segments)
        for key in _ENTRY_HINTS:
            hints[key] = any(isinstance(e, dict) and key in e
                             for tr in raw_traces if isinstance(tr, list) for e in tr)
        b.meta.version_hints = hints
        if isinstance(data, dict) and "allocator_settings" in data:
            b.meta.allocator_settings = checked_allocator_settings(
                data["allocator_settings"], self.path, self.lenient, self.notes, self._plain)
        has_time = any(isinstance(e, dict) and "time_us" in e
                       for tr in raw_traces if isinstance(tr, list) for e in tr)
        if not has_time and any(isinstance(tr, list) and tr for tr in raw_traces):
            b.meta.time_synthesized = True
            self.notes.append(f"no time_us in this snapshot (PyTorch < 2.2): times are synthesised, "
                              f"{SYNTHETIC_STEP_NS} ns per entry of each device; devices are "
                              "interleaved round-robin, each keeping its recorded order")

        fast = entry_columns(raw_traces, has_time, SYNTHETIC_STEP_NS, _MAX_TIME_US,
                             self.frames if self.keep_frames else None)
        built = self._build_fast(segments, fast, has_time) if fast is not None else None
        if built is not None:
            # Every value is in columns now: free the unpickled object graph before going on.
            if isinstance(holder, _Holder):
                holder.value = None
            del data, raw_traces, raw_segments
            self.frames.forget_objects()
            return self._finish_fast(segments, fast, *built, tables=self.frames.tables())
        trace = self._read_reference(segments, raw_traces, has_time)
        return self._with_frames(trace, self.frames.tables())

    @staticmethod
    def _with_frames(trace: Trace, tables: dict[str, dict[str, Any]]) -> Trace:
        # (finish_snapshot_trace checks the schema once the trace is complete)
        trace.frames = table_from_columns(tables["frames"], FRAME_DTYPES)
        trace.stacks = table_from_columns(tables["stacks"], STACK_DTYPES)
        return trace

    def read_scanned(self, scan: dict[str, Any]) -> Trace | None:
        """``read`` of the compiled scan's columns (a clean file); None when the records need the
        reference route. Hints, notes and settings are made exactly as ``read`` makes them."""
        b = self.b
        hints: dict[str, Any] = {"segments_only": bool(scan["top_is_list"])}
        if scan["top_is_list"]:
            self.notes.append("pre-2.0 snapshot (a bare list of segments): no trace events, "
                              "the segments are the initial state")
        segments = _scanned_segments(scan["segments"])
        check_final_state(self.path, segments, _N_LIVE_STATES, POOLS.index("small"))
        for key in _TOP_HINTS:
            hints[key] = bool(scan["has_settings"]) if key == "allocator_settings" else bool(
                scan["has_external_annotations"])
        for key, present in zip(_SEGMENT_HINTS, scan["segment_hints"]):
            hints[key] = bool(present)
        for key, present in zip(_ENTRY_HINTS, scan["entry_hints"]):
            hints[key] = bool(present)
        b.meta.version_hints = hints
        if scan["has_settings"]:
            b.meta.allocator_settings = checked_allocator_settings(
                scan["settings"], self.path, self.lenient, self.notes, self._plain)
        has_time = bool(scan["has_time"])
        fast = [_scanned_device(cols) for cols in scan["devices"]]
        if not has_time and any(len(d.action) for d in fast):
            b.meta.time_synthesized = True
            self.notes.append(f"no time_us in this snapshot (PyTorch < 2.2): times are synthesised, "
                              f"{SYNTHETIC_STEP_NS} ns per entry of each device; devices are "
                              "interleaved round-robin, each keeping its recorded order")
        built = self._build_fast(segments, fast, has_time)
        if built is None:
            return None
        filenames, lines, names, stack_frames, stack_starts = scan["frames"]
        tables = frame_tables(filenames, np.frombuffer(lines, np.int64), names, np.frombuffer(stack_frames, np.int32),
                              np.frombuffer(stack_starts, np.int64))
        return self._finish_fast(segments, fast, *built, tables=tables)

    def _read_reference(self, segments: SegmentColumns, raw_traces: list, has_time: bool) -> Trace:
        """The entry-by-entry path: names the first bad record and makes the lenient repairs."""
        b = self.b
        traces = self._parse_traces(raw_traces, has_time)
        devices = set(segments.device.tolist()) | {d for d, tr in enumerate(traces) if tr}
        b.meta.devices = sorted(devices)
        self._declare_initial_allocs(segments, traces)
        self._feed(traces)
        seg_events = [[e for e in tr if e.action.startswith("segment_")] for tr in traces]
        initial_segments = self._initial_segments(segments, seg_events)
        trace = b.finish(initial_segments=self._segments_frame(initial_segments))
        allocated = [(e.device, e.addr) for tr in traces for e in tr if e.action == "alloc"]
        initial = {name: trace.initial_allocs[name].to_numpy() for name in INITIAL_ALLOC_DTYPES}
        self._fix_orphan_block_sizes(initial, segments, allocated)
        trace.initial_allocs["block_size_bytes"] = initial["block_size_bytes"]
        trace.initial_blocks = self._initial_blocks(initial, initial_segments)
        return trace

    def _plain(self, value: Any) -> Any:
        """Copy ``value`` as JSON-able plain data, bounded in size and depth."""
        budget = [_SETTINGS_MAX_NODES]

        def conv(v: Any, depth: int) -> Any:
            budget[0] -= 1
            if budget[0] < 0 or depth > self.limits.depth:
                raise OverflowError
            if v is None or isinstance(v, (bool, str)):
                return v
            if _is_int(v):
                return v if _INT64_MIN <= v <= _INT64_MAX else short_repr(v)
            if isinstance(v, float):
                return v if v == v and v not in (float("inf"), float("-inf")) else str(v)
            if isinstance(v, dict):
                return {str(k): conv(x, depth + 1) for k, x in v.items()}
            if isinstance(v, (list, tuple)):
                return [conv(x, depth + 1) for x in v]
            return short_repr(v)

        try:
            return conv(value, 0)
        except OverflowError:
            self.notes.append(f"allocator_settings too large or nested deeper than the limit depth="
                              f"{self.limits.depth}; not copied (raise it with --limits depth=N)")
            return None

    # ------------------------------------------------------------------ parsing
    def _check_int(self, record: str, entry: dict, key: str, *, lo: int = _INT64_MIN,
                   hi: int = _INT64_MAX) -> int:
        value = entry[key]
        if not _is_int(value):
            self._bad(record, f"'{key}' is not an integer (got {_describe(value)})")
        if not lo <= value <= hi:
            self._bad(record, f"'{key}' {short_repr(value)} is out of range")
        return value

    def _check_size(self, record: str, size: int) -> None:
        if size < 0 or size > MAX_SIZE_BYTES:
            try:
                self.b.check_size(record, size)
            except TraceFormatError as exc:
                if not self.lenient:
                    raise
                self.b.repair(record, f"{exc.reason}; skipped it")
                raise _Skip from None

    def _parse_segments(self, raw_segments: list) -> SegmentColumns:
        out: list[_Segment] = []
        self._spend("top level", len(raw_segments))
        for i, seg in enumerate(raw_segments):
            record = f"segment {i}"
            try:
                out.append(self._parse_segment(record, seg))
            except _Skip:
                continue
        return SegmentColumns.from_segments(out)

    def _parse_segment(self, record: str, seg: Any) -> _Segment:
        if not isinstance(seg, dict):
            self._bad(record, f"not a dict (got {_describe(seg)})")
        for key in ("address", "total_size", "blocks"):
            if key not in seg:
                self._bad(record, f"lacks '{key}'")
        addr = self._check_int(record, seg, "address", lo=0)
        size = self._check_int(record, seg, "total_size")
        self._check_size(record, size)
        device = self._check_int(record, seg, "device", lo=0, hi=32767) if "device" in seg else 0
        stream = self._check_int(record, seg, "stream") if "stream" in seg else 0
        pool = seg.get("segment_type")
        if pool not in ("small", "large"):
            if pool is not None:
                self._bad(record, f"unknown segment_type {_describe(pool)}")
            pool = _pool_for_segment_size(size)
        expandable = seg.get("is_expandable", False)
        if not isinstance(expandable, bool):
            self._bad(record, f"'is_expandable' is not a bool (got {_describe(expandable)})")
        raw_blocks = seg["blocks"]
        if not isinstance(raw_blocks, list):
            self._bad(record, f"'blocks' is not a list (got {_describe(raw_blocks)})")
        self._spend(record, len(raw_blocks))
        blocks: list[_Block] = []
        offset = addr
        for j, blk in enumerate(raw_blocks):
            brec = f"{record} block {j}"
            if not isinstance(blk, dict):
                self._bad(brec, f"not a dict (got {_describe(blk)})")
            for key in ("size", "state"):
                if key not in blk:
                    self._bad(brec, f"lacks '{key}'")
            bsize = self._check_int(brec, blk, "size")
            self._check_size(brec, bsize)
            # Older versions have no block address: blocks are contiguous from the segment base.
            baddr = self._check_int(brec, blk, "address", lo=0) if "address" in blk else offset
            state = blk["state"]
            if not isinstance(state, str) or state not in _BLOCK_STATES:
                self._bad(brec, f"unknown block state {_describe(state)}")
            frames = blk.get("frames")
            first = self._legacy_history(brec, blk) if "frames" not in blk and "history" in blk else None
            if first is not None:
                # PyTorch 2.0 kept a live block's stack in 'history' (its first entry is the allocation,
                # as torch.cuda._memory_viz._block_extra_legacy reads it), not in 'frames'.
                frames = first.get("frames")
            if "requested_size" in blk:
                requested = self._check_int(brec, blk, "requested_size")
                self._check_size(brec, requested)
            elif first is not None and "real_size" in first:
                requested = self._check_int(brec, first, "real_size")
                self._check_size(brec, requested)
            else:
                requested = bsize
            blocks.append(_Block(baddr, bsize, requested, state, self._stack(brec, frames)))
            offset = baddr + bsize
        return _Segment(device, addr, size, stream, pool, expandable, blocks)

    def _legacy_history(self, record: str, blk: dict) -> dict | None:
        """The first entry of an old (PyTorch 2.0) block's 'history', or None when it has none."""
        history = blk["history"]
        if not isinstance(history, list):
            self._bad(record, f"'history' is not a list (got {_describe(history)})")
        if not history:
            return None
        first = history[0]
        if not isinstance(first, dict):
            self._bad(record, f"'history' entry 0 is not a dict (got {_describe(first)})")
        return first

    def _parse_traces(self, raw_traces: list, has_time: bool) -> list[list[_Entry]]:
        traces: list[list[_Entry]] = []
        if len(raw_traces) > 32768:
            raise self.b.fail("top level", f"{len(raw_traces)} device traces (at most 32768 devices)")
        for device, raw in enumerate(raw_traces):
            if not isinstance(raw, list):
                if not self.lenient:
                    raise self.b.fail(f"device {device}", f"trace is not a list (got {_describe(raw)})")
                self.b.repair(f"device {device}", "trace is not a list; dropped it")
                traces.append([])
                continue
            entries: list[_Entry] = []
            last_t = 0
            for i, e in enumerate(raw):
                record = f"device {device} entry {i}"
                try:
                    entry = self._parse_entry(record, device, i, e, has_time, last_t)
                except _Skip:
                    continue
                last_t = entry.t_ns
                entries.append(entry)
            traces.append(entries)
        return traces

    def _parse_entry(self, record: str, device: int, i: int, e: Any, has_time: bool,
                     last_t: int) -> _Entry:
        if not isinstance(e, dict):
            self._bad(record, f"not a dict (got {_describe(e)})")
        if "action" not in e:
            self._bad(record, "lacks 'action'")
        action = e["action"]
        if not isinstance(action, str) or action not in ACTIONS:
            self._bad(record, f"unknown action {_describe(action)}")
        if "size" not in e:
            self._bad(record, "lacks 'size'")
        size = self._check_int(record, e, "size")
        self._check_size(record, size)
        if action in _NEEDS_ADDR:
            if "addr" not in e:
                self._bad(record, f"{action} lacks 'addr'")
            addr = self._check_int(record, e, "addr", lo=0)
        else:
            addr = -1
        if "stream" in e:
            stream = self._check_int(record, e, "stream")
        else:
            if not self.lenient:
                raise self.b.fail(record, "lacks 'stream'")
            self.b.repair(record, "lacks 'stream'; assumed the default stream 0")
            stream = 0
        extra = -1
        if action == "oom":
            key = "device_free" if "device_free" in e else ("addr" if "addr" in e else None)
            if key is not None:
                extra = self._check_int(record, e, key, lo=0)
        if has_time:
            t_us = e.get("time_us")
            if not _is_int(t_us) or not 0 <= t_us <= _MAX_TIME_US:
                reason = ("lacks 'time_us' while other entries have it" if t_us is None
                          else f"'time_us' is not a valid time (got {_describe(t_us)})")
                if not self.lenient:
                    raise self.b.fail(record, reason)
                self.b.repair(record, f"{reason}; used the previous entry's time")
                t_ns = last_t
            else:
                t_ns = t_us * 1000
        else:
            t_ns = i * SYNTHETIC_STEP_NS
        stack = self._stack(record, e.get("frames"))
        return _Entry(t_ns, device, i, action, addr, size, stream, extra, record, stack)

    # ------------------------------------------------------------------ fast path
    def _build_fast(self, segments: SegmentColumns, fast: list, has_time: bool) -> tuple | None:
        """Build the request columns; None when a record needs the reference path."""
        rec, action_idx, extra = merged_records(fast)
        devices = sorted(set(segments.device.tolist()) | {d for d, f in enumerate(fast) if len(f.action)})
        check_count(self.path, "devices", len(devices), self.limits, "devices", "top level")
        is_req = rec.op <= 3
        last_dev, last_addr, last_action = _last_request_actions(
            rec.device[is_req], rec.addr[is_req], action_idx[is_req], np.flatnonzero(is_req))
        declared, contradicted, dangling = _declared_initial(
            _live_blocks(segments), last_dev, last_addr, last_action, has_events=len(rec) > 0)
        built = build_columns(rec, first_alloc_id=len(declared["addr"]))
        if built is None:
            return None
        return rec, action_idx, extra, devices, declared, contradicted, dangling, built

    def _finish_fast(self, segments: SegmentColumns, fast: list, rec, action_idx, extra, devices, declared,
                     contradicted: int, dangling: int, built, *, tables: dict[str, dict[str, Any]]) -> Trace:
        """The trace from the columns ``_build_fast`` made, with the frame ``tables``."""
        is_req = rec.op <= 3
        b = self.b
        b.meta.devices = devices
        self._note_declared(declared["device"], contradicted, dangling)
        seg_events = [_segment_entries(d, f) for d, f in enumerate(fast)]
        initial_segments = self._initial_segments(segments, seg_events)
        if built.orphan_frees:
            self.notes.append(
                f"{built.orphan_frees} frees of blocks allocated before the trace began; "
                "they are in the initial state with the size the free reported")
        initial = {name: np.concatenate([np.asarray(declared[name]), built.initial[name]])
                   for name in INITIAL_ALLOC_DTYPES}
        is_dec = action_idx != ACTION_NAMES.index("snapshot")
        req_dec = is_req[is_dec]
        decisions = {
            "event_index": built.row_event[is_dec],
            "t_ns": rec.t_ns[is_dec],
            "action": text_column(ACTION_NAMES, action_idx[is_dec]),
            "addr": np.where(action_idx[is_dec] == ACTION_NAMES.index("oom"), -1, rec.addr[is_dec]),
            "size_bytes": np.where(req_dec, built.row_alloc_size[is_dec], rec.size[is_dec]),
            "stream": rec.stream[is_dec],
            "device": rec.device[is_dec],
            "alloc_id": np.where(req_dec, built.row_alloc_id[is_dec], -1),
            "device_free_bytes": np.where(action_idx[is_dec] == ACTION_NAMES.index("oom"), extra[is_dec], -1),
            "stack_id": rec.stack_id[is_dec],
        }
        labels = ["snapshot"] if bool((~is_dec).any()) else []
        allocated = np.flatnonzero(rec.op == 1)
        self._fix_orphan_block_sizes(initial, segments, np.stack([rec.device[allocated], rec.addr[allocated]], axis=1))
        return Trace(
            events=frame_from_columns(built.events, EVENT_DTYPES),
            meta=b.meta,
            labels=labels,
            initial_allocs=frame_from_columns(initial, INITIAL_ALLOC_DTYPES),
            initial_segments=self._segments_frame(initial_segments),
            initial_blocks=self._initial_blocks(initial, initial_segments),
            decisions=frame_from_columns(decisions, DECISION_DTYPES),
            # Kept as columns: the frame strings stay shared as the file shares them (a DataFrame
            # would copy each one per frame) until something asks for the DataFrame.
            frames=table_from_columns(tables["frames"], FRAME_DTYPES),
            stacks=table_from_columns(tables["stacks"], STACK_DTYPES),
            recorded_series=empty_frame(RECORDED_SERIES_DTYPES),
        )

    # ------------------------------------------------------------------ initial allocations
    def _declare_initial_allocs(self, segments: SegmentColumns, traces: list[list[_Entry]]) -> None:
        """Declare final live blocks the window never touches: they were allocated before it."""
        req = [(e.device, e.addr, ACTION_NAMES.index(e.action), k)
               for k, e in enumerate(x for tr in traces for x in tr) if e.action in _REQUESTS]
        cols = np.array(req, dtype=np.int64).reshape(-1, 4)
        last_dev, last_addr, last_action = _last_request_actions(cols[:, 0], cols[:, 1], cols[:, 2], cols[:, 3])
        declared, contradicted, dangling = _declared_initial(
            _live_blocks(segments), last_dev, last_addr, last_action, has_events=bool(traces and any(traces)))
        for i in range(len(declared["addr"])):
            self.b.initial_alloc(int(declared["device"][i]), int(declared["stream"][i]), int(declared["addr"][i]),
                                 size_bytes=int(declared["size_bytes"][i]),
                                 block_size_bytes=int(declared["block_size_bytes"][i]),
                                 stack_id=int(declared["stack_id"][i]))
        self._note_declared(declared["device"], contradicted, dangling)

    def _note_declared(self, declared_device: np.ndarray, contradicted: int, dangling: int) -> None:
        if contradicted:
            self._inconsistent(f"{contradicted} blocks live in the final segments were freed at the "
                               "end of the trace")
        if dangling:
            self._inconsistent(f"{dangling} allocations live at the end of the trace are not in the "
                               "final segments")
        devices, counts = np.unique(np.asarray(declared_device, dtype=np.int64), return_counts=True)
        # One note per device where there are several, so each device's section states its own count.
        prefixes = [f"device {d}: " for d in devices.tolist()] if len(devices) > 1 else [""]
        for prefix, n_declared in zip(prefixes, counts.tolist()):
            self.notes.append(f"{prefix}{n_declared} blocks live in the final segments were allocated "
                              "before the trace began; they are in the initial state")

    def _fix_orphan_block_sizes(self, initial: dict[str, np.ndarray], segments: SegmentColumns,
                                allocated: Any) -> None:
        """Give orphan-free initial allocations a block size (the builder leaves -1) in the columns ``initial``;
        ``allocated``: the (device, addr) of every allocation in the window."""
        block = np.array(initial["block_size_bytes"], dtype=np.int64)
        todo = np.flatnonzero(block < 0)
        if not len(todo):
            return
        live = _live_blocks(segments)
        alloc_keys = np.array(allocated, dtype=np.int64).reshape(-1, 2)
        devices = np.asarray(initial["device"])[todo].astype(np.int64)
        addrs = np.asarray(initial["addr"])[todo]
        in_live = match_keys(live["device"], live["addr"], devices, addrs)
        in_window = match_keys(alloc_keys[:, 0], alloc_keys[:, 1], devices, addrs) >= 0
        exact = (in_live >= 0) & ~in_window
        sizes = np.asarray(initial["size_bytes"])[todo]
        rounded_sizes = np.maximum(K_MIN_BLOCK_SIZE, -(-sizes // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE)
        block[todo] = np.where(exact, _gather(live["block_size_bytes"], in_live), rounded_sizes)
        initial["block_size_bytes"] = block
        rounded = int((~exact).sum())
        if rounded:
            settings = self.b.meta.allocator_settings or {}
            divisions = settings.get("roundup_power2_divisions")
            configured = (isinstance(divisions, dict) and any(_is_int(v) and v > 1 for v in divisions.values())
                          or _is_int(divisions) and divisions > 1)
            self.notes.append(
                f"{rounded} initial blocks known only from their free have the block size PyTorch's "
                "default round_size gives (a lower bound: an unsplit large block can be bigger"
                + ("; this run set roundup_power2_divisions, which is not applied here" if configured else "")
                + ")")

    # ------------------------------------------------------------------ events
    def _feed(self, traces: list[list[_Entry]]) -> None:
        b = self.b
        nonempty = [tr for tr in traces if tr]
        if len(nonempty) == 1:
            stream_of_entries = iter(nonempty[0])
        else:
            # Stable across devices: equal times go in device order; each device keeps its order.
            stream_of_entries = heapq.merge(*nonempty, key=lambda e: e.t_ns)
        for e in stream_of_entries:
            action = e.action
            if action == "alloc":
                b.alloc(e.record, e.t_ns, e.device, e.stream, e.addr, e.size, record_decision=True,
                        stack_id=e.stack)
            elif action == "free_requested":
                b.free_requested(e.record, e.t_ns, e.device, e.stream, e.addr, e.size,
                                 record_decision=True, stack_id=e.stack)
            elif action == "free_completed":
                b.free_completed(e.record, e.t_ns, e.device, e.stream, e.addr, e.size,
                                 record_decision=True, stack_id=e.stack)
            elif action == "snapshot":
                b.marker(e.record, e.t_ns, "snapshot", e.device, e.stream, e.size)
            else:
                t_ns = e.t_ns
                if t_ns < b.last_t_ns:
                    b.problem(e.record, f"time goes back from {b.last_t_ns} ns to {t_ns} ns",
                              "clamped to the previous time")
                    t_ns = b.last_t_ns
                if action == "oom":
                    b.decision(b.next_event_index, t_ns, "oom", -1, e.size, e.stream, e.device,
                               device_free_bytes=e.extra, stack_id=e.stack)
                else:
                    b.decision(b.next_event_index, t_ns, action, e.addr, e.size, e.stream, e.device,
                               stack_id=e.stack)

    # ------------------------------------------------------------------ initial segments
    def _initial_segments(self, segments: SegmentColumns,
                          seg_events: list[list[_Entry]]) -> list[tuple[int, int, int, int, str, bool]]:
        """Walk the final segments back through the window's segment events to its start.

        Sorted containers keyed by address keep this O(n log n) whatever addresses a file holds.
        """
        by_device: dict[int, list[_Segment]] = {}
        for seg in segments.rows():
            by_device.setdefault(seg.device, []).append(seg)
        devices = sorted(set(by_device) | {d for d, tr in enumerate(seg_events) if tr})
        out: list[tuple[int, int, int, int, str, bool]] = []
        for device in devices:
            fixed: SortedDict = SortedDict()
            ranges = _RangeSet()
            for seg in by_device.get(device, []):
                if seg.expandable:
                    ranges.add_unchecked(seg.addr, seg.addr + seg.size, seg.stream, seg.pool)
                elif seg.addr in fixed:
                    self._inconsistent(f"device {device}: two final segments at {seg.addr:#x}")
                else:
                    fixed[seg.addr] = (seg.size, seg.stream, seg.pool)
            final_ranges = ranges.copy()
            events = seg_events[device] if device < len(seg_events) else []
            problems: list[str] = []
            for e in reversed(events):
                a = e.action
                if a == "segment_alloc":
                    got = fixed.pop(e.addr, None)
                    if got is None or got[0] != e.size:
                        problems.append(f"{e.record}: segment_alloc of {e.size} bytes at {e.addr:#x} "
                                        "is not a later-existing segment")
                elif a == "segment_free":
                    if e.addr in fixed:
                        problems.append(f"{e.record}: segment_free at {e.addr:#x} while a segment "
                                        "there exists later")
                    else:
                        fixed[e.addr] = (e.size, e.stream, _pool_for_segment_size(e.size))
                elif a == "segment_map":
                    if e.size and ranges.remove(e.addr, e.addr + e.size) != e.size:
                        problems.append(f"{e.record}: segment_map of [{e.addr:#x}, +{e.size}) is not "
                                        "mapped later")
                elif a == "segment_unmap" and e.size:
                    pool = ranges.nearest_pool(e.addr, e.addr + e.size, e.stream, final_ranges)
                    if not ranges.add(e.addr, e.addr + e.size, e.stream, pool):
                        problems.append(f"{e.record}: segment_unmap of [{e.addr:#x}, +{e.size}) "
                                        "overlaps memory mapped later")
            if problems:
                more = f" (and {len(problems) - _MAX_NOTED} more)" if len(problems) > _MAX_NOTED else ""
                self._inconsistent(f"device {device}: " + "; ".join(problems[:_MAX_NOTED]) + more)
            for addr, (size, stream, pool) in fixed.items():
                out.append((device, addr, size, stream, pool, False))
            for start, end, stream, pool in ranges.merged():
                out.append((device, start, end - start, stream, pool, True))
        out.sort(key=lambda s: (s[0], s[1]))
        return out

    @staticmethod
    def _segments_frame(segs: list[tuple[int, int, int, int, str, bool]]):
        cols = {name: [s[i] for s in segs] for i, name in enumerate(SEGMENT_DTYPES)}
        return frame_from_columns(cols, SEGMENT_DTYPES)

    # ------------------------------------------------------------------ initial blocks
    def _initial_blocks(self, initial: dict[str, np.ndarray], segs: list[tuple[int, int, int, int, str, bool]]):
        """The blocks tiling the initial segments: live initial allocations (columns ``initial``) and free gaps."""
        cols: dict[str, list[Any]] = {name: [] for name in BLOCK_DTYPES}
        if not self.consistent:
            self.notes.append("initial_blocks left empty because the start state is inconsistent")
            return empty_frame(BLOCK_DTYPES)
        allocs: dict[int, list[tuple[int, int, int, int, int]]] = {}
        column = lambda name: np.asarray(initial[name]).tolist()
        for dev, addr, bsize, req, aid, sid in zip(
                column("device"), column("addr"), column("block_size_bytes"), column("size_bytes"),
                column("alloc_id"), column("stack_id")):
            allocs.setdefault(dev, []).append((addr, bsize, req, aid, sid))
        seg_by_dev: dict[int, list[tuple[int, int]]] = {}
        for dev, addr, size, _stream, _pool, _exp in segs:
            seg_by_dev.setdefault(dev, []).append((addr, size))
        failures: list[str] = []
        placed: dict[tuple[int, int], list[tuple[int, int, int, int, int]]] = {}
        for dev, items in allocs.items():
            items.sort()
            dsegs = seg_by_dev.get(dev, [])
            starts = [s[0] for s in dsegs]
            prev_end = -1
            for addr, bsize, req, aid, sid in items:
                if addr < 0 or bsize <= 0:
                    failures.append(f"device {dev}: initial allocation {aid} has no address or block size")
                    continue
                if addr < prev_end:
                    failures.append(f"device {dev}: initial blocks overlap at {addr:#x}")
                prev_end = max(prev_end, addr + bsize)
                k = bisect.bisect_right(starts, addr) - 1
                if k < 0 or addr + bsize > dsegs[k][0] + dsegs[k][1]:
                    failures.append(f"device {dev}: initial block [{addr:#x}, +{bsize}) lies in no "
                                    "initial segment")
                    continue
                placed.setdefault((dev, k), []).append((addr, bsize, req, aid, sid))
        if failures:
            more = f" (and {len(failures) - _MAX_NOTED} more)" if len(failures) > _MAX_NOTED else ""
            self._inconsistent("; ".join(failures[:_MAX_NOTED]) + more)
            self.notes.append("initial_blocks left empty because the start state is inconsistent")
            return empty_frame(BLOCK_DTYPES)

        def add(dev: int, seg_addr: int, addr: int, size: int, req: int, state: int, aid: int, sid: int) -> None:
            cols["device"].append(dev)
            cols["segment_addr"].append(seg_addr)
            cols["addr"].append(addr)
            cols["size_bytes"].append(size)
            cols["requested_bytes"].append(req)
            cols["state"].append(state)
            cols["alloc_id"].append(aid)
            cols["stack_id"].append(sid)

        index_in_device: dict[int, int] = {}
        for dev, seg_addr, seg_size, _stream, _pool, _exp in segs:
            k = index_in_device.get(dev, 0)
            index_in_device[dev] = k + 1
            cursor = seg_addr
            for addr, bsize, req, aid, sid in placed.get((dev, k), []):
                if addr > cursor:
                    add(dev, seg_addr, cursor, addr - cursor, 0, _INACTIVE, -1, -1)
                add(dev, seg_addr, addr, bsize, req, _ALLOCATED, aid, sid)
                cursor = addr + bsize
            if cursor < seg_addr + seg_size:
                add(dev, seg_addr, cursor, seg_addr + seg_size - cursor, 0, _INACTIVE, -1, -1)
        cols["state"] = text_column(BLOCK_STATES, cols["state"])
        return frame_from_columns(cols, BLOCK_DTYPES)


# ---------------------------------------------------------------------- array helpers
def _gather(values: np.ndarray, index: np.ndarray) -> np.ndarray:
    """``values[index]`` where ``index`` may hold -1 (or ``values`` be empty): those give 0."""
    if not len(values):
        return np.zeros(len(index), dtype=values.dtype)
    return np.where(index >= 0, values[np.maximum(index, 0)], 0)


def _live_blocks(segments: SegmentColumns) -> dict[str, np.ndarray]:
    """Blocks live in the final segments, as int64 columns (in segment order)."""
    live = segments.block_state < _N_LIVE_STATES
    seg = segments.block_segment[live]
    return {"device": segments.device[seg], "addr": segments.block_addr[live], "stream": segments.stream[seg],
            "size_bytes": segments.block_requested[live], "block_size_bytes": segments.block_size[live],
            "stack_id": segments.block_stack[live].astype(np.int64)}


def _scanned_segments(cols: tuple) -> SegmentColumns:
    """``SegmentColumns`` of the compiled scan's bytearrays."""
    (device, addr, size, stream, pool, expandable, _n_blocks), \
        (b_seg, b_addr, b_size, b_requested, b_state, b_stack) = cols
    i64 = lambda raw: np.frombuffer(raw, dtype=np.int64)
    return SegmentColumns(device=i64(device), addr=i64(addr), size=i64(size), stream=i64(stream),
                          pool=np.frombuffer(pool, np.int8), expandable=np.frombuffer(expandable, np.int8).astype(bool),
                          block_segment=i64(b_seg), block_addr=i64(b_addr), block_size=i64(b_size),
                          block_requested=i64(b_requested), block_state=np.frombuffer(b_state, np.int8),
                          block_stack=np.frombuffer(b_stack, np.int32))


def _scanned_device(cols: tuple) -> DeviceEntries:
    """One device's entries from the compiled scan's bytearrays."""
    action, size, stream, addr, t_ns, extra, stack = cols
    i64 = lambda raw: np.frombuffer(raw, dtype=np.int64)
    return DeviceEntries(np.frombuffer(action, np.int8), i64(size), i64(stream), i64(addr), i64(t_ns),
                         np.frombuffer(stack, np.int32), i64(extra))


def _last_request_actions(device: np.ndarray, addr: np.ndarray, action: np.ndarray,
                          position: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Unique (device, addr) keys of request entries with the action of the last one at each."""
    if not len(device):
        e = np.empty(0, np.int64)
        return e, e, e
    order = np.lexsort((position, addr, device))
    d, a = device[order], addr[order]
    last = np.ones(len(order), dtype=bool)
    last[:-1] = (d[1:] != d[:-1]) | (a[1:] != a[:-1])
    return d[last].astype(np.int64), a[last].astype(np.int64), action[order][last].astype(np.int64)


def _declared_initial(live: dict[str, np.ndarray], last_dev: np.ndarray, last_addr: np.ndarray,
                      last_action: np.ndarray, *, has_events: bool) -> tuple[dict[str, np.ndarray], int, int]:
    """Final live blocks never touched in the window (sorted), and the two consistency counts."""
    done = ACTION_NAMES.index("free_completed")
    m = match_keys(last_dev, last_addr, live["device"], live["addr"])
    untouched = m < 0
    contradicted = int(((m >= 0) & (_gather(last_action, m) == done)).sum())
    back = match_keys(live["device"], live["addr"], last_dev, last_addr)
    dangling = int(((last_action != done) & (back < 0)).sum()) if has_events else 0
    sel = {k: v[untouched] for k, v in live.items()}
    order = np.lexsort((sel["block_size_bytes"], sel["size_bytes"], sel["stream"], sel["addr"], sel["device"]))
    declared = {k: v[order] for k, v in sel.items()}
    declared["alloc_id"] = np.arange(len(order), dtype=np.int64)
    return declared, contradicted, dangling


def _segment_entries(device: int, cols: Any) -> list[_Entry]:
    """The segment_* entries of one device as ``_Entry`` (few: the rest stay columns)."""
    first = ACTION_NAMES.index("segment_alloc")
    idx = np.flatnonzero((cols.action >= first) & (cols.action < first + 4))
    return [_Entry(t, device, i, ACTION_NAMES[a], addr, size, stream, -1, f"device {device} entry {i}")
            for i, t, a, addr, size, stream in zip(idx.tolist(), cols.t_ns[idx].tolist(), cols.action[idx].tolist(),
                                                   cols.addr[idx].tolist(), cols.size[idx].tolist(),
                                                   cols.stream[idx].tolist())]


# ---------------------------------------------------------------------- mapped ranges
class _RangeSet:
    """Disjoint mapped ranges ``[start, end)`` with stream and pool, sorted by address (O(log n) each)."""

    def __init__(self) -> None:
        self.ranges: SortedList = SortedList()
        self.by_stream: SortedDict = SortedDict()     # stream -> SortedList of (start, end, pool)

    def copy(self) -> "_RangeSet":
        other = _RangeSet()
        for r in self.ranges:
            other.add_unchecked(*r)
        return other

    def add_unchecked(self, start: int, end: int, stream: int, pool: str) -> None:
        self.ranges.add((start, end, stream, pool))
        self.by_stream.setdefault(stream, SortedList()).add((start, end, pool))

    def _discard(self, r: tuple) -> None:
        self.ranges.remove(r)
        self.by_stream[r[2]].remove((r[0], r[1], r[3]))

    def remove(self, start: int, end: int) -> int:
        """Unmap [start, end); return how many bytes were mapped there."""
        removed = 0
        k = max(0, self.ranges.bisect_left((start,)) - 1)
        hits = []
        while k < len(self.ranges) and self.ranges[k][0] < end:
            r = self.ranges[k]
            if r[1] > start:
                hits.append(r)
            k += 1
        for lo, hi, stream, pool in hits:
            self._discard((lo, hi, stream, pool))
            removed += min(hi, end) - max(lo, start)
            if lo < start:
                self.add_unchecked(lo, start, stream, pool)
            if hi > end:
                self.add_unchecked(end, hi, stream, pool)
        return removed

    def add(self, start: int, end: int, stream: int, pool: str) -> bool:
        """Map [start, end); False (and no change) if it overlaps a mapped range."""
        k = self.ranges.bisect_left((start,))
        if k > 0 and self.ranges[k - 1][1] > start:
            return False
        if k < len(self.ranges) and self.ranges[k][0] < end:
            return False
        self.add_unchecked(start, end, stream, pool)
        return True

    def nearest_pool(self, start: int, end: int, stream: int, final: "_RangeSet") -> str:
        """Pool of a range mapped only before an unmap: that of the nearest range of its stream."""
        for candidates in (self, final):
            lst = candidates.by_stream.get(stream)
            if not lst:
                continue
            k = lst.bisect_left((start,))
            best: tuple[int, int, str] | None = None
            for j in (k - 1, k):
                if 0 <= j < len(lst):
                    lo, hi, pool = lst[j]
                    gap = start - hi if hi <= start else (lo - end if lo >= end else 0)
                    if best is None or (gap, lo) < best[:2]:
                        best = (gap, lo, pool)
            if best is not None:
                return best[2]
        # Expandable pages: 2 MiB in the small pool, 20 MiB in the large one.
        return "large" if (end - start) % (10 * K_SMALL_BUFFER) == 0 else "small"

    def merged(self) -> list[tuple[int, int, int, str]]:
        """Touching ranges of one (stream, pool) merged: snapshots report one segment per mapped run."""
        merged: list[list[Any]] = []
        for start, end, stream, pool in self.ranges:
            if merged and merged[-1][1] == start and merged[-1][2] == stream and merged[-1][3] == pool:
                merged[-1][1] = end
            else:
                merged.append([start, end, stream, pool])
        return [tuple(m) for m in merged]
