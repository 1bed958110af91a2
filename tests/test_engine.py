"""The engine: fast and SimPy paths agree on memory, start state, OOMs, timing model, determinism."""

from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pytest

from allocsim.cost import CostModel
from allocsim.device import DeviceOutOfMemory, SimulatedDevice
from allocsim.engine import make_policy, run_fast, run_simpy, select_device
from allocsim.errors import AllocsimError, OutOfMemory
from allocsim.metrics import ConservationError, ConservationObserver
from allocsim.policies.base import Policy
from allocsim.policies.direct import DirectPolicy
from allocsim.trace.reading.builder import TraceBuilder
from allocsim.trace.schema import EventKind
from allocsim.units import KiB, MiB

MEMORY_COLUMNS = ["event_index", "t_ns", "kind", "requested_bytes", "allocated_bytes", "active_bytes",
                  "reserved_bytes"]
MEMORY_KEYS = ["events_replayed", "completed", "peak_requested_bytes", "peak_allocated_bytes", "peak_active_bytes",
               "peak_reserved_bytes", "peak_inactive_bytes", "peak_live_lower_bound_bytes", "final_reserved_bytes",
               "device_mallocs", "device_malloc_bytes", "device_frees", "device_free_bytes", "pool_hits",
               "splits", "merges", "gc_batches", "oom_count", "oom", "largest_free_block_at_peak_bytes",
               "largest_free_block_final_bytes", "at_peak_reserved", "peak_event_index"]
ZERO_COST = CostModel(**{name: 0 for name in CostModel.constant_names()})


# ---------------------------------------------------------------------- helpers
class ExactCache(Policy):
    """Test policy: caches freed blocks by exact footprint (pool hits, free blocks, empty_cache, retry)."""

    name = "exact-cache"

    def __init__(self, upstream):
        super().__init__(upstream)
        self.free_blocks: dict[int, list[int]] = {}

    def _do_malloc(self, alloc_id, size_bytes, stream):
        footprint = self.device.footprint(size_bytes)
        cached = self.free_blocks.get(footprint)
        if cached:
            self.n_pool_hits += 1
            return cached.pop(), footprint
        try:
            return self.device.malloc(size_bytes), footprint
        except DeviceOutOfMemory:
            self.empty_cache()
            try:
                return self.device.malloc(size_bytes), footprint
            except DeviceOutOfMemory as exc:
                raise OutOfMemory(size_bytes, str(exc)) from None

    def _do_free(self, alloc_id, addr, allocated_bytes, stream):
        self.free_blocks.setdefault(allocated_bytes, []).append(addr)

    def empty_cache(self):
        for addrs in self.free_blocks.values():
            for addr in addrs:
                self.device.free(addr)
        self.free_blocks.clear()

    def largest_free_block_bytes(self):
        return max((size for size, addrs in self.free_blocks.items() if addrs), default=0)

    def cached_free_bytes(self):
        return sum(size * len(addrs) for size, addrs in self.free_blocks.items())


class Recording(DirectPolicy):
    """DirectPolicy that logs every call it gets."""

    def __init__(self, upstream):
        super().__init__(upstream)
        self.calls: list[tuple] = []

    def malloc(self, alloc_id, size_bytes, stream=0):
        self.calls.append(("malloc", alloc_id, size_bytes, stream))
        return super().malloc(alloc_id, size_bytes, stream)

    def free_requested(self, alloc_id):
        self.calls.append(("free_requested", alloc_id))
        super().free_requested(alloc_id)

    def free_completed(self, alloc_id):
        self.calls.append(("free_completed", alloc_id))
        super().free_completed(alloc_id)


