"""The compiled readers against the Python reference route: the same Trace, or the same error, every time.

Each compiled part (``allocsim.trace._readers``) either returns exactly what the reference returns
or hands the input back, and the reader then takes the reference route. These tests read the same
bytes on both routes (``allocsim.policies.kernel.route``) and compare every table, the labels and
the metadata, or the error's class and message: every shared real file, and files that hypothesis
generates, valid and hostile (wrong types, shared and repeated objects, corrupt bytes). The
compiled parts are also tested alone against their Python twins (records builder, events check)
and on the hostile opcodes that must cost nothing.
"""

from __future__ import annotations

import gzip
import json
import pickle
import struct
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocsim.errors import TraceFormatError
from allocsim.policies import kernel
from allocsim.trace import Trace, read_trace, write_trace
from allocsim.trace.reading import compiled
from allocsim.trace.reading.columnar import (
    OP_ALLOC, OP_EMPTY_CACHE, OP_FREE, OP_FREE_COMPLETED, OP_FREE_REQUESTED, OP_MARKER, OP_NONE, Records,
    build_columns, build_columns_reference,
)
from allocsim.trace.reading.limits import DEFAULT_LIMITS
from allocsim.trace.inference.stats import live_bytes_series, live_bytes_series_reference
from allocsim.trace.schema import EVENT_DTYPES, EventKind, INITIAL_ALLOC_DTYPES, TraceMeta, frame_from_columns
from allocsim.trace.transport import TABLES

pytestmark = pytest.mark.skipif(compiled.ext is None, reason=f"compiled readers not built: {compiled.LOAD_ERROR}")

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
REPO_TRACES = Path(__file__).resolve().parents[1] / "traces"
_FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))


# ---------------------------------------------------------------------- helpers
def outcome(path: Path, route: str, **kwargs):
    """("trace", Trace) or ("error", class name, message) of reading ``path`` on ``route``."""
    with kernel.route(route):
        try:
            return ("trace", read_trace(path, **kwargs))
        except TraceFormatError as exc:
            return ("error", type(exc).__name__, str(exc))


def assert_same_trace(a: Trace, b: Trace) -> None:
    for name in TABLES:
        pd.testing.assert_frame_equal(getattr(a, name).reset_index(drop=True), getattr(b, name).reset_index(drop=True),
                                      check_dtype=True, obj=name)
    assert a.labels == b.labels
    assert a.meta.to_dict() == b.meta.to_dict()


def assert_routes_agree(path: Path, **kwargs) -> tuple:
    got, ref = outcome(path, "compiled", **kwargs), outcome(path, "reference", **kwargs)
    assert got[0] == ref[0], (got[:3], ref[:3])
    if got[0] == "trace":
        assert_same_trace(got[1], ref[1])
    else:
        assert got == ref
    return got


# ---------------------------------------------------------------------- the switch
def test_route_follows_the_kernel_switch(monkeypatch):
    with kernel.route("reference"):
        assert not compiled.active() and compiled.status()["route"] == "reference"
    with kernel.route("compiled"):
        assert compiled.active() and compiled.status()["route"] == "compiled"
    monkeypatch.setattr(compiled, "ext", None)
    with kernel.route("auto"):
        assert not compiled.active() and compiled.status()["route"] == "reference"
    with kernel.route("compiled"), pytest.raises(compiled.ReadersUnavailable, match="ALLOCSIM_KERNEL"):
        compiled.active()


def test_version_line_names_the_readers_route(monkeypatch):
    from allocsim.cli import version_line

    with kernel.route("reference"):
        assert "readers: reference" in version_line()
    with kernel.route("compiled"):
        assert "readers: compiled" in version_line()


# ---------------------------------------------------------------------- real files
def _shared(pattern: str) -> list[Path]:
    return sorted(SHARED.glob(pattern)) if SHARED.is_dir() else []


@pytest.mark.full
@pytest.mark.shared
@pytest.mark.parametrize("name", [p.name for p in _shared("*/*.pickle")] or ["none"])
def test_shared_snapshots_agree(shared_dir, name):
    path = next(p for p in _shared("*/*.pickle") if p.name == name)
    kind = assert_routes_agree(path)
    assert kind[0] == "trace"


@pytest.mark.full
@pytest.mark.shared
@pytest.mark.parametrize("name", [p.name for p in _shared("kineto-gpu/*.json.gz")] or ["none"])
def test_shared_kineto_files_agree(shared_dir, name):
    assert_routes_agree(next(p for p in _shared("kineto-gpu/*.json.gz") if p.name == name))


