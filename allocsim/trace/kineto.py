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

Devices: a trace may mix devices. ``device`` is CUDA device N -> N, CPU -> -1, any other device type
T with index I -> ``-(256 * T + I + 1)`` (so never -1 or >= 0). Kineto records no stream: every event
has stream 0. Markers carry the lowest CUDA device of the trace, else CPU (-1). The mapping, the
device types seen, and a per-device ``Total Allocated`` cross-check go to ``meta.version_hints``.

Frees of blocks allocated before profiling began become initial-state allocations of ``|Bytes|``.

Bad input (not JSON, corrupt gzip, no ``traceEvents``, a memory event without a numeric integer
``Addr``/``Bytes``, an absurd size) raises ``TraceFormatError`` naming the file, the record
(``traceEvents[1234]``) and the reason; with ``lenient=True`` bad events are skipped (and the
builder repairs double frees and size mismatches), each listed in ``meta.repairs``.
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from decimal import Decimal, InvalidOperation
from typing import Any

from ..errors import TraceFormatError
from .builder import MAX_SIZE_BYTES, TraceBuilder
from .schema import Trace

MEMORY_EVENT = "[memory]"
OOM_EVENT = "[OutOfMemory]"
STEP_PREFIX = "ProfilerStep#"

#: c10::DeviceType values (c10/core/DeviceType.h) for readable notes; others are shown by number.
DEVICE_TYPE_NAMES = {
    0: "CPU", 1: "CUDA", 2: "MKLDNN", 3: "OPENGL", 4: "OPENCL", 5: "IDEEP", 6: "HIP", 7: "FPGA",
    8: "MAIA", 9: "XLA", 10: "Vulkan", 11: "Metal", 12: "XPU", 13: "MPS", 14: "Meta", 15: "HPU",
    16: "VE", 17: "Lazy", 18: "IPU", 19: "MTIA", 20: "PrivateUse1",
}
CPU, CUDA = 0, 1

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_INT_RE = re.compile(r"[+-]?\d+")
_HEX_RE = re.compile(r"[+-]?0[xX][0-9a-fA-F]+")
_DEC_RE = re.compile(r"([+-]?)(\d*)(?:\.(\d*))?")
_DROPPED = object()  # stands in for events we never look at, to keep memory low while parsing


def device_id(device_type: int, device_index: int) -> int:
    """Map a (c10 device type, index) pair to the trace's int16 device id (see module doc)."""
    if device_type == CUDA:
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
    # Drop every trace event we will not use as soon as it is parsed (kernels, ops, metadata...).
    if "ph" in obj and "name" in obj:
        name = obj["name"]
        if name != MEMORY_EVENT and name != OOM_EVENT and not (
                isinstance(name, str) and name.startswith(STEP_PREFIX)):
            return _DROPPED
    return obj


