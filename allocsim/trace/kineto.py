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
first and last reserved bytes are stored as a ``RecordedRun`` (``allocsim.trace.recorded``).

Frames: Kineto records no allocation stacks. Each ``[memory]`` event gets pseudo-frames: the CPU
ops (``cpu_op``, ``user_annotation``; filename "" and line 0, name = the op name) and Python
functions (``python_function``, recorded with ``with_stack``: file and line from their name) that
contain it in time on its thread, innermost first, so memory can be attributed by operator.

The 2021 format (``[memory]`` events without ``Addr``) is refused: frees cannot be matched to
allocations without it. Frees of blocks allocated before profiling began become initial-state
allocations of ``|Bytes|``.

Decoding uses ``msgspec`` (only the events the reader keeps are converted; see ``kineto_fast``),
falling back to the standard library for anything unusual, which names the problem.

Bad input (not JSON, corrupt gzip, no ``traceEvents``, a memory event without a numeric integer
``Addr``/``Bytes``, an absurd size) raises ``TraceFormatError`` naming the file, the record
(``traceEvents[1234]``) and the reason; with ``lenient=True`` bad events are skipped (and the
builder repairs double frees and size mismatches), each listed in ``meta.repairs``.
"""

from __future__ import annotations

import json
import re
from decimal import Decimal, InvalidOperation
from typing import Any

import numpy as np

from ..errors import TraceFormatError
from .builder import MAX_SIZE_BYTES, TraceBuilder
from .columnar import OP_ALLOC, OP_FREE, OP_MARKER, OP_NONE, Records, build_columns
from .frames import FrameTable
from .limits import DEFAULT_LIMITS, Limits, LimitExceeded, check_count, quote, read_bytes
from .schema import (
    DECISION_DTYPES,
    EVENT_DTYPES,
    FRAME_DTYPES,
    INITIAL_ALLOC_DTYPES,
    RECORDED_SERIES_DTYPES,
    STACK_DTYPES,
    Trace,
    check_schema,
    frame_from_columns,
)

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
_PY_FUNCTION = re.compile(r"(.{1,4096}?)\((\d{1,9})\): (.{1,4096})")

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_INT_RE = re.compile(r"[+-]?\d+")
_HEX_RE = re.compile(r"[+-]?0[xX][0-9a-fA-F]+")
_DEC_RE = re.compile(r"([+-]?)(\d*)(?:\.(\d*))?")
_DROPPED = object()  # stands in for events we never look at, to keep memory low while parsing


def device_id(device_type: int, device_index: int) -> int:
    """Map a (c10 device type, index) pair to the trace's int16 device id (see module doc)."""
    if device_type == CUDA or device_type == HIP:
        return device_index
    if device_type == CPU:
        return -1
    return -(256 * device_type + device_index + 1)


# --------------------------------------------------------------------------- number parsing
def _as_int(value: Any) -> int | None:
    """An integer from a JSON int or an integral number text (``"8192"``, ``"8192.0"``, ``"0x1f"``)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        text = value.strip()
        if len(text) > 40:
            return None
        if _INT_RE.fullmatch(text):
            return int(text)
        if _HEX_RE.fullmatch(text):
            return int(text, 16)
        try:
            dec = Decimal(text)
        except (InvalidOperation, ValueError):
            return None
        if dec.is_finite() and dec == dec.to_integral_value() and abs(dec.adjusted()) < 40:
            return int(dec)
    return None


def ts_to_ns(value: Any) -> int | None:
    """Exact integer nanoseconds from a Chrome-trace ``ts`` in microseconds, or None if it is not a number.

    Accepts ints, floats and decimal text (``"5093554565374.3"`` -> 5093554565374300).
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value * 1000
    if isinstance(value, float):
        # repr() is the shortest text that round-trips, i.e. what the file said.
        value = repr(value)
    if not isinstance(value, str):
        return None
    text = value.strip()
    if len(text) > 60:
        return None
    m = _DEC_RE.fullmatch(text)
    if m and (m.group(2) or m.group(3)):
        sign, whole, frac = m.group(1), m.group(2) or "0", m.group(3) or ""
        frac_ns = (frac + "000")[:3]
        ns = int(whole) * 1000 + int(frac_ns)
        rest = frac[3:]
        if rest and rest.strip("0"):
            # Round half to even on the digits below 1 ns.
            first, tail = rest[0], rest[1:]
            if first > "5" or (first == "5" and (tail.strip("0") or ns % 2 == 1)):
                ns += 1
        return -ns if sign == "-" else ns
    try:
        dec = Decimal(text)
    except (InvalidOperation, ValueError):
        return None
    if not dec.is_finite() or abs(dec.adjusted()) > 30:
        return None
    return int((dec * 1000).to_integral_value())


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
class _Rec:
    """One event to feed to the builder, kept small until the events are sorted."""

    __slots__ = ("t_ns", "pos", "kind", "device", "addr", "nbytes", "total_alloc", "total_reserved",
                 "label", "thread", "label_type", "label_index")

    def __init__(self, t_ns, pos, kind, device=0, addr=0, nbytes=0, total_alloc=None, label="",
                 total_reserved=None, thread=""):
        self.t_ns, self.pos, self.kind = t_ns, pos, kind
        self.device, self.addr, self.nbytes = device, addr, nbytes
        self.total_alloc, self.total_reserved, self.label = total_alloc, total_reserved, label
        self.thread = thread
        self.label_type = self.label_index = None


