"""PaddlePaddle profiler Chrome traces (``paddle.profiler.Profiler(..., profile_memory=True)``): ``read_paddle(path)``.

What Paddle writes (paddle 3.x, ``ChromeTracingLogger::LogMemTraceEventNode``): ``[memory]``
instant events whose ``cat`` is ``Allocate``, ``Free``, ``ReservedAllocate`` or ``ReservedFree``
and whose ``args`` hold ``place`` (``"Place(gpu:0)"``, ``"Place(cpu)"``, ``"Place(gpu_pinned)"``),
``addr`` (a decimal string), ``increase_bytes`` (negative for frees), and the allocator's own
``current_allocated`` / ``current_reserved`` / ``peak_allocated`` / ``peak_reserved`` after the event.

What is read:

* ``Allocate`` with ``increase_bytes > 0`` allocates that many bytes at ``addr``; ``Free`` with
  ``increase_bytes < 0`` frees the block at ``addr`` (requested and completed at once: Paddle
  records no stream, so every event has stream 0). Events with 0 bytes carry nothing (a note
  counts them). ``ReservedAllocate`` / ``ReservedFree`` are the allocator's own device calls: they
  are not requests, only their ``current_reserved`` joins the recorded series.
* The place is the device: ``gpu:N`` -> N, ``cpu`` -> -1, ``gpu_pinned`` (page-locked host memory)
  -> -2, kept apart from pageable host memory; ``xpu:N`` -> ``-(256 * 12 + N + 1)`` (Kineto's XPU
  number). Any other place is refused, naming the record (skipped with ``lenient=True``).
* ``current_allocated`` / ``current_reserved`` after each event are the recorded series; each
  place's largest ``current_allocated`` (and, on GPU places, ``current_reserved``) is stored as a
  ``RecordedRun`` with ``allocator="paddle"`` (host places: ``"paddle-host"``; their
  ``current_reserved`` counts only what Paddle's host allocator caches, so it is not a peak).
* What a place held before the window (the largest value every event's ``current_allocated``
  allows, ``reading.running_total``: never the first event's alone) becomes start-of-window
  allocations, as for Kineto: frees of blocks allocated before the window take their own size, the
  rest is one allocation never freed, so the replay's peak live bytes equal the trace's largest
  ``current_allocated`` where the totals agree with the events. Two neighbouring events whose
  timestamps came out swapped are fed in the order the totals prove; totals no start explains are
  refused (``docs/formats.md``).
* ``ProfileStep#N[...]`` events are step markers; the enclosing ops (``Forward`` layers,
  ``UserDefined`` Python API calls, ``Operator`` / ``OperatorInner`` / kernel launches) on the
  same thread (Paddle writes a thread's Python and C++ sides as ``tid(Python)`` / ``tid(C++)``:
  one thread) are the pseudo-frames, innermost first, their names without Paddle's duration
  suffix (``"matmul dygraph[12.3 us]"`` -> ``"matmul dygraph"``).

Times: ``ts`` in microseconds, converted to ns exactly (``reading.json_numbers.ts_to_ns``); events are fed in
(ts, position in file) order, and each place's ``current_allocated`` must change by
``increase_bytes`` from one event to the next (mismatches are counted in a note).

Decoding: ``msgspec`` (``kineto.fast``), or the standard library for anything unusual. The compiled
Chrome-trace scanner models Kineto's fields only, so Paddle files always take this route for the
events; the records' columns, the frames' sweep and the feeding into the builder are the Kineto
reader's too (``reading.timeline``: ``op_frames`` is compiled when the readers are).
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

from ...errors import TraceFormatError, quote
from ..reading.builder import MAX_SIZE_BYTES, TraceBuilder
from ..reading.json_numbers import INT64_MAX, INT64_MIN, as_int, ts_to_ns
from ..reading.limits import DEFAULT_LIMITS, Limits, check_count, read_bytes
from ..reading.timeline import (
    MEM, STEP, OpColumns, Rec, RecColumns, Threads, feed_records, op_frames,
)
from ..reading.running_total import running_total_notes, settle_running_total
from ..schema import (
    FRAME_DTYPES, INITIAL_ALLOC_DTYPES, RECORDED_SERIES_DTYPES, STACK_DTYPES, Trace, check_schema, table_from_columns,
)

MEMORY_EVENT = "[memory]"
ALLOCATE, FREE = "Allocate", "Free"
RESERVED_CATS = frozenset({"ReservedAllocate", "ReservedFree"})
STEP_PREFIX = "ProfileStep#"
#: Paddle's host-event categories (``TracerEventType``) that enclose memory events: pseudo-frames.
FRAME_CATEGORIES = frozenset({"Operator", "OperatorInner", "UserDefined", "PythonUserDefined", "Forward",
                              "Backward", "Optimization", "Dataloader", "DygraphKernelLaunch",
                              "StaticKernelLaunch", "PythonOp"})
#: Keys only Paddle's ``[memory]`` args have; detection by fields looks for them.
PADDLE_MEMORY_KEYS = ("increase_bytes", "current_allocated", "place")
PINNED_DEVICE = -2
XPU_TYPE = 12
_PLACE = re.compile(r"Place\(([a-z_]{1,32})(?::([0-9]{1,3}))?\)")      # ASCII digits: not Place(gpu:٠)
_DURATION_SUFFIX = re.compile(r"\[[0-9.]{1,32} ?(?:ns|us|ms|s)\]$")
_RESERVED = 3          # a ReservedAllocate / ReservedFree record: series only, never fed


def place_device(place: Any) -> int | None:
    """The trace's device id for a Paddle place text (``"Place(gpu:1)"`` -> 1), or None if not modelled."""
    if not isinstance(place, str):
        return None
    m = _PLACE.fullmatch(place.strip())
    if not m:
        return None
    kind, index = m.group(1), m.group(2)
    if kind == "cpu" and index is None:
        return -1
    if kind == "gpu_pinned" and index is None:
        return PINNED_DEVICE
    if kind == "gpu" and index is not None and int(index) <= 254:
        return int(index)
    if kind == "xpu" and index is not None and int(index) <= 254:
        return -(256 * XPU_TYPE + int(index) + 1)
    return None


