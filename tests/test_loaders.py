"""The fast loaders: same traces as the reference paths, frames kept, limits and hostile input bounded."""

from __future__ import annotations

import gzip
import io
import json
import os
import struct
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from allocsim.errors import TraceFormatError
from allocsim.trace import LimitExceeded, Limits, read_trace, write_trace
from allocsim.trace.formats.snapshot import reader as snapshot_module
from allocsim.trace.inference.recorded import recorded_run
from allocsim.trace.inference.stats import summarize
from allocsim.trace.transport import TABLES
from tests.test_snapshot_reader import FILES, SNAPSHOT_DIR, make_snapshot, write

MiB = 1 << 20
KINETO_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "kineto-gpu"


def assert_same(a, b, tables=TABLES):
    for name in tables:
        pd.testing.assert_frame_equal(getattr(a, name).reset_index(drop=True),
                                      getattr(b, name).reset_index(drop=True), check_dtype=False, obj=name)
    assert a.labels == b.labels


def _reference_only(monkeypatch):
    """Make the snapshot reader skip its columnar path (the entry-by-entry reference runs)."""
    monkeypatch.setattr(snapshot_module, "entry_columns", lambda *a, **k: None)
    monkeypatch.setenv("ALLOCSIM_NO_ISOLATION", "1")


# ---------------------------------------------------------------------- snapshots
@pytest.mark.full
@pytest.mark.parametrize("name", sorted(FILES))
def test_fast_snapshot_path_equals_reference(shared_dir, monkeypatch, name):
    if not SNAPSHOT_DIR.is_dir():
        pytest.skip("no shared snapshots")
    fast = read_trace(SNAPSHOT_DIR / FILES[name])
    _reference_only(monkeypatch)
    reference = read_trace(SNAPSHOT_DIR / FILES[name])
    assert_same(fast, reference)
    assert fast.meta.notes == reference.meta.notes


def test_synthetic_fast_equals_reference(tmp_path, monkeypatch):
    snap = make_snapshot()
    snap["segments"][0]["blocks"][0]["frames"] = [{"filename": "y.py", "line": 9, "name": "g"}]
    path = write(tmp_path / "s.pickle", snap)
    fast = read_trace(path)
    kinds = fast.events["kind"].to_numpy()
    failed = [oom["event_index"] for run in fast.meta.recorded.values() for oom in run["ooms"]]
    request = kinds != 5
    request[failed] = False   # the oom entry's failed request: its entry had no frames
    assert ((fast.events["stack_id"].to_numpy() >= 0) == request).all()   # every other request has frames
    assert fast.stack(int(fast.events["stack_id"].iloc[0])) == [("x.py", 1, "f")]
    declared = fast.initial_allocs.loc[fast.initial_allocs["size_bytes"] == 100]      # the live block at S
    assert fast.stack(int(declared["stack_id"].iloc[0])) == [("y.py", 9, "g")]
    block = fast.initial_blocks.loc[fast.initial_blocks["alloc_id"] == int(declared["alloc_id"].iloc[0])]
    assert block["stack_id"].tolist() == declared["stack_id"].tolist()
    _reference_only(monkeypatch)
    assert_same(fast, read_trace(path))


@pytest.mark.full
def test_frames_of_a_real_snapshot_survive_convert(shared_dir, tmp_path):
    if not SNAPSHOT_DIR.is_dir():
        pytest.skip("no shared snapshots")
    trace = read_trace(SNAPSHOT_DIR / FILES["Wedsonlin 128 training"])
    with_frames = trace.events["stack_id"].to_numpy() >= 0
    assert with_frames.all() and len(trace.frames) > 100
    stack = trace.stack(int(trace.events["stack_id"].iloc[0]))
    assert stack[0][2] == "torch::unwind::unwind()"        # innermost first, as PyTorch records
    for suffix in (".parquet", ".csv"):
        out = tmp_path / f"t{suffix}"
        write_trace(trace, out)
        again = read_trace(out)
        assert_same(trace, again)
        assert again.stack(int(again.events["stack_id"].iloc[0])) == stack


def _opcode_bomb(body: bytes) -> bytes:
    return b"\x80\x04" + body