def _typed_memory_rec(a: Any, t_ns: int | None) -> _Rec | None:
    """A ``_Rec`` from typed args when every value is in range; None sends the event to the checked path."""
    if t_ns is None or not _INT64_MIN <= t_ns <= _INT64_MAX or abs(a.nbytes) > MAX_SIZE_BYTES:
        return None
    dtype, dindex, addr = a.device_type, a.device_index, a.addr
    if not _INT64_MIN <= addr <= (1 << 64) - 1 or not 0 <= dtype <= 100:
        return None
    if dtype == CPU:
        dindex = -1
    elif not (-1 <= dindex <= 254) or (dtype in (CUDA, HIP) and dindex < 0):
        return None
    if addr > _INT64_MAX:
        addr -= 1 << 64
    total, reserved = a.total_allocated, a.total_reserved
    if total is not None and not 0 <= total <= _INT64_MAX:
        total = None
    if reserved is not None and not 0 <= reserved <= _INT64_MAX:
        reserved = None
    rec = _Rec(t_ns, 0, "mem", device_id(dtype, dindex), addr, a.nbytes, total, total_reserved=reserved)
    rec.label_type, rec.label_index = dtype, dindex
    return rec


def _ops_spanning(op_events: list, mem_t_ns: list[int]) -> list:
    """The ops whose span may hold a [memory] event (a float first look, 1 us of margin): only
    those need exact times. Ops that run and end between two memory events can hold none."""
    from .kineto_fast import float_array

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
    if not memory or any(isinstance(ev, _Rec) for _, ev in selected):
        return
    if any("Addr" in ev["args"] for ev in memory):
        return
    raise TraceFormatError(
        path, None, f"its {len(memory):,} [memory] events carry no 'Addr' (the 2021 Kineto format), so frees "
        f"cannot be matched to allocations; 'Addr' is recorded since PyTorch {ADDR_SINCE}: record the "
        "trace again with a newer PyTorch")


def _python_frame(name: str) -> dict:
    """A frame for an op: Python functions (``file.py(12): fn``) keep their file and line."""
    m = _PY_FUNCTION.fullmatch(name)
    if m:
        return {"filename": m.group(1), "line": int(m.group(2)), "name": m.group(3)}
    return {"filename": "", "line": 0, "name": name}


def _thread_key(ev: Any) -> str:
    pid, tid = ev.get("pid"), ev.get("tid")
    return f"{str(pid)[:40]}\x00{str(tid)[:40]}"