def op_name(name: str) -> str:
    """An op's name without Paddle's duration suffix, so one op is one frame across calls."""
    return _DURATION_SUFFIX.sub("", name).rstrip()


def thread_key(pid: Any, tid: Any) -> str:
    """One key per OS thread: Paddle's ``"123(Python)"`` and ``"123(C++)"`` are the same thread."""
    tid_text = str(tid)[:40]
    base, paren, _ = tid_text.partition("(")
    if paren and base.isdigit():
        tid_text = base
    return f"{str(pid)[:40]}\x00{tid_text}"


# --------------------------------------------------------------------------- decoding
def _events(path: str, data: bytes, limits: Limits) -> tuple[list[tuple], str]:
    """(pos, name, ph, cat, ts, dur, pid, tid, args) of the events the reader may use, and the record format;
    the whole ``traceEvents`` count is held to ``limits.events`` first."""
    from .kineto.fast import decode_events, raw_args, raw_value

    fast = decode_events(data)
    out: list[tuple] = []
    if fast is not None:
        events, _top, is_object = fast
        check_count(path, "events", len(events), limits, "trace events", "traceEvents")
        for pos, e in enumerate(events):
            name, cat = e.name, e.cat
            if name == MEMORY_EVENT or (cat in FRAME_CATEGORIES and e.ph == "X") or cat == "ProfileStep":
                args = raw_args(e.args) if name == MEMORY_EVENT else None
                out.append((pos, name, e.ph, cat, raw_value(e.ts), raw_value(e.dur), e.pid, e.tid, args))
        return out, "traceEvents[{}]" if is_object else "[{}]"
    try:
        doc = json.loads(data, parse_float=str, parse_constant=str)
    except RecursionError:
        raise TraceFormatError(path, None, "not JSON: nested too deeply") from None
    except ValueError as exc:
        raise TraceFormatError(path, None, f"not JSON: {quote(str(exc))}") from None
    if isinstance(doc, dict):
        events, where = doc.get("traceEvents"), "traceEvents[{}]"
    else:
        events, where = doc, "[{}]"
    if not isinstance(events, list):
        raise TraceFormatError(path, None, "no 'traceEvents' list: not a Chrome trace")
    check_count(path, "events", len(events), limits, "trace events", "traceEvents")
    for pos, e in enumerate(events):
        if not isinstance(e, dict):
            continue
        name, cat = e.get("name"), e.get("cat")
        if name == MEMORY_EVENT or (isinstance(cat, str) and (cat in FRAME_CATEGORIES or cat == "ProfileStep")):
            out.append((pos, name, e.get("ph"), cat, e.get("ts"), e.get("dur"), e.get("pid"), e.get("tid"),
                        e.get("args") if name == MEMORY_EVENT else None))
    return out, where


