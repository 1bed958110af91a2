"""``allocsim run`` and ``allocsim policies``: JSON keys, text report, saved files, exit code 2 on bad input."""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from allocsim.cli import main as cli_main
from allocsim.policies.direct import DirectPolicy
from allocsim.trace import write_trace
from allocsim.trace.reading.builder import TraceBuilder
from allocsim.units import MiB

REPO = Path(__file__).resolve().parents[1]
REQUIRED_KEYS = {"policy", "params", "events", "peak_requested_bytes", "peak_allocated_bytes", "peak_reserved_bytes",
                 "peak_live_lower_bound_bytes", "device_mallocs", "device_frees", "oom", "alloc_latency_ns",
                 "stall_ns", "sim_seconds", "events_per_second"}


def _real_registry_available() -> bool:
    try:
        import allocsim.policies.registry  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.fixture
def registry(monkeypatch):
    """The real policy registry, or (until it exists) a stand-in with ``direct`` only."""
    if _real_registry_available():
        return
    ParamSpec = collections.namedtuple("ParamSpec", "name default unit doc type")
    PolicySpec = collections.namedtuple("PolicySpec", "name description params")
    fake = types.ModuleType("allocsim.policies.registry")
    fake.policy_specs = lambda: [PolicySpec("direct", "every request is a cudaMalloc", ())]

    def build_policy(name, *, device, params=None, allocator_settings=None):
        if name != "direct":
            raise ValueError(f"unknown policy {name!r}; known: direct")
        if params:
            raise ValueError(f"unknown parameter(s) {', '.join(map(repr, params))} for policy 'direct'")
        return DirectPolicy(device)

    fake.build_policy = build_policy
    monkeypatch.setitem(sys.modules, "allocsim.policies.registry", fake)


def write_synthetic(path: Path, devices=(0,)) -> Path:
    """A small trace file: allocations and frees on each device."""
    b = TraceBuilder(str(path), "test")
    t = 0
    for device in devices:
        for i in range(6):
            t += 100
            b.alloc(t, t, device, 0, 0x1000 * (i + 1), (i + 1) * MiB)
        for i in range(0, 6, 2):
            t += 100
            b.free(t, t, device, 0, 0x1000 * (i + 1))
    write_trace(b.finish(), path)
    return path


