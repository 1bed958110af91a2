"""Read the trace entries of a well-formed PyTorch snapshot at C speed: ``entry_columns(...)``.

Field access and type checks run as ``map`` / ``set`` / numpy calls over whole lists instead of a
Python loop per entry. Anything unusual (a missing key, a value of the wrong type or range, time
going back, a bad frame) makes ``entry_columns`` return ``None``; the reader then parses the file
with its entry-by-entry reference path, which names the bad record and makes lenient repairs.
"""

from __future__ import annotations

from itertools import repeat
from operator import itemgetter
from typing import Any

import numpy as np

from ....errors import TraceFormatError
from ...reading.builder import MAX_SIZE_BYTES
from ...reading.columnar import OP_ALLOC, OP_FREE_COMPLETED, OP_FREE_REQUESTED, OP_MARKER, OP_NONE, Records
from ...reading.frames import FrameTable

_CODES = {"alloc": OP_ALLOC, "free_requested": OP_FREE_REQUESTED, "free_completed": OP_FREE_COMPLETED,
          "snapshot": OP_MARKER, "segment_alloc": OP_NONE, "segment_free": OP_NONE, "segment_map": OP_NONE,
          "segment_unmap": OP_NONE, "oom": OP_NONE}
_ACTION_NAMES = list(_CODES)
_ACTION_INDEX = {name: i for i, name in enumerate(_ACTION_NAMES)}
_NO_ADDR = {"oom", "snapshot"}
_INT64_MAX = (1 << 63) - 1
_INT64_MIN = -(1 << 63)
_base = itemgetter("action", "size", "stream")


def _all_int(values: Any) -> bool:
    kinds = set(map(type, values))
    return not kinds or kinds == {int}


def _int64(values: list, lo: int = _INT64_MIN, hi: int = _INT64_MAX) -> np.ndarray | None:
    if not _all_int(values):
        return None
    try:
        arr = np.array(values, dtype=np.int64)
    except OverflowError:
        return None
    if len(arr) and (int(arr.min()) < lo or int(arr.max()) > hi):
        return None
    return arr


class DeviceEntries:
    """One device's entries as columns (action index into ``ACTION_NAMES``)."""

    __slots__ = ("action", "size", "stream", "addr", "t_ns", "stack", "extra")

    def __init__(self, action, size, stream, addr, t_ns, stack, extra):
        self.action, self.size, self.stream, self.addr = action, size, stream, addr
        self.t_ns, self.stack, self.extra = t_ns, stack, extra


ACTION_NAMES = _ACTION_NAMES


def _device_columns(raw: list, has_time: bool, step_ns: int, max_time_us: int,
                    frames: FrameTable | None, record: str) -> DeviceEntries | None:
    n = len(raw)
    if n == 0:
        e = np.empty(0, np.int64)
        return DeviceEntries(np.empty(0, np.int8), e, e, e, e, np.empty(0, np.int32), e)
    if set(map(type, raw)) != {dict}:
        return None
    try:
        base = list(map(_base, raw))
    except (KeyError, TypeError):
        return None
    actions, sizes, streams = zip(*base)
    del base
    if set(map(type, actions)) != {str}:
        return None
    codes = list(map(_ACTION_INDEX.get, actions))
    del actions
    if None in codes:
        return None
    action = np.array(codes, dtype=np.int8)
    del codes
    size = _int64(sizes, 0, MAX_SIZE_BYTES)
    stream = _int64(streams)
    del sizes, streams
    if size is None or stream is None:
        return None
    addrs = list(map(dict.get, raw, repeat("addr"), repeat(-1)))
    addr = _int64(addrs)
    if addr is None:
        return None
    needs_addr = ~np.isin(action, [_ACTION_INDEX[a] for a in _NO_ADDR])
    if bool((addr[needs_addr] < 0).any()):
        return None
    addr = np.where(needs_addr, addr, -1)
    if has_time:
        t_us = _int64(list(map(dict.get, raw, repeat("time_us"))), 0, max_time_us)
        if t_us is None:
            return None
        t_ns = t_us * 1000
        if n > 1 and bool((np.diff(t_ns) < 0).any()):
            return None
    else:
        t_ns = np.arange(n, dtype=np.int64) * step_ns
    extra = np.full(n, -1, dtype=np.int64)
    oom_rows = np.flatnonzero(action == _ACTION_INDEX["oom"])
    for i in oom_rows.tolist():
        e = raw[i]
        key = "device_free" if "device_free" in e else ("addr" if "addr" in e else None)
        if key is not None:
            v = e[key]
            if type(v) is not int or not 0 <= v <= _INT64_MAX:
                return None
            extra[i] = v
    if frames is None:       # frames not wanted
        stacks = [-1] * n
    else:
        try:
            stacks = frames.stack_ids(list(map(dict.get, raw, repeat("frames"))), record)
        except TraceFormatError:
            return None
    return DeviceEntries(action, size, stream, addr, t_ns, np.array(stacks, dtype=np.int32), extra)


def entry_columns(raw_traces: list, has_time: bool, step_ns: int, max_time_us: int,
                  frames: FrameTable | None) -> list[DeviceEntries] | None:
    """Columns of every device's entries, or None when any entry needs the reference path (``frames``
    None: stack frames not read)."""
    out = []
    for device, raw in enumerate(raw_traces):
        if not isinstance(raw, list):
            return None
        cols = _device_columns(raw, has_time, step_ns, max_time_us, frames, f"device {device}")
        if cols is None:
            return None
        out.append(cols)
    return out


def merged_records(per_device: list[DeviceEntries]) -> tuple[Records, np.ndarray, np.ndarray]:
    """All devices' entries in time order (ties: device order, then recorded order).

    Returns the builder's records, the action index of each record, and its oom ``extra``.
    """
    devs = [np.full(len(d.action), i, dtype=np.int64) for i, d in enumerate(per_device)]
    cat = lambda name: np.concatenate([getattr(d, name) for d in per_device]) if per_device else np.empty(0)
    t = cat("t_ns").astype(np.int64)
    order = np.argsort(t, kind="stable") if len(per_device) > 1 else np.arange(len(t))
    action = cat("action").astype(np.int8)[order]
    op = np.array([_CODES[a] for a in _ACTION_NAMES], dtype=np.uint8)[action] if len(action) else np.empty(0, np.uint8)
    size = cat("size").astype(np.int64)[order]
    rec = Records(
        t_ns=t[order],
        op=op,
        device=(np.concatenate(devs) if devs else np.empty(0, np.int64))[order],
        stream=cat("stream").astype(np.int64)[order],
        addr=cat("addr").astype(np.int64)[order],
        size=size,
        stack_id=cat("stack").astype(np.int32)[order],
        label=np.zeros(len(order), dtype=np.int64),
    )
    return rec, action, cat("extra").astype(np.int64)[order]