@pytest.mark.full
@pytest.mark.parametrize("blob, reason", [
    (b"\x80\x02]r\xff\xff\xff\x7f.", None),                                   # memo index 2**31-1: valid
    (b"\x80\x04\x95" + struct.pack("<Q", 1 << 62) + b"]." , "any"),        # FRAME claiming 4 EiB
    (b"\x80\x04\x8d" + struct.pack("<Q", 1 << 62) + b"abc.", "pickle"),     # BINUNICODE8 of 4 EiB
    (b"\x80\x04\x8e" + struct.pack("<Q", 1 << 40) + b"abc.", "pickle"),     # BINBYTES8 of 1 TiB
    (b"\x80\x04\x8b" + struct.pack("<I", 0xFFFFFFF0) + b"\x01.", "pickle"),  # LONG4 of 4 GiB
    (b"\x80\x04X" + struct.pack("<I", 0xFFFFFFFF) + b"a.", "pickle"),      # BINUNICODE of 4 GiB
    (b"\x80\x02]r\xff\xff\xff\xffh\x00\x00\x00\x00.", "pickle"),            # GET of a slot never PUT
])
def test_hostile_opcodes_are_cheap(tmp_path, blob, reason):
    import time

    path = tmp_path / "op.pickle"
    path.write_bytes(blob)
    start = time.perf_counter()
    if reason is None:
        assert len(read_trace(path).events) == 0
    elif reason == "any":      # harmless either way: it must only be quick and clean
        try:
            read_trace(path)
        except TraceFormatError as exc:
            assert "op.pickle" in str(exc) and "\n" not in str(exc)
    else:
        with pytest.raises(TraceFormatError) as err:
            read_trace(path)
        assert "op.pickle" in str(err.value) and "\n" not in str(err.value)
    assert time.perf_counter() - start < 20


@pytest.mark.full
def test_memory_cap_stops_a_legal_but_huge_parse(tmp_path):
    # 400k tiny allocations: fine by default, over a 64 MiB parsing budget.
    entries = [{"action": "alloc", "addr": 512 * i, "size": 512, "stream": 0} for i in range(400_000)]
    path = write(tmp_path / "many.pickle", {"segments": [], "device_traces": [entries]})
    with pytest.raises(LimitExceeded, match="memory_bytes"):
        read_trace(path, limits=Limits(memory_bytes=64 * MiB))


def test_event_cap_names_the_option(tmp_path):
    path = write(tmp_path / "s.pickle", make_snapshot())
    with pytest.raises(LimitExceeded) as err:
        read_trace(path, limits=Limits(events=3))
    assert "--max-events" in str(err.value) and "s.pickle" in str(err.value)


@pytest.mark.parametrize("settings, key", [
    ({"max_split_size": None}, "max_split_size"),
    ({"max_split_size": [1]}, "max_split_size"),
    ({"max_split_size": 1 << 20}, "max_split_size"),           # under PyTorch's 20 MiB minimum
    ({"garbage_collection_threshold": [0.5]}, "garbage_collection_threshold"),
    ({"garbage_collection_threshold": 7.0}, "garbage_collection_threshold"),
    ({"expandable_segments": "yes"}, "expandable_segments"),
    ({"roundup_power2_divisions": {"1": [4]}}, "roundup_power2_divisions"),
    ({"roundup_power2_divisions": {"1": 3}}, "roundup_power2_divisions"),
])
def test_invalid_recorded_settings(tmp_path, settings, key):
    snap = make_snapshot()
    snap["allocator_settings"] = settings
    path = write(tmp_path / "bad_settings.pickle", snap)
    with pytest.raises(TraceFormatError) as err:
        read_trace(path)
    assert "bad_settings.pickle" in str(err.value) and f"allocator_settings.{key}" in str(err.value)
    trace = read_trace(path, lenient=True)
    assert key not in (trace.meta.allocator_settings or {})
    assert any(key in note and "ignored" in note for note in trace.meta.notes)


