"""torch.profiler / Kineto Chrome-trace JSON (``.json`` or gzip ``.json.gz``): its ``[memory]`` events.

Start with ``read_kineto(path)``. What is read:

* ``[memory]`` instant events (``args``: ``Addr``, ``Bytes``, ``Total Allocated``, ``Total Reserved``,
  ``Device Type``, ``Device Id``). ``Bytes > 0`` is an allocation of that many bytes (the allocator's
  block size, not the requested size), ``Bytes < 0`` frees the block at ``Addr`` (requested and
  completed at the same instant), ``Bytes == 0`` carries nothing and is skipped (counted in a note).
* ``[OutOfMemory]`` events become ``decisions`` rows with action ``"oom"`` and ``size_bytes = Bytes``.
* ``ProfilerStep#N`` duration events (``ph == "X"``, not the GPU-side copies) become markers at their
  start, labelled with their name.

Times: ``ts`` is in microseconds (an int, a float, or a decimal string such as
``"1724696104648464.123"``); it is converted to integer nanoseconds exactly (float literals are kept
as their decimal text, never rounded through binary floating point; digits below 1 ns are rounded
half-even). Chrome traces need not be sorted: events are fed in (ts, position in file) order.

Devices: a trace may mix devices. ``device`` is GPU device N -> N (CUDA, Device Type 1, and ROCm
builds' HIP, Device Type 6), CPU -> -1, any other device type T with index I ->
``-(256 * T + I + 1)`` (so never -1 or >= 0). Kineto records no stream: every event has stream 0.
Markers carry the lowest GPU device of the trace, else CPU (-1). The mapping, the device types
seen, and a per-device ``Total Allocated`` cross-check go to ``meta.version_hints``.

Recorded totals: ``Total Allocated`` / ``Total Reserved`` after each ``[memory]`` event are kept in
``Trace.recorded_series`` (with the index of the event they follow), and each GPU device's peaks,
first and last reserved bytes are stored as a ``RecordedRun`` (``allocsim.trace.inference.recorded``).

Frames: Kineto records no allocation stacks. Each ``[memory]`` event gets pseudo-frames: the CPU
ops (``cpu_op``, ``user_annotation``; filename "" and line 0, name = the op name) and Python
functions (``python_function``, recorded with ``with_stack``: file and line from their name) that
contain it in time on its thread, innermost first, so memory can be attributed by operator.

The 2021 format (``[memory]`` events without ``Addr``) is refused: frees cannot be matched to
allocations without it. Frees of blocks allocated before profiling began become initial-state
allocations of ``|Bytes|``. The rest of what a GPU device held when recording began (``Total
Allocated`` minus ``Bytes`` at its first event, less those orphan frees) becomes one more initial
allocation, never freed (a note names it), so peaks and lower bounds count the memory the window
never touches. ``Total Reserved`` at the first event is laid out as ``initial_segments`` /
``initial_blocks`` from the addresses the window uses (``layout``: the cache the real
allocator held, free blocks included), so a ``pytorch`` replay starts where the real one did. A
profile with no ``[memory]`` event (recorded without ``profile_memory=True``) is refused.

Decoding: on the compiled route (``allocsim.trace.reading.compiled``) a strict JSON scanner in C reads the
[memory] events into columns and keeps only the ops that can frame them; the reference route uses
``msgspec`` (only the events the reader keeps are converted; see ``fast``), falling back to
the standard library for anything unusual, which names the problem. Both share the columnar back
half (``_finish``); the compiled scanner hands back any document it does not model. Under a
process memory limit (``ulimit -v``, a cgroup; ``reading.headroom``) both routes size their work
from what the process may still take and refuse a file over it with one line naming the limit.

Bad input (not JSON, corrupt gzip, no ``traceEvents``, a memory event without a numeric integer
``Addr``/``Bytes``, an absurd size) raises ``TraceFormatError`` naming the file, the record
(``traceEvents[1234]``) and the reason; with ``lenient=True`` bad events are skipped (and the
builder repairs double frees and size mismatches), each listed in ``meta.repairs``.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from ....errors import TraceFormatError, quote
from ...inference.device_props import recorded_devices
from ...reading import compiled
from ...reading.builder import MAX_SIZE_BYTES, TraceBuilder
from ...reading.json_numbers import INT64_MAX, INT64_MIN, as_int, ts_to_ns
from ...reading.headroom import headroom, over_room
from ...reading.limits import DEFAULT_LIMITS, Limits, LimitExceeded, check_count, read_bytes
from ...reading.running_total import running_total_notes, settle_running_total
from ...reading.timeline import MEM, STEP, OpColumns, Rec, RecColumns, Threads, feed_records, op_frames
from ...schema import (
    BLOCK_DTYPES,
    FRAME_DTYPES,
    INITIAL_ALLOC_DTYPES,
    RECORDED_SERIES_DTYPES,
    SEGMENT_DTYPES,
    STACK_DTYPES,
    Trace,
    check_schema,
    table_from_columns,
)
from ...table import Table

MEMORY_EVENT = "[memory]"
OOM_EVENT = "[OutOfMemory]"
STEP_PREFIX = "ProfilerStep#"

#: c10::DeviceType values (c10/core/DeviceType.h) for readable notes; others are shown by number.
DEVICE_TYPE_NAMES = {
    0: "CPU", 1: "CUDA", 2: "MKLDNN", 3: "OPENGL", 4: "OPENCL", 5: "IDEEP", 6: "HIP", 7: "FPGA",
    8: "MAIA", 9: "XLA", 10: "Vulkan", 11: "Metal", 12: "XPU", 13: "MPS", 14: "Meta", 15: "HPU",
    16: "VE", 17: "Lazy", 18: "IPU", 19: "MTIA", 20: "PrivateUse1",
}
CPU, CUDA, HIP = 0, 1, 6
#: Ops whose time span encloses a [memory] event give it pseudo-frames.
OP_CATEGORIES = frozenset({"cpu_op", "python_function", "user_annotation", "operator"})
_OP_CATS = frozenset(OP_CATEGORIES | {"Operator", "CPU_OP", "Python_Function"})
#: 'Addr' in [memory] events: added by pytorch/pytorch#61282 (July 2021), so first released in
#: PyTorch 1.10 (inferred from the merge date; 1.9 was cut before it).
ADDR_SINCE = "1.10"
_DROPPED = object()  # stands in for events we never look at, to keep memory low while parsing


def device_id(device_type: int, device_index: int) -> int:
    """Map a (c10 device type, index) pair to the trace's int16 device id (see module doc)."""
    if device_type == CUDA or device_type == HIP:
        return device_index
    if device_type == CPU:
        return -1
    return -(256 * device_type + device_index + 1)