def make_trace(ops, initial=()):
    """Build a trace from ('a', t, stream, addr, size) / ('f'|'fr'|'fc', t, stream, addr) / ('e', t) / ('m', t, label).

    ``initial`` holds (stream, addr, size) allocations alive at the start; an optional trailing
    ``device`` entry on 'a'/'f' tuples puts the event on that device.
    """
    b = TraceBuilder("synthetic", "test")
    for stream, addr, size in initial:
        b.initial_alloc(0, stream, addr, size)
    for n, op in enumerate(ops):
        kind, t = op[0], op[1]
        if kind == "a":
            device = op[5] if len(op) > 5 else 0
            b.alloc(n, t, device, op[2], op[3], op[4])
        elif kind in ("f", "fr", "fc"):
            device = op[4] if len(op) > 4 else 0
            call = {"f": b.free, "fr": b.free_requested, "fc": b.free_completed}[kind]
            call(n, t, device, op[2], op[3])
        elif kind == "e":
            b.empty_cache(n, t, 0)
        elif kind == "m":
            b.marker(n, t, op[2])
    return b.finish()


SIZES = [512, 3 * KiB, 700 * KiB, 1 * MiB, 2 * MiB, 5 * MiB, 21 * MiB, 64 * MiB]


def random_trace(seed: int, n_ops: int = 600, streams=(0,), cross_stream_frees: bool = False,
                 initial: int = 5, distinct_times: bool = False):
    """A random but valid trace: allocs, split and joint frees, empty_cache and markers."""
    rng = random.Random(seed)
    init = [(streams[i % len(streams)], 0x10_0000_0000 + i * 0x1000_0000, rng.choice(SIZES)) for i in range(initial)]
    live = [(s, a) for s, a, _ in init]
    pending = []
    ops, t, next_addr = [], 1_000, 0x1000
    for _ in range(n_ops):
        t += rng.randint(1 if distinct_times else 0, 5_000)
        r = rng.random()
        if r < 0.5 or not live:
            stream = rng.choice(streams)
            ops.append(("a", t, stream, next_addr, rng.choice(SIZES)))
            live.append((stream, next_addr))
            next_addr += 0x1000
        elif r < 0.85:
            stream, addr = live.pop(rng.randrange(len(live)))
            if cross_stream_frees and rng.random() < 0.3:
                stream = rng.choice(streams)
            if rng.random() < 0.3:
                ops.append(("fr", t, stream, addr))
                pending.append((stream, addr))
            else:
                ops.append(("f", t, stream, addr))
        elif r < 0.95 and pending:
            stream, addr = pending.pop(0)
            ops.append(("fc", t, stream, addr))
        elif r < 0.98:
            ops.append(("m", t, f"step{len(ops)}"))
        else:
            ops.append(("e", t))
    return make_trace(ops, init)


def memory_view(result):
    return {key: result.summary[key] for key in MEMORY_KEYS}


def assert_same_memory(fast, timed):
    pd.testing.assert_frame_equal(fast.timeseries[MEMORY_COLUMNS], timed.timeseries[MEMORY_COLUMNS])
    assert memory_view(fast) == memory_view(timed)


def registry_names() -> list[str]:
    try:
        from allocsim.policies.registry import policy_specs
    except ImportError:
        return []
    return [spec.name for spec in policy_specs()]


# ---------------------------------------------------------------------- fast vs SimPy
@pytest.mark.parametrize("policy_cls", [DirectPolicy, ExactCache])
@pytest.mark.parametrize("seed", [1, 2])
def test_fast_and_simpy_give_identical_memory_on_single_stream(policy_cls, seed):
    """Same policy code, same events in the same order: every sample and counter agrees."""
    trace = random_trace(seed)
    fast = run_fast(trace, policy_cls(SimulatedDevice()))
    timed = run_simpy(trace, policy_cls(SimulatedDevice()))
    assert_same_memory(fast, timed)
    assert fast.summary["completed"] and fast.summary["events_replayed"] == len(trace.events)


