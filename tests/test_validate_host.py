"""The validation harness end to end on the host backend (real host memory), plus GPU tests that skip here.

The host device maps real memory for every device call; with the host's page size as the
footprint rule, the simulator must predict its peak exactly, which checks both that the same
policy code ran and that the harness measures right.
"""

from __future__ import annotations

import json
import mmap
import subprocess
import sys
from pathlib import Path

import pytest

from allocsim.cost import CostModel
from allocsim.device import DeviceOutOfMemory
from allocsim.policies.registry import build_policy
from allocsim.trace import read_trace
from allocsim.trace.reading.builder import TraceBuilder
from validate.calibrate import choose_rule, churn_workload, fit_linear
from validate.devices import HostBackend, HostDevice, gpu_available
from validate.real_allocators import validate_real
from validate.replay import (
    ReplayOptions,
    compare,
    cost_model_for_policy,
    load_for_replay,
    next_gap_same_stream,
    slice_trace,
    validate_policy,
)
from validate.replay_cmd import parse_policies, parse_settings

ROOT = Path(__file__).resolve().parents[1]
BERT = ROOT / "traces" / "bert_fp32.json.gz"
PAGE = mmap.PAGESIZE
POLICIES = ("direct", "pytorch", "cupy", "paddle", "deferred-gc")
JSON_KEYS = ("predicted_peak_bytes", "measured_peak_bytes", "peak_error_pct", "predicted_p50_ns", "measured_p50_ns",
             "latency_error_pct", "predicted_p99_ns", "measured_p99_ns", "predicted_device_mallocs",
             "measured_device_mallocs", "predicted_device_frees", "measured_device_frees")


