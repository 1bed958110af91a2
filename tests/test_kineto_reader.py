"""torch.profiler / Kineto Chrome-trace reader: real traces, hand-written variants, bad input, fuzzing."""

from __future__ import annotations

import copy
import gzip
import json
import os
import random
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocsim.errors import TraceFormatError
from allocsim.trace import EventKind, Trace, detect_format, read_trace
from allocsim.trace.formats.kineto.reader import device_id, read_kineto, ts_to_ns
from allocsim.trace.reading.validate import validate_events

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "data" / "kineto"
# Real CPU trace, made with torch 2.13.0+cpu: profile(profile_memory=True, schedule(active=3)) over 3
# steps of randn/matmul/relu, with one 4000-byte tensor allocated in an earlier profiling session and
# freed in step 1; export_chrome_trace, then only [memory] + ProfilerStep#N events kept, gzipped.
TINY = DATA / "tiny_cpu_profile.json.gz"
MIXED = DATA / "mixed_devices.json"
REAL_TRACES = sorted((ROOT / "traces").glob("*.json.gz"))

A, FR, FC, M = EventKind.ALLOC, EventKind.FREE_REQUESTED, EventKind.FREE_COMPLETED, EventKind.MARKER


# --------------------------------------------------------------------------- helpers
def load_json(path: Path) -> dict:
    opener = gzip.open if path.read_bytes()[:2] == b"\x1f\x8b" else open
    with opener(path, "rt") as fh:
        return json.load(fh)


def write_json(tmp_path: Path, doc, name: str = "t.json", gz: bool = False) -> Path:
    path = tmp_path / name
    data = json.dumps(doc).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def mem(ts, addr, nbytes, dtype=0, dindex=-1, total=None, name="[memory]"):
    args = {"Bytes": nbytes, "Device Type": dtype, "Device Id": dindex}
    if addr is not None:
        args["Addr"] = addr
    if total is not None:
        args["Total Allocated"] = total
    return {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": name, "pid": 1, "tid": 1,
            "ts": ts, "args": args}


def lifetimes_ok(trace: Trace) -> None:
    """Every free names an id allocated in the trace or present at its start; nothing freed twice."""
    validate_events(trace, trace.meta.source)
    kind, ids = trace.column("kind"), trace.column("alloc_id")
    allocated = set(ids[kind == A].tolist()) | set(trace.initial_allocs["alloc_id"].tolist())
    freed = ids[kind == FC].tolist()
    assert set(freed) <= allocated
    assert len(freed) == len(set(freed))
    assert np.array_equal(np.sort(ids[kind == FR]), np.sort(ids[kind == FC]))


def same_trace(a: Trace, b: Trace) -> None:
    for name in ("events", "initial_allocs", "decisions"):
        assert getattr(a, name).equals(getattr(b, name)), name
    assert a.labels == b.labels
    assert a.meta.notes == b.meta.notes


