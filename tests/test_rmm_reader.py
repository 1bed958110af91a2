"""RMM logging_resource_adaptor CSV reader: every format variant, round trips from real traces, bad input."""

from __future__ import annotations

import gzip
import importlib.util
import os
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocsim.errors import TraceFormatError
from allocsim.trace import EventKind, Trace, detect_format, read_trace
from allocsim.trace.formats.rmm.reader import NS_PER_DAY, parse_hex, parse_time_ns, read_rmm_csv
from allocsim.trace.reading.validate import validate_events

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "data" / "rmm"
KINETO_TINY = Path(__file__).resolve().parent / "data" / "kineto" / "tiny_cpu_profile.json.gz"
REAL_KINETO = sorted((ROOT / "traces").glob("*.json.gz"))
SNAPSHOT = ROOT.parent / "shared" / "traces" / "pytorch-snapshots" / "silmont2000__memory_forward_fp32_128.pickle"
HEADER = "Thread,Time,Action,Pointer,Size,Stream"

A, FR, FC = EventKind.ALLOC, EventKind.FREE_REQUESTED, EventKind.FREE_COMPLETED


def rows(trace: Trace) -> list[tuple]:
    ev = trace.events
    return list(zip(ev.t_ns, ev.kind, ev.alloc_id, ev.size_bytes, ev.stream, ev.device))


def hms(h, m, s, us=0) -> int:
    return ((h * 60 + m) * 60 + s) * 10**9 + us * 1000