def _selected_events(events: list, limits: Limits):
    """(pos, event dict) of the events the reader uses, and the CPU ops as (thread, start, end, name)."""
    from .kineto_fast import Event, memory_args, ns_list, raw_args, raw_value

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
        threads = {ev.thread if isinstance(ev, _Rec) else _thread_key(ev) for _, ev in selected}
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
    from .kineto_fast import decode_events

    path = str(path)
    limits = limits or DEFAULT_LIMITS
    data = read_bytes(path, limits)
    if not data.strip():
        raise TraceFormatError(path, None, "empty file")
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
        elif isinstance(doc, list):
            events, where, top_keys = doc, "[{}]", {}
        else:
            raise TraceFormatError(path, None, f"top level is a JSON {type(doc).__name__}, not an object or list")
        if not isinstance(events, list):
            raise TraceFormatError(path, "traceEvents", f"is a {type(events).__name__}, not a list")
    del data
    check_count(path, "events", len(events), limits, "trace events", "traceEvents")
    selected, ops = _selected_events(events, limits)
    n_objects = sum(1 for e in events if e is not _DROPPED and not isinstance(e, dict)) if fast is None else 0
    del events

    builder = TraceBuilder(path, "kineto", lenient=lenient)
    recs: list[_Rec] = []
    device_types: dict[int, set[int]] = {}
    skipped_zero = 0
    not_objects = n_objects
    step_seen: set[str] = set()
    duplicate_steps = 0

    _refuse_without_addr(path, selected)
    for pos, ev in selected:
        if isinstance(ev, _Rec):     # a well-formed [memory] event, already parsed
            device_types.setdefault(ev.label_type, set()).add(ev.label_index)
            ev.label_type = ev.label_index = None
            if ev.nbytes == 0:
                skipped_zero += 1
                continue
            recs.append(ev)
            continue
        if not isinstance(ev, dict):
            continue
        name = ev.get("name")
        record = where.format(pos)
        if name == MEMORY_EVENT or name == OOM_EVENT:
            rec = _parse_memory(builder, record, ev, name == OOM_EVENT, device_types)
            if rec is None:
                continue
            if rec.kind == "mem" and rec.nbytes == 0:
                skipped_zero += 1
                continue
            rec.pos = pos
            rec.thread = _thread_key(ev)
            recs.append(rec)
        elif isinstance(name, str) and name.startswith(STEP_PREFIX) and ev.get("ph") == "X":
            cat = ev.get("cat")
            if isinstance(cat, str) and "gpu" in cat.lower():
                continue  # the GPU-timeline copy of the same step annotation
            t_ns = ts_to_ns(ev.get("ts"))
            if t_ns is None or not _INT64_MIN <= t_ns <= _INT64_MAX:
                builder.problem(record, f"step marker {quote(name)} has no numeric ts ({quote(ev.get('ts'))})",
                                "skipped the marker")
                continue
            if name in step_seen:
                duplicate_steps += 1
                continue
            if len(name) > limits.string_chars:
                raise LimitExceeded(path, record, "string_chars", limits.string_chars,
                                    f"a step name of {len(name):,} characters")
            step_seen.add(name)
            recs.append(_Rec(t_ns, pos, "step", label=name))
    del selected
    check_count(path, "devices", sum(len(v) for v in device_types.values()), limits, "devices", None)

    recs.sort(key=lambda r: (r.t_ns, r.pos))
    mem_devices = sorted({r.device for r in recs if r.kind == "mem"})
    gpu_devices = [d for d in mem_devices if d >= 0]
    marker_device = gpu_devices[0] if gpu_devices else (mem_devices[0] if mem_devices else -1)
    frames = FrameTable(path, limits)
    stack_ids = _op_stacks(recs, ops, frames)
    del ops

    event_index, built_trace = _feed(builder, recs, where, marker_device, stack_ids)
    series = _recorded_series(recs, event_index)

    meta = builder.meta
    hints = meta.version_hints
    for key in ("schemaVersion", "profile_memory", "displayTimeUnit", "baseTimeNanoseconds"):
        if key in top_keys and isinstance(top_keys[key], (int, str)):
            hints[key] = top_keys[key] if not isinstance(top_keys[key], str) else top_keys[key][:80]
    hints["device_types_seen"] = {
        DEVICE_TYPE_NAMES.get(t, f"type{t}"): sorted(idx) for t, idx in sorted(device_types.items())}
    hints["device_map"] = {
        f"{DEVICE_TYPE_NAMES.get(t, f'type{t}')}:{i}": device_id(t, i)
        for t, idx in sorted(device_types.items()) for i in sorted(idx)}
    hints["stream"] = "Kineto records no stream; every event has stream 0"
    hints["marker_device"] = marker_device
    check = _total_allocated_check(recs)
    hints["total_allocated_check"] = {str(d): s for d, s in sorted(check.items())}
    meta.notes.append("Kineto records no stream: all events are on stream 0")
    meta.notes.append("sizes are the allocator's block sizes (Bytes), not the requested sizes")
    if HIP in device_types:
        meta.notes.append("GPU memory recorded by a ROCm build (Device Type 6, HIP): HIP device N is "
                          "GPU device N, as CUDA's")
    if stack_ids is not None and frames.n_stacks:
        meta.notes.append("frames are pseudo-frames: the CPU operators (filename '', line 0) and "
                          "Python functions (file and line from their name) that enclose each [memory] "
                          "event in time on its thread, innermost first (Kineto records no allocation "
                          "stacks)")
    if len(device_types) > 1 or any(len(v) > 1 for v in device_types.values()):
        meta.notes.append(f"devices mixed in one trace: {hints['device_map']} (CUDA/HIP N -> N, CPU -> -1)")
    if skipped_zero:
        meta.notes.append(f"{skipped_zero} [memory] events with Bytes == 0 skipped (neither alloc nor free)")
    if not_objects:
        meta.notes.append(f"{not_objects} entries of traceEvents are not objects; ignored")
    if duplicate_steps:
        meta.notes.append(f"{duplicate_steps} repeated {STEP_PREFIX}N events ignored (first kept)")
    for d, s in sorted(check.items()):
        if s["checked"] and s["mismatched"]:
            meta.notes.append(
                f"device {d}: Total Allocated changed by a different amount than Bytes at "
                f"{s['mismatched']} of {s['checked']} events (events reported out of order, or "
                "another allocator's bytes are in the total)")
        if s["baseline_bytes"] > 0:
            meta.notes.append(
                f"device {d}: {s['baseline_bytes']} bytes were allocated before the first recorded event "
                "(Total Allocated - Bytes at that event)")
    meta.devices = sorted(set(mem_devices) | ({marker_device} if step_seen else set()))
    trace = built_trace if built_trace is not None else builder.finish()
    trace.recorded_series = frame_from_columns(series, RECORDED_SERIES_DTYPES)
    frame_tables = frames.tables()
    trace.frames = frame_from_columns(frame_tables["frames"], FRAME_DTYPES)
    trace.stacks = frame_from_columns(frame_tables["stacks"], STACK_DTYPES)
    _store_recorded_runs(trace, device_types)
    check_schema(trace)
    return trace