def test_fast_loop_matches_the_generic_path():
    """The tight loop (samples written only where they change) equals the per-event generic path."""
    trace = random_trace(3)
    plain = run_fast(trace, ExactCache(SimulatedDevice()))
    observed = run_fast(trace, ExactCache(SimulatedDevice()), observer=lambda i, p: None)
    pd.testing.assert_frame_equal(plain.timeseries, observed.timeseries)
    assert plain.summary == observed.summary


def test_peak_requested_equals_the_lower_bound():
    """Requested bytes are the trace's live bytes, so their peak is exactly the lower bound."""
    trace = random_trace(4)
    for result in (run_fast(trace, DirectPolicy(SimulatedDevice())), run_simpy(trace, DirectPolicy(SimulatedDevice()))):
        s = result.summary
        assert s["peak_requested_bytes"] == s["peak_live_lower_bound_bytes"]
        assert s["peak_reserved_bytes"] >= s["peak_live_lower_bound_bytes"]
        assert s["peak_over_lower_bound"]["requested"] == 1.0


def test_empty_trace_and_markers_only():
    """A trace with no memory events runs in both modes."""
    trace = make_trace([("m", 5, "start"), ("e", 6), ("m", 7, "end")])
    for result in (run_fast(trace, DirectPolicy(SimulatedDevice())), run_simpy(trace, DirectPolicy(SimulatedDevice()))):
        assert result.summary["events_replayed"] == 3
        assert result.summary["peak_reserved_bytes"] == 0
    empty = make_trace([])
    assert run_simpy(empty, DirectPolicy(SimulatedDevice())).summary["makespan_ns"] == 0


# ---------------------------------------------------------------------- start state
def test_initial_allocations_are_placed_first_in_id_order():
    """Allocations alive at the start are allocated before any event, in alloc_id order, on their stream."""
    trace = make_trace([("a", 10, 0, 0x9000, 1 * MiB), ("f", 20, 3, 0x200), ("f", 30, 0, 0x9000)],
                       initial=[(3, 0x100, 4 * MiB), (3, 0x200, 2 * MiB), (0, 0x300, 6 * MiB)])
    ids = trace.initial_allocs["alloc_id"].tolist()
    for run in (run_fast, run_simpy):
        policy = Recording(SimulatedDevice())
        result = run(trace, policy)
        mallocs = [c for c in policy.calls if c[0] == "malloc"]
        assert mallocs[:3] == [("malloc", ids[0], 4 * MiB, 3), ("malloc", ids[1], 2 * MiB, 3),
                               ("malloc", ids[2], 6 * MiB, 0)]
        assert policy.calls[3][0] == "malloc" and policy.calls[3][2] == 1 * MiB
        row0 = result.timeseries.iloc[0]
        assert row0["event_index"] == -1 and row0["requested_bytes"] == 12 * MiB
        assert result.summary["peak_requested_bytes"] == 13 * MiB == result.summary["peak_live_lower_bound_bytes"]
        assert result.summary["initial_allocs"] == 3
        assert result.summary["final_requested_bytes"] == 10 * MiB


# ---------------------------------------------------------------------- out of memory
def oom_trace():
    return make_trace([("a", 10, 0, 0x1000, 2 * MiB), ("a", 20, 0, 0x2000, 2 * MiB), ("f", 30, 0, 0x1000),
                       ("a", 40, 0, 0x3000, 4 * MiB), ("a", 50, 0, 0x4000, 1 * MiB), ("f", 60, 0, 0x3000),
                       ("a", 70, 0, 0x5000, 2 * MiB)])


@pytest.mark.parametrize("run", [run_fast, run_simpy])
def test_first_oom_is_reported_and_stops_the_run(run):
    """At capacity the failed request is a result: event index, time, request, reserved and allocated."""
    result = run(oom_trace(), DirectPolicy(SimulatedDevice(capacity_bytes=4 * MiB)))
    s = result.summary
    oom = s["oom"]
    assert oom["event_index"] == 4 and oom["t_ns"] == 40 and oom["requested_bytes"] == 4 * MiB
    assert oom["reserved_bytes"] == 2 * MiB and oom["allocated_bytes"] == 2 * MiB
    assert oom["capacity_bytes"] == 4 * MiB
    assert s["completed"] is False and s["events_replayed"] == 5 and s["oom_count"] == 1
    assert len(result.timeseries) == 6 and len(result.ooms) == 1