@pytest.fixture
def trace_file(tmp_path) -> Path:
    return write_synthetic(tmp_path / "synthetic.parquet")


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli_main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_run_json_has_the_documented_keys(registry, trace_file, capsys):
    """--json prints one object with the keys other tools rely on."""
    code, out, err = run_cli(capsys, "run", str(trace_file), "--policy", "direct", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert REQUIRED_KEYS <= set(data)
    assert data["policy"] == "direct" and data["events"] == 12 and data["oom"] is None
    assert set(data["alloc_latency_ns"]) >= {"p50", "p99", "max"}
    assert data["peak_requested_bytes"] == data["peak_live_lower_bound_bytes"] == 21 * MiB
    assert data["device_mallocs"] == 6 and data["device_frees"] == 3


def test_run_fast_and_capacity_report_the_oom(registry, trace_file, capsys):
    """--fast skips timing; an OOM at --capacity is a result: the verdict says so and the exit status is 3."""
    code, out, _ = run_cli(capsys, "run", str(trace_file), "--policy", "direct", "--fast", "--capacity", "10MiB",
                           "--json")
    data = json.loads(out)
    assert code == 3 and data["mode"] == "fast" and data["alloc_latency_ns"] is None
    assert data["verdict"]["fits"] is False and data["verdict"]["first_oom"]["event_index"] == 3
    assert set(data["oom"]) >= {"event_index", "requested_bytes", "t_ns", "reserved_bytes", "allocated_bytes"}
    assert data["oom"]["event_index"] == 3 and data["completed"] is False

    code, out, _ = run_cli(capsys, "run", str(trace_file), "--policy", "direct", "--fast", "--capacity", "10MiB",
                           "--continue-on-oom", "--json")
    data = json.loads(out)
    assert data["completed"] is True and data["oom_count"] == 3


def test_run_text_report_and_output_dir(registry, trace_file, tmp_path, capsys):
    """Without --json the table is printed; -o writes the result files."""
    out_dir = tmp_path / "out"
    code, out, _ = run_cli(capsys, "run", str(trace_file), "--policy", "direct", "-o", str(out_dir))
    assert code == 0
    assert "Reserved memory" in out and "allocation latency" in out
    assert {p.name for p in out_dir.iterdir()} == {"summary.json", "timeseries.parquet", "perf.json"}


def test_cost_model_file_and_overrides(registry, trace_file, tmp_path, capsys):
    """--cost-model reads a calibration file; --cost overrides one constant."""
    cost_file = tmp_path / "cost.json"
    cost_file.write_text(json.dumps({"malloc_base_ns": 123_000, "malloc_per_mib_ns": 0}))
    code, out, _ = run_cli(capsys, "run", str(trace_file), "--policy", "direct", "--cost-model", str(cost_file),
                           "--cost", "device_sync_ns=7", "--json")
    data = json.loads(out)
    assert code == 0 and data["alloc_latency_ns"]["p50"] == 123_000
    assert data["cost_model"]["device_sync_ns"] == 7


def test_json_output_is_deterministic_apart_from_wall_clock(registry, trace_file, capsys):
    """Two runs print the same JSON except sim_seconds and events_per_second."""
    outputs = []
    for _ in range(2):
        code, out, _ = run_cli(capsys, "run", str(trace_file), "--policy", "direct", "--json")
        data = json.loads(out)
        data.pop("sim_seconds")
        data.pop("events_per_second")
        outputs.append(json.dumps(data))
    assert outputs[0] == outputs[1]


@pytest.mark.parametrize("extra, message", [
    (["--policy", "no-such-policy"], "unknown policy"),
    (["--policy", "direct", "--set", "nokey"], "KEY=VALUE"),
    (["--policy", "direct", "--set", "bogus_param=1"], "unknown parameter"),
    (["--policy", "direct", "--capacity", "12 parsecs"], "not a size"),
    (["--policy", "direct", "--device", "5"], "no device 5"),
    (["--policy", "direct", "--cost", "warp_ns=1"], "unknown cost model keys"),
])
def test_bad_arguments_exit_2_with_one_line(registry, trace_file, capsys, extra, message):
    """Bad input is one line on stderr and exit code 2, never a traceback."""
    code, out, err = run_cli(capsys, "run", str(trace_file), *extra)
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_bad_trace_files_exit_2(registry, tmp_path, capsys):
    """Missing, unreadable and multi-device-without---device traces are errors, not crashes."""
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"\x00\x01 not a trace at all")
    multi = write_synthetic(tmp_path / "multi.parquet", devices=(0, 1))
    bad_cost = tmp_path / "cost.json"
    bad_cost.write_text("{")
    for argv in ([str(tmp_path / "missing.parquet")], [str(junk)], [str(multi)],
                 [str(multi), "--device", "1", "--cost-model", str(bad_cost)]):
        code, _, err = run_cli(capsys, "run", *argv, "--policy", "direct")
        assert code == 2, argv
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    code, out, _ = run_cli(capsys, "run", str(multi), "--device", "1", "--policy", "direct", "--json")
    assert code == 0 and json.loads(out)["trace"]["devices"] == [1]