def _load_json(path: str) -> Any:
    with open(path, "rb") as fh:
        magic = fh.read(2)
    try:
        if magic == b"\x1f\x8b":
            with gzip.open(path, "rb") as fh:
                data = fh.read()
        else:
            with open(path, "rb") as fh:
                data = fh.read()
    except (OSError, EOFError, zlib.error) as exc:
        raise TraceFormatError(path, None, f"corrupt gzip data: {type(exc).__name__}: {exc}") from None
    if not data.strip():
        raise TraceFormatError(path, None, "empty file")
    try:
        # Float literals stay text so that ts converts to ns exactly; NaN/Infinity stay text (rejected later).
        return json.loads(data, object_hook=_object_hook, parse_float=str, parse_constant=str)
    except RecursionError:
        raise TraceFormatError(path, None, "not JSON: nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, int digit limit
        raise TraceFormatError(path, None, f"not JSON: {exc}") from None


# --------------------------------------------------------------------------- reader
class _Rec:
    """One event to feed to the builder, kept small until the events are sorted."""

    __slots__ = ("t_ns", "pos", "kind", "device", "addr", "nbytes", "total_alloc", "label")

    def __init__(self, t_ns, pos, kind, device=0, addr=0, nbytes=0, total_alloc=None, label=""):
        self.t_ns, self.pos, self.kind = t_ns, pos, kind
        self.device, self.addr, self.nbytes = device, addr, nbytes
        self.total_alloc, self.label = total_alloc, label


def read_kineto(path, *, lenient: bool = False) -> Trace:
    """Read a torch.profiler / Kineto Chrome trace's memory events into a ``Trace`` (see module doc)."""
    path = str(path)
    doc = _load_json(path)
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

    builder = TraceBuilder(path, "kineto", lenient=lenient)
    recs: list[_Rec] = []
    device_types: dict[int, set[int]] = {}
    skipped_zero = 0
    not_objects = 0
    step_seen: set[str] = set()
    duplicate_steps = 0

    for pos, ev in enumerate(events):
        if ev is _DROPPED:
            continue
        if not isinstance(ev, dict):
            not_objects += 1
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
            recs.append(rec)
        elif isinstance(name, str) and name.startswith(STEP_PREFIX) and ev.get("ph") == "X":
            cat = ev.get("cat")
            if isinstance(cat, str) and "gpu" in cat.lower():
                continue  # the GPU-timeline copy of the same step annotation
            t_ns = ts_to_ns(ev.get("ts"))
            if t_ns is None or not _INT64_MIN <= t_ns <= _INT64_MAX:
                builder.problem(record, f"step marker {name!r} has no numeric ts ({ev.get('ts')!r})",
                                "skipped the marker")
                continue
            if name in step_seen:
                duplicate_steps += 1
                continue
            step_seen.add(name)
            recs.append(_Rec(t_ns, pos, "step", label=name))
    del events, doc

    recs.sort(key=lambda r: (r.t_ns, r.pos))
    mem_devices = sorted({r.device for r in recs if r.kind == "mem"})
    cuda_devices = [d for d in mem_devices if d >= 0]
    marker_device = cuda_devices[0] if cuda_devices else (mem_devices[0] if mem_devices else -1)

    # Per-device Total Allocated cross-check: consecutive changes must equal Bytes.
    last_total: dict[int, int] = {}
    check: dict[int, dict[str, int]] = {}
    for r in recs:
        where_ = where.format(r.pos)
        if r.kind == "mem":
            if r.nbytes > 0:
                builder.alloc(where_, r.t_ns, r.device, 0, r.addr, r.nbytes)
            else:
                builder.free(where_, r.t_ns, r.device, 0, r.addr, -r.nbytes)
            if r.total_alloc is not None:
                stats = check.setdefault(r.device, {"checked": 0, "mismatched": 0,
                                                    "baseline_bytes": r.total_alloc - r.nbytes})
                prev = last_total.get(r.device)
                if prev is not None:
                    stats["checked"] += 1
                    if r.total_alloc - prev != r.nbytes:
                        stats["mismatched"] += 1
                last_total[r.device] = r.total_alloc
        elif r.kind == "oom":
            builder.decision(builder.next_event_index, max(r.t_ns, builder.last_t_ns), "oom", -1,
                             r.nbytes, 0, r.device)
        else:
            builder.marker(where_, r.t_ns, r.label, device=marker_device)

    meta = builder.meta
    hints = meta.version_hints
    for key in ("schemaVersion", "profile_memory", "displayTimeUnit", "baseTimeNanoseconds"):
        if key in top_keys and isinstance(top_keys[key], (int, str)):
            hints[key] = top_keys[key]
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
    if len(device_types) > 1 or any(len(v) > 1 for v in device_types.values()):
        meta.notes.append(f"devices mixed in one trace: {hints['device_map']} (CUDA N -> N, CPU -> -1)")
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
    return builder.finish()


def _parse_memory(builder: TraceBuilder, record: str, ev: dict, is_oom: bool,
                  device_types: dict[int, set[int]]) -> _Rec | None:
    """Parse one [memory] / [OutOfMemory] event; return None when it was skipped under lenient."""
    what = OOM_EVENT if is_oom else MEMORY_EVENT

    def bad(reason: str) -> None:
        builder.problem(record, f"{what} event: {reason}", "skipped the event")
        return None

    t_ns = ts_to_ns(ev.get("ts"))
    if t_ns is None:
        return bad(f"ts is missing or not a number ({ev.get('ts')!r})")
    if not _INT64_MIN <= t_ns <= _INT64_MAX:
        return bad(f"ts {ev.get('ts')!r} is out of range")
    args = ev.get("args")
    if not isinstance(args, dict):
        return bad("no 'args' object")
    nbytes = _as_int(args.get("Bytes"))
    if nbytes is None:
        return bad(f"Bytes is missing or not an integer ({args.get('Bytes')!r})")
    if abs(nbytes) > MAX_SIZE_BYTES:
        return bad(f"absurd size {nbytes} bytes (> {MAX_SIZE_BYTES})")
    if is_oom and nbytes < 0:
        return bad(f"negative Bytes {nbytes}")
    addr = 0
    if not is_oom:
        addr = _as_int(args.get("Addr"))
        if addr is None:
            return bad(f"Addr is missing or not an integer ({args.get('Addr')!r})")
        if not _INT64_MIN <= addr <= (1 << 64) - 1:
            return bad(f"Addr {addr} does not fit in 64 bits")
        if addr > _INT64_MAX:
            addr -= 1 << 64  # an unsigned pointer printed as such: same bits as intptr_t
    dtype = _as_int(args.get("Device Type"))
    dindex = _as_int(args.get("Device Id"))
    if dtype is None and "Device Type" in args:
        return bad(f"Device Type is not an integer ({args.get('Device Type')!r})")
    if dindex is None and "Device Id" in args:
        return bad(f"Device Id is not an integer ({args.get('Device Id')!r})")
    if dtype is None:
        # Very old exports: assume CPU unless a device index says otherwise.
        dtype = CUDA if dindex is not None and dindex >= 0 else CPU
    if dindex is None:
        dindex = -1 if dtype == CPU else 0
    if not 0 <= dtype <= 100:
        return bad(f"Device Type {dtype} is not a device type")
    if dtype == CPU:
        dindex = -1
    elif not (-1 <= dindex <= 254) or (dtype == CUDA and dindex < 0):
        return bad(f"Device Id {dindex} out of range for device type {dtype}")
    device_types.setdefault(dtype, set()).add(dindex)
    total = _as_int(args.get("Total Allocated"))
    return _Rec(t_ns, 0, "oom" if is_oom else "mem", device_id(dtype, dindex), addr, nbytes, total)