@pytest.mark.full
def test_quadratic_inputs_stay_fast(tmp_path):
    """40k expandable map events and 20k segments load in seconds, not hours."""
    n = 20_000
    base = 1 << 40
    entries = [{"action": "segment_map", "addr": base + i * 20 * MiB, "size": 20 * MiB, "stream": 0,
                "time_us": i} for i in range(n)]
    entries += [{"action": "segment_unmap", "addr": base + i * 20 * MiB, "size": 20 * MiB, "stream": i % 7,
                 "time_us": n + i} for i in range(0, n, 2)]
    segments = [{"device": 0, "address": (1 << 44) + i * 2 * MiB, "total_size": 2 * MiB, "stream": 0,
                 "blocks": [{"size": 2 * MiB, "state": "inactive"}]} for i in range(n)]
    path = write(tmp_path / "q.pickle", {"segments": segments, "device_traces": [entries]})
    import time
    start = time.perf_counter()
    trace = read_trace(path)
    assert time.perf_counter() - start < 60
    assert len(trace.initial_segments) >= n


# ---------------------------------------------------------------------- Kineto
def _kineto(path: Path, events: list, top: dict | None = None) -> Path:
    path.write_text(json.dumps({**(top or {}), "traceEvents": events}))
    return path


def _mem(ts, addr, nbytes, dtype=1, dindex=0, total=None, reserved=None, tid=1):
    args = {"Addr": addr, "Bytes": nbytes, "Device Type": dtype, "Device Id": dindex}
    if total is not None:
        args["Total Allocated"] = total
    if reserved is not None:
        args["Total Reserved"] = reserved
    return {"ph": "i", "name": "[memory]", "ts": ts, "pid": 1, "tid": tid, "args": args}


def test_kineto_hip_device_is_a_gpu(tmp_path):
    path = _kineto(tmp_path / "rocm.json", [
        _mem(1.5, 4096, 512, dtype=6, total=512, reserved=2 * MiB),
        _mem(2.5, 4096, -512, dtype=6, total=0, reserved=2 * MiB)])
    trace = read_trace(path)
    assert trace.devices == [0]
    run = recorded_run(trace, 0)
    assert run is not None and run.peak_reserved_bytes == 2 * MiB and run.peak_allocated_bytes == 512
    assert trace.recorded_series["event_index"].tolist() == [0, 2]


def test_kineto_2021_format_is_refused(tmp_path):
    events = [{"ph": "i", "name": "[memory]", "ts": i, "args": {"Bytes": 4, "Device Type": 0, "Device Id": -1}}
              for i in range(3)]
    with pytest.raises(TraceFormatError) as err:
        read_trace(_kineto(tmp_path / "old.json", events))
    assert "Addr" in str(err.value) and "PyTorch 1.10" in str(err.value) and "\n" not in str(err.value)


def test_kineto_pseudo_frames_are_the_enclosing_ops(tmp_path):
    ops = [{"ph": "X", "cat": "python_function", "name": "train.py(12): step", "ts": 0, "dur": 100, "pid": 1, "tid": 1},
           {"ph": "X", "cat": "cpu_op", "name": "aten::empty", "ts": 10, "dur": 5, "pid": 1, "tid": 1},
           {"ph": "X", "cat": "cpu_op", "name": "aten::other_thread", "ts": 0, "dur": 100, "pid": 1, "tid": 2}]
    path = _kineto(tmp_path / "ops.json", ops + [_mem(12, 4096, 512), _mem(50, 4096, -512)])
    trace = read_trace(path)
    assert trace.stack(int(trace.events["stack_id"].iloc[0])) == [("", 0, "aten::empty"), ("train.py", 12, "step")]
    assert trace.stack(int(trace.events["stack_id"].iloc[1])) == [("train.py", 12, "step")]


@pytest.mark.full
def test_real_kineto_files(shared_dir):
    if not KINETO_DIR.is_dir():
        pytest.skip("no shared Kineto traces")
    rocm = read_trace(KINETO_DIR / "AMD-AGI_TraceLens_normalization_layer_test.json.gz")
    assert 0 in rocm.devices and min(rocm.devices) >= -1
    assert recorded_run(rocm, 0).peak_reserved_bytes == 8 * MiB      # 2 -> 4 -> 6 -> 8 MB
    h100 = read_trace(KINETO_DIR / "AMD-AGI_TraceLens_h100_bert-small.json.gz")
    reserved = h100.recorded_series.loc[h100.recorded_series["device"] == 0, "reserved_bytes"]
    assert reserved.nunique() == 1 and recorded_run(h100, 0).peak_reserved_bytes == int(reserved.iloc[0])
    with pytest.raises(TraceFormatError, match="Addr"):
        read_trace(KINETO_DIR / "pytorch_kineto_resnet50_nw0_1623143566756.json.gz")


