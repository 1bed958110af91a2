"""RMM ``logging_resource_adaptor`` CSV logs (plain or gzip): start with ``read_rmm_csv(path)``.

The header names the columns (``Thread,Time,Action,Pointer,Size,Stream``; order and extra columns
are taken from the header). ``Action``, ``Pointer`` and ``Size`` are required; without ``Time`` the
row number is used as the time (``meta.time_synthesized``), without ``Stream`` every row is on
stream 0. Every variant RMM has written is accepted:

* ``Time`` ``HH:MM:SS.ffffff`` (since 2021) or ``HH:MM:SS:ffffff`` (older), 0-9 fraction digits,
  converted exactly to integer ns since midnight. A log has no date: time going back by more than
  12 h is taken as midnight passing (a day is added, and noted); smaller steps back are the
  builder's business (an error, or clamped under ``lenient``).
* ``Pointer`` and ``Stream`` in hex with or without ``0x``; ``(nil)``, ``nullptr``, ``0x0`` or an
  empty field is null (stream 0 is the default stream).
* ``Action`` ``allocate``, ``free`` (fed to the builder with the logged size) and
  ``allocate failure`` (not a request: a ``decisions`` row with action ``"oom"``, the requested
  size, and ``addr`` -1).

The log has no device column: every row is on ``device`` (default 0). Allocations and frees of
null pointers with size 0 (what ``allocate(0)`` returns in some resources) are skipped and counted.

Bad input (empty file, missing columns, wrong field count, non-numeric ``Size``, unparseable time,
pointer or stream, unknown action) raises ``TraceFormatError`` naming the file, the line and the
reason. With ``lenient=True``: a bad time takes the previous row's time, a bad stream becomes 0, a
free with a bad size uses the allocated size, other bad rows are skipped; each is listed in
``meta.repairs``.
"""

from __future__ import annotations

import io
import re
import zlib

import numpy as np

from ....errors import TraceFormatError
from ...reading.builder import MAX_SIZE_BYTES, TraceBuilder
from ...reading.columnar import OP_ALLOC, OP_FREE, OP_NONE, Records, build_columns
from ...reading.limits import DEFAULT_LIMITS, Limits, LimitExceeded, check_count, open_binary, read_bytes
from .fast import rmm_columns
from ...schema import (
    DECISION_DTYPES,
    EVENT_DTYPES,
    INITIAL_ALLOC_DTYPES,
    Trace,
    check_schema,
    frame_from_columns,
)

HEADER = ("thread", "time", "action", "pointer", "size", "stream")
REQUIRED = ("action", "pointer", "size")
NS_PER_DAY = 86_400 * 10**9
HALF_DAY_NS = NS_PER_DAY // 2

_TIME_RE = re.compile(r"(\d{1,2}):(\d{2}):(\d{2})(?:([.:])(\d{0,9}))?")
_HEX_RE = re.compile(r"(0[xX])?([0-9a-fA-F]{1,16})")
_SIZE_RE = re.compile(r"[0-9]{1,20}")
_NULLS = {"", "(nil)", "nil", "nullptr", "null", "(null)"}
_INT64_MAX = (1 << 63) - 1
_MAX_THREADS_KEPT = 10_000


def parse_time_ns(text: str) -> tuple[int, str] | None:
    """``"13:04:05.000123"`` -> (ns since midnight, separator before the fraction), or None if malformed."""
    m = _TIME_RE.fullmatch(text)
    if not m:
        return None
    h, mi, s = int(m.group(1)), int(m.group(2)), int(m.group(3))
    if h > 23 or mi > 59 or s > 60:
        return None
    frac = m.group(5) or ""
    ns = ((h * 60 + mi) * 60 + s) * 10**9 + int((frac + "000000000")[:9])
    return ns, m.group(4) or ""


def parse_hex(text: str) -> tuple[int, bool] | None:
    """A pointer/stream in hex (``0x`` optional; null spellings -> 0) -> (value as int64 bits, had 0x)."""
    low = text.lower()
    if low in _NULLS:
        return 0, False
    m = _HEX_RE.fullmatch(text)
    if not m:
        return None
    value = int(m.group(2), 16)
    if value > _INT64_MAX:
        value -= 1 << 64  # same bits, stored in the int64 columns
    return value, bool(m.group(1))