def test_set_passes_values_to_the_policy(registry, trace_file, capsys):
    """--set KEY=VALUE reaches the registry as text (sizes with units) and shows in the reported params."""
    from allocsim.policies.registry import policy_specs

    candidates = [(spec.name, p) for spec in policy_specs() for p in spec.params
                  if p.unit == "bytes" and isinstance(p.default, int) and p.default > 0]
    if not candidates:
        pytest.skip("no registered policy has a size parameter")
    name, param = candidates[0]
    value = param.default * 2
    code, out, err = run_cli(capsys, "run", str(trace_file), "--policy", name, "--fast",
                             "--set", f"{param.name}={value // 1024}KiB", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["policy"] == name
    assert value in data["params"].values() or data["params"].get(param.name) == value, data["params"]


def test_trace_allocator_settings_apply_to_pytorch(registry, tmp_path, capsys):
    """A snapshot's allocator_settings reach the pytorch policy; --set overrides them."""
    from allocsim.policies.registry import policy_specs

    if "pytorch" not in [spec.name for spec in policy_specs()]:
        pytest.skip("no pytorch policy registered")
    b = TraceBuilder(str(tmp_path / "s.parquet"), "test")
    b.meta.allocator_settings = {"max_split_size": 64 * MiB, "expandable_segments": False}
    b.alloc(0, 0, 0, 0, 0x1000, 3 * MiB)
    path = tmp_path / "s.parquet"
    write_trace(b.finish(), path)
    code, out, err = run_cli(capsys, "run", str(path), "--policy", "pytorch", "--fast", "--json")
    assert code == 0, err
    assert 64 * MiB in json.loads(out)["params"].values()
    code, out, err = run_cli(capsys, "run", str(path), "--policy", "pytorch", "--fast", "--json",
                             "--set", "max_split_size=128MiB")
    assert code == 0, err
    params = json.loads(out)["params"]
    assert 128 * MiB in params.values() and 64 * MiB not in params.values()


def test_policies_lists_names_and_parameters(registry, capsys):
    """``allocsim policies --json`` lists every policy with its parameters; text mode too."""
    code, out, _ = run_cli(capsys, "policies", "--json")
    assert code == 0
    policies = json.loads(out)["policies"]
    names = [p["name"] for p in policies]
    assert "direct" in names
    for p in policies:
        assert set(p) == {"name", "description", "params"}
        for param in p["params"]:
            assert set(param) == {"name", "default", "unit", "type", "doc"}
    code, out, _ = run_cli(capsys, "policies")
    assert code == 0 and "direct" in out


@pytest.mark.full
def test_python_dash_m_run_never_prints_a_traceback(tmp_path):
    """The installed entry point: a bad trace exits 2 with one line (no registry needed)."""
    missing = tmp_path / "missing.parquet"
    proc = subprocess.run([sys.executable, "-m", "allocsim", "run", str(missing), "--policy", "direct", "--json"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


# ----------------------------------------------------------------------------- sizes, devices, GPUs (issue 33 #14)
def test_a_decimal_capacity_is_rounded_down_to_whole_bytes_and_said(registry, trace_file, capsys):
    """``--capacity 11.7GiB`` is 12,562,779,340.8 bytes: replayed on 12,562,779,340, with a note on stderr."""
    code, out, err = run_cli(capsys, "run", str(trace_file), "--policy", "direct", "--capacity", "11.7GiB", "--json")
    assert code == 0, err
    assert json.loads(out)["verdict"]["capacity_bytes"] == 12_562_779_340
    assert err.strip() == ("allocsim run: note: --capacity 11.7GiB is 12,562,779,340.8 bytes: rounded down to a "
                           "whole number of bytes, 12,562,779,340")
    code, out, err = run_cli(capsys, "run", str(trace_file), "--policy", "direct", "--capacity", "1.5GiB", "--json")
    assert code == 0 and err == "" and json.loads(out)["verdict"]["capacity_bytes"] == 3 * 2**29   # exact: no note


def write_kineto_gpu_and_host(path: Path) -> Path:
    """A Kineto trace of one CUDA GPU (Device Type 1, id 0) and host memory (Device Type 0, id -1)."""
    def mem(ts: int, addr: int, nbytes: int, device_type: int, device_id: int) -> dict:
        return {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": ts,
                "args": {"Addr": addr, "Bytes": nbytes, "Device Type": device_type, "Device Id": device_id}}

    events = [mem(1, 0x1000, 4 * MiB, 1, 0), mem(2, 0x9000, 64, 0, -1), mem(3, 0x2000_0000, 2 * MiB, 1, 0),
              mem(4, 0x1000, -4 * MiB, 1, 0), mem(5, 0x9000, -64, 0, -1), mem(6, 0x2000_0000, -2 * MiB, 1, 0)]
    path.write_text(json.dumps({"traceEvents": events}), encoding="utf-8")
    return path


def test_a_kineto_trace_of_one_gpu_and_host_memory_replays_the_gpu_and_says_so(tmp_path, capsys):
    path = write_kineto_gpu_and_host(tmp_path / "gpu_and_host.json")
    note = ("allocsim run: note: device 0 replayed, the trace's only GPU (-1 is host memory: --device -1 replays "
            "it)")
    code, out, err = run_cli(capsys, "run", str(path), "--policy", "pytorch", "--fast", "--json")
    assert code == 0 and err.strip() == note
    data = json.loads(out)
    assert data["device"] == 0 and data["trace"]["devices"] == [0] and data["peak_requested_bytes"] == 6 * MiB
    code, out, err = run_cli(capsys, "run", str(path), "--policy", "pytorch", "--fast", "--device", "-1", "--json")
    assert code == 0 and err == "" and json.loads(out)["peak_requested_bytes"] == 64
    code, out, err = run_cli(capsys, "advise", str(path), "--capacity", "1GiB", "--fast")
    assert code == 0 and out.splitlines()[1] == note.removeprefix("allocsim run: note: ")


def test_several_gpus_still_need_a_device(registry, tmp_path, capsys):
    path = write_synthetic(tmp_path / "two.parquet", devices=(0, 1))
    code, out, err = run_cli(capsys, "run", str(path), "--policy", "direct")
    assert code == 2 and "has devices [0, 1]; choose one with --device N" in err


@pytest.mark.parametrize("command", [["run", "--policy", "pytorch"], ["advise"]])
def test_an_empty_gpu_name_is_refused(command, trace_file, capsys):
    """``--gpu ''`` was ignored silently (the run went on with no capacity): it names no GPU."""
    code, out, err = run_cli(capsys, command[0], str(trace_file), *command[1:], "--gpu", "", "--fast")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert f"allocsim {command[0]}: error: --gpu needs a GPU name, got ''; known: RTX 3060" in err
