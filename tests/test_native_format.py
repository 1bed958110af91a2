"""allocsim's own Parquet and CSV: exact round trips, and clear errors for damaged files."""

from __future__ import annotations

import gzip
import json
import random

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocsim.errors import TraceFormatError
from allocsim.trace import EventKind, detect_format, read_trace, write_trace
from allocsim.trace.reading.builder import TraceBuilder
from allocsim.trace.schema import SEGMENT_DTYPES, BLOCK_DTYPES, frame_from_columns

TABLES = ("events", "initial_allocs", "initial_segments", "initial_blocks", "decisions")


def sample_trace(seed: int = 0, n_allocs: int = 200):
    """A two-device, three-stream trace with orphans, markers, decisions and side tables."""
    rng = random.Random(seed)
    b = TraceBuilder("sample.pickle", "pytorch-snapshot")
    b.meta.allocator_settings = {"max_split_size": -1, "expandable_segments": False}
    b.initial_alloc(device=0, stream=7, addr=0x7000, size_bytes=4096, block_size_bytes=4096)
    live: list[tuple[int, int, int, int]] = []
    t = 0
    for i in range(n_allocs):
        t += rng.randint(0, 3)
        dev, stream = rng.choice([(0, 0), (0, 7), (1, 0)])
        addr = 0x100000 + 512 * rng.randint(0, 50)
        if (dev, addr) in {(d, a) for d, _, a, _ in live}:
            continue
        size = rng.randint(1, 1 << 22)
        b.alloc(i, t, dev, stream, addr, size, record_decision=True)
        live.append((dev, stream, addr, size))
        if live and rng.random() < 0.5:
            d, s, a, sz = live.pop(rng.randrange(len(live)))
            b.free_requested(i, t, d, s, a, sz, record_decision=True)
            b.free_completed(i, t + 1, d, s, a, sz, record_decision=True)
            t += 1
        if i % 50 == 0:
            b.marker(i, t, f"step {i // 50}")
            b.decision(b.next_event_index, t, "segment_alloc", 0x200000 + i, 2 << 20, 0, 0)
    b.free(n_allocs, t + 5, 0, 0, 0xDEAD00, 1000)   # orphan free: becomes initial state
    segments = frame_from_columns({"device": [0], "addr": [0x7000], "size_bytes": [2 << 20], "stream": [7],
                                   "pool": ["small"], "is_expandable": [False]}, SEGMENT_DTYPES)
    blocks = frame_from_columns({"device": [0, 0], "segment_addr": [0x7000, 0x7000], "addr": [0x7000, 0x8000],
                                 "size_bytes": [4096, (2 << 20) - 4096], "requested_bytes": [4096, 0],
                                 "state": ["active_allocated", "inactive"], "alloc_id": [0, -1]}, BLOCK_DTYPES)
    return b.finish(initial_segments=segments, initial_blocks=blocks)


def assert_same_trace(a, b):
    for name in TABLES:
        pd.testing.assert_frame_equal(getattr(a, name), getattr(b, name), check_dtype=False)
        for col in getattr(a, name).columns:
            if getattr(a, name)[col].dtype != object:
                assert getattr(a, name)[col].dtype == getattr(b, name)[col].dtype, (name, col)
    assert a.labels == b.labels
    assert a.meta.allocator_settings == b.meta.allocator_settings
    assert a.meta.notes == b.meta.notes and a.meta.devices == b.meta.devices


@pytest.mark.parametrize("suffix", [".parquet", ".csv", ".csv.gz"])
def test_round_trip_is_exact(tmp_path, suffix):
    trace = sample_trace()
    path = tmp_path / f"t{suffix}"
    write_trace(trace, path)
    back = read_trace(path)
    assert_same_trace(trace, back)
    assert back.meta.format == ("allocsim-parquet" if suffix == ".parquet" else "allocsim-csv")
    assert back.meta.version_hints["converted_from"] == "pytorch-snapshot"
    # and a second round trip changes nothing at all
    path2 = tmp_path / f"u{suffix}"
    write_trace(back, path2)
    assert_same_trace(back, read_trace(path2))


def test_detection_is_by_content(tmp_path):
    trace = sample_trace()
    write_trace(trace, tmp_path / "a.parquet")
    (tmp_path / "a.parquet").rename(tmp_path / "renamed.bin")
    assert detect_format(tmp_path / "renamed.bin") == "allocsim-parquet"
    write_trace(trace, tmp_path / "b.csv")
    (tmp_path / "b.csv").rename(tmp_path / "b.txt")
    assert detect_format(tmp_path / "b.txt") == "allocsim-csv"