# --------------------------------------------------------------------------- loading
def _object_hook(obj: dict) -> Any:
    # Drop every trace event we will not use as soon as it is parsed (kernels, metadata...).
    if "ph" in obj and "name" in obj:
        name = obj["name"]
        if name != MEMORY_EVENT and name != OOM_EVENT and not (
                isinstance(name, str) and name.startswith(STEP_PREFIX)) and not _is_op(obj.get("ph"), obj.get("cat")):
            return _DROPPED
    return obj


def _is_op(ph: Any, cat: Any) -> bool:
    return ph == "X" and isinstance(cat, str) and cat.lower() in OP_CATEGORIES


def _load_json(path: str, data: bytes) -> Any:
    try:
        # Float literals stay text so that ts converts to ns exactly; NaN/Infinity stay text (rejected later).
        return json.loads(data, object_hook=_object_hook, parse_float=str, parse_constant=str)
    except RecursionError:
        raise TraceFormatError(path, None, "not JSON: nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, int digit limit
        raise TraceFormatError(path, None, f"not JSON: {quote(str(exc))}") from None


# --------------------------------------------------------------------------- reader
def _typed_memory_rec(a: Any, t_ns: int | None) -> Rec | None:
    """A ``Rec`` from typed args when every value is in range; None sends the event to the checked path."""
    if t_ns is None or not INT64_MIN <= t_ns <= INT64_MAX or abs(a.nbytes) > MAX_SIZE_BYTES:
        return None
    dtype, dindex, addr = a.device_type, a.device_index, a.addr
    if not INT64_MIN <= addr <= (1 << 64) - 1 or not 0 <= dtype <= 100:
        return None
    if dtype == CPU:
        dindex = -1
    elif not (-1 <= dindex <= 254) or (dtype in (CUDA, HIP) and dindex < 0):
        return None
    if addr > INT64_MAX:
        addr -= 1 << 64
    total, reserved = a.total_allocated, a.total_reserved
    if total is not None and not 0 <= total <= INT64_MAX:
        total = None
    if reserved is not None and not 0 <= reserved <= INT64_MAX:
        reserved = None
    rec = Rec(t_ns, 0, "mem", device_id(dtype, dindex), addr, a.nbytes, total, total_reserved=reserved)
    rec.label_type, rec.label_index = dtype, dindex
    return rec


def _ops_spanning(op_events: list, mem_t_ns: list[int]) -> list:
    """The ops whose span may hold a [memory] event (a float first look, 1 us of margin): only
    those need exact times. Ops that run and end between two memory events can hold none."""
    from .fast import float_array

    if not op_events or not mem_t_ns:
        return []
    mem_us = np.sort(np.asarray(mem_t_ns, dtype=np.float64) / 1000.0)
    start = float_array([e.ts for e in op_events])
    end = start + float_array([e.dur for e in op_events])
    nxt = np.searchsorted(mem_us, start - 1.0)
    keep = ~(np.isfinite(start) & np.isfinite(end))          # odd values: let the exact parser judge
    inside = nxt < len(mem_us)
    keep |= inside & (mem_us[np.minimum(nxt, len(mem_us) - 1)] <= end + 1.0)
    return [op_events[i] for i in np.flatnonzero(keep).tolist()]


def _refuse_without_addr(path: str, selected: list) -> None:
    """The 2021 format (no ``Addr`` in any [memory] event) cannot be replayed: one line says why."""
    memory = [ev for _, ev in selected if isinstance(ev, dict) and ev.get("name") == MEMORY_EVENT
              and isinstance(ev.get("args"), dict)]
    if not memory or any(isinstance(ev, Rec) for _, ev in selected):
        return
    if any("Addr" in ev["args"] for ev in memory):
        return
    if not any("Bytes" in ev["args"] for ev in memory):
        fields = sorted({str(k)[:40] for ev in memory[:100] for k in ev["args"]})[:8]
        raise TraceFormatError(
            path, None, f"its {len(memory):,} [memory] events carry args {', '.join(fields) or '(none)'}: neither "
            "PyTorch's Kineto fields (Addr, Bytes) nor PaddlePaddle's (addr, increase_bytes); a profiler allocsim "
            "does not read")
    raise TraceFormatError(
        path, None, f"its {len(memory):,} [memory] events carry no 'Addr' (the 2021 Kineto format), so frees "
        f"cannot be matched to allocations; 'Addr' is recorded since PyTorch {ADDR_SINCE}: record the "
        "trace again with a newer PyTorch")


def _refuse_without_memory(path: str, cols: "RecColumns", state: "_ReadState", top_keys: Any) -> None:
    """A profile with no [memory] event has nothing to replay: one line says how to record memory."""
    if np.any(cols.kind != STEP) or state.skipped_zero:
        return
    flag = top_keys.get("profile_memory") if isinstance(top_keys, dict) else None
    said = f" (its profile_memory is {quote(flag)})" if flag is not None else ""
    raise TraceFormatError(
        path, None, f"no [memory] events{said}: the profile was recorded without memory profiling; record it "
        "again with torch.profiler.profile(profile_memory=True) to replay its allocations")


def _thread_key(ev: Any) -> str:
    pid, tid = ev.get("pid"), ev.get("tid")
    return f"{str(pid)[:40]}\x00{str(tid)[:40]}"


def _selected_events(events: list, limits: Limits):
    """(pos, event dict) of the events the reader uses, and the CPU ops as (thread, start, end, name)."""
    from .fast import Event, memory_args, ns_list, raw_args, raw_value

    selected: list[tuple[int, Any]] = []
    ops: list[tuple[str, int, int, str]] = []
    if events and isinstance(events[0], Event):
        names = [e.name for e in events]
        wanted = [i for i, n in enumerate(names) if n == MEMORY_EVENT or n == OOM_EVENT or (
            type(n) is str and n.startswith(STEP_PREFIX))]
        mem = [i for i in wanted if names[i] == MEMORY_EVENT]
        mem_ts = dict(zip(mem, ns_list([events[i].ts for i in mem])))
        for pos in wanted:
            e = events[pos]
            if pos in mem_ts:
                typed = memory_args(e.args)
                rec = _typed_memory_rec(typed, mem_ts[pos]) if typed is not None else None
                if rec is not None:
                    rec.pos = pos
                    rec.thread = f"{str(e.pid)[:40]}\x00{str(e.tid)[:40]}"
                    selected.append((pos, rec))
                    continue
            args = raw_args(e.args)
            if isinstance(args, dict):
                args = {k: (repr(v) if isinstance(v, float) else v) for k, v in args.items()}
            selected.append((pos, {"name": e.name, "ph": e.ph, "cat": e.cat, "ts": raw_value(e.ts),
                                   "args": args, "pid": e.pid, "tid": e.tid}))
        threads = {ev.thread if isinstance(ev, Rec) else _thread_key(ev) for _, ev in selected}
        op_events = [e for e in events if e.ph == "X" and e.cat in _OP_CATS and type(e.name) is str
                     and f"{str(e.pid)[:40]}\x00{str(e.tid)[:40]}" in threads]
        op_events = _ops_spanning(op_events, [t for t in mem_ts.values() if t is not None])
        starts, durs = ns_list([e.ts for e in op_events]), ns_list([e.dur for e in op_events])
        for e, start, dur in zip(op_events, starts, durs):
            if start is not None and dur is not None and dur >= 0 and len(e.name) <= limits.string_chars:
                ops.append((f"{str(e.pid)[:40]}\x00{str(e.tid)[:40]}", start, start + dur, e.name))
        return selected, ops
    for pos, ev in enumerate(events):
        if ev is _DROPPED:
            continue
        selected.append((pos, ev))
        if isinstance(ev, dict) and _is_op(ev.get("ph"), ev.get("cat")) and isinstance(ev.get("name"), str):
            start, dur = ts_to_ns(ev.get("ts")), ts_to_ns(ev.get("dur"))
            if start is not None and dur is not None and dur >= 0 and len(ev["name"]) <= limits.string_chars:
                ops.append((_thread_key(ev), start, start + dur, ev["name"]))
    return selected, ops


def read_kineto(path, *, lenient: bool = False, limits: Limits | None = None) -> Trace:
    """Read a torch.profiler / Kineto Chrome trace's memory events into a ``Trace`` (see module doc)."""
    path = str(path)
    limits = limits or DEFAULT_LIMITS
    data = read_bytes(path, limits)
    if not data.strip():
        raise TraceFormatError(path, None, "empty file")
    return read_kineto_data(path, data, lenient=lenient, limits=limits)


def read_kineto_data(path: str, data: bytes, *, lenient: bool = False, limits: Limits | None = None) -> Trace:
    """``read_kineto`` on the file's (decompressed) bytes, already read."""
    limits = limits or DEFAULT_LIMITS
    try:
        if compiled.active():
            scan = _scan(path, data, limits)
            if scan is not None:
                return _read_scanned(path, data, scan, lenient, limits)
        return _read_decoded(path, data, lenient, limits)
    except MemoryError:
        room = headroom()
        if room is None:
            raise
        raise over_room(path, room) from None      # under a process limit: name it, on either route


#: Reading a Kineto file after the scan (the columns, the trace, its frames) takes five to six
#: times what the scan held at its peak (measured: 2M and 4M [memory] events, 120 and 240 MiB
#: scans, 5.3x and 5.9x more address space): under a process limit the scan gets an eighth.
_SCAN_SHARE_OF_HEADROOM = 8


def _scan(path: str, data: bytes, limits: Limits) -> dict | None:
    """The compiled scan's columns, or None when the reference route must read the file.

    The scan's budget is ``limits.memory_bytes`` or, under a tighter process limit (``ulimit -v``,
    a cgroup), an eighth of what the process may still take. A file over a budget set by the
    process limit is refused at once, naming that limit: the reference route needs more still.
    """
    room = headroom()
    budget = limits.memory_bytes
    from_room = room is not None and room.bytes // _SCAN_SHARE_OF_HEADROOM < budget
    if from_room:
        budget = room.bytes // _SCAN_SHARE_OF_HEADROOM
    scan = compiled.ext.chrome_scan(data, budget, limits.depth, limits.events)
    if isinstance(scan, int):
        if from_room:
            raise over_room(path, room)
        return None        # over memory_bytes: the reference route decides
    return scan


def _read_decoded(path: str, data: bytes, lenient: bool, limits: Limits) -> Trace:
    """The reference route: the document decoded (msgspec, else the standard library), then read."""
    from ...reading.json_depth import max_nesting
    from .fast import decode_events, recorded_torch

    depth = max_nesting(data)
    if depth > limits.depth:
        raise LimitExceeded(path, None, "depth", limits.depth, f"JSON nested {depth:,} levels deep")
    fast = decode_events(data)
    if fast is not None:
        events, top_keys, is_object = fast
        where = "traceEvents[{}]" if is_object else "[{}]"
    else:
        doc = _load_json(path, data)
        if isinstance(doc, dict):
            if "traceEvents" not in doc:
                raise TraceFormatError(path, None, "no 'traceEvents' key: not a Chrome trace")
            events = doc["traceEvents"]
            where = "traceEvents[{}]"
            top_keys = doc
            torch_version = recorded_torch(doc.get("metadata"))
            if torch_version:
                top_keys = {**doc, "torch": torch_version}
        elif isinstance(doc, list):
            events, where, top_keys = doc, "[{}]", {}
        else:
            raise TraceFormatError(path, None, f"top level is a JSON {type(doc).__name__}, not an object or list")
        if not isinstance(events, list):
            raise TraceFormatError(path, "traceEvents", f"is a {type(events).__name__}, not a list")
    del data
    check_count(path, "events", len(events), limits, "trace events", "traceEvents")
    _refuse_over_room(path, events)
    selected, ops = _selected_events(events, limits)
    n_objects = sum(1 for e in events if e is not _DROPPED and not isinstance(e, dict)) if fast is None else 0
    del events

    builder = TraceBuilder(path, "kineto", lenient=lenient)
    state = _ReadState(n_objects)
    _refuse_without_addr(path, selected)
    for pos, ev in selected:
        if isinstance(ev, Rec):     # a well-formed [memory] event, already parsed
            state.device_types.setdefault(ev.label_type, set()).add(ev.label_index)
            ev.label_type = ev.label_index = None
            if ev.nbytes == 0:
                state.skipped_zero += 1
                continue
            state.recs.append(ev)
            continue
        _read_event(builder, state, pos, ev, where, limits)
    del selected
    threads = Threads()
    cols = RecColumns.of(state.recs, threads)
    op_cols = OpColumns.of(ops, threads)
    return _finish(path, builder, state, cols, op_cols, threads.names, top_keys, where, limits)


#: Address space the reference route takes per [memory] event once the document is decoded (its
#: records, columns and trace; measured: 1.1 KB at 400k and 800k events): a lower bound on its need.
_REFERENCE_BYTES_PER_MEMORY_EVENT = 1024


def _refuse_over_room(path: str, events: list) -> None:
    """Refuse at once, naming the process's memory limit, a decoded document whose [memory] events
    need more than that limit leaves (reading them would fail after minutes)."""
    from .fast import Event

    room = headroom()
    if room is None:
        return
    n_memory = sum(1 for e in events if (e.name if isinstance(e, Event) else
                                         e.get("name") if isinstance(e, dict) else None) == MEMORY_EVENT)
    if n_memory * _REFERENCE_BYTES_PER_MEMORY_EVENT > room.bytes:
        raise over_room(path, room)


class _ReadState:
    """What reading the selected events gathers besides the records: device types and counts."""

    def __init__(self, not_objects: int = 0):
        self.recs: list[Rec] = []
        self.device_types: dict[int, set[int]] = {}
        self.skipped_zero = 0
        self.not_objects = not_objects
        self.step_seen: set[str] = set()
        self.duplicate_steps = 0


def _read_event(builder: TraceBuilder, state: _ReadState, pos: int, ev: Any, where: str, limits: Limits) -> None:
    """One selected event that is not an already-typed [memory] record: checked [memory] / OOM, or a step."""
    if not isinstance(ev, dict):
        return
    name = ev.get("name")
    record = where.format(pos)
    if name == MEMORY_EVENT or name == OOM_EVENT:
        rec = _parse_memory(builder, record, ev, name == OOM_EVENT, state.device_types)
        if rec is None:
            return
        if rec.kind == "mem" and rec.nbytes == 0:
            state.skipped_zero += 1
            return
        rec.pos = pos
        rec.thread = _thread_key(ev)
        state.recs.append(rec)
    elif isinstance(name, str) and name.startswith(STEP_PREFIX) and ev.get("ph") == "X":
        cat = ev.get("cat")
        if isinstance(cat, str) and "gpu" in cat.lower():
            return  # the GPU-timeline copy of the same step annotation
        t_ns = ts_to_ns(ev.get("ts"))
        if t_ns is None or not INT64_MIN <= t_ns <= INT64_MAX:
            builder.problem(record, f"step marker {quote(name)} has no numeric ts ({quote(ev.get('ts'))})",
                            "skipped the marker")
            return
        if name in state.step_seen:
            state.duplicate_steps += 1
            return
        if len(name) > limits.string_chars:
            raise LimitExceeded(builder.path, record, "string_chars", limits.string_chars,
                                f"a step name of {len(name):,} characters")
        state.step_seen.add(name)
        state.recs.append(Rec(t_ns, pos, "step", label=name))


def _read_scanned(path: str, data: bytes, scan: dict, lenient: bool, limits: Limits) -> Trace:
    """The compiled route: the scan's [memory] columns as they are, the few other events as the
    reference reads them, then the same back half (``_finish``)."""
    from .fast import raw_args, raw_value

    where = "traceEvents[{}]" if scan["is_object"] else "[{}]"
    builder = TraceBuilder(path, "kineto", lenient=lenient)
    state = _ReadState()
    i64, i32 = (lambda raw: np.frombuffer(raw, np.int64)), (lambda raw: np.frombuffer(raw, np.int32))
    m_pos, m_t, m_addr, m_bytes, m_total, m_reserved = (i64(c) for c in scan["memory"][:6])
    m_type, m_index, m_thread = (i32(c) for c in scan["memory"][6:])
    # (type, index) pairs: types are 0..100 and indices -1..254 (checked by the scan)
    pairs = np.unique(m_type.astype(np.int64) * 512 + m_index + 1)
    for dtype, dindex in zip((pairs // 512).tolist(), (pairs % 512 - 1).tolist()):
        state.device_types.setdefault(dtype, set()).add(dindex)
    nonzero = m_bytes != 0
    state.skipped_zero = int(len(m_bytes) - np.count_nonzero(nonzero))
    threads = Threads(scan["threads"])
    o_pos, o_start, o_end = (i64(c).tolist() for c in scan["other"][:3])
    o_thread = i32(scan["other"][3])
    for pos, start, end in zip(o_pos, o_start, o_end):
        e = msgspec_event(data[start:end])
        args = raw_args(e.args)
        if isinstance(args, dict):
            args = {k: (repr(v) if isinstance(v, float) else v) for k, v in args.items()}
        _read_event(builder, state, pos, {"name": e.name, "ph": e.ph, "cat": e.cat, "ts": raw_value(e.ts),
                                          "args": args, "pid": e.pid, "tid": e.tid}, where, limits)
    devices = _device_ids(m_type, m_index)
    cols = RecColumns.concat(
        RecColumns(t_ns=m_t[nonzero], pos=m_pos[nonzero], kind=np.zeros(int(nonzero.sum()), np.int8),
                    device=devices[nonzero], addr=m_addr[nonzero], nbytes=m_bytes[nonzero],
                    total=m_total[nonzero], reserved=m_reserved[nonzero], thread=m_thread[nonzero].astype(np.int64),
                    label=np.zeros(int(nonzero.sum()), np.int64), labels=[]),
        RecColumns.of(state.recs, threads))
    selected_threads = np.unique(np.concatenate([m_thread, o_thread]).astype(np.int64))
    op_cols = _scanned_ops(scan, selected_threads, m_t, limits)
    top = dict(scan["top"])
    from .fast import document_torch

    torch_version = document_torch(data)
    if torch_version:
        top["torch"] = torch_version
    if scan["device_properties"] is not None:     # its text, already checked to be JSON by the scan
        top["deviceProperties"] = msgspec_value(scan["device_properties"])
    return _finish(path, builder, state, cols, op_cols, threads.names, top, where, limits)


def msgspec_value(text: bytes) -> Any:
    """Any JSON value, decoded as the msgspec route decodes it."""
    from .fast import _ANY

    return _ANY.decode(text)


def msgspec_event(text: bytes) -> Any:
    """One event object decoded as the reference's msgspec path decodes it (``fast.Event``)."""
    from .fast import decode_event

    return decode_event(text)


def _device_ids(device_type: np.ndarray, device_index: np.ndarray) -> np.ndarray:
    """``device_id`` of each (type, index) pair, as an int64 array."""
    t, i = device_type.astype(np.int64), device_index.astype(np.int64)
    return np.where((t == CUDA) | (t == HIP), i, np.where(t == CPU, -1, -(256 * t + i + 1)))


def _scanned_ops(scan: dict, selected_threads: np.ndarray, mem_t_ns: np.ndarray, limits: Limits) -> "OpColumns":
    """The ops that may frame [memory] events (``_selected_events`` on the msgspec path): on a thread
    of a kept event, near a [memory] event in time, with exact times and a name within the cap."""
    p_thread = np.frombuffer(scan["ops"][0], np.int32).astype(np.int64)
    p_name = np.frombuffer(scan["ops"][1], np.int32)
    ts, dur = np.frombuffer(scan["ops"][2], np.float64), np.frombuffer(scan["ops"][3], np.float64)
    ts_ns, dur_ns = np.frombuffer(scan["ops"][4], np.int64), np.frombuffer(scan["ops"][5], np.int64)
    ts_ok, dur_ok = np.frombuffer(scan["ops"][6], np.int8) == 1, np.frombuffer(scan["ops"][7], np.int8) == 1
    keep = np.isin(p_thread, selected_threads)
    keep &= _spanning_mask(ts, dur, mem_t_ns)
    names = scan["names"]
    short = np.array([len(n) <= limits.string_chars for n in names], dtype=bool)
    keep &= ts_ok & dur_ok & (dur_ns >= 0) & (short[p_name] if len(names) else False)
    rows = np.flatnonzero(keep)
    return OpColumns(thread=p_thread[rows], start=ts_ns[rows], end=ts_ns[rows] + dur_ns[rows],
                      name=[names[i] for i in p_name[rows].tolist()])


def _spanning_mask(start: np.ndarray, dur: np.ndarray, mem_t_ns: np.ndarray) -> np.ndarray:
    """``_ops_spanning``'s test on float times (us): may the op's span hold a [memory] event?"""
    if not len(start) or not len(mem_t_ns):
        return np.zeros(len(start), dtype=bool)
    mem_us = np.sort(np.asarray(mem_t_ns, dtype=np.float64) / 1000.0)
    end = start + dur
    nxt = np.searchsorted(mem_us, start - 1.0)
    keep = ~(np.isfinite(start) & np.isfinite(end))
    inside = nxt < len(mem_us)
    keep |= inside & (mem_us[np.minimum(nxt, len(mem_us) - 1)] <= end + 1.0)
    return keep


def _finish(path: str, builder: TraceBuilder, state: _ReadState, cols: RecColumns, ops: OpColumns,
            thread_names: list[str], top_keys: dict, where: str, limits: Limits) -> Trace:
    """The back half both routes share: order, frames, events, recorded totals, hints and notes."""
    device_types = state.device_types
    check_count(path, "devices", sum(len(v) for v in device_types.values()), limits, "devices", None)
    if not builder.meta.repairs:     # (lenient reads that skipped bad [memory] events saw some)
        _refuse_without_memory(path, cols, state, top_keys)
    cols = cols.sorted()
    is_mem = cols.kind == MEM
    mem_devices = sorted(set(np.unique(cols.device[is_mem]).tolist()))
    gpu_devices = [d for d in mem_devices if d >= 0]
    marker_device = gpu_devices[0] if gpu_devices else (mem_devices[0] if mem_devices else -1)
    stack_ids, frame_tables, n_stacks = op_frames(path, cols, ops, thread_names, limits)
    cols, stack_ids, check = settle_running_total(builder, cols, stack_ids, where, "Total Allocated")

    event_index, built_trace = feed_records(builder, cols, where, marker_device, stack_ids)
    series = _recorded_series(cols, event_index)

    meta = builder.meta
    hints = meta.version_hints
    for key in ("schemaVersion", "profile_memory", "displayTimeUnit", "baseTimeNanoseconds", "torch"):
        if key in top_keys and isinstance(top_keys[key], (int, str)):
            hints[key] = top_keys[key] if not isinstance(top_keys[key], str) else top_keys[key][:80]
    hints["device_types_seen"] = {
        DEVICE_TYPE_NAMES.get(t, f"type{t}"): sorted(idx) for t, idx in sorted(device_types.items())}
    hints["device_map"] = {
        f"{DEVICE_TYPE_NAMES.get(t, f'type{t}')}:{i}": device_id(t, i)
        for t, idx in sorted(device_types.items()) for i in sorted(idx)}
    hints["stream"] = "Kineto records no stream; every event has stream 0"
    hints["marker_device"] = marker_device
    hints["total_allocated_check"] = {str(d): s for d, s in sorted(check.items())}
    meta.notes.append("Kineto records no stream: all events are on stream 0")
    meta.notes.append("sizes are the allocator's block sizes (Bytes), not the requested sizes")
    hints["size_bytes"] = "block"      # no request size is recorded: rounding inside blocks is unknown
    if HIP in device_types:
        meta.notes.append("GPU memory recorded by a ROCm build (Device Type 6, HIP): HIP device N is "
                          "GPU device N, as CUDA's")
    if stack_ids is not None and n_stacks:
        meta.notes.append("frames are pseudo-frames: the CPU operators (filename '', line 0) and "
                          "Python functions (file and line from their name) that enclose each [memory] "
                          "event in time on its thread, innermost first (Kineto records no allocation "
                          "stacks)")
    if len(device_types) > 1 or any(len(v) > 1 for v in device_types.values()):
        meta.notes.append(f"devices mixed in one trace: {hints['device_map']} (CUDA/HIP N -> N, CPU -> -1)")
    if state.skipped_zero:
        meta.notes.append(f"{state.skipped_zero} [memory] events with Bytes == 0 skipped (neither alloc nor free)")
    if state.not_objects:
        meta.notes.append(f"{state.not_objects} entries of traceEvents are not objects; ignored")
    if state.duplicate_steps:
        meta.notes.append(f"{state.duplicate_steps} repeated {STEP_PREFIX}N events ignored (first kept)")
    for d, s in sorted(check.items()):
        if s["checked"] and s["mismatched"]:
            meta.notes.append(
                f"device {d}: Total Allocated changed by a different amount than Bytes at "
                f"{s['mismatched']} of {s['checked']} events (events reported out of order, or "
                "another allocator's bytes are in the total)")
        if s["baseline_bytes"] > 0:
            meta.notes.append(
                f"device {d}: {s['baseline_bytes']} bytes were allocated before the first recorded event "
                "(the largest start every event's Total Allocated allows)")
    meta.notes.extend(running_total_notes(check, "Total Allocated"))
    meta.devices = sorted(set(mem_devices) | ({marker_device} if state.step_seen else set()))
    meta.device_properties, unusable = recorded_devices(top_keys.get("deviceProperties"))
    if unusable:
        meta.notes.append(f"{unusable} deviceProperties entries without an integer id and totalGlobalMem ignored")
    trace = built_trace if built_trace is not None else builder.finish()
    layouts = _start_of_window_allocations(trace, check, cols)
    trace.recorded_series = table_from_columns(series, RECORDED_SERIES_DTYPES)
    trace.frames = table_from_columns(frame_tables["frames"], FRAME_DTYPES)
    trace.stacks = table_from_columns(frame_tables["stacks"], STACK_DTYPES)
    _store_recorded_runs(trace, layouts)
    check_schema(trace)
    return trace


def _start_of_window_allocations(trace: Trace, check: dict[int, dict[str, int]], cols: RecColumns) -> dict:
    """What a GPU device held before the first recorded event: start allocations and, where the
    addresses tell it, the segments and blocks they and the cached free memory lay in.

    ``baseline_bytes`` (``reading.running_total``: the largest start every event's ``Total
    Allocated`` allows, never the first event's figure alone) is what the allocator held when
    recording began. The window's orphan frees (already initial allocations)
    account for part of it; the rest was never freed in the window, so it becomes one allocation
    alive from the start (never freed): peaks, the lower bound and the verdict count it.
    ``Total Reserved`` minus that is memory the allocator had cached free; ``layout`` lays
    both out from the addresses the window uses, so a replay of the recorded allocator starts
    where the real one did instead of allocating its cache anew.
    """
    from .layout import DeviceWindow, start_layout

    layouts = {}                  # device -> Layout, for the recorded run
    ia = trace.table("initial_allocs")
    added, segments, blocks, laid_out = [], [], [], []
    next_id = max([int(t["alloc_id"].max()) + 1 for t in (trace.table("events"), ia) if len(t)], default=0)
    ia_device = ia["device"]
    for device, stats in sorted(check.items()):
        if device < 0:
            continue          # the CPU allocator is not the caching allocator
        mine = ia_device == device
        orphans = list(zip(ia["alloc_id"][mine].tolist(), ia["addr"][mine].tolist(),
                           ia["size_bytes"][mine].tolist()))
        orphan_bytes = sum(s for _, _, s in orphans)
        rest = stats["baseline_bytes"] - orphan_bytes
        rows = np.flatnonzero((cols.kind == MEM) & (cols.device == device))
        layout: Any = "no [memory] event records Total Reserved"
        if len(rows) and cols.reserved[rows[0]] >= 0 and stats["baseline_bytes"] <= MAX_SIZE_BYTES:
            window = DeviceWindow(
                device=device, start_reserved_bytes=int(cols.reserved[rows[0]]),
                baseline_bytes=max(stats["baseline_bytes"], 0), addr=cols.addr[rows].tolist(),
                nbytes=cols.nbytes[rows].tolist(), reserved=cols.reserved[rows].tolist(), orphans=orphans)
            layout = start_layout(window, next_id)
        if isinstance(layout, str):
            if stats["baseline_bytes"] > 0 and 0 < rest <= MAX_SIZE_BYTES:
                trace.meta.notes.append(f"device {device}: no start-of-window layout: {layout}")
        else:
            trace.meta.notes.append(layout.note)
            if layout.other_pool_sentence():
                trace.meta.notes.append(f"device {device}: {layout.other_pool_sentence()}")
            laid_out.append(device)
            layouts[device] = layout
            segments += [(device, a, s, 0, pool, False) for a, s, pool in layout.segments]
            blocks += [(device, seg, a, s, s, "active_allocated" if aid >= 0 else "inactive", aid, -1)
                       for seg, a, s, aid in layout.blocks]
        if rest <= 0 or rest > MAX_SIZE_BYTES or stats["baseline_bytes"] <= 0:
            continue
        placed = not isinstance(layout, str) and layout.baseline_alloc_addr >= 0
        addr = layout.baseline_alloc_addr if placed else -1
        added.append((next_id, rest, 0, device, addr, rest if placed else -1, -1))
        trace.meta.notes.append(
            f"device {device}: {rest:,} bytes allocated before the first recorded event and not freed in the "
            f"window (of {stats['baseline_bytes']:,} then allocated; {orphan_bytes:,} are freed in it) are one "
            f"start-of-window allocation, alloc_id {next_id}, never freed")
        next_id += 1
    if segments:
        # Kineto's Bytes are block sizes: the orphans' blocks are known exactly where they are laid out.
        ia = ia.with_column("block_size_bytes", np.where(np.isin(ia["device"], laid_out), ia["size_bytes"],
                                                         ia["block_size_bytes"]))
        trace.initial_allocs = ia
        trace.initial_segments = _table(segments, SEGMENT_DTYPES)
        trace.initial_blocks = _table(blocks, BLOCK_DTYPES)
    if added:
        extra = _table(added, INITIAL_ALLOC_DTYPES)
        trace.initial_allocs = ia.concat(extra) if len(ia) else extra
    return layouts


def _table(rows: list[tuple], dtypes: dict) -> Table:
    """A table of ``rows`` (tuples in the order of ``dtypes``) with exactly those dtypes."""
    columns = {name: np.array([r[k] for r in rows], dtype=dtype) for k, (name, dtype) in enumerate(dtypes.items())}
    return table_from_columns(columns, dtypes)


def _recorded_series(cols: RecColumns, index: np.ndarray) -> dict[str, np.ndarray]:
    rows = (cols.kind == MEM) & ((cols.total >= 0) | (cols.reserved >= 0))
    return {"event_index": index[rows], "t_ns": cols.t_ns[rows], "device": cols.device[rows],
            "allocated_bytes": cols.total[rows], "reserved_bytes": cols.reserved[rows]}


def _store_recorded_runs(trace: Trace, layouts: dict) -> None:
    """The caching allocator's recorded totals per GPU device, as ``RecordedRun`` facts.

    Where the start layout was inferred (``layout``), reserved never shrinks in the window,
    so each growth of Total Reserved is one cudaMalloc: their count and bytes are recorded too.
    """
    from ...inference.recorded import RecordedRun, set_recorded_run

    series = trace.table("recorded_series")
    for device in sorted(int(d) for d in np.unique(series["device"])):
        if device < 0:
            continue   # the CPU allocator is not the caching allocator
        mine = series["device"] == device
        reserved = series["reserved_bytes"][mine]
        reserved = reserved[reserved >= 0]
        allocated = series["allocated_bytes"][mine]
        allocated = allocated[allocated >= 0]
        run = RecordedRun(
            device=device, allocator="pytorch",
            peak_reserved_bytes=int(reserved.max()) if len(reserved) else None,
            peak_allocated_bytes=int(allocated.max()) if len(allocated) else None,
            start_reserved_bytes=int(reserved[0]) if len(reserved) else None,
            final_reserved_bytes=int(reserved[-1]) if len(reserved) else None)
        layout = layouts.get(device)
        if layout is not None:
            run.segment_allocs = layout.window_segments
            run.segment_alloc_bytes = int(reserved[-1] - reserved[0]) if len(reserved) else 0
            run.start_layout = "inferred"
            run.unmodelled = ["the start-of-window layout is inferred from the window's addresses, not recorded"]
            if layout.other_pool_sentence():
                run.unmodelled.append(layout.other_pool_sentence())
        set_recorded_run(trace, run)


def _parse_memory(builder: TraceBuilder, record: str, ev: dict, is_oom: bool,
                  device_types: dict[int, set[int]]) -> Rec | None:
    """Parse one [memory] / [OutOfMemory] event; return None when it was skipped under lenient."""
    what = OOM_EVENT if is_oom else MEMORY_EVENT

    def bad(reason: str) -> None:
        builder.problem(record, f"{what} event: {reason}", "skipped the event")
        return None

    t_ns = ts_to_ns(ev.get("ts"))
    if t_ns is None:
        return bad(f"ts is missing or not a number ({quote(ev.get('ts'))})")
    if not INT64_MIN <= t_ns <= INT64_MAX:
        return bad(f"ts {quote(ev.get('ts'))} is out of range")
    args = ev.get("args")
    if not isinstance(args, dict):
        return bad("no 'args' object")
    nbytes = as_int(args.get("Bytes"))
    if nbytes is None:
        return bad(f"Bytes is missing or not an integer ({quote(args.get('Bytes'))})")
    if abs(nbytes) > MAX_SIZE_BYTES:
        return bad(f"absurd size {quote(nbytes)} bytes (> {MAX_SIZE_BYTES})")
    if is_oom and nbytes < 0:
        return bad(f"negative Bytes {quote(nbytes)}")
    addr = 0
    if not is_oom:
        addr = as_int(args.get("Addr"))
        if addr is None:
            return bad(f"Addr is missing or not an integer ({quote(args.get('Addr'))})")
        if not INT64_MIN <= addr <= (1 << 64) - 1:
            return bad(f"Addr {quote(addr)} does not fit in 64 bits")
        if addr > INT64_MAX:
            addr -= 1 << 64  # an unsigned pointer printed as such: same bits as intptr_t
    dtype = as_int(args.get("Device Type"))
    dindex = as_int(args.get("Device Id"))
    if dtype is None and "Device Type" in args:
        return bad(f"Device Type is not an integer ({quote(args.get('Device Type'))})")
    if dindex is None and "Device Id" in args:
        return bad(f"Device Id is not an integer ({quote(args.get('Device Id'))})")
    if dtype is None:
        # Very old exports: assume CPU unless a device index says otherwise.
        dtype = CUDA if dindex is not None and dindex >= 0 else CPU
    if dindex is None:
        dindex = -1 if dtype == CPU else 0
    if not 0 <= dtype <= 100:
        return bad(f"Device Type {quote(dtype)} is not a device type")
    if dtype == CPU:
        dindex = -1
    elif not (-1 <= dindex <= 254) or (dtype in (CUDA, HIP) and dindex < 0):
        return bad(f"Device Id {quote(dindex)} out of range for device type {quote(dtype)}")
    device_types.setdefault(dtype, set()).add(dindex)
    total = as_int(args.get("Total Allocated"))
    reserved = as_int(args.get("Total Reserved"))
    if total is not None and not 0 <= total <= INT64_MAX:
        total = None
    if reserved is not None and not 0 <= reserved <= INT64_MAX:
        reserved = None
    return Rec(t_ns, 0, "oom" if is_oom else "mem", device_id(dtype, dindex), addr, nbytes, total,
                total_reserved=reserved)