# --------------------------------------------------------------------------- reader
def read_paddle(path, *, lenient: bool = False, limits: Limits | None = None) -> Trace:
    """Read a PaddlePaddle profiler trace's memory events into a ``Trace`` (see module doc)."""
    path = str(path)
    limits = limits or DEFAULT_LIMITS
    data = read_bytes(path, limits)
    if not data.strip():
        raise TraceFormatError(path, None, "empty file")
    return read_paddle_data(path, data, lenient=lenient, limits=limits)


def read_paddle_data(path: str, data: bytes, *, lenient: bool = False, limits: Limits | None = None) -> Trace:
    """``read_paddle`` on the file's (decompressed) bytes, already read."""
    limits = limits or DEFAULT_LIMITS
    selected, where = _events(path, data, limits)
    builder = TraceBuilder(path, "paddle", lenient=lenient)
    recs: list[Rec] = []
    ops: list[tuple[str, int, int, str]] = []
    skipped_zero = n_memory = 0
    places: dict[int, str] = {}
    steps_seen: set[str] = set()
    for pos, name, ph, cat, ts, dur, pid, tid, args in selected:
        record = where.format(pos)
        if name == MEMORY_EVENT:
            n_memory += 1
            rec = _memory_rec(builder, record, cat, ts, args, places)
            if rec is None:
                continue
            if rec.nbytes == 0 and rec.kind == "mem":
                skipped_zero += 1
                continue
            rec.pos, rec.thread = pos, thread_key(pid, tid)
            recs.append(rec)
        elif cat == "ProfileStep" and isinstance(name, str) and name.startswith(STEP_PREFIX) and ph == "X":
            label = op_name(name)[:limits.string_chars]
            t_ns = ts_to_ns(ts)
            if t_ns is None or not INT64_MIN <= t_ns <= INT64_MAX:
                builder.problem(record, f"step {quote(name)} has no numeric ts ({quote(ts)})", "skipped the marker")
            elif label not in steps_seen:
                steps_seen.add(label)
                recs.append(Rec(t_ns, pos, "step", label=label))
        elif ph == "X" and isinstance(name, str) and len(name) <= limits.string_chars:
            start, length = ts_to_ns(ts), ts_to_ns(dur)
            if start is not None and length is not None and length >= 0:
                ops.append((thread_key(pid, tid), start, start + length, op_name(name)))
    if n_memory == 0:
        raise TraceFormatError(path, None, "a PaddlePaddle profiler trace without [memory] events: record with "
                               "paddle.profiler.Profiler(..., profile_memory=True)")
    return _finish(path, builder, recs, ops, places, skipped_zero, where, limits)