@pytest.mark.full
@pytest.mark.parametrize("path", sorted(REPO_TRACES.glob("*.json.gz")), ids=lambda p: p.name)
def test_repository_kineto_captures_agree(path):
    assert assert_routes_agree(path)[0] == "trace"


@pytest.mark.shared
def test_snapshot_without_frames_agrees(shared_dir):
    from allocsim.trace.formats.snapshot.reader import read_snapshot

    path = _shared("pytorch-snapshots/*.pickle")[0]
    with kernel.route("compiled"):
        got = read_snapshot(path, frames=False)
    with kernel.route("reference"):
        ref = read_snapshot(path, frames=False)
    assert_same_trace(got, ref)
    assert (got.events["stack_id"] == -1).all() and not len(got.frames)


# ---------------------------------------------------------------------- generated snapshots
_ACTIONS = ["alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
            "segment_unmap", "oom", "snapshot"]
_odd = st.sampled_from([None, True, 1.5, "7", -1, 1 << 70, [1], {"a": 1}])


@st.composite
def _frame(draw):
    frame = {}
    if draw(st.booleans()):
        frame["filename"] = draw(st.sampled_from(["a.py", "b.py", "\u00e9.py", ""]) | _odd)
    if draw(st.booleans()):
        frame["line"] = draw(st.integers(0, 3) | _odd)
    if draw(st.integers(0, 9)):
        frame["name"] = draw(st.sampled_from(["f", "g", "h"]))
    return frame


@st.composite
def snapshot_objects(draw):
    """A snapshot-like object: half of them well-formed (shared objects included), half with odd values mixed in."""
    clean = draw(st.booleans())
    odd = (lambda n: draw(st.integers(0, n)) == 0) if not clean else (lambda n: False)
    frames_pool = draw(st.lists(_frame(), min_size=1, max_size=4)) if not clean else [
        {"filename": "a.py", "line": k, "name": "f"} for k in range(draw(st.integers(1, 4)))]
    shared_lists = [[frames_pool[i % len(frames_pool)] for i in range(k)] for k in (1, 2, 3)]

    def frames_value():
        choice = draw(st.integers(0, 9))
        if choice <= 3:
            return draw(st.sampled_from(shared_lists))                     # the same list object again
        if choice <= 6 or clean:
            return [draw(st.sampled_from(frames_pool)) for _ in range(draw(st.integers(0, 3)))]
        return draw(st.sampled_from([None, [], ["x"], "frames", ({},)]))

    addrs = [512 * k for k in range(1, 6)]
    devices = []
    for _ in range(draw(st.integers(0, 2))):
        entries, t = [], 0
        for _ in range(draw(st.integers(0, 10))):
            t += draw(st.integers(-1 if odd(20) else 0, 5))
            e = {"action": draw(_odd) if odd(30) else draw(st.sampled_from(_ACTIONS)),
                 "size": draw(_odd) if odd(30) else draw(st.sampled_from([512, 512, 1024, 2 << 20])),
                 "stream": draw(_odd) if odd(20) else 0}
            if not odd(20):
                e["addr"] = draw(st.sampled_from(addrs))
            if not odd(15):
                e["time_us"] = t
            if draw(st.booleans()):
                e["frames"] = frames_value()
            if draw(st.integers(0, 8)) == 0:
                e[draw(st.sampled_from(["user_metadata", "compile_context", "device_free"]))] = draw(
                    st.integers(0, 4) if clean else st.integers(0, 4) | _odd)
            entries.append(e)
        if entries and draw(st.integers(0, 6)) == 0:
            entries.append(entries[draw(st.integers(0, len(entries) - 1))])   # one dict object twice
        devices.append(entries)
    segments = []
    for k in range(draw(st.integers(0, 2))):
        blocks = []
        for j in range(draw(st.integers(0, 3))):
            states = ["active_allocated", "inactive", "active_pending_free"] + ([] if clean else ["bogus"])
            blk = {"size": draw(st.sampled_from([512, 1024])), "state": draw(st.sampled_from(states))}
            if draw(st.booleans()):
                blk["address"] = (k + 1) * (4 << 20) + 1024 * j
            if draw(st.booleans()):
                blk["frames"] = frames_value()
            blocks.append(blk)
        seg = {"address": (k + 1) * (4 << 20), "total_size": draw(st.sampled_from([2 << 20, 4 << 20])),
               "stream": 0, "blocks": blocks}
        if draw(st.booleans()):
            seg["segment_type"] = draw(st.sampled_from(["small", "large", None] + ([] if clean else ["huge"])))
        if draw(st.booleans()):
            seg["is_expandable"] = draw(st.sampled_from([True, False] + ([] if clean else [1])))
        segments.append(seg)
    if draw(st.integers(0, 12)) == 0:
        return segments                                                # the pre-2.0 bare list
    snap = {"segments": segments, "device_traces": devices}
    if draw(st.booleans()):
        snap["allocator_settings"] = draw(st.sampled_from([
            {"max_split_size": -1, "garbage_collection_threshold": 0.0, "expandable_segments": False},
            {"max_split_size": (1 << 64) - 1, "roundup_power2_divisions": [1, 2]},
            {"max_split_size": None}, {"roundup_power2_divisions": {"1": [2]}}, [1, 2], {"a": (1, 2)}]))
    return snap


