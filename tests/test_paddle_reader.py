"""PaddlePaddle profiler traces: read by their fields, replayed to Paddle's own figures, on both reader routes."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from allocsim.errors import TraceFormatError
from allocsim.policies import kernel
from allocsim.trace.reading import compiled
from allocsim.trace import detect_format, read_trace
from allocsim.trace.formats.paddle import op_name, place_device, thread_key
from allocsim.trace.inference.recorded import recorded_run
from allocsim.trace.inference.stats import live_bytes_series

REPO = Path(__file__).resolve().parents[1]
PADDLE_TRACES = sorted((REPO / "traces" / "paddle").glob("*.json.gz"))
MiB = 1 << 20


def raw_memory_events(path: Path) -> list[dict]:
    """The file's [memory] events as the standard library reads them (the test's own reading)."""
    with gzip.open(path, "rt") as fh:
        doc = json.load(fh)
    return [e for e in doc["traceEvents"] if e.get("name") == "[memory]"]


def peak_live_with_start(trace) -> int:
    """Peak of live bytes when the start-of-window allocations count."""
    _window, total = live_bytes_series(trace)
    return int(np.max(total)) if len(total) else int(trace.initial_allocs["size_bytes"].sum())


def write_paddle(path: Path, events: list[dict], **top) -> Path:
    path.write_text(json.dumps({"schemaVersion": "1.0.2", "span_index": "0", **top, "traceEvents": events,
                                "ExtraInfo": {}}))
    return path


class Recorder:
    """Paddle-style [memory] events with current_allocated / current_reserved kept per place."""

    def __init__(self, allocated: dict[str, int] | None = None, reserved: dict[str, int] | None = None):
        self.events: list[dict] = []
        self.cur = dict(allocated or {})
        self.res = dict(reserved or {})
        self.t = 1_000

    def mem(self, cat: str, addr: int, inc: int, place: str = "Place(gpu:0)", **extra) -> None:
        self.t += 1
        book = self.cur if cat in ("Allocate", "Free") else self.res
        book[place] = book.get(place, 0) + inc
        args = {"place": place, "addr": str(addr), "increase_bytes": inc,
                "current_allocated": self.cur.get(place, 0), "current_reserved": self.res.get(place, 0),
                "peak_allocated": 0, "peak_reserved": 0, **extra}
        self.events.append({"name": "[memory]", "pid": 7, "tid": "7(C++)", "ts": self.t, "ph": "i", "cat": cat,
                            "args": args})


# ----------------------------------------------------------------------------- real traces
def test_real_paddle_traces_are_shipped():
    assert len(PADDLE_TRACES) >= 2, "traces/paddle/*.json.gz: recorded by traces/capture_paddle.py"


@pytest.mark.full
@pytest.mark.parametrize("path", PADDLE_TRACES, ids=lambda p: p.name)
def test_real_trace_replays_to_paddles_own_figures(path):
    memory = raw_memory_events(path)
    trace = read_trace(path)
    assert detect_format(path) == "paddle" and trace.meta.format == "paddle"
    # The place is the device: these were recorded on CPU.
    places = {e["args"]["place"] for e in memory}
    assert trace.meta.devices == sorted({place_device(p) for p in places})
    allocs = [e for e in memory if e["cat"] == "Allocate" and e["args"]["increase_bytes"] > 0]
    assert len(trace.events.query("kind == 1")) == len(allocs)
    # Peak live bytes, counting what was allocated before the window, is Paddle's largest current_allocated.
    largest = max(int(e["args"]["current_allocated"]) for e in memory)
    assert peak_live_with_start(trace) == largest
    run = recorded_run(trace, trace.meta.devices[0])
    assert run is not None and run.peak_allocated_bytes == largest
    # Frames: Paddle's operators, without their duration suffix.
    names = set(trace.frames["name"])
    assert names and not any(n.endswith(" us]") or n.endswith(" ms]") for n in names)


@pytest.mark.full
@pytest.mark.skipif(compiled.ext is None, reason="compiled readers not built")
@pytest.mark.parametrize("path", PADDLE_TRACES, ids=lambda p: p.name)
def test_both_routes_read_the_same_trace(path):
    from tests.test_compiled_readers import assert_routes_agree

    assert assert_routes_agree(path)[0] == "trace"


def test_cli_run_shows_paddles_recorded_peak(capsys):
    from allocsim.cli import main

    path = PADDLE_TRACES[0]
    largest = max(int(e["args"]["current_allocated"]) for e in raw_memory_events(path))
    assert main(["run", str(path), "--policy", "paddle", "--fast", "--json", "--sites", "0"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["peak_live_lower_bound_bytes"] == data["peak_requested_bytes"] == largest
    assert data["recorded"]["peak_allocated_bytes"] == largest and data["recorded"]["allocator"] == "paddle-host"


# ----------------------------------------------------------------------------- crafted files
def test_gpu_places_reserved_events_and_start_of_window(tmp_path):
    rec = Recorder(allocated={"Place(gpu:1)": 4 * MiB}, reserved={"Place(gpu:1)": 8 * MiB})
    rec.mem("ReservedAllocate", 0x7000, 2 * MiB, "Place(gpu:1)")
    rec.mem("Allocate", 0x1000, 1 * MiB, "Place(gpu:1)")
    rec.mem("Allocate", 0x2000, 3 * MiB, "Place(gpu:1)")
    rec.mem("Free", 0x1000, -1 * MiB, "Place(gpu:1)")
    rec.mem("Free", 0x9000, -2 * MiB, "Place(gpu:1)")          # allocated before the window
    rec.mem("ReservedFree", 0x7000, -2 * MiB, "Place(gpu:1)")
    trace = read_trace(write_paddle(tmp_path / "gpu.json", rec.events))
    assert trace.meta.devices == [1]
    assert len(trace.events.query("kind == 1")) == 2              # reserved events are not requests
    assert sorted(trace.initial_allocs["size_bytes"].tolist()) == [2 * MiB, 2 * MiB]
    assert peak_live_with_start(trace) == 8 * MiB
    run = recorded_run(trace, 1)
    assert (run.allocator, run.peak_allocated_bytes, run.peak_reserved_bytes) == ("paddle", 8 * MiB, 10 * MiB)
    assert len(trace.recorded_series) == 6


def test_pinned_host_memory_is_kept_apart(tmp_path):
    rec = Recorder()
    rec.mem("Allocate", 0x1000, 4096, "Place(cpu)")
    rec.mem("Allocate", 0x2000, 8192, "Place(gpu_pinned)")
    rec.mem("Allocate", 0x3000, 512, "Place(gpu:0)")
    trace = read_trace(write_paddle(tmp_path / "mixed.json", rec.events))
    assert trace.meta.devices == [-2, -1, 0]
    assert recorded_run(trace, -2).allocator == "paddle-host" and recorded_run(trace, -2).peak_reserved_bytes is None
    assert any("pinned" in note for note in trace.meta.notes)


def test_paddle_trace_is_recognised_by_its_fields_not_its_head(tmp_path):
    # Thousands of op events first: the first 4 KiB show nothing of Paddle; the memory fields decide.
    ops = [{"name": f"op{i} dygraph[1.000 us]", "pid": 7, "tid": "7(C++)", "ts": i, "dur": 1, "ph": "X",
            "cat": "Operator", "args": {}} for i in range(200)]
    rec = Recorder()
    rec.mem("Allocate", 0x1000, 4096, "Place(gpu:0)")
    path = tmp_path / "late.json"
    path.write_text(json.dumps({"traceEvents": ops + rec.events}))
    assert detect_format(path) == "kineto"        # the head alone cannot tell
    trace = read_trace(path)
    assert trace.meta.format == "paddle" and trace.meta.devices == [0]


def test_kineto_traces_are_never_taken_for_paddle():
    path = REPO / "traces" / "bert_fp32.json.gz"
    assert detect_format(path) == "kineto" and read_trace(path).meta.format == "kineto"


@pytest.mark.full
def test_unknown_framework_gets_one_line_naming_its_fields(tmp_path):
    events = [{"name": "[memory]", "ph": "i", "ts": 1, "pid": 1, "tid": 1, "args": {"ptr": 1, "size": 8}}]
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"traceEvents": events}))
    with pytest.raises(TraceFormatError, match="carry args ptr, size: neither PyTorch's Kineto fields"):
        read_trace(path)
    out = subprocess.run([sys.executable, "-m", "allocsim", "info", str(path)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr


def test_paddle_trace_without_memory_events_says_how_to_record(tmp_path):
    ops = [{"name": "matmul dygraph[1.0 us]", "pid": 1, "tid": "1(C++)", "ts": 1, "dur": 1, "ph": "X",
            "cat": "Operator", "args": {"input_shapes": {}, "callstack": ""}}]
    path = write_paddle(tmp_path / "nomem.json", ops)      # Paddle's top-level span_index / ExtraInfo
    assert detect_format(path) == "paddle"
    with pytest.raises(TraceFormatError, match="profile_memory=True"):
        read_trace(path)


@pytest.mark.parametrize("args,reason", [
    ({"place": "Place(npu:0)"}, "place 'Place\\(npu:0\\)' is not modelled"),
    ({"addr": "0xZZ"}, "addr is not a 64-bit integer"),
    ({"increase_bytes": "lots"}, "increase_bytes is not an integer"),
    ({"increase_bytes": -4096}, "Allocate with increase_bytes -4096"),
    ({"increase_bytes": 1 << 60}, "absurd size"),
])
def test_bad_memory_events_name_the_record(tmp_path, args, reason):
    rec = Recorder()
    rec.mem("Allocate", 0x1000, 4096, "Place(gpu:0)")
    rec.mem("Allocate", 0x2000, 4096, "Place(gpu:0)")
    rec.events[1]["args"].update(args)
    path = write_paddle(tmp_path / "bad.json", rec.events)
    with pytest.raises(TraceFormatError, match=rf"traceEvents\[1\].*{reason}"):
        read_trace(path)
    lenient = read_trace(path, lenient=True)
    assert len(lenient.events.query("kind == 1")) == 1 and len(lenient.meta.repairs) == 1


def test_names_and_threads():
    assert op_name("matmul dygraph[12.345 us]") == "matmul dygraph"
    assert op_name("ProfileStep#3[1.5 ms]") == "ProfileStep#3"
    assert thread_key(7, "7(Python)") == thread_key(7, "7(C++)") != thread_key(7, "8(C++)")
    assert [place_device(p) for p in ("Place(gpu:3)", "Place(cpu)", "Place(gpu_pinned)", "Place(npu:0)", 5)] == \
        [3, -1, -2, None, None]


@pytest.mark.parametrize("route", ["reference", "compiled"])
def test_crafted_file_reads_the_same_on_each_route(tmp_path, route):
    if route == "compiled" and compiled.ext is None:
        pytest.skip("compiled readers not built")
    rec = Recorder(allocated={"Place(gpu:0)": 1024})
    for k in range(50):
        rec.mem("Allocate", 0x1000 + k * 0x100, 256 * (k + 1))
    for k in range(0, 50, 2):
        rec.mem("Free", 0x1000 + k * 0x100, -256 * (k + 1))
    path = write_paddle(tmp_path / "r.json", rec.events)
    with kernel.route(route):
        trace = read_trace(path)
    assert peak_live_with_start(trace) == max(e["args"]["current_allocated"] for e in rec.events)


# ----------------------------------------------------------------------------- hostile input
_ODD_VALUES = [None, True, -1, 0, 1 << 70, 1.5, "1e3", "", "Place(gpu:999)", "Place(gpu:0", "-0", "0x10", [], {},
               "9" * 50, "NaN"]


def _mutated(seed: int) -> list[dict]:
    """A small valid Paddle trace with a few fields replaced by odd values (deterministic by seed)."""
    rng = np.random.default_rng(seed)
    rec = Recorder(allocated={"Place(gpu:0)": 512})
    for k in range(8):
        rec.mem("Allocate", 0x1000 + 0x100 * k, 256 * (k + 1))
    for k in range(0, 8, 3):
        rec.mem("Free", 0x1000 + 0x100 * k, -256 * (k + 1))
    for _ in range(int(rng.integers(1, 4))):
        ev = rec.events[int(rng.integers(len(rec.events)))]
        target = ev["args"] if rng.random() < 0.7 else ev
        key = list(target)[int(rng.integers(len(target)))]
        if rng.random() < 0.2:
            del target[key]
        else:
            target[key] = _ODD_VALUES[int(rng.integers(len(_ODD_VALUES)))]
    return rec.events


@pytest.mark.full
@pytest.mark.parametrize("seed", range(40))
def test_odd_fields_give_a_trace_or_one_line_on_both_routes(tmp_path, seed):
    path = write_paddle(tmp_path / f"odd{seed}.json", _mutated(seed))
    outcomes = []
    for route in (["reference", "compiled"] if compiled.ext is not None else ["reference"]):
        with kernel.route(route):
            try:
                trace = read_trace(path)
                outcomes.append(("trace", len(trace.events), sorted(trace.meta.devices)))
            except TraceFormatError as exc:
                assert "\n" not in str(exc) and "Traceback" not in str(exc)
                outcomes.append(("error", str(exc)))
    assert all(o == outcomes[0] for o in outcomes)


def test_event_cap_counts_every_trace_event(tmp_path):
    from allocsim.trace.reading.limits import LimitExceeded, Limits

    rec = Recorder()
    rec.mem("Allocate", 0x1000, 4096)
    ops = [{"name": "x", "ph": "M", "pid": 1, "tid": 1}] * 20
    path = write_paddle(tmp_path / "many.json", ops + rec.events)
    with pytest.raises(LimitExceeded, match="events"):
        read_trace(path, limits=Limits(events=10))
    assert len(read_trace(path, limits=Limits(events=21)).events) == 1


def test_no_shared_or_shipped_kineto_trace_is_taken_for_paddle(shared_dir):
    from allocsim.trace.formats.detect import chrome_framework
    from allocsim.trace.reading.limits import DEFAULT_LIMITS, read_bytes

    paths = sorted((shared_dir / "traces" / "kineto-gpu").glob("*.json.gz")) + sorted((REPO / "traces").glob("*.json.gz"))
    assert len(paths) >= 8
    for path in paths:
        assert detect_format(path) == "kineto" and chrome_framework(read_bytes(str(path), DEFAULT_LIMITS)) == "kineto"
    for path in PADDLE_TRACES:
        assert chrome_framework(read_bytes(str(path), DEFAULT_LIMITS)) == "paddle"


# ----------------------------------------------------------------------------- what info and run say (issue 33 #15)
def test_info_on_a_paddle_trace_with_history_uses_no_snapshot_wording(cli):
    """A host place records no reserved bytes: not "no history ... when the snapshot was taken"."""
    code, out, err = cli("info", REPO / "traces" / "paddle" / "resnet_fp32.json.gz")
    assert code == 0, err
    assert "  device -1: paddle-host allocator; reserved bytes not recorded; peak allocated 180.34 MiB\n" in out
    assert "snapshot was taken" not in out and "no history" not in out


def test_the_sites_header_on_a_paddle_trace_says_what_is_really_skipped(cli):
    """Paddle's frames are operators, layers and API calls, never files: no path of the filter applies."""
    path = REPO / "traces" / "paddle" / "resnet_fp32.json.gz"
    header = "(no path skipped: Paddle records operators, layers and API calls, not source files)"
    code, out, err = cli("info", path)
    assert code == 0 and f"allocations by the innermost frame of the program {header}\n" in out
    code, out, err = cli("run", path, "--policy", "paddle", "--fast")
    assert code == 0 and f"Code sites: the innermost frame of the program {header}\n" in out
    assert "torch/" not in out and "<stdlib>" not in out
    code, out, err = cli("info", REPO / "traces" / "bert_fp32.json.gz")     # a Kineto trace keeps the filter's paths
    assert "(skipped: <stdlib>, torch/; change with --site-filter)" in out


def test_every_recorded_allocator_name_is_documented():
    """`info` prints each RecordedRun's allocator name; a user must find what each one means."""
    import re

    given = re.compile(r'allocator="([\w-]+)"(?: if [^\n]* else "([\w-]+)")?')      # allocator="a" if ... else "b"
    pairs = [m for path in (REPO / "allocsim").rglob("*.py") for m in given.findall(path.read_text(encoding="utf-8"))]
    names = {name for pair in pairs for name in pair if name}
    assert {"pytorch", "paddle", "paddle-host"} <= names
    docs = (REPO / "docs" / "paddle.md").read_text() + (REPO / "docs" / "formats.md").read_text()
    for name in names - {"pytorch"}:
        assert f"`{name}`" in docs, name