# --------------------------------------------------------------------------- real traces
@pytest.mark.full
@pytest.mark.parametrize("path", REAL_TRACES or [None], ids=[p.name for p in REAL_TRACES] or ["none"])
def test_real_capture(path):
    if path is None:
        pytest.skip("no traces/*.json.gz captured yet")
    assert detect_format(path) == "kineto"
    trace = read_trace(path)
    kind = trace.column("kind")
    assert np.count_nonzero(kind == A) > 0
    lifetimes_ok(trace)
    # The reader's own per-device check of Total Allocated against the running sum of Bytes.
    check = trace.meta.version_hints["total_allocated_check"]
    assert check and all(c["checked"] > 0 and c["mismatched"] == 0 for c in check.values()), check
    assert not any("Total Allocated changed" in n for n in trace.meta.notes)

    # Independent cross-check from the raw JSON: per device, baseline + running sum == Total Allocated.
    doc = load_json(path)
    raw = [(ts_to_ns(e["ts"]), i, e["args"]) for i, e in enumerate(doc["traceEvents"])
           if e.get("name") == "[memory]"]
    raw.sort(key=lambda r: (r[0], r[1]))
    running: dict[int, int] = {}
    for _, _, args in raw:
        dev = device_id(int(args["Device Type"]), int(args["Device Id"]))
        if dev not in running:
            running[dev] = args["Total Allocated"] - args["Bytes"]
        running[dev] += args["Bytes"]
        assert running[dev] == args["Total Allocated"]
    nonzero = [a for _, _, a in raw if a["Bytes"] != 0]
    assert np.count_nonzero(kind == A) == sum(a["Bytes"] > 0 for a in nonzero)
    assert np.count_nonzero(kind == FC) == sum(a["Bytes"] < 0 for a in nonzero)
    # Live bytes per device, starting from the initial state, never go negative.
    sizes, devs = trace.column("size_bytes"), trace.column("device")
    for dev in np.unique(devs[kind == A]):
        delta = np.where(kind == A, sizes, np.where(kind == FC, -sizes, 0))[devs == dev]
        base = trace.initial_allocs.loc[trace.initial_allocs["device"] == dev, "size_bytes"].sum()
        assert (base + np.cumsum(delta)).min() >= 0

    sidecar = path.with_name(path.name[:-len(".json.gz")] + ".meta.json")
    if sidecar.exists():
        info = json.loads(sidecar.read_text())
        if "allocs" in info:
            assert np.count_nonzero(kind == A) == info["allocs"]
        if "frees" in info:
            assert np.count_nonzero(kind == FC) == info["frees"]
        if "step_names" in info:
            assert trace.labels == info["step_names"]


def test_tiny_real_cpu_profile():
    trace = read_kineto(TINY)
    kind = trace.column("kind")
    assert trace.meta.format == "kineto"
    assert trace.labels == ["ProfilerStep#0", "ProfilerStep#1", "ProfilerStep#2"]
    assert np.count_nonzero(kind == M) == 3
    assert np.count_nonzero(kind == A) == 21
    assert np.count_nonzero(kind == FC) == 22
    assert trace.meta.devices == [-1] and set(trace.column("device")) == {-1}
    assert set(trace.column("stream")) == {0}
    # The tensor from the earlier profiling session: freed here, so it is initial state.
    assert trace.initial_allocs["size_bytes"].tolist() == [4000]
    assert trace.meta.version_hints["device_types_seen"] == {"CPU": [-1]}
    assert trace.meta.version_hints["total_allocated_check"] == {
        "-1": {"checked": 42, "mismatched": 0, "baseline_bytes": 4000}}
    assert any("4000 bytes were allocated before" in n for n in trace.meta.notes)
    assert np.all(np.diff(trace.column("t_ns")) >= 0)
    lifetimes_ok(trace)


def test_gzip_and_plain_read_the_same(tmp_path):
    plain = tmp_path / "tiny.json"
    plain.write_bytes(gzip.decompress(TINY.read_bytes()))
    same_trace(read_kineto(TINY), read_kineto(plain))
    gz = tmp_path / "mixed.json.gz"
    gz.write_bytes(gzip.compress(MIXED.read_bytes()))
    same_trace(read_kineto(MIXED), read_kineto(gz))
    assert detect_format(gz) == "kineto" and detect_format(plain) == "kineto"