def _mutate(data: bytes, draw) -> bytes:
    kind = draw(st.integers(0, 5))
    if kind == 0 and len(data) > 4:                                   # truncate
        return data[:draw(st.integers(1, len(data) - 1))]
    if kind == 1 and len(data) > 4:                                   # flip bytes
        out = bytearray(data)
        for _ in range(draw(st.integers(1, 3))):
            out[draw(st.integers(2, len(out) - 1))] = draw(st.integers(0, 255))
        return bytes(out)
    return data


@pytest.mark.full
@_FUZZ
@given(obj=snapshot_objects(), protocol=st.integers(2, 5), data=st.data())
def test_generated_snapshots_agree(tmp_path_factory, obj, protocol, data):
    raw = pickle.dumps(obj, protocol=protocol)
    if data.draw(st.integers(0, 3)) == 0:
        raw = _mutate(raw, data.draw)
    path = tmp_path_factory.mktemp("snap") / "s.pickle"
    path.write_bytes(gzip.compress(raw) if data.draw(st.integers(0, 5)) == 0 else raw)
    assert_routes_agree(path, lenient=data.draw(st.booleans()))


@pytest.mark.parametrize("blob", [
    b"\x80\x02]r\xff\xff\xff\x7f.",                                   # memo index 2**31-1 (valid pickle)
    b"\x80\x02]r\xff\xff\xff\xffh\x00\x00\x00\x00.",                  # GET of a slot never PUT
    b"\x80\x04\x95" + struct.pack("<Q", 1 << 62) + b"].",             # FRAME claiming 4 EiB
    b"\x80\x04\x8d" + struct.pack("<Q", 1 << 62) + b"abc.",           # BINUNICODE8 of 4 EiB
    b"\x80\x04X" + struct.pack("<I", 0xFFFFFFFF) + b"a.",            # BINUNICODE of 4 GiB
    b"\x80\x04\x8b" + struct.pack("<I", 0xFFFFFFF0) + b"\x01.",      # LONG4 of 4 GiB
    b"\x80\x04\x8e" + struct.pack("<Q", 1 << 40) + b"abc.",           # BINBYTES8 (not modelled)
    b"\x80\x04cos\nsystem\n.",                                        # a global: never modelled
    b"\x80\x04" + b"(" * 100_000 + b".",                              # a hundred thousand marks
], ids=["memo-index", "get-unset", "frame-length", "binunicode8", "binunicode", "long4", "binbytes8", "global",
        "marks"])