def _lines(source):
    """Yield (line number, text) of a binary stream, decoding bad bytes as U+FFFD."""
    text = io.TextIOWrapper(source, encoding="utf-8", errors="replace", newline=None)
    for number, line in enumerate(text, start=1):
        yield number, line


def _header_of(data: bytes) -> tuple[int, int, bytes] | None:
    """(line number, byte offset after it, text) of the first non-empty line, or None."""
    pos, number = 0, 0
    while pos < len(data):
        end = data.find(b"\n", pos)
        end = len(data) if end < 0 else end + 1
        number += 1
        line = data[pos:end]
        if line.strip():
            return number, end, line
        pos = end
    return None


def read_rmm_csv(path, *, lenient: bool = False, device: int = 0, limits: Limits | None = None) -> Trace:
    """Read an RMM logging_resource_adaptor CSV log into a ``Trace`` (see module doc)."""
    path = str(path)
    limits = limits or DEFAULT_LIMITS
    if not -(1 << 15) <= int(device) < (1 << 15):
        raise ValueError(f"device {device} does not fit in int16")
    device = int(device)
    try:
        data = read_bytes(path, limits)
    except LimitExceeded:
        raise
    except TraceFormatError:
        data = None        # damaged: the line-by-line path reads what it can and says where it stopped
    if data is not None:
        trace = _read_columnar(path, data, device, limits)
        if trace is not None:
            return trace
    source = io.BytesIO(data) if data is not None else open_binary(path, limits)
    try:
        return _read_lines(path, source, lenient, device, limits)
    finally:
        source.close()


def _read_columnar(path: str, data: bytes, device: int, limits: Limits) -> Trace | None:
    """The trace of a clean log from columns, or None when the line-by-line path must read it."""
    head = _header_of(data)
    if head is None:
        return None
    number, header_end, line = head
    text = line.decode("utf-8", "replace").strip()
    if number == 1:
        text = text.lstrip("\ufeff")
    fields = [f.strip() for f in text.split(",")]
    columns = _parse_header(path, f"line {number}", fields)
    cols = rmm_columns(data, columns, len(fields), header_end)
    if cols is None:
        return None
    check_count(path, "events", len(cols.action), limits, "rows", None)
    n = len(cols.action)
    skip = (cols.pointer == 0) & (cols.action != 2)          # null pointer, size 0 (checked)
    keep = np.flatnonzero(~skip)
    t_ns = cols.t_ns if cols.t_ns is not None else np.arange(n, dtype=np.int64)
    op = np.array([OP_ALLOC, OP_FREE, OP_NONE], dtype=np.uint8)[cols.action]
    stream = cols.stream if cols.stream is not None else np.zeros(n, dtype=np.int64)
    if len(stream) and int(stream.min()) != int(stream.max()):
        check_count(path, "streams", len(np.unique(stream)), limits, "streams", None)
    rec = Records(t_ns=t_ns[keep], op=op[keep], device=np.full(len(keep), device, dtype=np.int64),
                  stream=stream[keep], addr=cols.pointer[keep], size=cols.size[keep],
                  stack_id=np.full(len(keep), -1, dtype=np.int32), label=np.zeros(len(keep), dtype=np.int64))
    built = build_columns(rec)
    if built is None:
        return None
    builder = TraceBuilder(path, "rmm-csv")
    fail = np.flatnonzero(rec.op == OP_NONE)
    decisions = {
        "event_index": built.row_event[fail], "t_ns": rec.t_ns[fail],
        "action": np.array(["oom"] * len(fail), dtype=object),
        "addr": np.where(rec.addr[fail] != 0, rec.addr[fail], -1), "size_bytes": rec.size[fail],
        "stream": rec.stream[fail], "device": rec.device[fail],
        "alloc_id": np.full(len(fail), -1, np.int64), "device_free_bytes": np.full(len(fail), -1, np.int64)}
    if built.orphan_frees:
        builder.meta.notes.append(
            f"{built.orphan_frees} frees of blocks allocated before the trace began; "
            "they are in the initial state with the size the free reported")
    trace = Trace(events=frame_from_columns(built.events, EVENT_DTYPES), meta=builder.meta,
                  initial_allocs=frame_from_columns(built.initial, INITIAL_ALLOC_DTYPES),
                  decisions=frame_from_columns(decisions, DECISION_DTYPES))
    styles = {"time_separator": cols.time_separators, "pointer_0x": cols.pointer_0x, "stream_0x": cols.stream_0x}
    threads = min(cols.threads, _MAX_THREADS_KEPT) if cols.threads is not None else 0
    _describe(builder.meta, columns, len(fields), styles, threads, device, wraps=0,
              failures=len(fail), null_zero=int(skip.sum()), rows=n)
    check_schema(trace)
    return trace