@pytest.mark.parametrize("run", [run_fast, run_simpy])
def test_continue_on_oom_records_every_failure_and_ignores_their_frees(run):
    """With continue_on_oom the failed allocation is skipped, its free ignored, and the run goes on."""
    result = run(oom_trace(), DirectPolicy(SimulatedDevice(capacity_bytes=4 * MiB)), continue_on_oom=True)
    s = result.summary
    assert s["completed"] is True and s["events_replayed"] == len(oom_trace().events)
    # event 4 (4 MiB with 2 MiB reserved) and event 8 (2 MiB with 4 MiB reserved) fail
    assert s["oom_count"] == 2 and s["oom"]["event_index"] == 4
    assert result.ooms["event_index"].tolist() == [4, 8]
    assert s["final_requested_bytes"] == 2 * MiB + 1 * MiB

    tight = run(oom_trace(), DirectPolicy(SimulatedDevice(capacity_bytes=2 * MiB)), continue_on_oom=True)
    assert tight.ooms["event_index"].tolist() == [1, 4, 8]
    assert tight.summary["oom_count"] == 3 and tight.summary["final_requested_bytes"] == 1 * MiB


def test_oom_in_the_start_state_has_event_index_minus_one():
    """An initial allocation that does not fit is reported with event_index -1 and stops before any event."""
    trace = make_trace([("a", 10, 0, 0x1000, 1 * MiB)], initial=[(0, 0x100, 8 * MiB)])
    result = run_simpy(trace, DirectPolicy(SimulatedDevice(capacity_bytes=4 * MiB)))
    assert result.summary["oom"]["event_index"] == -1
    assert result.summary["events_replayed"] == 0


# ---------------------------------------------------------------------- conservation
@pytest.mark.parametrize("policy_cls", [DirectPolicy, ExactCache])
def test_conservation_holds_on_every_sample(policy_cls):
    """active + cached free == reserved after every event, in both engines (and on multi-stream traces)."""
    for trace in (random_trace(5), random_trace(6, streams=(0, 7, 9), cross_stream_frees=True)):
        for run in (run_fast, run_simpy):
            observer = ConservationObserver()
            result = run(trace, policy_cls(SimulatedDevice(capacity_bytes=200 * MiB)), observer=observer,
                         continue_on_oom=True)
            assert observer.samples == len(result.timeseries)
            ts = result.timeseries
            assert (ts["requested_bytes"] <= ts["active_bytes"]).all()
            assert (ts["allocated_bytes"] <= ts["active_bytes"]).all()
            assert (ts["active_bytes"] <= ts["reserved_bytes"]).all()


def test_conservation_observer_catches_a_lying_policy():
    """A policy whose cached free bytes do not add up fails at the first bad event."""
    class Lying(ExactCache):
        def cached_free_bytes(self):
            return super().cached_free_bytes() + (1 if self.free_blocks else 0)

    with pytest.raises(ConservationError, match="after event"):
        run_fast(random_trace(7), Lying(SimulatedDevice()), observer=ConservationObserver())


# ---------------------------------------------------------------------- timing model
def test_allocation_latency_grows_with_cudamalloc_cost():
    """A costlier cudaMalloc raises the latency distribution and the makespan."""
    trace = random_trace(8)
    cheap = run_simpy(trace, DirectPolicy(SimulatedDevice()), CostModel(malloc_base_ns=1_000, malloc_per_mib_ns=0))
    dear = run_simpy(trace, DirectPolicy(SimulatedDevice()), CostModel(malloc_base_ns=100_000, malloc_per_mib_ns=0))
    assert cheap.summary["alloc_latency_ns"]["p50"] == 1_000
    assert dear.summary["alloc_latency_ns"]["p50"] == 100_000
    assert dear.summary["alloc_latency_ns"]["max"] > cheap.summary["alloc_latency_ns"]["max"]
    assert dear.summary["makespan_ns"] > cheap.summary["makespan_ns"] >= cheap.summary["trace_span_ns"]
    assert_same_memory(cheap, dear)