def test_hostile_opcodes_cost_the_scan_nothing(blob):
    """The interpreter checks every index and length against what it has and hands such files back."""
    start = time.perf_counter()
    got = compiled.ext.snapshot_scan(blob, 64 << 20, 10, 100, 10, 10, 10, (1 << 63) // 1000, 1000, True)
    assert got is None or got["top_is_list"]          # only the memo-index pickle is data (an empty list)
    assert time.perf_counter() - start < 1.0


def test_scan_memory_is_capped():
    """More than limits.memory_bytes of tree: handed back with the bytes it wanted (the caller names the cap)."""
    entries = [{"action": "alloc", "addr": 512 * i, "size": 512, "stream": 0} for i in range(20_000)]
    blob = pickle.dumps({"segments": [], "device_traces": [entries]}, protocol=4)
    args = (DEFAULT_LIMITS.frames, 100, 10, 10, 1 << 30, (1 << 63) // 1000, 1000, True)
    assert compiled.ext.snapshot_scan(blob, 1 << 30, *args) is not None
    wanted = compiled.ext.snapshot_scan(blob, 1 << 20, *args)
    assert isinstance(wanted, int) and wanted > 1 << 20


# ---------------------------------------------------------------------- generated Kineto traces
_CATS = ["cpu_op", "python_function", "user_annotation", "Operator", "kernel", "gpu_user_annotation", 7]
_NAMES = ["aten::add", "a.py(3): f", "b.py(012): g", "ProfilerStep#1", "ProfilerStep#2", "[memory]", "x\"y",
          "\u00e9t\u00e9", "[OutOfMemory]"]


@st.composite
def chrome_documents(draw):
    clean = draw(st.booleans())
    events = []
    addrs = [4096 * k for k in range(1, 5)]
    pid_tid = st.sampled_from([(1, 1), (1, 2), ("p", 1), (1, None), (True, 1)] + ([] if clean else [(1.5, 1)]))
    for _ in range(draw(st.integers(0, 14))):
        kind = draw(st.integers(0, 9))
        pid, tid = draw(pid_tid)
        ts = draw(st.sampled_from([10, 20.5, 30.125, 60, 70.000, -5] + ([] if clean else [40.1234, "50.5", 1e3])))
        if kind <= 4:
            args = {"Addr": draw(st.sampled_from(addrs)) if clean or draw(st.integers(0, 20)) else draw(_odd),
                    "Bytes": draw(st.sampled_from([512, -512, 1024, -1024, 0])),
                    "Device Type": draw(st.sampled_from([1, 1, 0, 6, 3])), "Device Id": draw(st.sampled_from([0, 0, 1, -1]))}
            if draw(st.booleans()):
                args["Total Allocated"] = draw(st.sampled_from([512, 1024, None, -1, 1 << 70] + ([] if clean else ["5"])))
            if draw(st.booleans()):
                args["Total Reserved"] = draw(st.sampled_from([2 << 20, None]))
            if not clean and draw(st.integers(0, 10)) == 0:
                del args[draw(st.sampled_from(list(args)))]
            events.append({"ph": "i", "name": "[memory]", "ts": ts, "pid": pid, "tid": tid, "args": args})
        elif kind <= 7:
            events.append({"ph": draw(st.sampled_from(["X", "X", "i"])), "cat": draw(st.sampled_from(_CATS)),
                           "name": draw(st.sampled_from(_NAMES)), "ts": ts,
                           "dur": draw(st.sampled_from([5, 100, 0.5, -1, 1000])), "pid": pid, "tid": tid})
        elif kind == 8:
            events.append({"ph": "i", "name": "[OutOfMemory]", "ts": ts, "pid": pid, "tid": tid,
                           "args": {"Bytes": draw(st.sampled_from([1 << 30, -1])), "Device Type": 1, "Device Id": 0}})
        else:
            events.append(draw(st.sampled_from([{"ph": "M", "name": "process_name", "args": {"name": "x"}}, 5, []])))
    if draw(st.integers(0, 6)) == 0:
        return events
    doc = {"traceEvents": events}
    if draw(st.booleans()):
        doc["schemaVersion"] = draw(st.sampled_from([1, "1", 1.5, True, None, {"a": 1}]))
    if draw(st.booleans()):
        doc["deviceProperties"] = [{"id": 0, "name": "H100"}]
    return doc


def _chrome_text(doc, draw) -> bytes:
    text = json.dumps(doc, ensure_ascii=draw(st.booleans()))
    edit = draw(st.integers(0, 12))
    if edit == 0:
        text = text.replace('"name"', '"n\\u0061me"', 1)              # an escaped key
    elif edit == 1:
        text = text.replace('"ts": 10', '"ts": 10, "ts": 20', 1)      # a repeated key
    elif edit == 2 and len(text) > 10:
        text = text[:draw(st.integers(1, len(text) - 1))]              # truncated
    elif edit == 3:
        text = text.replace("10", "NaN", 1)
    elif edit == 4:
        text = "\ufeff" + text
    return text.encode("utf-8", "surrogatepass")


@pytest.mark.full
@_FUZZ
@given(doc=chrome_documents(), data=st.data())
def test_generated_kineto_files_agree(tmp_path_factory, doc, data):
    raw = _chrome_text(doc, data.draw)
    path = tmp_path_factory.mktemp("kineto") / ("k.json.gz" if data.draw(st.booleans()) else "k.json")
    path.write_bytes(gzip.compress(raw) if path.suffix == ".gz" else raw)
    assert_routes_agree(path, format="kineto", lenient=data.draw(st.booleans()))


@pytest.mark.full
@_FUZZ
@given(spans=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 30), st.sampled_from(["f", "g", "a.py(1): h"]),
                                st.integers(1, 2)), max_size=12),
       mems=st.lists(st.tuples(st.integers(0, 70), st.integers(1, 2)), min_size=1, max_size=10))