def _op_stacks(recs: list[_Rec], ops: list[tuple[str, int, int, str]], frames: FrameTable) -> list[int] | None:
    """Stack id of each record: the ops that contain it in time on its thread, innermost first.

    One sweep per thread over ops sorted by start (outer first on ties) with a stack of open ops;
    ops on one thread nest (a call tree), so the open stack at a [memory] event is its context.
    """
    if not ops:
        return None
    by_thread: dict[str, list[tuple[int, int, str]]] = {}
    for thread, start, end, name in ops:
        by_thread.setdefault(thread, []).append((start, -end, name))
    mem_by_thread: dict[str, list[int]] = {}
    for i, r in enumerate(recs):
        if r.kind == "mem":
            mem_by_thread.setdefault(r.thread, []).append(i)
    out = [-1] * len(recs)
    frame_of: dict[str, dict] = {}
    for thread, rec_rows in mem_by_thread.items():
        thread_ops = by_thread.get(thread)
        if not thread_ops:
            continue
        thread_ops.sort()
        record = f"thread {thread.replace(chr(0), '/')}"
        ends: list[int] = []        # open ops, outermost first
        sids: list[int] = []        # stack id with each open op innermost
        k = 0
        n_ops = len(thread_ops)
        for row in rec_rows:        # recs are in time order
            t = recs[row].t_ns
            while k < n_ops and thread_ops[k][0] <= t:
                start, neg_end, name = thread_ops[k]
                k += 1
                while ends and ends[-1] < start:
                    ends.pop()
                    sids.pop()
                frame = frame_of.get(name)
                if frame is None:
                    frame = frame_of[name] = _python_frame(name)
                sids.append(frames.child_stack(sids[-1] if sids else -1, frame, record))
                ends.append(-neg_end)
            while ends and ends[-1] < t:
                ends.pop()
                sids.pop()
            out[row] = sids[-1] if sids else -1
    return out