# --------------------------------------------------------------------------- hand-written variants
def test_mixed_devices_fixture():
    """CPU + two CUDA devices, unsorted, string/float/int ts, orphan free, OOM, markers (GPU copy ignored)."""
    trace = read_trace(MIXED)
    ev = trace.events
    expected = [  # t_ns, kind, alloc_id, size, device
        (100000, M, 0, 0, 0),
        (110250, A, 0, 1048576, 0),
        (112000, A, 1, 64, -1),
        (115000, A, 2, 4096, 1),
        (118000, FR, 1, 64, -1), (118000, FC, 1, 64, -1),
        (119000, A, 3, 128, -1),            # same CPU address again: a fresh id
        (120500, A, 4, 512, 0),
        (125000, FR, 2, 4096, 1), (125000, FC, 2, 4096, 1),   # same number as the CPU address
        (130000, FR, 0, 1048576, 0), (130000, FC, 0, 1048576, 0),
        (135000, M, 1, 0, 0),
        (140001, FR, 5, 2097152, 0), (140001, FC, 5, 2097152, 0),  # allocated before profiling
        (160000, FR, 4, 512, 0), (160000, FC, 4, 512, 0),
    ]
    got = list(zip(ev.t_ns, ev.kind, ev.alloc_id, ev.size_bytes, ev.device))
    assert got == [(t, int(k), i, s, d) for t, k, i, s, d in expected]
    assert set(ev.stream) == {0}
    assert trace.labels == ["ProfilerStep#1", "ProfilerStep#2"]
    assert trace.meta.devices == [-1, 0, 1] and trace.devices == [-1, 0, 1]
    init = trace.initial_allocs
    assert init[["alloc_id", "size_bytes", "device", "addr"]].values.tolist() == [[5, 2097152, 0, 139637984067584]]
    dec = trace.decisions
    assert dec[["event_index", "t_ns", "action", "size_bytes", "device"]].values.tolist() == [
        [15, 150000, "oom", 8589934592, 0]]
    hints = trace.meta.version_hints
    assert hints["device_types_seen"] == {"CPU": [-1], "CUDA": [0, 1]}
    assert hints["device_map"] == {"CPU:-1": -1, "CUDA:0": 0, "CUDA:1": 1}
    assert hints["marker_device"] == 0
    assert hints["total_allocated_check"]["0"] == {"checked": 4, "mismatched": 0, "baseline_bytes": 2097152}
    assert all(c["mismatched"] == 0 for c in hints["total_allocated_check"].values())
    assert any("frees of blocks allocated before" in n for n in trace.meta.notes)
    assert any("no stream" in n for n in trace.meta.notes)
    lifetimes_ok(trace)
    # Per-device views keep their own events.
    cpu = trace.for_device(-1)
    memory = cpu.events[cpu.events.kind != int(EventKind.MARKER)]
    assert memory.size_bytes.tolist() == [64, 64, 64, 128]
    # step markers belong to the whole run: every device keeps them
    assert (cpu.events.kind == int(EventKind.MARKER)).sum() == 2


def test_ts_exact_conversion():
    assert ts_to_ns("1724696104648464.123") == 1724696104648464123
    assert ts_to_ns(1724696104648464) == 1724696104648464000
    assert ts_to_ns(5093554565374.3) == 5093554565374300
    assert ts_to_ns("5093554565374.3") == 5093554565374300
    assert ts_to_ns("12") == 12000 and ts_to_ns("12.") == 12000 and ts_to_ns(".5") == 500
    assert ts_to_ns("-1.5") == -1500
    assert ts_to_ns("1.5e3") == 1500000
    # Below 1 ns: round half to even.
    assert [ts_to_ns(x) for x in ("0.0005", "0.0015", "0.00151", "0.0004999")] == [0, 2, 2, 0]
    for bad in (None, True, "abc", "nan", "NaN", "inf", "Infinity", "", "1.2.3", [1], {"a": 1}, "0x10"):
        assert ts_to_ns(bad) is None, bad


def test_string_and_float_ts_in_file(tmp_path):
    doc = {"traceEvents": [
        mem("1724696104648464.123", 16, 100, total=100),
        mem(1724696104648464.5, 32, 50, total=150),      # written as a float literal
        mem(1724696104648465, 16, -100, total=50),
    ]}
    trace = read_kineto(write_json(tmp_path, doc))
    assert trace.column("t_ns")[:2].tolist() == [1724696104648464123, 1724696104648464500]
    assert trace.column("t_ns")[-1] == 1724696104648465000


def test_unsorted_events_are_sorted_stably(tmp_path):
    # Two events at the same ts keep their file order; the free comes before its alloc in the file.
    doc = {"traceEvents": [
        mem(30, 16, -100),
        mem(10, 16, 100),
        mem(20, 32, 7), mem(20, 48, 9),
    ]}
    trace = read_kineto(write_json(tmp_path, doc))
    assert trace.column("t_ns").tolist() == [10000, 20000, 20000, 30000, 30000]
    assert trace.column("size_bytes").tolist() == [100, 7, 9, 100, 100]
    assert len(trace.initial_allocs) == 0