def test_op_sweep_and_interning_agree(tmp_path_factory, spans, mems):
    """Nested or overlapping ops on two threads around [memory] events: the same stacks on both routes."""
    events = [{"ph": "X", "cat": "cpu_op", "name": name, "ts": start, "dur": dur, "pid": 1, "tid": tid}
              for start, dur, name, tid in spans]
    events += [{"ph": "i", "name": "[memory]", "ts": t, "pid": 1, "tid": tid,
                "args": {"Addr": 4096 * (i + 1), "Bytes": 512, "Device Type": 1, "Device Id": 0}}
               for i, (t, tid) in enumerate(mems)]
    path = tmp_path_factory.mktemp("ops") / "ops.json"
    path.write_text(json.dumps({"traceEvents": events}))
    got = assert_routes_agree(path)
    assert got[0] == "trace"


# ---------------------------------------------------------------------- generated RMM logs
@st.composite
def rmm_logs(draw):
    clean = draw(st.booleans())
    columns = draw(st.sampled_from([["Thread", "Time", "Action", "Pointer", "Size", "Stream"],
                                    ["Action", "Pointer", "Size"], ["time", "action", "pointer", "size", "stream"],
                                    ["Thread", "Time", "Action", "Pointer", "Size", "Stream", "Extra"]]))
    rows, live, t_us = [], {}, 0
    for i in range(draw(st.integers(0, 12))):
        t_us += draw(st.integers(0 if clean or draw(st.integers(0, 15)) else -2000, 3000))
        if live and draw(st.booleans()):
            ptr = draw(st.sampled_from(sorted(live)))
            action, size = "free", live.pop(ptr)
        else:
            ptr = 4096 * draw(st.integers(1, 6))
            action, size = draw(st.sampled_from(["allocate", "allocate", "Allocate", "allocate failure"])), \
                draw(st.sampled_from([512, 4096, 0]))
            if action != "allocate failure":
                live[ptr] = size
        values = {"thread": draw(st.sampled_from(["1", "140234", "007"] + ([] if clean else ["x1", ""]))),
                  "time": draw(st.sampled_from(["{h:02d}:{m:02d}:{s:02d}.{f:06d}", "{h:02d}:{m:02d}:{s:02d}:{f:06d}",
                                                "{h}:{m:02d}:{s:02d}.{f:03d}", "{h:02d}:{m:02d}:{s:02d}"])).format(
                      h=10 + t_us // 3_600_000_000 % 12, m=t_us // 60_000_000 % 60, s=t_us // 1_000_000 % 60,
                      f=t_us % 1000),
                  "action": action,
                  "pointer": draw(st.sampled_from(["0x{:x}", "{:x}", "0X{:X}"])).format(ptr),
                  "size": str(size) if clean or draw(st.integers(0, 20)) else draw(st.sampled_from(["+5", "-0", "x", " 5"])),
                  "stream": draw(st.sampled_from(["0x0", "0x7f00", "(nil)", "0", "nullptr"])),
                  "extra": "e"}
        row = ",".join(values[c.lower()] for c in columns)
        if not clean and draw(st.integers(0, 20)) == 0:
            row = draw(st.sampled_from([row + ",", row.replace(",", ", ", 1), row + "\r", "\u00e9" + row]))
        rows.append(row)
    return "\n".join([",".join(columns)] + rows) + draw(st.sampled_from(["\n", "", "\n\n"]))


@pytest.mark.full
@_FUZZ
@given(text=rmm_logs(), lenient=st.booleans())
def test_generated_rmm_logs_agree(tmp_path_factory, text, lenient):
    path = tmp_path_factory.mktemp("rmm") / "log.csv"
    path.write_bytes(text.encode())
    assert_routes_agree(path, format="rmm-csv", lenient=lenient)


# ---------------------------------------------------------------------- the records builder alone
_OPS = [OP_ALLOC, OP_FREE_REQUESTED, OP_FREE_COMPLETED, OP_FREE, OP_MARKER, OP_NONE, OP_EMPTY_CACHE]


@pytest.mark.full
@settings(max_examples=400, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(-1, 3), st.sampled_from(_OPS), st.sampled_from([0, 0, 1, -3]),
                               st.sampled_from([512, 1024, 2048, -1 << 62]),
                               st.sampled_from([100, 512, 4096, -1, 0, 1 << 51])), max_size=40),
       first=st.integers(0, 5))