def _read_lines(path: str, source, lenient: bool, device: int, limits: Limits) -> Trace:
    """The reference path: one line at a time, naming the first bad line or repairing it."""
    builder = TraceBuilder(path, "rmm-csv", lenient=lenient)
    meta = builder.meta

    columns: dict[str, int] | None = None
    ncols = 0
    header_line = 0
    last_abs: int | None = None
    day = 0
    wraps = 0
    rows = 0
    null_zero = 0
    failures = 0
    threads: set[str] = set()
    styles = {"time_separator": set(), "pointer_0x": set(), "stream_0x": set()}

    try:
        for number, line in _lines(source):
            line = line.strip()
            if number == 1:
                line = line.lstrip("\ufeff")
            if not line:
                continue
            record = f"line {number}"
            fields = [f.strip() for f in line.split(",")]
            if columns is None:
                columns, ncols = _parse_header(path, record, fields), len(fields)
                header_line = number
                continue
            rows += 1
            if len(fields) != ncols:
                builder.problem(record, f"expected {ncols} comma-separated fields, got {len(fields)}",
                                "skipped the row")
                continue

            action = fields[columns["action"]].lower()
            if action not in ("allocate", "free", "allocate failure"):
                builder.problem(record, f"unknown action {fields[columns['action']][:40]!r} "
                                "(expected allocate, free or allocate failure)", "skipped the row")
                continue

            # Time -----------------------------------------------------------------
            if "time" in columns:
                raw_time = fields[columns["time"]]
                parsed = parse_time_ns(raw_time)
                if parsed is None:
                    builder.problem(record, f"unparseable time {raw_time[:40]!r} (expected HH:MM:SS.micro)",
                                    "used the previous row's time")
                    t_ns = last_abs if last_abs is not None else 0
                else:
                    t_raw, sep = parsed
                    styles["time_separator"].add(sep)
                    t_ns = t_raw + day * NS_PER_DAY
                    if last_abs is not None and t_ns < last_abs - HALF_DAY_NS:
                        day += 1
                        wraps += 1
                        t_ns += NS_PER_DAY
                    elif day and t_ns > last_abs + HALF_DAY_NS:
                        t_ns -= NS_PER_DAY  # a late row from before the midnight we already passed
                    last_abs = t_ns if last_abs is None else max(last_abs, t_ns)
            else:
                t_ns = rows - 1

            # Size, pointer, stream ---------------------------------------------------
            raw_size = fields[columns["size"]]
            size: int | None = int(raw_size) if _SIZE_RE.fullmatch(raw_size) else None
            if size is None:
                reason = f"Size {raw_size[:40]!r} is not a non-negative integer (RMM logs sizes in decimal)"
                if action == "free":
                    builder.problem(record, reason, "used the allocated size")
                else:
                    builder.problem(record, reason, "skipped the row")
                    continue
            elif size > MAX_SIZE_BYTES:
                builder.problem(record, f"absurd size {size} bytes (> {MAX_SIZE_BYTES})", "skipped the row")
                continue

            raw_ptr = fields[columns["pointer"]]
            ptr = parse_hex(raw_ptr)
            if ptr is None:
                builder.problem(record, f"unparseable pointer {raw_ptr[:40]!r}", "skipped the row")
                continue
            addr = ptr[0]
            if addr:
                styles["pointer_0x"].add(ptr[1])

            stream = 0
            if "stream" in columns:
                raw_stream = fields[columns["stream"]]
                parsed_stream = parse_hex(raw_stream)
                if parsed_stream is None:
                    builder.problem(record, f"unparseable stream {raw_stream[:40]!r}", "used stream 0")
                else:
                    stream = parsed_stream[0]
                    if stream:
                        styles["stream_0x"].add(parsed_stream[1])

            if "thread" in columns and len(threads) < _MAX_THREADS_KEPT:
                threads.add(fields[columns["thread"]])

            # Feed ---------------------------------------------------------------------
            if action == "allocate failure":
                failures += 1
                if t_ns < builder.last_t_ns:
                    builder.problem(record, f"time goes back from {builder.last_t_ns} ns to {t_ns} ns",
                                    "clamped to the previous time")
                    t_ns = builder.last_t_ns
                builder.decision(builder.next_event_index, t_ns, "oom", addr if addr else -1,
                                 size if size is not None else 0, stream, device)
                continue
            if addr == 0:
                if size == 0:
                    null_zero += 1
                    continue
                builder.problem(record, f"null pointer in a{'n' if action[0] == 'a' else ''} {action} row "
                                f"of {raw_size} bytes (only valid in 'allocate failure')", "skipped the row")
                continue
            if action == "allocate":
                builder.alloc(record, t_ns, device, stream, addr, size)
            else:
                builder.free(record, t_ns, device, stream, addr, size)
    except (OSError, EOFError, zlib.error) as exc:
        where = f"after line {header_line + rows}" if columns is not None else None
        if not lenient or columns is None:
            raise TraceFormatError(path, where, f"cannot read: {type(exc).__name__}: {exc}") from None
        builder.repair(where, f"file is truncated or corrupt ({type(exc).__name__}); kept the rows before")

    if columns is None:
        raise TraceFormatError(path, None, "empty file (no header line)")
    _describe(meta, columns, ncols, styles, len(threads), device, wraps, failures, null_zero, rows)
    return builder.finish()