def _memory_rec(builder: TraceBuilder, record: str, cat: Any, ts: Any, args: Any,
                places: dict[int, str]) -> Rec | None:
    """One ``[memory]`` event as a record; None when it was skipped under lenient."""
    def bad(reason: str) -> None:
        builder.problem(record, f"[memory] event: {reason}", "skipped the event")
        return None

    if not isinstance(cat, str) or (cat not in (ALLOCATE, FREE) and cat not in RESERVED_CATS):
        return bad(f"cat {quote(cat)} is none of Allocate, Free, ReservedAllocate, ReservedFree")
    t_ns = ts_to_ns(ts)
    if t_ns is None or not INT64_MIN <= t_ns <= INT64_MAX:
        return bad(f"ts is missing or not a number ({quote(ts)})")
    if not isinstance(args, dict):
        return bad("no 'args' object")
    missing = [k for k in ("place", "addr", "increase_bytes") if k not in args]
    if missing:
        return bad(f"args lack {', '.join(missing)} (a PaddlePaddle [memory] event has place, addr, increase_bytes)")
    device = place_device(args["place"])
    if device is None:
        return bad(f"place {quote(args['place'])} is not modelled (gpu:N, cpu, gpu_pinned, xpu:N)")
    nbytes = as_int(args["increase_bytes"])
    if nbytes is None:
        return bad(f"increase_bytes is not an integer ({quote(args['increase_bytes'])})")
    if abs(nbytes) > MAX_SIZE_BYTES:
        return bad(f"absurd size {quote(nbytes)} bytes (> {MAX_SIZE_BYTES})")
    if (cat in (ALLOCATE, "ReservedAllocate") and nbytes < 0) or (cat in (FREE, "ReservedFree") and nbytes > 0):
        return bad(f"{cat} with increase_bytes {nbytes}")
    addr = as_int(args["addr"])
    if addr is None or not INT64_MIN <= addr <= (1 << 64) - 1:
        return bad(f"addr is not a 64-bit integer ({quote(args['addr'])})")
    if addr > INT64_MAX:
        addr -= 1 << 64      # an unsigned pointer: same bits as intptr_t
    total, reserved = as_int(args.get("current_allocated")), as_int(args.get("current_reserved"))
    total = total if total is not None and 0 <= total <= INT64_MAX else None
    reserved = reserved if reserved is not None and 0 <= reserved <= INT64_MAX else None
    places.setdefault(device, str(args["place"])[:40])
    rec = Rec(t_ns, 0, "mem", device, addr, nbytes, total, total_reserved=reserved)
    if cat in RESERVED_CATS:
        rec.kind = "reserved"
    return rec


def _columns(recs: list[Rec], threads: Threads) -> tuple[RecColumns, list[Rec]]:
    """The records to feed (memory and steps) and, apart, the reserved-change rows, both in feed order."""
    fed = [r for r in recs if r.kind != "reserved"]
    cols = RecColumns.of(fed, threads).sorted()
    reserved = [r for r in recs if r.kind == "reserved"]
    return cols, reserved