def test_pool_hits_cost_pool_hit_ns():
    """An allocation served from cache costs pool_hit_ns and never syncs."""
    trace = make_trace([("a", 0, 0, 0x1, 1 * MiB), ("f", 10, 0, 0x1), ("a", 20, 0, 0x2, 1 * MiB)])
    result = run_simpy(trace, ExactCache(SimulatedDevice()), CostModel(pool_hit_ns=777, malloc_base_ns=5_000,
                                                                      malloc_per_mib_ns=0))
    latency = result.timeseries.loc[result.timeseries["kind"] == EventKind.ALLOC, "latency_ns"].tolist()
    assert latency == [5_000, 777]
    assert result.summary["pool_hits"] == 1 and result.summary["sync_count"] == 0


SYNC = CostModel.from_overrides({"device_sync_ns": 1_000_000}, base=ZERO_COST)


def two_stream_trace(with_free: bool = True):
    ops = [("a", 0, 1, 0x1, 1 * MiB)]
    if with_free:
        ops.append(("f", 10, 1, 0x1))
    ops += [("a", 100, 2, 0x2, 1 * MiB), ("a", 200, 2, 0x3, 1 * MiB)]
    return make_trace(ops)


def test_cudafree_sync_stalls_the_other_stream():
    """A cudaFree on stream 1 freezes stream 2's work for the whole sync window."""
    result = run_simpy(two_stream_trace(), DirectPolicy(SimulatedDevice()), SYNC)
    ts = result.timeseries.set_index("event_index")
    # events: 0 alloc s1 @0, 1 free_requested s1 @10, 2 free_completed s1 @10 (cudaFree), 3/4 allocs s2
    assert result.summary["events"] == 5
    assert ts.loc[2, "latency_ns"] == 1_000_000
    assert ts.loc[3, "sim_t_ns"] == 100 + 1_000_000 and ts.loc[4, "sim_t_ns"] == 200 + 1_000_000
    s = result.summary
    assert s["sync_count"] == 1 and s["sync_ns"] == 1_000_000
    assert s["stall_ns"] == 2_000_000           # drain on stream 1 + stream 2 frozen
    assert s["makespan_ns"] == 1_000_200

    control = run_simpy(two_stream_trace(with_free=False), DirectPolicy(SimulatedDevice()), SYNC)
    cts = control.timeseries.set_index("event_index")
    assert cts.loc[1, "sim_t_ns"] == 100 and cts.loc[2, "sim_t_ns"] == 200
    assert control.summary["stall_ns"] == 0 and control.summary["sync_count"] == 0


def test_a_call_issued_during_a_sync_waits_for_its_end():
    """A stream whose event falls inside another stream's sync window issues it at the window's end."""
    trace = make_trace([("a", 0, 1, 0x1, 1 * MiB), ("f", 10, 1, 0x1), ("a", 10, 2, 0x2, 1 * MiB)])
    result = run_simpy(trace, DirectPolicy(SimulatedDevice()), SYNC)
    ts = result.timeseries.set_index("event_index")
    assert ts.loc[3, "sim_t_ns"] >= 10 + 1_000_000


def test_single_stream_syncs_only_cost_the_drain():
    """On one stream a cudaFree delays the stream by its latency; the stall is the drain alone."""
    trace = make_trace([("a", 0, 0, 0x1, 1 * MiB), ("f", 10, 0, 0x1), ("a", 100, 0, 0x2, 1 * MiB)])
    result = run_simpy(trace, DirectPolicy(SimulatedDevice()), SYNC)
    assert result.summary["stall_ns"] == 1_000_000
    assert result.timeseries["sim_t_ns"].tolist() == [0, 0, 10, 10, 100 + 1_000_000]


