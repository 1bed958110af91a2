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

Nothing in the file is trusted: the pickle is loaded by ``safe_pickle`` (no globals), every entry is
type- and range-checked and a bad one raises ``TraceFormatError`` naming ``device D entry I`` (under
``lenient`` it is skipped and listed in ``meta.repairs``). A final state that does not fit the
window is reported in ``meta.notes`` and leaves ``initial_blocks`` empty instead of failing.
"""

from __future__ import annotations

import bisect
import heapq
import os
from typing import Any, NamedTuple

import numpy as np

from ..errors import TraceFormatError
from .builder import MAX_SIZE_BYTES, TraceBuilder
from .recorded import infer_from_snapshot
from .safe_pickle import DEFAULT_MAX_BYTES, loads_data, read_bounded, short_repr
from .schema import BLOCK_DTYPES, SEGMENT_DTYPES, Trace, check_schema, frame_from_columns

FORMAT = "pytorch-snapshot"

#: PyTorch CUDACachingAllocator constants (c10/cuda/CUDACachingAllocator.cpp).
K_MIN_BLOCK_SIZE = 512
K_SMALL_BUFFER = 2 * 1024 * 1024

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
_SETTINGS_MAX_DEPTH = 8
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


class _Block(NamedTuple):
    addr: int
    size: int
    requested: int
    state: str


class _Segment(NamedTuple):
    device: int
    addr: int
    size: int
    stream: int
    pool: str
    expandable: bool
    blocks: list


class _Skip(Exception):
    """An entry that lenient mode drops (the repair has already been recorded)."""


def read_snapshot(path: str | os.PathLike, *, lenient: bool = False,
                  max_bytes: int = DEFAULT_MAX_BYTES) -> Trace:
    """Read a PyTorch memory snapshot pickle (plain or gzip) into a ``Trace``.

    Raises ``UnsafePickleError`` for pickles that reference code and ``TraceFormatError`` (naming the
    file, the record such as ``device 0 entry 17`` and the reason) for anything malformed. With
    ``lenient=True`` malformed entries are skipped and listed in ``trace.meta.repairs``.
    """
    path = os.fspath(path)
    raw = read_bounded(path, max_bytes=max_bytes)
    data = loads_data(raw, path)
    return _SnapshotReader(path, lenient, budget=len(raw)).read(data)


class _SnapshotReader:
    def __init__(self, path: str, lenient: bool, budget: int):
        self.path = path
        self.lenient = lenient
        # Every list element costs at least one pickle byte unless lists are shared through the
        # memo; more elements than bytes means repeated lists (a CPU bomb), never a real snapshot.
        self.budget = budget
        self.b = TraceBuilder(path, FORMAT, lenient=lenient)
        self.notes = self.b.meta.notes
        self.consistent = True  # False once the start-state reconstruction hit a contradiction

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

    # ------------------------------------------------------------------ top level
    def read(self, data: Any) -> Trace:
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

        segments = self._parse_segments(raw_segments)
        traces = self._parse_traces(raw_traces)

        # Version fingerprint: which optional keys appear anywhere.
        for key in _TOP_HINTS:
            hints[key] = isinstance(data, dict) and key in data
        for key in _SEGMENT_HINTS:
            hints[key] = any(isinstance(s, dict) and key in s for s in raw_segments)
        for key in _ENTRY_HINTS:
            hints[key] = any(isinstance(e, dict) and key in e
                             for tr in raw_traces if isinstance(tr, list) for e in tr)
        b.meta.version_hints = hints
        if isinstance(data, dict) and isinstance(data.get("allocator_settings"), dict):
            b.meta.allocator_settings = self._plain(data["allocator_settings"])

        devices = {s.device for s in segments} | {d for d, tr in enumerate(traces) if tr}
        b.meta.devices = sorted(devices)

        self._declare_initial_allocs(segments, traces)
        self._feed(traces)
        initial_segments = self._initial_segments(segments, traces)
        trace = b.finish(initial_segments=self._segments_frame(initial_segments))
        self._fix_orphan_block_sizes(trace, segments, traces)
        blocks = self._initial_blocks(trace, initial_segments)
        trace.initial_blocks = blocks
        infer_from_snapshot(trace)
        check_schema(trace)
        return trace

    def _plain(self, value: Any) -> Any:
        """Copy ``value`` as JSON-able plain data, bounded in size and depth."""
        budget = [_SETTINGS_MAX_NODES]

        def conv(v: Any, depth: int) -> Any:
            budget[0] -= 1
            if budget[0] < 0 or depth > _SETTINGS_MAX_DEPTH:
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
            self.notes.append("allocator_settings too large or deeply nested; not copied")
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

    def _parse_segments(self, raw_segments: list) -> list[_Segment]:
        out: list[_Segment] = []
        self._spend("top level", len(raw_segments))
        for i, seg in enumerate(raw_segments):
            record = f"segment {i}"
            try:
                out.append(self._parse_segment(record, seg))
            except _Skip:
                continue
        return out

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
            if "requested_size" in blk:
                requested = self._check_int(brec, blk, "requested_size")
                self._check_size(brec, requested)
            else:
                requested = bsize
            blocks.append(_Block(baddr, bsize, requested, state))
            offset = baddr + bsize
        return _Segment(device, addr, size, stream, pool, expandable, blocks)

    def _parse_traces(self, raw_traces: list) -> list[list[_Entry]]:
        traces: list[list[_Entry]] = []
        if len(raw_traces) > 32768:
            raise self.b.fail("top level", f"{len(raw_traces)} device traces (at most 32768 devices)")
        self._spend("top level", len(raw_traces))
        self._spend("top level", sum(len(tr) for tr in raw_traces if isinstance(tr, list)))
        has_time = any(isinstance(e, dict) and "time_us" in e
                       for tr in raw_traces if isinstance(tr, list) for e in tr)
        if not has_time and any(isinstance(tr, list) and tr for tr in raw_traces):
            self.b.meta.time_synthesized = True
            self.notes.append(f"no time_us in this snapshot (PyTorch < 2.2): times are synthesised, "
                              f"{SYNTHETIC_STEP_NS} ns per entry of each device; devices are "
                              "interleaved round-robin, each keeping its recorded order")
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
        return _Entry(t_ns, device, i, action, addr, size, stream, extra, record)

    # ------------------------------------------------------------------ initial allocations
    def _declare_initial_allocs(self, segments: list[_Segment], traces: list[list[_Entry]]) -> None:
        """Declare final live blocks the window never touches: they were allocated before it."""
        last: dict[tuple[int, int], str] = {}
        for entries in traces:
            for e in entries:
                if e.action in _REQUESTS:
                    last[(e.device, e.addr)] = e.action
        final_live: set[tuple[int, int]] = set()
        declared: list[tuple[int, int, int, int, int]] = []
        contradicted = 0
        for seg in segments:
            for blk in seg.blocks:
                if blk.state not in _LIVE_STATES:
                    continue
                key = (seg.device, blk.addr)
                final_live.add(key)
                action = last.get(key)
                if action is None:
                    declared.append((seg.device, blk.addr, seg.stream, blk.requested, blk.size))
                elif action == "free_completed":
                    contradicted += 1
        if contradicted:
            self._inconsistent(f"{contradicted} blocks live in the final segments were freed at the "
                               "end of the trace")
        dangling = sum(1 for key, action in last.items() if action != "free_completed"
                       and key not in final_live)
        if dangling and traces and any(traces):
            self._inconsistent(f"{dangling} allocations live at the end of the trace are not in the "
                               "final segments")
        for device, addr, stream, requested, block_size in sorted(declared):
            self.b.initial_alloc(device, stream, addr, size_bytes=requested, block_size_bytes=block_size)
        if declared:
            self.notes.append(f"{len(declared)} blocks live in the final segments were allocated "
                              "before the trace began; they are in the initial state")

    def _fix_orphan_block_sizes(self, trace: Trace, segments: list[_Segment],
                                traces: list[list[_Entry]]) -> None:
        """Give orphan-free initial allocations a block size (the builder leaves -1)."""
        ia = trace.initial_allocs
        block = ia["block_size_bytes"].to_numpy().copy()
        todo = np.flatnonzero(block < 0)
        if not len(todo):
            return
        final_live = {(seg.device, blk.addr): blk.size for seg in segments for blk in seg.blocks
                      if blk.state in _LIVE_STATES}
        allocated_in_window = {(e.device, e.addr) for tr in traces for e in tr if e.action == "alloc"}
        sizes = ia["size_bytes"].to_numpy()
        devices = ia["device"].to_numpy()
        addrs = ia["addr"].to_numpy()
        rounded = 0
        for row in todo:
            key = (int(devices[row]), int(addrs[row]))
            if key in final_live and key not in allocated_in_window:
                block[row] = final_live[key]      # still pending-free at the end: exact size
            else:
                block[row] = round_size(int(sizes[row]))
                rounded += 1
        trace.initial_allocs["block_size_bytes"] = block
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
                b.alloc(e.record, e.t_ns, e.device, e.stream, e.addr, e.size, record_decision=True)
            elif action == "free_requested":
                b.free_requested(e.record, e.t_ns, e.device, e.stream, e.addr, e.size,
                                 record_decision=True)
            elif action == "free_completed":
                b.free_completed(e.record, e.t_ns, e.device, e.stream, e.addr, e.size,
                                 record_decision=True)
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
                               device_free_bytes=e.extra)
                else:
                    b.decision(b.next_event_index, t_ns, action, e.addr, e.size, e.stream, e.device)

    # ------------------------------------------------------------------ initial segments
    def _initial_segments(self, segments: list[_Segment],
                          traces: list[list[_Entry]]) -> list[tuple[int, int, int, int, str, bool]]:
        """Walk the final segments back through the window's segment events to its start."""
        devices = sorted({s.device for s in segments} | {d for d, tr in enumerate(traces) if tr})
        out: list[tuple[int, int, int, int, str, bool]] = []
        for device in devices:
            fixed: dict[int, tuple[int, int, str]] = {}
            ranges: list[list[Any]] = []   # sorted [start, end, stream, pool]
            for seg in segments:
                if seg.device != device:
                    continue
                if seg.expandable:
                    ranges.append([seg.addr, seg.addr + seg.size, seg.stream, seg.pool])
                elif seg.addr in fixed:
                    self._inconsistent(f"device {device}: two final segments at {seg.addr:#x}")
                else:
                    fixed[seg.addr] = (seg.size, seg.stream, seg.pool)
            ranges.sort()
            final_pools = [(r[0], r[1], r[2], r[3]) for r in ranges]
            events = traces[device] if device < len(traces) else []
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
                    if e.size and _remove_range(ranges, e.addr, e.addr + e.size) != e.size:
                        problems.append(f"{e.record}: segment_map of [{e.addr:#x}, +{e.size}) is not "
                                        "mapped later")
                elif a == "segment_unmap" and e.size:
                    pool = _guess_pool(ranges, final_pools, e.addr, e.addr + e.size, e.stream)
                    if not _add_range(ranges, e.addr, e.addr + e.size, e.stream, pool):
                        problems.append(f"{e.record}: segment_unmap of [{e.addr:#x}, +{e.size}) "
                                        "overlaps memory mapped later")
            if problems:
                more = f" (and {len(problems) - _MAX_NOTED} more)" if len(problems) > _MAX_NOTED else ""
                self._inconsistent(f"device {device}: " + "; ".join(problems[:_MAX_NOTED]) + more)
            for addr in sorted(fixed):
                size, stream, pool = fixed[addr]
                out.append((device, addr, size, stream, pool, False))
            for start, end, stream, pool in _merge_ranges(ranges):
                out.append((device, start, end - start, stream, pool, True))
        out.sort(key=lambda s: (s[0], s[1]))
        return out

    @staticmethod
    def _segments_frame(segs: list[tuple[int, int, int, int, str, bool]]):
        cols = {name: [s[i] for s in segs] for i, name in enumerate(SEGMENT_DTYPES)}
        return frame_from_columns(cols, SEGMENT_DTYPES)

    # ------------------------------------------------------------------ initial blocks
    def _initial_blocks(self, trace: Trace, segs: list[tuple[int, int, int, int, str, bool]]):
        cols: dict[str, list[Any]] = {name: [] for name in BLOCK_DTYPES}
        empty = frame_from_columns(cols, BLOCK_DTYPES)
        if not self.consistent:
            self.notes.append("initial_blocks left empty because the start state is inconsistent")
            return empty
        ia = trace.initial_allocs
        allocs: dict[int, list[tuple[int, int, int, int]]] = {}
        for dev, addr, bsize, req, aid in zip(ia["device"].to_numpy().tolist(), ia["addr"].to_numpy().tolist(),
                                              ia["block_size_bytes"].to_numpy().tolist(),
                                              ia["size_bytes"].to_numpy().tolist(),
                                              ia["alloc_id"].to_numpy().tolist()):
            allocs.setdefault(dev, []).append((addr, bsize, req, aid))
        seg_by_dev: dict[int, list[tuple[int, int]]] = {}
        for dev, addr, size, _stream, _pool, _exp in segs:
            seg_by_dev.setdefault(dev, []).append((addr, size))
        failures: list[str] = []
        placed: dict[tuple[int, int], list[tuple[int, int, int, int]]] = {}
        for dev, items in allocs.items():
            items.sort()
            dsegs = seg_by_dev.get(dev, [])
            starts = [s[0] for s in dsegs]
            prev_end = -1
            for addr, bsize, req, aid in items:
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
                placed.setdefault((dev, dsegs[k][0]), []).append((addr, bsize, req, aid))
        if failures:
            more = f" (and {len(failures) - _MAX_NOTED} more)" if len(failures) > _MAX_NOTED else ""
            self._inconsistent("; ".join(failures[:_MAX_NOTED]) + more)
            self.notes.append("initial_blocks left empty because the start state is inconsistent")
            return empty

        def add(dev: int, seg_addr: int, addr: int, size: int, req: int, state: str, aid: int) -> None:
            cols["device"].append(dev)
            cols["segment_addr"].append(seg_addr)
            cols["addr"].append(addr)
            cols["size_bytes"].append(size)
            cols["requested_bytes"].append(req)
            cols["state"].append(state)
            cols["alloc_id"].append(aid)

        for dev, seg_addr, seg_size, _stream, _pool, _exp in segs:
            cursor = seg_addr
            for addr, bsize, req, aid in placed.get((dev, seg_addr), []):
                if addr > cursor:
                    add(dev, seg_addr, cursor, addr - cursor, 0, "inactive", -1)
                add(dev, seg_addr, addr, bsize, req, "active_allocated", aid)
                cursor = addr + bsize
            if cursor < seg_addr + seg_size:
                add(dev, seg_addr, cursor, seg_addr + seg_size - cursor, 0, "inactive", -1)
        return frame_from_columns(cols, BLOCK_DTYPES)