def _finish(path: str, builder: TraceBuilder, recs: list[Rec], ops: list, places: dict[int, str],
            skipped_zero: int, where: str, limits: Limits) -> Trace:
    check_count(path, "devices", len(places), limits, "devices", None)
    threads = Threads()
    cols, reserved = _columns(recs, threads)
    op_cols = OpColumns.of(ops, threads)
    is_mem = cols.kind == MEM
    devices = sorted(set(np.unique(cols.device[is_mem]).tolist()))
    gpus = [d for d in devices if d >= 0]
    marker_device = gpus[0] if gpus else (devices[0] if devices else -1)
    stack_ids, tables, n_stacks = op_frames(path, cols, op_cols, threads.names, limits)
    cols, stack_ids, check = settle_running_total(builder, cols, stack_ids, where, "current_allocated")
    event_index, built = feed_records(builder, cols, where, marker_device, stack_ids)
    series = _series(cols, event_index, reserved)
    meta = builder.meta
    hints = meta.version_hints
    hints["framework"] = "paddlepaddle"
    hints["places"] = {place: device for device, place in sorted(places.items())}
    hints["stream"] = "Paddle's profiler records no stream; every event has stream 0"
    hints["marker_device"] = marker_device
    hints["current_allocated_check"] = {str(d): s for d, s in sorted(check.items())}
    meta.notes.append("PaddlePaddle's profiler records no stream: all events are on stream 0")
    meta.notes.append("sizes are Paddle's allocation sizes (increase_bytes), as its allocator counted them")
    if PINNED_DEVICE in places:
        meta.notes.append("pinned host memory (Place(gpu_pinned)) is device -2, kept apart from pageable host "
                          "memory (Place(cpu), device -1)")
    if stack_ids is not None and n_stacks:
        meta.notes.append("frames are pseudo-frames: the Paddle layers, API calls and operators that enclose each "
                          "[memory] event in time on its thread, innermost first (Paddle records no allocation "
                          "stacks)")
    if len(places) > 1:
        meta.notes.append(f"places mixed in one trace: {hints['places']} (gpu:N -> N, cpu -> -1, gpu_pinned -> -2)")
    if skipped_zero:
        meta.notes.append(f"{skipped_zero} [memory] events with increase_bytes == 0 skipped (neither alloc nor free)")
    if reserved:
        meta.notes.append(f"{len(reserved)} ReservedAllocate/ReservedFree events (the allocator's own device calls) "
                          "are kept as recorded reserved bytes, not replayed")
    for d, s in sorted(check.items()):
        if s["checked"] and s["mismatched"]:
            meta.notes.append(f"device {d}: current_allocated changed by a different amount than increase_bytes "
                              f"at {s['mismatched']} of {s['checked']} events (events reported out of order)")
    meta.notes.extend(running_total_notes(check, "current_allocated"))
    meta.devices = sorted(set(devices) | ({marker_device} if (cols.kind == STEP).any() else set()))
    trace = built if built is not None else builder.finish()
    _start_of_window(trace, check)
    trace.recorded_series = table_from_columns(series, RECORDED_SERIES_DTYPES)
    trace.frames = table_from_columns(tables["frames"], FRAME_DTYPES)
    trace.stacks = table_from_columns(tables["stacks"], STACK_DTYPES)
    _store_recorded_runs(trace)
    check_schema(trace)
    return trace


def _series(cols: RecColumns, index: np.ndarray, reserved: list[Rec]) -> dict[str, np.ndarray]:
    """Paddle's current_allocated / current_reserved after each event, in time order; a reserved-only
    event follows the last request fed before it (event_index -1 before the first)."""
    rows = (cols.kind == MEM) & ((cols.total >= 0) | (cols.reserved >= 0))
    t, pos = cols.t_ns[rows], cols.pos[rows]
    out = {"event_index": index[rows], "t_ns": t, "device": cols.device[rows],
           "allocated_bytes": cols.total[rows], "reserved_bytes": cols.reserved[rows]}
    if not reserved:
        return out
    r_t = np.array([r.t_ns for r in reserved], dtype=np.int64)
    r_pos = np.array([r.pos for r in reserved], dtype=np.int64)
    # Each reserved row follows the last fed [memory] event before it in (ts, position) order.
    fed = np.flatnonzero(cols.kind == MEM)          # cols are already in (ts, position) order
    fed_t, fed_pos = cols.t_ns[fed], cols.pos[fed]
    k = np.array([np.searchsorted(fed_t, rt, side="left") for rt in r_t.tolist()], dtype=np.int64)
    for j, (rt, rp) in enumerate(zip(r_t.tolist(), r_pos.tolist())):
        while k[j] < len(fed) and fed_t[k[j]] == rt and fed_pos[k[j]] < rp:
            k[j] += 1
    r_index = np.where(k > 0, index[fed][np.maximum(k - 1, 0)], -1) if len(fed) else np.full(len(k), -1)
    r_total = np.array([r.total_alloc if r.total_alloc is not None else -1 for r in reserved], dtype=np.int64)
    r_res = np.array([r.total_reserved if r.total_reserved is not None else -1 for r in reserved], dtype=np.int64)
    merged = {
        "event_index": np.concatenate([out["event_index"], np.array(r_index, dtype=np.int64)]),
        "t_ns": np.concatenate([t, r_t]), "device": np.concatenate([out["device"],
                                                                     [r.device for r in reserved]]),
        "allocated_bytes": np.concatenate([out["allocated_bytes"], r_total]),
        "reserved_bytes": np.concatenate([out["reserved_bytes"], r_res])}
    order = np.lexsort((np.concatenate([pos, r_pos]), merged["t_ns"]))
    return {k: np.asarray(v)[order] for k, v in merged.items()}