def test_kineto_series_survive_convert(tmp_path):
    path = _kineto(tmp_path / "k.json", [_mem(1, 4096, 512, total=512, reserved=2 * MiB),
                                         _mem(2, 4096, -512, total=0, reserved=2 * MiB)])
    trace = read_trace(path)
    for suffix in (".parquet", ".csv"):
        again = read_trace(write_trace(trace, tmp_path / f"k{suffix}") or tmp_path / f"k{suffix}")
        assert_same(trace, again)
        assert again.meta.recorded == trace.meta.recorded


# ---------------------------------------------------------------------- RMM
def test_rmm_columnar_equals_line_by_line(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    lines = ["Thread,Time,Action,Pointer,Size,Stream"]
    live: list[int] = []
    t = 0
    for i in range(3000):
        t += int(rng.integers(0, 5000))
        stamp = f"{t // 3_600_000_000_000 % 24:02d}:{t // 60_000_000_000 % 60:02d}:{t // 1_000_000_000 % 60:02d}.{t % 1_000_000_000 // 1000:06d}"
        if live and rng.random() < 0.45:
            addr = live.pop(int(rng.integers(0, len(live))))
            lines.append(f"7,{stamp},free,0x{addr:x},{addr % 4096 + 1},0x0")
        else:
            addr = int(rng.integers(1, 1 << 30)) * 4096
            live.append(addr)
            lines.append(f"7,{stamp},allocate,0x{addr:x},{addr % 4096 + 1},0x0")
    path = tmp_path / "log.csv"
    path.write_text("\n".join(lines) + "\n")
    fast = read_trace(path)
    from allocsim.trace.formats.rmm import reader as rmm_module
    monkeypatch.setattr(rmm_module, "rmm_columns", lambda *a, **k: None)
    slow = read_trace(path)
    assert_same(fast, slow)
    assert fast.meta.version_hints == slow.meta.version_hints and fast.meta.notes == slow.meta.notes


# ---------------------------------------------------------------------- limits and files
@pytest.mark.full
def test_gzip_bomb_is_stopped_by_the_ratio(tmp_path):
    path = tmp_path / "bomb.json.gz"
    with gzip.open(path, "wb", compresslevel=9) as fh:
        fh.write(b'{"traceEvents": [' + b" " * (300 * MiB))
    assert path.stat().st_size < 2 * MiB
    with pytest.raises(LimitExceeded, match="compression_ratio"):
        read_trace(path)


def test_corrupt_deflate_stream_is_one_line(tmp_path):
    data = bytearray(gzip.compress(json.dumps({"traceEvents": [_mem(1, 4096, 512)] * 200}).encode()))
    data[30:40] = b"\xff" * 10
    path = tmp_path / "bad.json.gz"
    path.write_bytes(bytes(data))
    with pytest.raises(TraceFormatError) as err:
        read_trace(path)
    assert "bad.json.gz" in str(err.value) and "\n" not in str(err.value)


def test_special_files_are_one_line(tmp_path):
    with pytest.raises(TraceFormatError, match="is a directory"):
        read_trace(tmp_path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(TraceFormatError, match="FIFO"):
        read_trace(fifo)
    with pytest.raises(TraceFormatError, match="device file"):
        read_trace("/dev/null")
    with pytest.raises(TraceFormatError, match="no such file"):
        read_trace(tmp_path / "missing.pickle")


def _parquet(tmp_path, events: dict, metadata: dict | None = None) -> Path:
    table = pa.table(events)
    if metadata:
        table = table.replace_schema_metadata(metadata)
    path = tmp_path / "t.parquet"
    pq.write_table(table, path)
    return path


def _events(n=3, **over):
    cols = {"t_ns": np.arange(n, dtype=np.int64), "kind": np.ones(n, dtype=np.uint8),
            "alloc_id": np.arange(n, dtype=np.int64), "size_bytes": np.full(n, 512, dtype=np.int64),
            "stream": np.zeros(n, dtype=np.int64), "device": np.zeros(n, dtype=np.int16)}
    cols.update(over)
    return cols


def test_parquet_float_and_uint64_columns_are_refused(tmp_path):
    with pytest.raises(TraceFormatError, match="floating-point"):
        read_trace(_parquet(tmp_path, _events(t_ns=np.array([0.0, 1.0, 2.0]))))
    with pytest.raises(TraceFormatError, match="out of range"):
        read_trace(_parquet(tmp_path, _events(size_bytes=np.array([1, 2, 1 << 63], dtype=np.uint64))))
    with pytest.raises(TraceFormatError, match="2\\*\\*62"):
        read_trace(_parquet(tmp_path, _events(t_ns=np.array([0, 1, (1 << 63) - 1], dtype=np.int64))))


def test_parquet_row_count_is_checked_before_reading(tmp_path):
    path = _parquet(tmp_path, _events(n=1000))
    with pytest.raises(LimitExceeded, match="events"):
        read_trace(path, limits=Limits(events=999))


def test_parquet_side_table_bomb(tmp_path):
    frame = pa.table({"alloc_id": np.zeros(4_000_000, np.int64), "size_bytes": np.zeros(4_000_000, np.int64),
                      "stream": np.zeros(4_000_000, np.int64), "device": np.zeros(4_000_000, np.int16),
                      "addr": np.zeros(4_000_000, np.int64), "block_size_bytes": np.zeros(4_000_000, np.int64)})
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, frame.schema, options=pa.ipc.IpcWriteOptions(compression="zstd")) as w:
        w.write_table(frame)
    assert len(sink.getvalue()) < 1 * MiB
    path = _parquet(tmp_path, _events(), {b"allocsim.initial_allocs": sink.getvalue()})
    with pytest.raises(LimitExceeded, match="compression_ratio|decompressed"):
        read_trace(path)


def test_live_bytes_past_2_62_are_refused_and_sums_do_not_wrap(tmp_path):
    n = 9000                                     # 9000 * 2**50 > 2**63
    path = _parquet(tmp_path, _events(n=n, size_bytes=np.full(n, 1 << 50, dtype=np.int64)))
    with pytest.raises(TraceFormatError, match="event row 4096: live bytes reach"):
        read_trace(path)
    from allocsim.trace.formats.native import read_parquet
    summary = summarize(read_parquet(str(path)))          # the statistics themselves never wrap
    assert summary["peak_live_bytes"] == n * (1 << 50)


def test_quoted_values_are_short(tmp_path):
    snap = make_snapshot()
    snap["device_traces"][0][1]["action"] = "x" * 5_000_000
    path = write(tmp_path / "long.pickle", snap)
    with pytest.raises(TraceFormatError) as err:
        read_trace(path)
    assert len(str(err.value)) < 400


# ---------------------------------------------------------------------- command line
def test_cli_limit_options_and_special_files(tmp_path, capsys):
    from allocsim.cli import main

    path = write(tmp_path / "s.pickle", make_snapshot())
    assert main(["info", str(path), "--max-events", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "s.pickle" in err and "--max-events" in err
    assert main(["info", str(path), "--limits", "events=100,string_chars=1KiB"]) == 2     # not a whole number
    assert "string_chars" in capsys.readouterr().err
    assert main(["info", str(path), "--limits", "events=100", "--limits", "depth=4", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["allocs"] - info["recorded_ooms"] == 2   # the oom entry's failed request is an ALLOC too
    assert main(["info", str(path), "--limits", "nonsense=1"]) == 2
    assert "unknown limit" in capsys.readouterr().err
    assert main(["info", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "is a directory" in err
    assert main(["run", str(path), "--policy", "pytorch", "--fast", "--max-decompressed", "100"]) == 2
    assert "decompressed_bytes" in capsys.readouterr().err