def test_compiled_builder_equals_numpy(rows, first):
    t = np.cumsum([r[0] for r in rows]).astype(np.int64)
    rec = Records(t_ns=t, op=np.array([r[1] for r in rows], np.uint8), device=np.array([r[2] for r in rows], np.int64),
                  stream=np.arange(len(rows), dtype=np.int64), addr=np.array([r[3] for r in rows], np.int64),
                  size=np.array([r[4] for r in rows], np.int64), stack_id=np.arange(len(rows), dtype=np.int32),
                  label=np.arange(len(rows), dtype=np.int64) % 3)
    ref = build_columns_reference(rec, first_alloc_id=first)
    with kernel.route("compiled"):
        got = build_columns(rec, first_alloc_id=first)
    assert (got is None) == (ref is None)
    if ref is None:
        return
    for table in ("events", "initial"):
        for col, values in getattr(ref, table).items():
            np.testing.assert_array_equal(getattr(got, table)[col], values, err_msg=f"{table}.{col}")
    for name in ("row_event", "row_alloc_id", "row_alloc_size"):
        np.testing.assert_array_equal(getattr(got, name), getattr(ref, name), err_msg=name)
    assert got.orphan_frees == ref.orphan_frees


# ---------------------------------------------------------------------- the events check alone
@pytest.mark.full
@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(rows=st.lists(st.tuples(st.integers(-2, 3), st.integers(0, 6), st.integers(-1, 6), st.integers(-1, 2048)),
                     max_size=25),
       initial=st.lists(st.integers(-1, 6), max_size=3), n_labels=st.integers(0, 2))
def test_parquet_tables_agree(tmp_path_factory, rows, initial, n_labels):
    """Hand-written event tables (any kinds, ids, sizes, times) through Parquet: same trace or error."""
    t = np.cumsum([r[0] for r in rows]).astype(np.int64)
    events = frame_from_columns({"t_ns": t, "kind": [r[1] for r in rows], "alloc_id": [r[2] for r in rows],
                                 "size_bytes": [r[3] for r in rows], "stream": [0] * len(rows),
                                 "device": [0] * len(rows)}, EVENT_DTYPES)
    ia = frame_from_columns({"alloc_id": initial, "size_bytes": [512] * len(initial), "stream": [0] * len(initial),
                             "device": [0] * len(initial), "addr": [-1] * len(initial),
                             "block_size_bytes": [-1] * len(initial)}, INITIAL_ALLOC_DTYPES)
    trace = Trace(events=events, meta=TraceMeta(format="synthetic"), labels=["m"] * n_labels, initial_allocs=ia)
    path = tmp_path_factory.mktemp("pq") / "t.parquet"
    write_trace(trace, path)
    assert_routes_agree(path)
    assert_routes_agree(path, lenient=True)



# ---------------------------------------------------------------------- live bytes alone
@pytest.mark.full
@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(rows=st.lists(st.tuples(st.sampled_from(list(EventKind)), st.integers(-1, 8),
                               st.sampled_from([0, 512, 4096, 1 << 40, 1 << 62])), max_size=30),
       initial=st.lists(st.tuples(st.integers(-1, 8), st.sampled_from([512, 1 << 40, 1 << 62])), max_size=4,
                        unique_by=lambda r: r[0]))
def test_compiled_live_bytes_equals_numpy(rows, initial):
    """Live bytes after each event (sizes as validated traces hold them): compiled equals numpy, sums past 2**63 included."""
    events = frame_from_columns({"t_ns": list(range(len(rows))), "kind": [int(r[0]) for r in rows],
                                 "alloc_id": [r[1] for r in rows], "size_bytes": [r[2] for r in rows],
                                 "stream": [0] * len(rows), "device": [0] * len(rows)}, EVENT_DTYPES)
    ia = frame_from_columns({"alloc_id": [r[0] for r in initial], "size_bytes": [r[1] for r in initial],
                             "stream": [0] * len(initial), "device": [0] * len(initial), "addr": [-1] * len(initial),
                             "block_size_bytes": [-1] * len(initial)}, INITIAL_ALLOC_DTYPES)
    trace = Trace(events=events, meta=TraceMeta(format="synthetic"), initial_allocs=ia)
    want = live_bytes_series_reference(trace)
    with kernel.route("compiled"):
        got = live_bytes_series(trace)
    for g, w in zip(got, want):
        assert [int(x) for x in g] == [int(x) for x in w]


# ---------------------------------------------------------------------- sanitizer findings (tests/fuzz)
# Each is the smallest input that made the AddressSanitizer / UBSan build fail before its fix.
_MAX_TIME_US = (1 << 63) // 1000