def _describe(meta, columns: dict[str, int], ncols: int, styles: dict, threads: int, device: int,
              wraps: int, failures: int, null_zero: int, rows: int) -> None:
    """Version hints and notes of a log (both paths)."""
    hints = meta.version_hints
    hints["columns"] = [name for name, _ in sorted(columns.items(), key=lambda kv: kv[1])]
    if ncols > len(columns):
        hints["extra_columns"] = ncols - len(columns)
    seps = styles["time_separator"]
    if seps:
        hints["time_format"] = "/".join(sorted(
            {".": "HH:MM:SS.micro (RMM >= 2021)", ":": "HH:MM:SS:micro (RMM < 2021)",
             "": "HH:MM:SS"}[s if s is not None else ""] for s in seps))
    for key in ("pointer_0x", "stream_0x"):
        if styles[key]:
            hints[key.replace("_0x", "_style")] = "/".join(
                sorted("0x-prefixed hex" if v else "bare hex" for v in styles[key]))
    if threads:
        hints["threads"] = threads
    hints["device"] = device
    meta.devices = [device]
    meta.notes.append(f"RMM logs have no device column: every row is on device {device}")
    if "time" not in columns:
        meta.time_synthesized = True
        meta.notes.append("no Time column: the row number is used as the time in ns")
    if "stream" not in columns:
        meta.notes.append("no Stream column: every row is on stream 0")
    if wraps:
        meta.notes.append(f"the time of day went back by more than 12 h {wraps} time(s): "
                          "taken as midnight passing (a day added each time)")
    if failures:
        meta.notes.append(f"{failures} 'allocate failure' rows are in decisions as 'oom' (no request event)")
    if null_zero:
        meta.notes.append(f"{null_zero} rows of 0 bytes at a null pointer skipped")
    if rows == 0:
        meta.notes.append("the log has a header but no rows")


def _parse_header(path: str, record: str, fields: list[str]) -> dict[str, int]:
    names = [f.lower() for f in fields]
    columns: dict[str, int] = {}
    for i, name in enumerate(names):
        if name in HEADER:
            if name in columns:
                raise TraceFormatError(path, record, f"column {fields[i]!r} appears twice in the header")
            columns[name] = i
    missing = [c for c in REQUIRED if c not in columns]
    if missing:
        shown = ",".join(fields)[:120]
        raise TraceFormatError(
            path, record, f"not an RMM log header: missing column(s) {', '.join(m.capitalize() for m in missing)} "
            f"(expected Thread,Time,Action,Pointer,Size,Stream; got {shown!r})")
    return columns