def test_cross_stream_free_waits_for_its_allocation():
    """A free on another stream never runs before its allocation, however delayed that stream is."""
    costly = CostModel.from_overrides({"malloc_base_ns": 10_000_000}, base=ZERO_COST)
    trace = make_trace([("a", 0, 1, 0x1, 1 * MiB), ("a", 5, 1, 0x2, 1 * MiB), ("f", 10, 2, 0x2)])
    result = run_simpy(trace, DirectPolicy(SimulatedDevice()), costly)
    assert result.summary["completed"] and result.summary["final_requested_bytes"] == 1 * MiB
    assert result.summary["dependency_wait_ns"] > 0
    order = result.timeseries["event_index"].tolist()
    assert order.index(3) > order.index(1)


def test_multi_stream_invariants():
    """Delays may reorder streams, but each event runs once, in stream order, never before its trace time."""
    trace = random_trace(9, n_ops=800, streams=(0, 1, 2), cross_stream_frees=True)
    fast = run_fast(trace, ExactCache(SimulatedDevice()))
    timed = run_simpy(trace, ExactCache(SimulatedDevice()), CostModel(device_sync_ns=200_000))
    ts = timed.timeseries.iloc[1:]
    assert sorted(ts["event_index"].tolist()) == list(range(len(trace.events)))
    assert (ts["sim_t_ns"] >= ts["t_ns"]).all()
    streams = trace.column("stream")[ts["event_index"].to_numpy()]
    for stream in np.unique(streams):
        mine = ts[streams == stream]
        assert mine["event_index"].is_monotonic_increasing and mine["sim_t_ns"].is_monotonic_increasing
    assert timed.summary["final_requested_bytes"] == fast.summary["final_requested_bytes"]
    assert timed.summary["makespan_ns"] >= timed.summary["trace_span_ns"]
    assert timed.summary["events_replayed"] == fast.summary["events_replayed"]


def test_zero_cost_simpy_replays_the_trace_order_on_many_streams():
    """With no simulated latency and distinct timestamps the SimPy order is the trace order."""
    trace = random_trace(10, streams=(0, 1, 2), cross_stream_frees=True, distinct_times=True)
    fast = run_fast(trace, ExactCache(SimulatedDevice()))
    timed = run_simpy(trace, ExactCache(SimulatedDevice()), ZERO_COST)
    assert_same_memory(fast, timed)
    assert timed.summary["makespan_ns"] == timed.summary["trace_span_ns"]


# ---------------------------------------------------------------------- devices, policies, determinism
def test_multi_device_trace_needs_a_device():
    """Several devices: no default; device=N replays only that device's events."""
    trace = make_trace([("a", 0, 0, 0x1, 1 * MiB, 0), ("a", 1, 0, 0x1, 3 * MiB, 1), ("f", 2, 0, 0x1, 1)])
    with pytest.raises(AllocsimError, match="--device"):
        run_fast(trace, DirectPolicy(SimulatedDevice()))
    result = run_fast(trace, DirectPolicy(SimulatedDevice()), device=1)
    assert result.summary["events"] == 3 and result.summary["peak_requested_bytes"] == 3 * MiB
    with pytest.raises(AllocsimError, match="no device 5"):
        select_device(trace, 5)


def test_make_policy_rejects_used_policies_and_builds_factories():
    """A used policy is refused; a factory is built on a device of the given capacity."""
    used = DirectPolicy(SimulatedDevice())
    used.malloc(1, 10)
    with pytest.raises(ValueError, match="used"):
        make_policy(used)
    with pytest.raises(ValueError, match="capacity"):
        make_policy(DirectPolicy(SimulatedDevice()), capacity_bytes=10)
    built = make_policy(DirectPolicy, capacity_bytes=6 * MiB)
    assert built.device.capacity_bytes == 6 * MiB
    result = run_fast(oom_trace(), DirectPolicy, capacity_bytes=4 * MiB)
    assert result.summary["oom"]["event_index"] == 4