def test_rmm_scan_refuses_column_indices_past_the_fields():
    """A column index past the header's fields read a pointer off the stack (stack-buffer-overflow)."""
    for wild in ([0, 1, 2, 100, -1, -1], [0, 1, 2, 3, -1, -1], [-1, 1, 2, -1, -1, -1], [0, 1, 2, -2, -1, -1],
                 [0, 1, 2, -1, -1, 64]):
        with pytest.raises(ValueError, match="column index"):
            compiled.ext.rmm_scan(b"allocate,1,1\n", 3, *wild)
    assert compiled.ext.rmm_scan(b"allocate,1,1\n", 3, 0, 1, 2, -1, -1, -1) is not None


def test_chrome_scan_nests_deep_without_recursion():
    """Nesting as deep as the caller allows overflowed the C stack (the scan recursed once per level)."""
    depth = 99_990
    doc = b'{"traceEvents": [], "x": ' + b"[" * depth + b'{"a": [1, {}]}' + b"]" * depth + b"}"
    assert compiled.ext.chrome_scan(doc, 1 << 30, 1 << 40, 1000) is not None       # within the 100,000 ceiling
    assert compiled.ext.chrome_scan(doc, 1 << 30, depth + 3, 1000) is None          # one level short
    assert compiled.ext.chrome_scan(doc, 1 << 30, depth + 4, 1000) is not None
    deeper = b'{"traceEvents": [], "x": ' + b"[" * 300_000 + b"]" * 300_000 + b"}"
    assert compiled.ext.chrome_scan(deeper, 1 << 30, 1 << 40, 1000) is None


def _records_args(n: int, device: int = 0):
    z = np.zeros(n, np.int64)
    return (np.arange(n, dtype=np.int64), np.full(n, OP_ALLOC, np.uint8), z + device, z,
            512 * np.arange(1, n + 1, dtype=np.int64), z + 512, np.zeros(n, np.int32), z)


def test_build_records_hands_back_ids_past_int64_and_devices_past_int16():
    """first_alloc_id near 2**63 overflowed the id counter (signed overflow); a device outside int16 was
    stored wrapped, so its address never matched its own slot again."""
    assert compiled.ext.build_records(*_records_args(3), (1 << 63) - 1, 0) is None
    assert compiled.ext.build_records(*_records_args(3), (1 << 63) - 3, 0) is None
    assert compiled.ext.build_records(*_records_args(3), (1 << 63) - 4, 0) is not None
    assert compiled.ext.build_records(*_records_args(3, device=40_000), 0, 0) is None
    assert compiled.ext.build_records(*_records_args(3, device=-3), 0, 0) is not None


def test_op_sweep_fills_rows_outside_every_group():
    """Groups that did not cover every op and [memory] row left those outputs uninitialised."""
    i64 = lambda *v: np.array(v, dtype=np.int64)
    parent, top = compiled.ext.op_sweep(i64(0, 1, 2), i64(5, 5, 5), i64(1, 2), i64(1, 3), i64(1, 1))
    assert np.frombuffer(parent, np.int64).tolist() == [-2, -2, -2]
    assert np.frombuffer(top, np.int64).tolist() == [-1, -1]


def test_snapshot_scan_hands_back_times_past_int64():
    """time_us * 1000 and index * step_ns overflowed int64 (signed overflow) when the caller's limits allowed."""
    timed = pickle.dumps({"segments": [], "device_traces": [[
        {"action": "alloc", "addr": 512, "size": 512, "stream": 0, "time_us": 1 << 62}]]}, protocol=4)
    args = (DEFAULT_LIMITS.frames, 100, 10, 10, 100)
    assert compiled.ext.snapshot_scan(timed, 1 << 30, *args, (1 << 63) - 1, 1000, True) is None
    untimed = pickle.dumps({"segments": [], "device_traces": [[
        {"action": "alloc", "addr": 512 * k, "size": 512, "stream": 0} for k in range(1, 4)]]}, protocol=4)
    assert compiled.ext.snapshot_scan(untimed, 1 << 30, *args, _MAX_TIME_US, 1 << 62, True) is None
    assert compiled.ext.snapshot_scan(untimed, 1 << 30, *args, _MAX_TIME_US, 1 << 61, True) is not None