# ---------------------------------------------------------------------- mapped-range helpers
def _remove_range(ranges: list[list[Any]], start: int, end: int) -> int:
    """Unmap [start, end) from the sorted range list; return how many bytes were mapped there."""
    removed = 0
    out: list[list[Any]] = []
    for r in ranges:
        lo, hi = r[0], r[1]
        if hi <= start or lo >= end:
            out.append(r)
            continue
        removed += min(hi, end) - max(lo, start)
        if lo < start:
            out.append([lo, start, r[2], r[3]])
        if hi > end:
            out.append([end, hi, r[2], r[3]])
    ranges[:] = out
    return removed


def _add_range(ranges: list[list[Any]], start: int, end: int, stream: int, pool: str) -> bool:
    """Map [start, end) into the sorted range list; False (and no change) if it overlaps."""
    k = bisect.bisect_left(ranges, [start])
    if k > 0 and ranges[k - 1][1] > start:
        return False
    if k < len(ranges) and ranges[k][0] < end:
        return False
    ranges.insert(k, [start, end, stream, pool])
    return True


def _guess_pool(ranges: list[list[Any]], final_ranges: list[tuple[int, int, int, str]],
                start: int, end: int, stream: int) -> str:
    """Pool of a range mapped only before the window's unmap: that of the nearest range of its stream."""
    best: tuple[int, str] | None = None
    for candidates in (ranges, final_ranges):
        for r in candidates:
            if r[2] != stream:
                continue
            gap = start - r[1] if r[1] <= start else (r[0] - end if r[0] >= end else 0)
            if best is None or gap < best[0]:
                best = (gap, r[3])
        if best is not None:
            return best[1]
    # Expandable pages: 2 MiB in the small pool, 20 MiB in the large one.
    return "large" if (end - start) % (10 * K_SMALL_BUFFER) == 0 else "small"


def _merge_ranges(ranges: list[list[Any]]) -> list[tuple[int, int, int, str]]:
    """Merge touching ranges of one (stream, pool): snapshots report one segment per mapped run."""
    merged: list[list[Any]] = []
    for start, end, stream, pool in ranges:
        if merged and merged[-1][1] == start and merged[-1][2] == stream and merged[-1][3] == pool:
            merged[-1][1] = end
        else:
            merged.append([start, end, stream, pool])
    return [tuple(m) for m in merged]