def _feed(builder: TraceBuilder, recs: list[_Rec], where: str, marker_device: int,
          stack_ids: list[int] | None) -> tuple[list[int], Trace | None]:
    """Feed the records: (event index of each record, the Trace) from the vectorised builder when
    the records are clean; else the sequential builder's indices and None (call ``finish``)."""
    n = len(recs)
    labels: list[str] = []
    label_index: dict[str, int] = {}
    op = np.empty(n, dtype=np.uint8)
    size = np.empty(n, dtype=np.int64)
    label = np.zeros(n, dtype=np.int64)
    for i, r in enumerate(recs):
        if r.kind == "mem":
            op[i] = OP_ALLOC if r.nbytes > 0 else OP_FREE
            size[i] = abs(r.nbytes)
        elif r.kind == "oom":
            op[i] = OP_NONE
            size[i] = r.nbytes
        else:
            op[i] = OP_MARKER
            size[i] = 0
            if r.label not in label_index:
                label_index[r.label] = len(labels)
                labels.append(r.label)
            label[i] = label_index[r.label]
    records = Records(
        t_ns=np.array([r.t_ns for r in recs], dtype=np.int64), op=op,
        device=np.array([r.device if r.kind != "step" else marker_device for r in recs], dtype=np.int64),
        stream=np.zeros(n, dtype=np.int64), addr=np.array([r.addr for r in recs], dtype=np.int64),
        size=size, stack_id=np.array(stack_ids if stack_ids is not None else [-1] * n, dtype=np.int32),
        label=label)
    built = build_columns(records)
    if built is not None:
        oom = np.flatnonzero(op == OP_NONE)
        decisions = {
            "event_index": built.row_event[oom], "t_ns": records.t_ns[oom],
            "action": np.array(["oom"] * len(oom), dtype=object), "addr": np.full(len(oom), -1, np.int64),
            "size_bytes": size[oom], "stream": np.zeros(len(oom), np.int64), "device": records.device[oom],
            "alloc_id": np.full(len(oom), -1, np.int64), "device_free_bytes": np.full(len(oom), -1, np.int64)}
        if built.orphan_frees:
            builder.meta.notes.append(
                f"{built.orphan_frees} frees of blocks allocated before the trace began; "
                "they are in the initial state with the size the free reported")
        trace = Trace(events=frame_from_columns(built.events, EVENT_DTYPES), meta=builder.meta, labels=labels,
                      initial_allocs=frame_from_columns(built.initial, INITIAL_ALLOC_DTYPES),
                      decisions=frame_from_columns(decisions, DECISION_DTYPES))
        index = np.where(op == OP_NONE, -1, built.row_event)
        return index.tolist(), trace
    index = []
    for i, r in enumerate(recs):
        where_ = where.format(r.pos)
        sid = stack_ids[i] if stack_ids is not None else -1
        if r.kind == "mem":
            if r.nbytes > 0:
                builder.alloc(where_, r.t_ns, r.device, 0, r.addr, r.nbytes, stack_id=sid)
                index.append(builder.next_event_index - 1)
            else:
                done = builder.free(where_, r.t_ns, r.device, 0, r.addr, -r.nbytes, stack_id=sid)
                index.append(builder.next_event_index - 1 if done is not None else -1)
        elif r.kind == "oom":
            builder.decision(builder.next_event_index, max(r.t_ns, builder.last_t_ns), "oom", -1,
                             r.nbytes, 0, r.device)
            index.append(-1)
        else:
            builder.marker(where_, r.t_ns, r.label, device=marker_device)
            index.append(-1)
    return index, None


def _recorded_series(recs: list[_Rec], index: list[int]) -> dict[str, np.ndarray]:
    rows = [(index[i], r.t_ns, r.device,
             r.total_alloc if r.total_alloc is not None else -1,
             r.total_reserved if r.total_reserved is not None else -1)
            for i, r in enumerate(recs)
            if r.kind == "mem" and (r.total_alloc is not None or r.total_reserved is not None)]
    arr = np.array(rows, dtype=np.int64).reshape(-1, 5)
    return {"event_index": arr[:, 0], "t_ns": arr[:, 1], "device": arr[:, 2],
            "allocated_bytes": arr[:, 3], "reserved_bytes": arr[:, 4]}