@pytest.mark.full
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmPeak from /proc")
def test_rmm_scan_reserves_for_rows_not_blank_lines():
    """A body of blank lines reserved 41 bytes of columns per newline: address space 41 times the input."""
    import subprocess
    import sys

    code = """if True:
        from allocsim.trace.reading import compiled
        def peak():
            return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmPeak"))
        body = b"\\n" * (64 << 20)
        before = peak()
        assert compiled.ext.rmm_scan(body, 6, 2, 3, 4, 1, 5, 0) is None
        print((peak() - before) / len(body))"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert float(out.stdout) < 8, out.stdout      # columns for the rows the body could hold: about 4 bytes a byte


def test_chrome_scan_empty_first_name_and_thread():
    """An empty op name or pid as the first text copied zero bytes from a NULL array (memcpy, UBSan)."""
    doc = b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "", "pid": "", "tid": "", "ts": 1, "dur": 1}]}'
    scan = compiled.ext.chrome_scan(doc, 1 << 30, 64, 1000)
    assert scan["names"] == [""] and scan["threads"] == ["\x00"]


@pytest.mark.parametrize("blob", [
    b"\x80\x04\x95" + struct.pack("<Q", 3) + b"]r\x00\x00\x00\x00.",           # LONG_BINPUT's index crosses the frame end
    b"\x80\x04\x95" + struct.pack("<Q", 11) + b"]\x95" + struct.pack("<Q", 0) + b".",   # a frame inside a frame
], ids=["read-across-frame-end", "frame-in-frame"])
def test_snapshot_scan_hands_back_what_the_unpicklers_disagree_on(blob, tmp_path):
    """Python's unpickler refuses these frames and CPython's C one reads them: the scan read them too, so
    where the reference takes the Python unpickler (no isolation) the routes disagreed. Now handed back."""
    import pickle as std_pickle

    with pytest.raises(std_pickle.UnpicklingError, match="frame"):
        std_pickle._loads(blob)
    assert std_pickle.loads(blob) == []
    assert compiled.ext.snapshot_scan(blob, 1 << 30, 10**7, 100, 10, 10, 100, _MAX_TIME_US, 1000, True) is None
    framed = b"\x80\x04\x95" + struct.pack("<Q", 6) + b"]r\x00\x00\x00\x00."       # the same, within its frame
    assert compiled.ext.snapshot_scan(framed, 1 << 30, 10**7, 100, 10, 10, 100, _MAX_TIME_US, 1000, True) is not None


def test_kineto_op_times_past_int64_agree(tmp_path):
    """An op whose start in ns is past int64 made the compiled sweep's caller fail converting the times
    ("malformed kineto data: OverflowError") where the reference read the file. The {"tid": {}} event
    sends the file to the decoded route, whose times are Python ints."""
    ts = "9867988678724404"
    path = tmp_path / "ops.json"
    path.write_text('{"traceEvents": [{"ph": "X", "cat": "user_annotation", "name": "f", "pid": 1, "tid": 1, '
                    f'"ts": {ts}, "dur": 0}}, {{"name": "[memory]", "pid": 1, "tid": 1, "ts": 1, "args": '
                    '{"Addr": 4096, "Bytes": 512, "Device Type": 1, "Device Id": 0}}, {"tid": {}}]}')
    assert assert_routes_agree(path, format="kineto")[0] == "trace"


@pytest.mark.parametrize("doc", [
    '{"traceEvents": [OP, MEM, {"pid": 11e308}]}',                   # a scalar field msgspec finds out of range
    '{"traceEvents": [OP, MEM, {"pid": {}, "pid": 1}]}',             # an object in a repeated key's first value
    '{"schemaVersion": [], "schemaVersion": 1, "traceEvents": [OP, MEM]}',
], ids=["float-out-of-range", "repeated-key-object", "repeated-document-key"])
def test_chrome_scan_hands_back_what_msgspec_refuses(tmp_path, doc):
    """msgspec refuses these documents (the reader then takes the standard library's, which keeps
    every op); the scan read them, so the routes kept different ops and gave different stack tables."""
    op = '{"ph": "X", "cat": "cpu_op", "name": "f", "pid": 1, "tid": 1, "ts": 7, "dur": 4}'
    mem = '{"name": "[memory]", "pid": 1, "tid": 1, "ts": 81, "args": {"Addr": 4096, "Bytes": 512, ' \
          '"Device Type": 1, "Device Id": 0}}'
    text = doc.replace("OP", op).replace("MEM", mem).encode()
    assert compiled.ext.chrome_scan(text, 1 << 30, 64, 1000) is None
    path = tmp_path / "k.json"
    path.write_bytes(text)
    assert_routes_agree(path, format="kineto")


def test_policy_kernel_free_list_without_streams():
    """whole_free_segments() on a free list that never had a stream passed NULL to memcpy (UBSan)."""
    from allocsim.policies import _kernel

    assert _kernel.FreeList().whole_free_segments() == []