def _start_of_window(trace: Trace, check: dict[int, dict[str, int]]) -> None:
    """What each place held before its first event and the window never frees: one allocation alive from the start.

    ``baseline_bytes`` (``reading.running_total``: the largest start every event's ``current_allocated``
    allows) is what Paddle's allocator held when recording began; the window's frees of older blocks (already initial allocations)
    are part of it, the rest is never freed in the window. With it the replay's live bytes follow
    ``current_allocated`` exactly, on every place (Paddle counts host memory with the same stats).
    """
    ia = trace.table("initial_allocs")
    added = []
    next_id = max([int(t["alloc_id"].max()) + 1 for t in (trace.table("events"), ia) if len(t)], default=0)
    for device, stats in sorted(check.items()):
        if stats["baseline_bytes"] <= 0:
            continue
        sizes = ia["size_bytes"][ia["device"] == device]
        orphan_bytes = sum(sizes.tolist())
        rest = stats["baseline_bytes"] - orphan_bytes
        if rest <= 0 or rest > MAX_SIZE_BYTES:
            continue
        added.append((next_id, rest, 0, device, -1, -1, -1))
        trace.meta.notes.append(
            f"device {device}: {rest:,} bytes allocated before the first recorded event and not freed in the "
            f"window (of {stats['baseline_bytes']:,} then allocated; {orphan_bytes:,} are freed in it) are one "
            f"start-of-window allocation, alloc_id {next_id}, never freed")
        next_id += 1
    if added:
        rows = {name: np.array([r[k] for r in added], dtype=dtype)
                for k, (name, dtype) in enumerate(INITIAL_ALLOC_DTYPES.items())}
        extra = table_from_columns(rows, INITIAL_ALLOC_DTYPES)
        trace.initial_allocs = ia.concat(extra) if len(ia) else extra


def _store_recorded_runs(trace: Trace) -> None:
    """Paddle's own figures per place, as ``RecordedRun`` facts (host places: allocated only)."""
    from ..inference.recorded import RecordedRun, set_recorded_run

    series = trace.table("recorded_series")
    for device in sorted(int(d) for d in np.unique(series["device"])):
        mine = series["device"] == device
        allocated = series["allocated_bytes"][mine]
        allocated = allocated[allocated >= 0]
        reserved = series["reserved_bytes"][mine]
        reserved = reserved[reserved >= 0] if device >= 0 else reserved[:0]
        set_recorded_run(trace, RecordedRun(
            device=device, allocator="paddle" if device >= 0 else "paddle-host",
            peak_reserved_bytes=int(reserved.max()) if len(reserved) else None,
            peak_allocated_bytes=int(allocated.max()) if len(allocated) else None,
            start_reserved_bytes=int(reserved[0]) if len(reserved) else None,
            final_reserved_bytes=int(reserved[-1]) if len(reserved) else None))