def test_runs_are_deterministic(tmp_path):
    """Same inputs give byte-identical summaries and saved files."""
    trace = random_trace(11, streams=(0, 1), cross_stream_frees=True)
    first = run_simpy(trace, ExactCache(SimulatedDevice()))
    second = run_simpy(trace, ExactCache(SimulatedDevice()))
    assert first.to_json() == second.to_json()
    first.save(tmp_path / "a")
    second.save(tmp_path / "b")
    for name in ("summary.json", "timeseries.parquet"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


# ---------------------------------------------------------------------- real traces
REAL = ["silmont2000__memory_forward_fp32_128.pickle", "MercuryB1__cuda_memory_snapshot.pickle"]


def _real_trace(shared_dir, name):
    from allocsim.trace import read_trace

    path = shared_dir / "traces" / "pytorch-snapshots" / name
    if not path.exists():
        pytest.skip(f"{path} is absent")
    return read_trace(path)


def _registry_policy(name, trace):
    from allocsim.policies.registry import build_policy

    return build_policy(name, device=SimulatedDevice(), allocator_settings=trace.meta.allocator_settings)


@pytest.mark.full
@pytest.mark.shared
@pytest.mark.parametrize("name", REAL)
def test_real_snapshot_fast_equals_simpy(shared_dir, name):
    """On real single-stream snapshots both engines agree, for direct and every registered policy."""
    trace = _real_trace(shared_dir, name)
    fast = run_fast(trace, DirectPolicy(SimulatedDevice()), observer=ConservationObserver())
    assert_same_memory(fast, run_simpy(trace, DirectPolicy(SimulatedDevice())))
    assert fast.summary["peak_requested_bytes"] == fast.summary["peak_live_lower_bound_bytes"]
    for policy_name in registry_names():
        fast = run_fast(trace, _registry_policy(policy_name, trace), observer=ConservationObserver())
        assert_same_memory(fast, run_fast(trace, _registry_policy(policy_name, trace)))
        timed = run_simpy(trace, _registry_policy(policy_name, trace))
        assert_same_memory(fast, timed)
        assert fast.summary["peak_reserved_bytes"] >= fast.summary["peak_live_lower_bound_bytes"], policy_name


@pytest.mark.full
@pytest.mark.shared
def test_real_multi_stream_snapshot_invariants(shared_dir):
    """The ten-stream snapshot replays every event in SimPy mode with the fast path's final state."""
    trace = _real_trace(shared_dir, "Maphsge4__snapshot.pickle")
    fast = run_fast(trace, DirectPolicy(SimulatedDevice()))
    timed = run_simpy(trace, DirectPolicy(SimulatedDevice()))
    assert timed.summary["completed"] and timed.summary["events_replayed"] == len(trace.events)
    assert timed.summary["final_requested_bytes"] == fast.summary["final_requested_bytes"]
    assert timed.summary["sync_count"] == timed.summary["device_frees"] > 0
    zero = run_simpy(trace, DirectPolicy(SimulatedDevice()), ZERO_COST)
    assert zero.summary["final_reserved_bytes"] == fast.summary["final_reserved_bytes"]
    for policy_name in registry_names():
        fast = run_fast(trace, _registry_policy(policy_name, trace))
        timed = run_simpy(trace, _registry_policy(policy_name, trace), observer=ConservationObserver())
        assert timed.summary["completed"], policy_name
        assert timed.summary["final_requested_bytes"] == fast.summary["final_requested_bytes"], policy_name
        assert timed.summary["peak_reserved_bytes"] >= timed.summary["peak_requested_bytes"], policy_name