def write(tmp_path: Path, text: str, name: str = "log.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# --------------------------------------------------------------------------- the variants
def test_new_style():
    """Current printf form: 0x pointers, '.' before micros, bare-hex streams, (nil) failure pointer."""
    path = DATA / "new_style.csv"
    assert detect_format(path) == "rmm-csv"
    trace = read_trace(path)
    big = 0x55D5C0A1B2C0
    t = lambda us: hms(10, 0, 0, us)
    assert rows(trace) == [
        (t(1), A, 0, 1024, 0, 0), (t(10), A, 1, 256, 2, 0), (t(20), A, 2, 4096, big, 0),
        (t(30), FR, 0, 1024, 0, 0), (t(30), FC, 0, 1024, 0, 0),
        (t(50), A, 3, 512, 2, 0),                       # address reused: fresh id
        (t(60), FR, 2, 4096, big, 0), (t(60), FC, 2, 4096, big, 0),
        (t(500000), FR, 1, 256, 2, 0), (t(500000), FC, 1, 256, 2, 0),
        (t(1000000), FR, 4, 8192, 0, 0), (t(1000000), FC, 4, 8192, 0, 0),  # allocated before logging
    ]
    assert trace.initial_allocs[["alloc_id", "size_bytes", "addr"]].values.tolist() == [[4, 8192, 0x7F2A00100000]]
    assert trace.decisions[["event_index", "t_ns", "action", "addr", "size_bytes", "stream"]].values.tolist() == [
        [5, t(40), "oom", -1, 17179869184, 0]]
    hints = trace.meta.version_hints
    assert hints["time_format"].startswith("HH:MM:SS.micro")
    assert hints["pointer_style"] == "0x-prefixed hex" and hints["stream_style"] == "bare hex"
    assert hints["threads"] == 2
    assert trace.meta.devices == [0]
    assert any("allocate failure" in n for n in trace.meta.notes)
    validate_events(trace, str(path))


def test_old_style():
    """Before RMM PR #755: ':' before micros; bare-hex pointers; empty pointer in the failure row (PR #988)."""
    trace = read_rmm_csv(DATA / "old_style.csv")
    t = lambda us: hms(8, 15, 30, us)
    assert rows(trace) == [
        (t(100), A, 0, 800, 0, 0), (t(250), A, 1, 1600, 0, 0),
        (t(1000), FR, 0, 800, 0, 0), (t(1000), FC, 0, 800, 0, 0),
        (t(2000), A, 2, 800, 0, 0),
        (t(3000), FR, 1, 1600, 0, 0), (t(3000), FC, 1, 1600, 0, 0),
        (t(3000), FR, 2, 800, 0, 0), (t(3000), FC, 2, 800, 0, 0),
    ]
    assert trace.decisions[["event_index", "action", "size_bytes"]].values.tolist() == [[4, "oom", 1 << 40]]
    assert trace.meta.version_hints["time_format"] == "HH:MM:SS:micro (RMM < 2021)"
    assert trace.meta.version_hints["pointer_style"] == "bare hex"
    assert len(trace.initial_allocs) == 0


def test_fmt_era_streams():
    """2024 fmt form: 0x streams, (nil) default stream, 0x0 failure pointer; several streams and threads."""
    trace = read_rmm_csv(DATA / "fmt_era.csv")
    s1, s2 = 0x5581D0C0E9A0, 0x5581D0C0F1B0
    assert trace.column("stream").tolist() == [0, s1, s2, s2, s2, s1, s1, 0, 0]
    assert trace.column("size_bytes").tolist() == [256, 512, 768, 768, 768, 512, 512, 256, 256]
    assert trace.decisions[["event_index", "size_bytes", "stream"]].values.tolist() == [[3, 32 << 30, s1]]
    assert trace.meta.version_hints["stream_style"] == "0x-prefixed hex"
    validate_events(trace, "fmt_era.csv")


def test_reordered_columns_extra_column_crlf():
    trace = read_trace(DATA / "reordered_columns.csv")
    assert rows(trace) == [(hms(1, 2, 3, 4), A, 0, 4096, 0, 0), (hms(1, 2, 3, 6), FR, 0, 4096, 0, 0),
                           (hms(1, 2, 3, 6), FC, 0, 4096, 0, 0)]
    assert trace.meta.version_hints["extra_columns"] == 1
    assert any("0 bytes at a null pointer" in n for n in trace.meta.notes)


def test_device_keyword():
    trace = read_rmm_csv(DATA / "fmt_era.csv", device=3)
    assert set(trace.column("device")) == {3} and trace.meta.devices == [3]
    assert set(trace.decisions["device"]) == {3}
    with pytest.raises(ValueError):
        read_rmm_csv(DATA / "fmt_era.csv", device=1 << 20)


def test_parsers():
    assert parse_time_ns("23:59:59.999999") == (NS_PER_DAY - 1000, ".")
    assert parse_time_ns("00:00:01:5") == (1_500_000_000, ":")
    assert parse_time_ns("01:02:03") == (hms(1, 2, 3), "")
    assert parse_time_ns("12:00:00.123456789") == (hms(12, 0, 0) + 123456789, ".")
    for bad in ("24:00:00.0", "12:60:00.0", "1:2:3", "12:00:00.1234567890", "noon", "", "12:00:00,5"):
        assert parse_time_ns(bad) is None, bad
    assert parse_hex("0x7f00") == (0x7F00, True) and parse_hex("7f00") == (0x7F00, False)
    assert parse_hex("(nil)") == (0, False) and parse_hex("") == (0, False) and parse_hex("nullptr") == (0, False)
    assert parse_hex("0xffffffffffffffff") == (-1, True)
    for bad in ("0x", "-5", "xyz", "0x1" + "0" * 16, "12 34"):
        assert parse_hex(bad) is None, bad


def test_midnight_wrap(tmp_path):
    text = "\n".join([HEADER, "1,23:59:59.999999,allocate,0x100,8,0", "1,00:00:00.000001,free,0x100,8,0",
                      "1,00:00:02.000000,allocate,0x100,16,0", ""])
    trace = read_rmm_csv(write(tmp_path, text))
    assert trace.column("t_ns").tolist() == [NS_PER_DAY - 1000, NS_PER_DAY + 1000, NS_PER_DAY + 1000,
                                             NS_PER_DAY + 2 * 10**9]
    assert any("midnight" in n for n in trace.meta.notes)
    # A late row from before midnight, after the wrap, is time going back (not another day).
    late = text + "1,23:59:59.999998,allocate,0x200,8,0\n"
    with pytest.raises(TraceFormatError, match="line 5: time goes back"):
        read_rmm_csv(write(tmp_path, late))
    trace = read_rmm_csv(write(tmp_path, late), lenient=True)
    assert trace.column("t_ns")[-1] == NS_PER_DAY + 2 * 10**9
    assert sum("midnight" in n for n in trace.meta.notes) == 1


def test_missing_time_and_stream_columns(tmp_path):
    trace = read_rmm_csv(write(tmp_path, "Action,Pointer,Size\nallocate,0x10,4\nfree,0x10,4\n"))
    assert trace.column("t_ns").tolist() == [0, 1, 1]
    assert trace.meta.time_synthesized
    assert set(trace.column("stream")) == {0}
    assert any("no Stream column" in n for n in trace.meta.notes)


def test_header_only_and_gzip(tmp_path):
    trace = read_rmm_csv(write(tmp_path, HEADER + "\n"))
    assert len(trace) == 0 and any("no rows" in n for n in trace.meta.notes)
    gz = tmp_path / "log.csv.gz"
    gz.write_bytes(gzip.compress((DATA / "new_style.csv").read_bytes()))
    assert detect_format(gz) == "rmm-csv"
    assert rows(read_trace(gz)) == rows(read_rmm_csv(DATA / "new_style.csv"))


def test_truncated_gzip(tmp_path):
    body = HEADER + "\n" + "".join(f"1,10:00:{i // 10**6:02d}.{i % 10**6:06d},allocate,{0x1000 + 16 * i:#x},16,0\n"
                                   for i in range(20000))
    blob = gzip.compress(body.encode())
    gz = tmp_path / "cut.csv.gz"
    gz.write_bytes(blob[: len(blob) * 2 // 3])
    with pytest.raises(TraceFormatError, match="cannot read") as err:
        read_rmm_csv(gz)
    assert str(gz) in str(err.value)
    trace = read_rmm_csv(gz, lenient=True)
    assert 0 < len(trace) < 20000 and any("truncated" in r for r in trace.meta.repairs)


# --------------------------------------------------------------------------- bad input
GOOD = ["1,10:00:00.000001,allocate,0x100,64,0", "1,10:00:00.000002,allocate,0x200,32,0",
        "1,10:00:00.000003,free,0x100,64,0"]


@pytest.mark.parametrize("line3, reason, lenient_check", [
    ("1,10:00:00.000003,free,0x100,abc,0", "Size 'abc' is not a non-negative integer",
     lambda t: t.column("size_bytes").tolist() == [64, 32, 64, 64]),          # free: allocated size used
    ("1,10:00:00.000003,allocate,0x300,-5,0", "Size '-5' is not a non-negative integer",
     lambda t: len(t) == 2),
    ("1,10:00:00.000003,allocate,0x300,1e3,0", "not a non-negative integer", lambda t: len(t) == 2),
    ("1,10:00:00.000003,allocate,0x300,99999999999999999999,0", "absurd size", lambda t: len(t) == 2),
    ("1,25:00:00.000003,free,0x100,64,0", "unparseable time '25:00:00.000003'",
     lambda t: t.column("t_ns").tolist()[-1] == hms(10, 0, 0, 2)),             # previous row's time
    ("1,10:00:00.000003,free,0xzz,64,0", "unparseable pointer '0xzz'", lambda t: len(t) == 2),
    ("1,10:00:00.000003,free,0x100,64,stream", "unparseable stream 'stream'",
     lambda t: t.column("stream").tolist() == [0, 0, 0, 0]),
    ("1,10:00:00.000003,reallocate,0x100,64,0", "unknown action 'reallocate'", lambda t: len(t) == 2),
    ("1,10:00:00.000003,free,0x100,64", "expected 6 comma-separated fields, got 5", lambda t: len(t) == 2),
    ("1,10:00:00.000003,free,0x100,64,0,extra", "got 7", lambda t: len(t) == 2),
    ("1,10:00:00.000003,allocate,(nil),64,0", "null pointer in an allocate row", lambda t: len(t) == 2),
    ("1,10:00:00.000003,free,0x0,64,0", "null pointer in a free row", lambda t: len(t) == 2),
    ("1,09:59:59.000000,free,0x100,64,0", "time goes back", lambda t: np.all(np.diff(t.column("t_ns")) >= 0)),
    ("1,10:00:00.000003,free,0x100,60,0", "free of 60 bytes", lambda t: t.column("size_bytes").tolist()[-1] == 64),
    ("1,10:00:00.000003,allocate,0x200,8,0", "still allocated", lambda t: len(t) == 5),
])
def test_bad_rows(tmp_path, line3, reason, lenient_check):
    path = write(tmp_path, "\n".join([HEADER, GOOD[0], GOOD[1], line3, ""]))
    with pytest.raises(TraceFormatError) as err:
        read_rmm_csv(path)
    msg = str(err.value)
    assert str(path) in msg and "line 4" in msg and reason in msg, msg
    trace = read_rmm_csv(path, lenient=True)
    assert any(r.startswith("record line 4: ") for r in trace.meta.repairs), trace.meta.repairs
    assert lenient_check(trace), rows(trace)
    validate_events(trace, str(path))


def test_double_free(tmp_path):
    path = write(tmp_path, "\n".join([HEADER, GOOD[0], GOOD[2], GOOD[2].replace("03,", "04,")]))
    with pytest.raises(TraceFormatError, match="line 4: double free"):
        read_rmm_csv(path)
    assert len(read_rmm_csv(path, lenient=True)) == 3


@pytest.mark.parametrize("text, record, reason", [
    ("", None, "empty file"),
    ("\n\n  \n", None, "empty file"),
    ("Thread,Time,Action,Size,Stream\n1,10:00:00.0,allocate,64,0\n", "line 1", "missing column(s) Pointer"),
    ("1,10:00:00.000001,allocate,0x100,64,0\n", "line 1", "missing column(s) Action, Pointer, Size"),
    ("Event Type,Device ID,Address,Stream,Size (bytes)\n", "line 1", "not an RMM log header"),
    ("Action,Pointer,Size,Action\n", "line 1", "appears twice"),
])
def test_bad_files(tmp_path, text, record, reason):
    path = write(tmp_path, text)
    for lenient in (False, True):
        with pytest.raises(TraceFormatError) as err:
            read_rmm_csv(path, lenient=lenient)
        assert err.value.record == record and reason in err.value.reason and str(path) in str(err.value)


# --------------------------------------------------------------------------- real traces as RMM logs
def trace_to_rmm_csv(trace: Trace, path: Path, *, start_ns: int = NS_PER_DAY - 10**9) -> pd.DataFrame:
    """Write one device of ``trace`` as an RMM log; return the events it should read back as.

    Allocations get synthetic addresses that never overlap a live block (a bump pointer, plus reuse of
    freed addresses of the same size); blocks alive at the start are freed without an allocate row.
    Time starts 1 s before midnight, rounded down to whole microseconds, so long traces wrap.
    """
    ev = trace.events[trace.events["kind"].isin([int(A), int(FR)])]
    t0 = int(ev["t_ns"].min()) if len(ev) else 0
    next_addr = 0x7F0000000000
    addr_of: dict[int, int] = {}
    free_by_size: dict[int, list[int]] = {}

    def bump(size: int) -> int:
        nonlocal next_addr
        addr, next_addr = next_addr, next_addr + max(512, -(-size // 512) * 512)
        return addr

    for aid, size in zip(trace.initial_allocs["alloc_id"], trace.initial_allocs["size_bytes"]):
        addr_of[int(aid)] = bump(int(size))
    lines = [HEADER]
    expect_t = []
    for t, kind, aid, size, stream in zip(ev["t_ns"], ev["kind"], ev["alloc_id"], ev["size_bytes"], ev["stream"]):
        t_us = (int(t) - t0) // 1000
        rel = start_ns + t_us * 1000
        expect_t.append(rel)
        day_us = (rel % NS_PER_DAY) // 1000
        clock = (f"{day_us // 3_600_000_000:02d}:{day_us // 60_000_000 % 60:02d}:"
                 f"{day_us // 1_000_000 % 60:02d}.{day_us % 1_000_000:06d}")
        size, aid = int(size), int(aid)
        if kind == A:
            pool = free_by_size.get(size)
            addr = pool.pop() if pool else bump(size)
            addr_of[aid] = addr
            action = "allocate"
        else:
            addr = addr_of.pop(aid)
            free_by_size.setdefault(size, []).append(addr)
            action = "free"
        lines.append(f"140001,{clock},{action},{addr:#x},{size},{int(stream) & ((1 << 64) - 1):x}")
    path.write_text("\n".join(lines) + "\n")
    out = ev[["kind", "alloc_id", "size_bytes", "stream"]].reset_index(drop=True)
    out.insert(0, "t_ns", np.asarray(expect_t, dtype=np.int64))
    return out


def _sources():
    yield pytest.param(KINETO_TINY, id="kineto-tiny")
    for p in REAL_KINETO:
        yield pytest.param(p, id=f"kineto-{p.name}")
    yield pytest.param(SNAPSHOT, id="snapshot-silmont2000-fp32", marks=pytest.mark.shared)


@pytest.mark.full
@pytest.mark.parametrize("source", list(_sources()))
def test_rmm_log_written_from_real_trace(tmp_path, source):
    if source.suffix == ".pickle":
        if importlib.util.find_spec("allocsim.trace.formats.snapshot.reader") is None:
            pytest.skip("allocsim.trace.formats.snapshot.reader is not there yet")
        if not source.exists():
            pytest.skip("../shared/traces is not beside this checkout")
    original = read_trace(source)
    checked = 0
    for device in original.devices:
        part = original.for_device(device)
        if not np.any(part.column("kind") == A):
            continue
        path = tmp_path / f"dev{device}.csv"
        expect = trace_to_rmm_csv(part, path)
        back = read_rmm_csv(path, device=device)
        ev = back.events[back.events["kind"].isin([int(A), int(FR)])].reset_index(drop=True)
        # Same requests in the same order, same sizes, streams and times (to the microsecond).
        assert ev["kind"].tolist() == expect["kind"].tolist()
        assert ev["size_bytes"].tolist() == expect["size_bytes"].tolist()
        assert ev["stream"].tolist() == expect["stream"].tolist()
        assert ev["t_ns"].tolist() == expect["t_ns"].tolist()
        # Same lifetimes: ids match up to renaming, initial state matches.
        assert np.array_equal(pd.factorize(ev["alloc_id"])[0], pd.factorize(expect["alloc_id"])[0])
        # An RMM log can only show blocks from before the log when they are freed in it.
        init = part.initial_allocs
        freed_init = init.loc[init["alloc_id"].isin(expect["alloc_id"]), "size_bytes"]
        assert sorted(back.initial_allocs["size_bytes"]) == sorted(freed_init)
        kind = back.column("kind")
        assert np.count_nonzero(kind == A) == np.count_nonzero(part.column("kind") == A)
        assert np.count_nonzero(kind == FC) == np.count_nonzero(part.column("kind") == FR)
        assert set(back.column("device")) == {device}
        validate_events(back, str(path))
        checked += 1
    assert checked


# --------------------------------------------------------------------------- fuzzing
_SEED_TEXTS = [(DATA / n).read_text() for n in ("new_style.csv", "old_style.csv", "fmt_era.csv", "reordered_columns.csv")]
_FIELD_VALUES = st.one_of(
    st.text(max_size=10), st.integers(-(1 << 70), 1 << 70).map(str), st.integers(0, 1 << 66).map(hex),
    st.sampled_from(["(nil)", "", "allocate", "free", "allocate failure", "23:59:59.999999", "00:00:00:000001",
                     "0x0", "nullptr", "Action", "Pointer", "Size", "0x7f2a00000000", "99:99:99.9"]),
)


def _check_reads(data: bytes, name: str = "f.csv") -> None:
    """The reader returns a valid Trace or raises TraceFormatError, strict and lenient alike."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, name)
        with open(path, "wb") as fh:
            fh.write(data)
        for lenient in (False, True):
            try:
                trace = read_rmm_csv(path, lenient=lenient)
            except TraceFormatError:
                continue
            assert isinstance(trace, Trace)
            validate_events(trace, path)


@pytest.mark.full
@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, len(_SEED_TEXTS) - 1), rnd=st.randoms(use_true_random=False),
       value=_FIELD_VALUES, n_mut=st.integers(1, 4), op=st.integers(0, 5))
def test_fuzz_rmm_never_crashes(seed, rnd, value, n_mut, op):
    text = _SEED_TEXTS[seed]
    lines = text.splitlines()
    if op == 0:  # replace fields with random text / numbers
        for _ in range(n_mut):
            i = rnd.randrange(len(lines))
            fields = lines[i].split(",")
            fields[rnd.randrange(len(fields))] = value
            lines[i] = ",".join(fields)
        data = "\n".join(lines).encode()
    elif op == 1:  # shuffle lines (the header too, sometimes)
        body = lines[1:]
        rnd.shuffle(body)
        lines = ([lines[0]] + body) if rnd.random() < 0.7 else body + [lines[0]]
        data = "\n".join(lines).encode()
    elif op == 2:  # duplicate / delete lines
        for _ in range(n_mut):
            i = rnd.randrange(len(lines))
            if rnd.random() < 0.5:
                lines.insert(i, lines[i])
            elif len(lines) > 1:
                del lines[i]
        data = "\n".join(lines).encode()
    elif op == 3:  # truncate
        data = text.encode()[: rnd.randrange(len(text))]
    elif op == 4:  # flip bytes
        buf = bytearray(text.encode())
        for _ in range(n_mut):
            buf[rnd.randrange(len(buf))] = rnd.randrange(256)
        data = bytes(buf)
    else:  # damage a gzip copy
        blob = bytearray(gzip.compress(text.encode()))
        if rnd.random() < 0.5:
            blob = blob[: rnd.randrange(len(blob))]
        else:
            for _ in range(n_mut):
                blob[rnd.randrange(len(blob))] = rnd.randrange(256)
        _check_reads(bytes(blob), "f.csv.gz")
        return
    _check_reads(data)