def run_validate(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "validate", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


@pytest.fixture(scope="module")
def bert():
    return load_for_replay(read_trace(BERT))


@pytest.fixture(scope="module")
def host_calibration(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cal") / "calibration.json"
    run_validate("calibrate", "--backend", "host", "--quick", "-o", str(out))
    return out


# ---------------------------------------------------------------------- the host device
def test_host_device_maps_real_memory_and_counts():
    dev = HostDevice(touch=True)
    a = dev.malloc(1)
    b = dev.malloc(3 * PAGE + 5)
    assert dev.footprint(1) == PAGE and dev.reserved_bytes == PAGE + 4 * PAGE
    assert dev.measured_bytes == dev.reserved_bytes == dev.peak_measured_bytes
    assert dev.verify_mappings() == 2                      # the kernel really maps both
    assert dev.peak_rss_bytes >= 4 * PAGE                  # and they are resident (populated)
    assert dev.real_pointer(a) % PAGE == 0 and a == 1 << 40   # policies see SimulatedDevice's addresses
    assert b == (1 << 40) + PAGE and dev.real_pointer(b) != dev.real_pointer(a)
    dev.free(a)
    assert (dev.n_mallocs, dev.n_frees, dev.malloc_bytes, dev.freed_bytes) == (2, 1, 5 * PAGE, PAGE)
    assert len(dev.call_ns) == 3 and all(ns > 0 for ns in dev.call_ns)
    dev.close()
    assert dev.reserved_bytes == 0 and dev.measured_bytes == 0


def test_host_device_capacity_and_real_addresses():
    dev = HostDevice(capacity_bytes=2 * PAGE, real_addresses=True)
    a = dev.malloc(PAGE)
    assert a == dev.real_pointer(a) and a % PAGE == 0
    with pytest.raises(DeviceOutOfMemory):
        dev.malloc(2 * PAGE)
    assert dev.n_failed_mallocs == 1
    dev.close()


def test_host_device_expandable_segments_emulation():
    dev = HostDevice(touch=True)
    base = dev.reserve_address_space(64 * 1024 * 1024)
    dev.map(base, 8 * PAGE)
    dev.map(base + 8 * PAGE, 4 * PAGE)
    assert dev.reserved_bytes == dev.measured_bytes == 12 * PAGE
    import ctypes

    ctypes.memset(dev.real_pointer(base + 10 * PAGE), 1, PAGE)   # mapped pages are usable memory
    dev.unmap(base + 2 * PAGE, 8 * PAGE)                         # across both map calls
    assert dev.reserved_bytes == dev.measured_bytes == 4 * PAGE
    assert (dev.n_maps, dev.n_unmaps) == (2, 1)
    with pytest.raises(ValueError):
        dev.release_address_space(base)                          # pages still mapped
    dev.unmap(base, 2 * PAGE)
    dev.unmap(base + 10 * PAGE, 2 * PAGE)
    dev.release_address_space(base)
    assert dev.reserved_bytes == 0


def test_pytorch_expandable_segments_replay_on_host(bert):
    part = slice_trace(bert, 3000)
    row = validate_policy(part, "pytorch", HostBackend(), params={"expandable_segments": "true"})
    assert row["measured_device_maps"] > 0
    assert row["measured_peak_bytes"] == row["predicted_peak_bytes"]
    assert row["device_calls_match"]


# ---------------------------------------------------------------------- replay = simulation on the host
@pytest.mark.parametrize("policy", POLICIES)
def test_host_replay_peak_equals_prediction(bert, policy):
    row = validate_policy(bert, policy, HostBackend())
    assert row["measured_peak_bytes"] == row["predicted_peak_bytes"] > 2_000_000_000
    assert row["device_counter_peak_bytes"] == row["predicted_peak_bytes"]
    assert row["peak_error_pct"] == 0.0 and row["targets"]["peak_within_1pct"]
    assert row["device_calls_match"]
    assert row["measured_device_mallocs"] == row["predicted_device_mallocs"] > 0
    assert row["measured_device_frees"] == row["predicted_device_frees"]
    for key in JSON_KEYS:
        assert row[key] is not None, key
    assert row["measured"]["alloc_latency_ns"]["count"] == 7086
    assert row["oom_measured"] is None and row["oom_predicted"] is None


@pytest.mark.full
def test_host_replay_rss_confirms_the_peak(bert):
    """With populated pages the resident set is an independent measurement of the same peak."""
    part = slice_trace(bert, 4000)
    row = validate_policy(part, "cupy", HostBackend(touch=True))
    assert row["measured_rss_peak_bytes"] == pytest.approx(row["predicted_peak_bytes"], rel=0.05)


def test_host_replay_with_compute_and_capacity_oom(bert):
    part = slice_trace(bert, 1500)
    row = validate_policy(part, "pytorch", HostBackend(),
                          options=ReplayOptions(compute=True, time_scale=0.002))
    span = (part.column("t_ns")[-1] - part.column("t_ns")[0]) * 0.002
    assert row["measured_total_ns"] >= span * 0.9
    assert row["predicted_makespan_ns"] >= span * 0.9
    row = validate_policy(part, "direct", HostBackend(), options=ReplayOptions(capacity_bytes=64 * 1024 * 1024))
    assert row["oom_measured"] and row["oom_predicted"]
    assert row["oom_measured"]["event_index"] == row["oom_predicted"]["event_index"]
    assert any("out of memory" in n for n in row["notes"])


def test_multi_stream_trace_and_initial_allocs():
    b = TraceBuilder("synthetic", "test")
    b.initial_alloc(0, 3, 0x1000, 5000)
    t = 0
    for i in range(200):
        stream = i % 3
        t += 1000
        b.alloc(i, t, 0, stream, 0x10_0000 + i * 0x10_0000, 1024 * (1 + i % 7))
        if i >= 3:
            t += 10
            b.free(i, t, 0, (i - 3) % 3, 0x10_0000 + (i - 3) * 0x10_0000)
    trace = b.finish()
    gaps = next_gap_same_stream(trace.column("t_ns"), trace.column("stream"))
    assert gaps.min() >= 0 and gaps.max() > 0
    for policy in ("cupy", "stream-bound", "cuda-async"):
        row = validate_policy(trace, policy, HostBackend())
        assert row["measured_peak_bytes"] == row["predicted_peak_bytes"], policy
        assert row["device_calls_match"], policy


# ---------------------------------------------------------------------- calibration
def test_fit_linear_recovers_a_line_and_clamps():
    sizes = [512, 4096, 1 << 20, 16 << 20, 64 << 20]
    base, per = fit_linear(sizes, [1000 + 50 * s / (1 << 20) for s in sizes])
    assert base == pytest.approx(1000, rel=1e-6) and per == pytest.approx(50, rel=1e-6)
    base, per = fit_linear(sizes, [5000 - s / (1 << 20) for s in sizes])   # decreasing: no negative slope
    assert per == 0 and base > 0
    assert choose_rule({1: 512, 4096: 4096, 1 << 20: 1 << 20, (2 << 20) + 1: 4 << 20})[:2] == (2 << 20, 512)
    steps = churn_workload(50, live=10)
    assert sum(op == "a" for op, _, _ in steps) == sum(op == "f" for op, _, _ in steps) == 60


@pytest.mark.full
def test_calibrate_host_writes_a_cost_model_allocsim_run_uses(host_calibration, tmp_path):
    model = CostModel.load(host_calibration)
    data = json.loads(host_calibration.read_text())
    assert data["_format"] == "allocsim-cost-model/1"
    assert data["_granularity_bytes"] == data["_small_granularity_bytes"] == PAGE
    assert model.malloc_base_ns > 0 and model.free_base_ns > 0 and model.pool_hit_ns > 0
    assert model.device_sync_ns == 0
    harness = model.provenance["_harness"]["python_policy"]
    assert set(harness["pool_hit_ns"]) >= {"pytorch", "cupy", "paddle", "deferred-gc", "default"}
    assert data["_device"]["page_bytes"] == PAGE
    # allocsim run reads it and charges its constants
    proc = subprocess.run([sys.executable, "-m", "allocsim", "run", str(BERT), "--policy", "direct", "--json",
                           "--cost-model", str(host_calibration)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["cost_model"]["malloc_base_ns"] == data["malloc_base_ns"]
    # the harness adds the Python overheads for its own predictions
    adjusted = cost_model_for_policy(model, "pytorch")
    assert adjusted.pool_hit_ns == harness["pool_hit_ns"]["pytorch"]
    assert adjusted.malloc_base_ns == pytest.approx(model.malloc_base_ns + harness["malloc_overhead_ns"])
    assert cost_model_for_policy(CostModel(), "pytorch") == CostModel()


# ---------------------------------------------------------------------- the commands
@pytest.mark.full
def test_replay_command_json_and_reports(host_calibration, tmp_path):
    out = tmp_path / "res"
    proc = run_validate("replay", str(BERT), "--policy", "direct,pytorch", "--policy", "cupy", "--policy", "paddle",
                        "--policy", "deferred-gc", "--real", "all", "--cost-model", str(host_calibration),
                        "--json", "-o", str(out))
    doc = json.loads(proc.stdout)
    assert set(doc["policies"]) == set(POLICIES)
    for name, row in doc["policies"].items():
        for key in JSON_KEYS:
            assert key in row, (name, key)
        assert row["measured_peak_bytes"] == row["predicted_peak_bytes"]
    for name in ("cupy-pool", "cupy-async", "torch"):
        assert "skipped" in doc["real_allocators"][name]
    report = (out / "report.md").read_text()
    assert "Machine: CPU" in report and "| pytorch |" in report and "skipped" in report
    results = json.loads((out / "results.json").read_text())
    assert results["machine"]["cpu_count"] >= 1
    assert results["runs"][0]["cost_model"]["file"] == str(host_calibration)


@pytest.mark.full
def test_replay_command_text_errors_and_options(tmp_path):
    proc = run_validate("replay", str(BERT), "--policy", "cupy", "--limit-events", "500", "--touch",
                        "--set", "cupy.limit=1GiB", "-o", str(tmp_path / "r"))
    assert "| cupy |" in proc.stdout
    bad = run_validate("replay", str(BERT), "--policy", "nope", "-o", str(tmp_path / "x"), check=False)
    assert bad.returncode == 2 and "unknown policy" in bad.stderr
    bad = run_validate("replay", str(BERT), "--policy", "cupy", "--real", "nope", check=False)
    assert bad.returncode == 2 and "unknown real allocator" in bad.stderr
    assert parse_policies(["all"])[:2] == ["direct", "pytorch"]
    assert parse_settings(["a=1", "cupy.limit=2"], ["cupy", "pytorch"]) == {"cupy": {"a": "1", "limit": "2"},
                                                                           "pytorch": {"a": "1"}}


@pytest.mark.full
def test_report_merge(tmp_path, bert):
    from validate.report import main as report_main
    from validate.report import render_markdown

    run_validate("replay", str(BERT), "--policy", "direct", "--limit-events", "300", "-o", str(tmp_path / "a"))
    run_validate("replay", str(BERT), "--policy", "cupy", "--limit-events", "300", "-o", str(tmp_path / "b"))
    assert report_main(["merge", str(tmp_path / "a"), str(tmp_path / "b"), "-o", str(tmp_path / "m"),
                        "--note", "hello"]) == 0
    doc = json.loads((tmp_path / "m" / "results.json").read_text())
    assert len(doc["runs"]) == 2
    assert "hello" in render_markdown(doc)


def test_compare_errors_and_targets():
    row = compare({"device_peak_reserved_bytes": 101, "alloc_latency_ns": {"p50": 120, "p99": 10}},
                  {"measured_peak_bytes": 100, "alloc_latency_ns": {"p50": 100, "p99": 20}})
    assert row["peak_error_pct"] == 1.0 and row["targets"]["peak_within_1pct"]
    assert row["latency_error_pct"] == 20.0 and row["targets"]["p50_within_20pct"]
    assert row["p99_error_pct"] == -50.0


# ---------------------------------------------------------------------- GPU (skipped without one)
def test_real_allocators_skip_cleanly_on_the_host(bert):
    row = validate_real(slice_trace(bert, 100), "cupy-pool", HostBackend())
    assert "skipped" in row and "GPU" in row["skipped"]


@pytest.mark.gpu
def test_gpu_replay_and_real_allocators(bert, tmp_path):
    if not gpu_available():
        pytest.skip("needs CuPy and a CUDA GPU")
    from validate.calibrate import calibrate
    from validate.devices import CupyBackend

    model, _ = calibrate("cupy", quick=True)
    part = slice_trace(bert, 3000)
    backend = CupyBackend()
    for policy in ("direct", "cupy"):
        row = validate_policy(part, policy, backend, cost_model=model)
        assert row["device_calls_match"]
        assert row["measured_peak_bytes"] > 0
    for name in ("cupy-pool", "cupy-async"):
        row = validate_real(part, name, backend, cost_model=model)
        assert "error" not in row and row.get("measured_peak_bytes", 0) > 0


@pytest.mark.gpu
def test_gpu_calibrate_command(tmp_path):
    if not gpu_available():
        pytest.skip("needs CuPy and a CUDA GPU")
    out = tmp_path / "cal.json"
    run_validate("calibrate", "--backend", "cupy", "--quick", "-o", str(out))
    model = CostModel.load(out)
    assert model.malloc_base_ns > 0
    assert json.loads(out.read_text())["_device"]["gpu"]["name"]


def test_policies_are_unchanged_by_the_real_device():
    """Nothing above the device changes: a policy built on HostDevice is the registry's own class."""
    dev = HostDevice()
    pol = build_policy("pytorch", device=dev)
    assert type(pol).__module__ == "allocsim.policies.pytorch" and pol.device is dev


@pytest.mark.shared
def test_snapshot_recorded_start_state_is_replayed_like_the_simulator(shared_dir):
    """On a PyTorch snapshot the pytorch preset starts from the recorded layout on both sides."""
    snaps = sorted((shared_dir / "traces" / "pytorch-snapshots").glob("*.pickle"), key=lambda p: p.stat().st_size)
    if not snaps:
        pytest.skip("no shared PyTorch snapshots")
    checked = 0
    for path in snaps[:3]:
        trace = read_trace(path)
        if len(trace.devices) != 1:
            continue
        trace = load_for_replay(trace)
        for policy in ("pytorch", "cupy"):
            row = validate_policy(trace, policy, HostBackend())
            assert row["start_state_measured"] == row["start_state_predicted"], (path.name, policy)
            assert row["measured_peak_bytes"] == row["predicted_peak_bytes"], (path.name, policy)
            assert row["device_calls_match"], (path.name, policy)
            checked += 1
    assert checked