def test_empty_and_unknown_files_are_named(tmp_path):
    empty = tmp_path / "empty.parquet"
    empty.write_bytes(b"")
    with pytest.raises(TraceFormatError, match="empty.parquet: empty file"):
        read_trace(empty)
    junk = tmp_path / "junk.dat"
    junk.write_text("hello world\n")
    with pytest.raises(TraceFormatError, match="junk.dat: unknown trace format"):
        read_trace(junk)


def _csv_lines(tmp_path):
    path = tmp_path / "t.csv"
    write_trace(sample_trace(n_allocs=30), path)
    return path, path.read_text().splitlines()


def test_csv_semantic_errors_name_the_row(tmp_path):
    path, lines = _csv_lines(tmp_path)
    header, cols, rows = lines[0], lines[1], lines[2:]
    # A free of an id that is not allocated (the id is changed to one never used)
    first_free = next(i for i, r in enumerate(rows) if r.split(",")[1] == str(int(EventKind.FREE_REQUESTED)))
    parts = rows[first_free].split(",")
    parts[2] = "999999"
    bad = rows[:first_free] + [",".join(parts)] + rows[first_free + 1:]
    path.write_text("\n".join([header, cols] + bad) + "\n")
    with pytest.raises(TraceFormatError, match=rf"t.csv: event row {first_free}: free request of id 999999"):
        read_trace(path)
    repaired = read_trace(path, lenient=True)
    assert any("999999" in line for line in repaired.meta.repairs)


def test_csv_time_going_back_and_non_numeric(tmp_path):
    path, lines = _csv_lines(tmp_path)
    header, cols, rows = lines[0], lines[1], lines[2:]
    parts = rows[5].split(",")
    parts[0] = "-50"
    path.write_text("\n".join([header, cols] + rows[:5] + [",".join(parts)] + rows[6:]) + "\n")
    with pytest.raises(TraceFormatError, match="event row 5: time goes back"):
        read_trace(path)
    parts[0] = "soon"
    path.write_text("\n".join([header, cols] + rows[:5] + [",".join(parts)] + rows[6:]) + "\n")
    with pytest.raises(TraceFormatError, match=r"events row 5.*not a number: 'soon'"):
        read_trace(path)


def test_csv_missing_column(tmp_path):
    path, lines = _csv_lines(tmp_path)
    header, cols, rows = lines[0], lines[1], lines[2:]
    device_col = cols.split(",").index("device")
    strip = lambda line: ",".join(p for i, p in enumerate(line.split(",")) if i != device_col)  # noqa: E731
    path.write_text("\n".join([header, strip(cols)] + [strip(r) for r in rows]) + "\n")
    with pytest.raises(TraceFormatError, match=r"missing columns \['device'\]"):
        read_trace(path)


def test_parquet_truncated(tmp_path):
    path = tmp_path / "t.parquet"
    write_trace(sample_trace(), path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceFormatError, match="t.parquet"):
        read_trace(path)


@pytest.mark.full
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_corrupted_csv_never_crashes(tmp_path_factory, data):
    base = tmp_path_factory.mktemp("fuzz")
    path = base / "t.csv"
    write_trace(sample_trace(n_allocs=20), path)
    raw = bytearray(path.read_bytes())
    how = data.draw(st.sampled_from(["truncate", "flip", "field"]))
    if how == "truncate":
        raw = raw[: data.draw(st.integers(0, len(raw)))]
    elif how == "flip":
        for _ in range(data.draw(st.integers(1, 8))):
            raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    else:
        lines = raw.decode().splitlines()
        row = data.draw(st.integers(2, len(lines) - 1))
        parts = lines[row].split(",")
        parts[data.draw(st.integers(0, len(parts) - 1))] = data.draw(
            st.one_of(st.text(max_size=6), st.integers(-(2**63), 2**64).map(str)))
        lines[row] = ",".join(parts)
        raw = bytearray("\n".join(lines).encode())
    path.write_bytes(bytes(raw))
    for lenient in (False, True):
        try:
            read_trace(path, lenient=lenient)
        except TraceFormatError:
            pass


@pytest.mark.full
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(0, 10_000), flips=st.lists(st.tuples(st.integers(0, 10**9), st.integers(0, 255)), max_size=6))
def test_corrupted_parquet_never_crashes(tmp_path_factory, cut, flips):
    path = tmp_path_factory.mktemp("fuzzpq") / "t.parquet"
    write_trace(sample_trace(n_allocs=20), path)
    raw = bytearray(path.read_bytes())
    for pos, value in flips:
        raw[pos % len(raw)] = value
    if cut:
        raw = raw[: max(1, len(raw) - cut)]
    path.write_bytes(bytes(raw))
    try:
        read_trace(path)
    except TraceFormatError:
        pass


def test_events_are_compact():
    trace = sample_trace(n_allocs=2000)
    per_event = trace.events.memory_usage(index=False, deep=True).sum() / len(trace.events)
    assert per_event <= 40