def _total_allocated_check(recs: list[_Rec]) -> dict[int, dict[str, int]]:
    """Per device: consecutive changes of Total Allocated must equal Bytes."""
    last_total: dict[int, int] = {}
    check: dict[int, dict[str, int]] = {}
    for r in recs:
        if r.kind != "mem" or r.total_alloc is None:
            continue
        stats = check.setdefault(r.device, {"checked": 0, "mismatched": 0,
                                            "baseline_bytes": r.total_alloc - r.nbytes})
        prev = last_total.get(r.device)
        if prev is not None:
            stats["checked"] += 1
            if r.total_alloc - prev != r.nbytes:
                stats["mismatched"] += 1
        last_total[r.device] = r.total_alloc
    return check


def _store_recorded_runs(trace: Trace, device_types: dict[int, set[int]]) -> None:
    """The caching allocator's recorded totals per GPU device, as ``RecordedRun`` facts."""
    from .recorded import RecordedRun, set_recorded_run

    series = trace.recorded_series
    for device in sorted(int(d) for d in np.unique(series["device"].to_numpy())):
        if device < 0:
            continue   # the CPU allocator is not the caching allocator
        rows = series.loc[series["device"] == device]
        reserved = rows["reserved_bytes"].to_numpy()
        reserved = reserved[reserved >= 0]
        allocated = rows["allocated_bytes"].to_numpy()
        allocated = allocated[allocated >= 0]
        run = RecordedRun(
            device=device, allocator="pytorch",
            peak_reserved_bytes=int(reserved.max()) if len(reserved) else None,
            peak_allocated_bytes=int(allocated.max()) if len(allocated) else None,
            start_reserved_bytes=int(reserved[0]) if len(reserved) else None,
            final_reserved_bytes=int(reserved[-1]) if len(reserved) else None)
        set_recorded_run(trace, run)


def _parse_memory(builder: TraceBuilder, record: str, ev: dict, is_oom: bool,
                  device_types: dict[int, set[int]]) -> _Rec | None:
    """Parse one [memory] / [OutOfMemory] event; return None when it was skipped under lenient."""
    what = OOM_EVENT if is_oom else MEMORY_EVENT

    def bad(reason: str) -> None:
        builder.problem(record, f"{what} event: {reason}", "skipped the event")
        return None

    t_ns = ts_to_ns(ev.get("ts"))
    if t_ns is None:
        return bad(f"ts is missing or not a number ({quote(ev.get('ts'))})")
    if not _INT64_MIN <= t_ns <= _INT64_MAX:
        return bad(f"ts {quote(ev.get('ts'))} is out of range")
    args = ev.get("args")
    if not isinstance(args, dict):
        return bad("no 'args' object")
    nbytes = _as_int(args.get("Bytes"))
    if nbytes is None:
        return bad(f"Bytes is missing or not an integer ({quote(args.get('Bytes'))})")
    if abs(nbytes) > MAX_SIZE_BYTES:
        return bad(f"absurd size {quote(nbytes)} bytes (> {MAX_SIZE_BYTES})")
    if is_oom and nbytes < 0:
        return bad(f"negative Bytes {quote(nbytes)}")
    addr = 0
    if not is_oom:
        addr = _as_int(args.get("Addr"))
        if addr is None:
            return bad(f"Addr is missing or not an integer ({quote(args.get('Addr'))})")
        if not _INT64_MIN <= addr <= (1 << 64) - 1:
            return bad(f"Addr {quote(addr)} does not fit in 64 bits")
        if addr > _INT64_MAX:
            addr -= 1 << 64  # an unsigned pointer printed as such: same bits as intptr_t
    dtype = _as_int(args.get("Device Type"))
    dindex = _as_int(args.get("Device Id"))
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
    total = _as_int(args.get("Total Allocated"))
    reserved = _as_int(args.get("Total Reserved"))
    if total is not None and not 0 <= total <= _INT64_MAX:
        total = None
    if reserved is not None and not 0 <= reserved <= _INT64_MAX:
        reserved = None
    return _Rec(t_ns, 0, "oom" if is_oom else "mem", device_id(dtype, dindex), addr, nbytes, total,
                total_reserved=reserved)