def test_bare_list_and_other_device_types(tmp_path):
    events = [mem(1, 8, 64, dtype=13, dindex=0), mem(2, 8, -64, dtype=13, dindex=0),
              mem(3, 8, 32, dtype=1, dindex=3), {"ph": "M", "name": "process_name", "args": {"name": "x"}}]
    path = write_json(tmp_path, events)
    assert detect_format(path) == "kineto"
    trace = read_trace(path)
    assert trace.column("device").tolist() == [device_id(13, 0)] * 3 + [3]
    assert device_id(13, 0) == -(256 * 13 + 1)
    assert trace.meta.version_hints["device_types_seen"] == {"CUDA": [3], "MPS": [0]}


def test_step_markers_interleave_by_time(tmp_path):
    step = lambda n, ts, cat="user_annotation": {"ph": "X", "cat": cat, "name": f"ProfilerStep#{n}",
                                                 "ts": ts, "dur": 5}
    doc = {"traceEvents": [mem(12, 16, 100, dtype=1, dindex=0), step(2, 11), step(1, 1), step(1, 1.5, "gpu_user_annotation"),
                           mem(5, 16, -100, dtype=1, dindex=0),
                           {"ph": "i", "name": "ProfilerStep#9", "ts": 3}]}  # not a duration event
    trace = read_kineto(write_json(tmp_path, doc))
    ev = trace.events
    assert list(zip(ev.t_ns, ev.kind)) == [(1000, M), (5000, FR), (5000, FC), (11000, M), (12000, A)]
    assert trace.labels == ["ProfilerStep#1", "ProfilerStep#2"]
    assert set(ev.device) == {0}


def test_zero_byte_events_are_skipped(tmp_path):
    trace = read_kineto(write_json(tmp_path, {"traceEvents": [mem(1, 16, 0), mem(2, 16, 8)]}))
    assert trace.column("size_bytes").tolist() == [8]
    assert any("Bytes == 0" in n for n in trace.meta.notes)


def test_total_allocated_mismatch_is_a_note_not_an_error(tmp_path):
    doc = {"traceEvents": [mem(1, 16, 100, total=100), mem(2, 32, 100, total=999)]}
    trace = read_kineto(write_json(tmp_path, doc))
    assert trace.meta.version_hints["total_allocated_check"]["-1"]["mismatched"] == 1
    assert any("Total Allocated changed" in n for n in trace.meta.notes)


def test_empty_trace_events_are_refused_with_how_to_record_memory(tmp_path):
    with pytest.raises(TraceFormatError, match=r"no \[memory\] events.*profile_memory=True"):
        read_kineto(write_json(tmp_path, {"traceEvents": []}))


# --------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("mutate, record, reason", [
    (lambda ev: ev[1]["args"].pop("Addr"), "traceEvents[1]", "Addr is missing"),
    (lambda ev: ev[1]["args"].update(Addr="0xzz"), "traceEvents[1]", "Addr is missing or not an integer"),
    (lambda ev: ev[1]["args"].update(Bytes="lots"), "traceEvents[1]", "Bytes is missing or not an integer"),
    (lambda ev: ev[1]["args"].update(Bytes=12.5), "traceEvents[1]", "not an integer"),
    (lambda ev: ev[1]["args"].update(Bytes=1 << 60), "traceEvents[1]", "absurd size"),
    (lambda ev: ev[1]["args"].update(Bytes=-(1 << 60)), "traceEvents[1]", "absurd size"),
    (lambda ev: ev[1].update(ts="yesterday"), "traceEvents[1]", "ts is missing or not a number"),
    (lambda ev: ev[1].pop("args"), "traceEvents[1]", "no 'args' object"),
    (lambda ev: ev[1]["args"].update({"Device Type": "gpu"}), "traceEvents[1]", "Device Type is not an integer"),
    (lambda ev: ev[1]["args"].update({"Device Type": 1, "Device Id": -1}), "traceEvents[1]", "Device Id -1 out of range"),
    (lambda ev: ev.append(mem(9, 16, -100)), "traceEvents[3]", "double free"),
    (lambda ev: ev.append(mem(9, 32, -5)), "traceEvents[3]", "free of 5 bytes"),
])
def test_bad_memory_event(tmp_path, mutate, record, reason):
    events = [mem(1, 16, 100), mem(2, 32, 50), mem(3, 16, -100)]
    mutate(events)
    path = write_json(tmp_path, {"traceEvents": events})
    with pytest.raises(TraceFormatError) as err:
        read_kineto(path)
    msg = str(err.value)
    assert str(path) in msg and record in msg and reason in msg, msg
    # Lenient: the bad record is skipped or repaired, and listed.
    trace = read_kineto(path, lenient=True)
    assert any(r.startswith(f"record {record}: ") for r in trace.meta.repairs), trace.meta.repairs
    lifetimes_ok(trace)


