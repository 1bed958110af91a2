"""Metrics: sample columns, summary definitions, the lower bound, RunResult files and the text report."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from allocsim.device import SimulatedDevice
from allocsim.engine import run_fast, run_simpy
from allocsim.metrics import distribution, lower_bound_bytes, with_derived
from allocsim.metrics.series import UNCHANGED, forward_fill
from allocsim.metrics.summary import jsonable
from allocsim.policies.base import Policy
from allocsim.policies.direct import DirectPolicy
from allocsim.trace.reading.builder import TraceBuilder
from allocsim.units import MiB


class KeepFreed(Policy):
    """Test policy: never reuses, keeps every freed block cached until empty_cache."""

    name = "keep-freed"

    def __init__(self, upstream):
        super().__init__(upstream)
        self.cached: dict[int, int] = {}

    def _do_malloc(self, alloc_id, size_bytes, stream):
        return self.device.malloc(size_bytes), self.device.footprint(size_bytes)

    def _do_free(self, alloc_id, addr, allocated_bytes, stream):
        self.cached[addr] = allocated_bytes

    def empty_cache(self):
        for addr in list(self.cached):
            self.device.free(addr)
        self.cached.clear()

    def largest_free_block_bytes(self):
        return max(self.cached.values(), default=0)


def build(ops, initial=()):
    """('a', t, addr, size) / ('fr'|'fc'|'f', t, addr) / ('e', t) on device 0, stream 0."""
    b = TraceBuilder("metrics-test", "test")
    for addr, size in initial:
        b.initial_alloc(0, 0, addr, size)
    for n, op in enumerate(ops):
        if op[0] == "a":
            b.alloc(n, op[1], 0, 0, op[2], op[3])
        elif op[0] == "e":
            b.empty_cache(n, op[1], 0)
        else:
            {"f": b.free, "fr": b.free_requested, "fc": b.free_completed}[op[0]](n, op[1], 0, 0, op[2])
    return b.finish()


def test_forward_fill_repeats_the_last_written_value():
    """UNCHANGED entries take the previous written value."""
    values = np.array([5, UNCHANGED, UNCHANGED, 0, UNCHANGED, 7], dtype=np.int64)
    assert forward_fill(values).tolist() == [5, 5, 5, 0, 0, 7]
    full = np.array([1, 2], dtype=np.int64)
    assert forward_fill(full) is full


def test_distribution_uses_actual_samples():
    """Percentiles are values that occurred; empty input gives None."""
    d = distribution(np.arange(1, 101, dtype=np.int64))
    assert (d["p50"], d["p99"], d["max"], d["count"], d["total"]) == (50, 99, 100, 100, 5050)
    assert distribution(np.array([], dtype=np.int64)) is None


def test_peaks_rounding_and_fragmentation_of_direct():
    """Direct rounds to 2 MiB pages: internal fragmentation, no external, J&W over-live ratio."""
    trace = build([("a", 0, 0x1, 1 * MiB), ("a", 1, 0x2, 3 * MiB), ("f", 2, 0x1)])
    s = run_fast(trace, DirectPolicy(SimulatedDevice())).summary
    assert s["peak_requested_bytes"] == 4 * MiB == s["peak_live_lower_bound_bytes"]
    assert s["peak_active_bytes"] == s["peak_reserved_bytes"] == 6 * MiB
    assert s["at_peak_reserved"]["internal_fragmentation_bytes"] == 2 * MiB
    assert s["at_peak_reserved"]["external_fragmentation_bytes"] == 0
    assert s["fragmentation"]["ratio"] == 0.0
    assert s["fragmentation"]["over_live"] == 0.5
    assert s["peak_over_lower_bound"]["reserved"] == 1.5
    assert s["final_reserved_bytes"] == 4 * MiB
    assert (s["device_mallocs"], s["device_frees"], s["device_free_bytes"]) == (2, 1, 2 * MiB)
    assert s["peak_event_index"]["reserved"] == 1


def test_pending_frees_count_as_active_not_allocated():
    """Between free_requested and free_completed a block is active but no longer allocated."""
    trace = build([("a", 0, 0x1, 2 * MiB), ("fr", 1, 0x1), ("a", 2, 0x2, 2 * MiB), ("fc", 3, 0x1)])
    ts = run_fast(trace, DirectPolicy(SimulatedDevice())).timeseries
    at = ts.set_index("event_index")
    assert (at.loc[2, "active_bytes"], at.loc[2, "allocated_bytes"]) == (4 * MiB, 2 * MiB)
    assert at.loc[2, "requested_bytes"] == 4 * MiB   # held until the free completes, like the bound
    assert (at.loc[3, "active_bytes"], at.loc[3, "allocated_bytes"]) == (2 * MiB, 2 * MiB)
    derived = with_derived(ts).set_index("event_index")
    assert derived.loc[2, "pending_free_bytes"] == 2 * MiB
    assert derived.loc[2, "internal_fragmentation_bytes"] == 0


def test_cached_memory_is_inactive_and_largest_free_block_is_reported():
    """Freed-but-cached blocks are inactive (external fragmentation); the largest is reported at peak and end."""
    trace = build([("a", 0, 0x1, 8 * MiB), ("a", 1, 0x2, 2 * MiB), ("f", 2, 0x1), ("a", 3, 0x3, 4 * MiB),
                   ("f", 4, 0x3), ("e", 5)])
    for run in (run_fast, run_simpy):
        s = run(trace, KeepFreed(SimulatedDevice())).summary
        assert s["peak_reserved_bytes"] == 14 * MiB and s["peak_event_index"]["reserved"] == 4
        assert s["largest_free_block_at_peak_bytes"] == 8 * MiB
        assert s["at_peak_reserved"]["external_fragmentation_bytes"] == 8 * MiB
        assert s["fragmentation"]["external_at_peak"] == 0.0          # one free block: no scatter
        assert s["peak_inactive_bytes"] == 12 * MiB
        assert s["final_reserved_bytes"] == 2 * MiB and s["final_inactive_bytes"] == 0
        assert s["largest_free_block_final_bytes"] == 0
        assert s["fragmentation"]["ratio"] == pytest.approx(1 - 10 / 14, abs=1e-6)


def test_lower_bound_counts_the_start_state():
    """The bound is peak live bytes including allocations alive at the start (and works with no events)."""
    trace = build([("a", 0, 0x1, 3 * MiB), ("f", 1, 0x100), ("a", 2, 0x2, 1 * MiB)], initial=[(0x100, 5 * MiB)])
    assert lower_bound_bytes(trace) == 8 * MiB
    assert lower_bound_bytes(build([], initial=[(0x100, 5 * MiB)])) == 5 * MiB


def test_timing_fields_are_null_in_fast_mode_and_filled_in_simpy_mode():
    """Fast mode has no clock; SimPy mode reports latency per call kind, stalls and makespan."""
    trace = build([("a", 0, 0x1, 1 * MiB), ("f", 10, 0x1)])
    fast = run_fast(trace, DirectPolicy(SimulatedDevice())).summary
    assert fast["alloc_latency_ns"] is None and fast["stall_ns"] is None and fast["makespan_ns"] is None
    timed = run_simpy(trace, DirectPolicy(SimulatedDevice())).summary
    assert set(timed["alloc_latency_ns"]) >= {"p50", "p99", "max"}
    assert set(timed["call_latency_ns"]) == {"alloc", "free_requested", "free_completed", "empty_cache"}
    assert timed["call_latency_ns"]["empty_cache"] is None
    assert timed["sync_count"] == 1 and timed["stall_ns"] > 0 and timed["makespan_ns"] > 10
    assert timed["cost_model"]["device_sync_ns"] == 20_000


def test_save_writes_deterministic_files(tmp_path):
    """save() writes summary.json, timeseries.parquet (with derived columns), perf.json and ooms.parquet."""
    trace = build([("a", 0, 0x1, 3 * MiB), ("a", 1, 0x2, 3 * MiB)])
    result = run_simpy(trace, DirectPolicy(SimulatedDevice(capacity_bytes=6 * MiB)))
    paths = result.save(tmp_path)
    assert set(paths) == {"summary", "timeseries", "perf", "ooms"}
    summary = json.loads(paths["summary"].read_text())
    assert summary == json.loads(result.to_json())
    assert "sim_seconds" not in summary and "sim_seconds" in json.loads(paths["perf"].read_text())
    ts = pd.read_parquet(paths["timeseries"])
    assert {"inactive_bytes", "pending_free_bytes", "internal_fragmentation_bytes", "sim_t_ns"} <= set(ts.columns)
    assert len(ts) == 3
    ooms = pd.read_parquet(paths["ooms"])
    assert ooms["event_index"].tolist() == [1]
    assert "events_per_second" in json.loads(result.to_json(include_perf=True))


def test_format_text_is_a_table_with_units():
    """The text report names the metrics, uses byte units and explains an OOM."""
    trace = build([("a", 0, 0x1, 3 * MiB), ("a", 1, 0x2, 3 * MiB)])
    text = run_simpy(trace, DirectPolicy(SimulatedDevice(capacity_bytes=6 * MiB))).format_text()
    for needle in ("Reserved memory", "Lower bound (peak live)", "MiB", "cudaMalloc", "allocation latency",
                   "OUT OF MEMORY in 6.00 MiB at event 1"):
        assert needle in text
    widths = {len(line) for line in text.splitlines() if line.startswith("|")}
    assert widths == {79}


def test_jsonable_turns_numpy_and_containers_into_json():
    """Parameters with numpy scalars, tuples or sets still serialise."""
    value = {"a": np.int64(3), "b": (1, np.float32(0.5)), "c": {2, 1}, "d": float("nan"), "e": None}
    assert json.loads(json.dumps(jsonable(value))) == {"a": 3, "b": [1, 0.5], "c": [1, 2], "d": None, "e": None}


@pytest.mark.full
def test_summary_takes_a_public_run_output_and_never_imports_the_engine():
    """The summary is built from a ``RunOutput`` any replay can fill; importing it loads no engine."""
    import subprocess
    import sys

    from allocsim.metrics.series import Samples
    from allocsim.metrics.summary import RunInfo, RunOutput
    from allocsim.result import build_result

    code = "import sys, allocsim.metrics.summary; print('allocsim.engine' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60).stdout.strip() == "False"
    trace = build([("a", 0, 0x1, 3 * MiB), ("a", 1, 0x2, 5 * MiB)])
    policy = DirectPolicy(SimulatedDevice(capacity_bytes=16 * MiB))
    samples = Samples(len(trace.events) + 1)
    samples.write(0, policy, policy.device.reserved_bytes)
    for row, (aid, size) in enumerate(zip(trace.events["alloc_id"], trace.events["size_bytes"]), start=1):
        policy.malloc(int(aid), int(size), 0)        # a replay done by hand, no engine involved
        samples.write(row, policy, policy.device.reserved_bytes)
    samples.rows = len(trace.events) + 1
    run = RunOutput(trace=trace, policy=policy, samples=samples, ooms=[], completed=True, continue_on_oom=False,
                    start_state="allocated", start_state_note="", t0_ns=0)
    result = build_result(run, RunInfo(mode="fast", wall_s=0.0))
    s = result.summary
    assert (s["peak_requested_bytes"], s["peak_reserved_bytes"], s["device_mallocs"]) == (8 * MiB, 10 * MiB, 2)
    assert s["verdict"]["line"] == "FITS in 16.00 MiB: peak reserved 10.00 MiB, headroom 6.00 MiB"