@pytest.mark.parametrize("data, reason", [
    (b"not json at all", "not JSON"),
    (b'{"traceEvents": [', "not JSON"),
    (b'{"schemaVersion": 1}', "no 'traceEvents'"),
    (b'{"traceEvents": {"a": 1}}', "not a list"),
    (b'"just a string"', "not an object or list"),
    (b"   \n", "empty file"),
    (b'{"traceEvents": [' + b"[" * 100000 + b"]" * 100000 + b"]}", "nested 100,002 levels deep: over the limit depth=64"),
])
def test_bad_documents(tmp_path, data, reason):
    path = tmp_path / "bad.json"
    path.write_bytes(data)
    for lenient in (False, True):
        with pytest.raises(TraceFormatError, match=reason) as err:
            read_kineto(path, lenient=lenient)
        assert str(path) in str(err.value)


def test_truncated_and_corrupt_gzip(tmp_path):
    blob = TINY.read_bytes()
    path = tmp_path / "cut.json.gz"
    path.write_bytes(blob[: len(blob) // 2])
    with pytest.raises(TraceFormatError, match="corrupt gzip") as err:
        read_kineto(path)
    assert str(path) in str(err.value)
    flipped = bytearray(blob)
    flipped[len(blob) // 2] ^= 0xFF
    path.write_bytes(bytes(flipped))
    with pytest.raises(TraceFormatError):
        read_kineto(path)


def test_oom_event_without_bytes_is_rejected(tmp_path):
    path = write_json(tmp_path, {"traceEvents": [mem(1, None, "x", dtype=1, dindex=0, name="[OutOfMemory]")]})
    with pytest.raises(TraceFormatError, match=r"traceEvents\[0\].*\[OutOfMemory\].*Bytes"):
        read_kineto(path)
    assert len(read_kineto(path, lenient=True).decisions) == 0


# --------------------------------------------------------------------------- fuzzing
_SEEDS = [load_json(MIXED), {"traceEvents": load_json(TINY)["traceEvents"][:25]}]
_SEED_BYTES = [json.dumps(d).encode() for d in _SEEDS]
_RANDOM_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(1 << 70), max_value=1 << 70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


def _mutate_doc(doc, rng: random.Random, value) -> None:
    events = doc["traceEvents"]
    op = rng.randrange(5)
    if op == 0:
        rng.shuffle(events)
        return
    if op == 1 and events:
        events[rng.randrange(len(events))] = value
        return
    target = events[rng.randrange(len(events))] if events else doc
    if not isinstance(target, dict):
        return
    if op == 2:
        target = target.get("args") if isinstance(target.get("args"), dict) else target
    keys = list(target) or ["x"]
    key = rng.choice(keys)
    if op == 4:
        target.pop(key, None)
    else:
        target[key] = value


def _check_reads(data: bytes, name: str = "f.json") -> None:
    """The reader returns a valid Trace or raises TraceFormatError, strict and lenient alike."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, name)
        with open(path, "wb") as fh:
            fh.write(data)
        for lenient in (False, True):
            try:
                trace = read_kineto(path, lenient=lenient)
            except TraceFormatError:
                continue
            assert isinstance(trace, Trace)
            validate_events(trace, path)


@pytest.mark.full
@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 1), rnd=st.randoms(use_true_random=False), value=_RANDOM_VALUES,
       n_mut=st.integers(1, 3), raw=st.integers(-3, 4))
def test_fuzz_kineto_never_crashes(seed, rnd, value, n_mut, raw):
    doc = copy.deepcopy(_SEEDS[seed])
    if raw <= 0:  # structural edits: shuffle events, replace events/fields/args with random values
        for _ in range(n_mut):
            _mutate_doc(doc, rnd, value)
        try:
            data = json.dumps(doc).encode()
        except (ValueError, TypeError):
            return
        if rnd.random() < 0.3:
            _check_reads(gzip.compress(data), "f.json.gz")
        else:
            _check_reads(data)
        return
    data = bytearray(_SEED_BYTES[seed])
    if raw == 1:  # truncate the text
        _check_reads(bytes(data[: rnd.randrange(len(data))]))
    elif raw == 2:  # flip bytes in the text
        for _ in range(n_mut):
            data[rnd.randrange(len(data))] = rnd.randrange(256)
        _check_reads(bytes(data))
    else:  # damage the gzip stream itself
        blob = bytearray(gzip.compress(bytes(data)))
        if raw == 3:
            blob = blob[: rnd.randrange(len(blob))]
        else:
            for _ in range(n_mut):
                blob[rnd.randrange(len(blob))] = rnd.randrange(256)
        _check_reads(bytes(blob), "f.json.gz")


# --------------------------------------------------------------------------- memory from before the window
def test_memory_from_before_the_window_is_one_start_allocation(tmp_path):
    """Total Allocated - Bytes at the first event, less the orphan frees' bytes, is one initial allocation."""
    events = [mem(10, 4096, 512, dtype=1, dindex=0, total=10_000 + 512),      # 10,000 held before
              mem(20, 8192, -2000, dtype=1, dindex=0, total=8_512),          # an orphan free of 2,000
              mem(30, 4096, -512, dtype=1, dindex=0, total=8_000)]
    trace = read_trace(write_json(tmp_path, {"traceEvents": events}))
    ia = trace.initial_allocs
    assert ia[["size_bytes", "device", "addr"]].values.tolist() == [[2000, 0, 8192], [8000, 0, -1]]
    start = int(ia["alloc_id"].iloc[1])
    assert start not in trace.events["alloc_id"].tolist()                    # never freed in the window
    assert any(f"alloc_id {start}" in n and "8,000 bytes" in n for n in trace.meta.notes)
    from allocsim.trace.inference.stats import summarize

    info = summarize(trace)
    assert info["baseline_live_bytes"] == 10_000
    assert info["peak_live_with_baseline_bytes"] == 10_512 == max(trace.recorded_series["allocated_bytes"])


def test_no_start_allocation_when_the_orphans_explain_it_or_on_the_cpu(tmp_path):
    explained = [mem(10, 8192, -2000, dtype=1, dindex=0, total=0), mem(20, 4096, 64, total=64 + 500)]
    trace = read_trace(write_json(tmp_path, {"traceEvents": explained}))
    assert trace.initial_allocs["size_bytes"].tolist() == [2000]             # the orphan only; CPU memory: none


@pytest.mark.full
@pytest.mark.shared
def test_shared_gpu_traces_peak_at_the_recorded_total(shared_dir):
    """With the memory held before the window as an allocation, each GPU trace's peak live bytes
    equals the largest Total Allocated the profiler recorded (Qwen: 0.98 GB held at the start)."""
    from allocsim.trace.inference.stats import summarize

    paths = sorted((shared_dir / "traces" / "kineto-gpu").glob("*.json.gz"))
    checked = 0
    for path in paths:
        if "resnet50" in path.name:
            continue          # the 2021 format: refused
        info = summarize(read_trace(path).for_device(0))
        assert info["peak_live_with_baseline_bytes"] == info["recorded"]["0"]["peak_allocated_bytes"], path.name
        checked += 1
    assert checked == 6
    qwen = read_trace(next(p for p in paths if "qwen" in p.name))
    assert summarize(qwen)["baseline_live_bytes"] == 984_742_400
