"""Attribution of reserved memory by cause: the parts add up to reserved EXACTLY, every sample, every policy.

Synthetic multi-stream traces (stream-ordered frees, cross-stream frees, empty_cache, small capacities)
run through every registered policy, deferred-gc over each, and non-default variants; every event is
sampled (``every=1``) and the observer raises at the first sample that does not add up. Hand-built cases
pin each part to its definition, and every shared PyTorch snapshot is checked with the pytorch preset.
"""

from __future__ import annotations

import numpy as np
import pytest

from allocsim.device import SimulatedDevice
from allocsim.engine import run_fast, run_simpy
from allocsim.metrics.attribution import (
    CATEGORIES,
    AttributionObserver,
    attribute,
    reference_stream,
    segment_table,
)
from allocsim.policies import build_policy, policy_specs
from allocsim.runner import attribute_run
from allocsim.trace import read_trace
from allocsim.trace.reading.builder import TraceBuilder
from allocsim.units import KiB, MiB

BASE = [(spec.name, {}) for spec in policy_specs() if spec.name != "deferred-gc"]
CASES = BASE + [("deferred-gc", {"inner": name, "threshold": "4MiB"}) for name, _ in BASE] + [
    ("pytorch", {"expandable_segments": "true"}),
    ("pytorch", {"max_split_size": "24MiB", "garbage_collection_threshold": "0.5", "memory_fraction": "0.9"}),
    ("stream-bound", {"cross_stream_reuse": "true"}),
    ("bestfit", {"growth": "chunk", "chunk": "4MiB", "stream_bound": "true", "carve_from_high_end": "true"}),
    ("cuda-async", {"release_threshold": "16MiB"}),
    ("paddle", {"free_idle_chunk": "true"}),
    ("paddle-naive", {"gpu_memory": "1GiB"}),
    ("paddle-naive", {"initial_gpu_memory": "8MiB", "reallocate_gpu_memory": "8MiB"}),   # huge chunks
    ("deferred-gc", {"inner": "pytorch", "threshold": "64MiB", "expandable_segments": "true"}),
]
STREAM_BOUND = {"stream-bound", "pytorch", "paddle", "cupy"}


def case_id(case):
    name, params = case
    return name + ("[" + ",".join(f"{k}={v}" for k, v in params.items()) + "]" if params else "")


def synthetic_trace(seed: int = 0, n_ops: int = 400, streams: int = 3):
    """Random allocations on several streams: deferred and cross-stream frees, two empty_cache calls."""
    rng = np.random.default_rng(seed)
    b = TraceBuilder(f"synthetic-{seed}", "test")
    live: list[tuple[int, int]] = []           # (addr, stream)
    pending: list[tuple[int, int, int]] = []   # (addr, stream, completes at op)
    addr, t = 0x1000, 0
    sizes = [1, 8, 700, 4 * KiB, 300 * KiB, 1 * MiB, 3 * MiB + 5, 12 * MiB, 25 * MiB]
    for op in range(n_ops):
        t += int(rng.integers(1, 50))
        for item in [p for p in pending if p[2] <= op]:
            pending.remove(item)
            b.free_completed(op, t, 0, item[1], item[0])
        roll = rng.random()
        if op in (n_ops // 2, 3 * n_ops // 4):
            b.empty_cache(op, t, 0)
        elif roll < 0.55 or not live:
            addr += 0x100000
            stream = int(rng.integers(0, streams))
            b.alloc(op, t, 0, stream, addr, int(rng.choice(sizes)))
            live.append((addr, stream))
        else:
            a, s = live.pop(int(rng.integers(0, len(live))))
            other = int(rng.integers(0, streams))   # the free may come from another stream
            if rng.random() < 0.5:
                b.free(op, t, 0, other, a)
            else:
                b.free_requested(op, t, 0, other, a)
                pending.append((a, other, op + int(rng.integers(1, 30))))
    for a, s, _ in pending:
        t += 1
        b.free_completed("end", t, 0, s, a)
    return b.finish()


@pytest.fixture(scope="module")
def traces():
    return [synthetic_trace(seed) for seed in range(2)]


def check_table(observer: AttributionObserver, result) -> None:
    """Every sample adds up and matches the run's own reserved column at that row."""
    table = observer.table()
    assert len(table)
    assert (table[list(CATEGORIES)].sum(axis=1) == table["reserved_bytes"]).all()
    assert (table[list(CATEGORIES)] >= 0).all().all()
    ts_reserved = result.timeseries["reserved_bytes"].to_numpy()
    assert (ts_reserved[table["row"].to_numpy()] == table["reserved_bytes"].to_numpy()).all()
    if observer.peak is not None:
        assert sum(observer.peak.values()) == result.summary["peak_reserved_bytes"]
        assert table.loc[table["at_peak"], "reserved_bytes"].tolist() == [result.summary["peak_reserved_bytes"]]


@pytest.mark.full
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_parts_add_up_on_every_event(case, traces):
    """Every event of multi-stream traces with deferred frees: the parts sum to reserved, in fast mode."""
    name, params = case
    for trace in traces:
        obs = AttributionObserver(every=1)
        result = run_fast(trace, name, params=params, observer=obs)
        assert obs.calls == len(result.timeseries)
        check_table(obs, result)
        assert len(obs.table()) == obs.calls
        segs = segment_table(obs.policy)
        assert segs["size_bytes"].sum() == obs.policy.reserved_bytes


@pytest.mark.full
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_parts_add_up_at_a_small_capacity_with_ooms(case, traces):
    """A device too small for the trace: releases, retries and OOMs still leave the parts exact (SimPy mode)."""
    name, params = case
    obs = AttributionObserver(every=1)
    capacity = 64 * MiB if name != "paddle-naive" else 256 * MiB
    result = run_simpy(traces[0], name, params=params, capacity_bytes=capacity, continue_on_oom=True, observer=obs)
    check_table(obs, result)


@pytest.mark.full
def test_stranded_only_for_stream_bound_pools(traces):
    """Free blocks cached for another stream are 'stranded' only where pools are per stream."""
    for name, _ in BASE:
        obs = AttributionObserver(every=1)
        run_fast(traces[0], name, observer=obs)
        stranded = obs.table()["stranded"]
        if name in STREAM_BOUND:
            assert stranded.max() > 0, name
        else:
            assert stranded.max() == 0, name


def one_stream(ops):
    """('a', addr, size[, stream]) / ('fr'|'fc'|'f', addr) / ('e',) on device 0."""
    b = TraceBuilder("hand", "test")
    for n, op in enumerate(ops):
        if op[0] == "a":
            b.alloc(n, n, 0, op[3] if len(op) > 3 else 0, op[1], op[2])
        elif op[0] == "e":
            b.empty_cache(n, n, 0)
        else:
            {"f": b.free, "fr": b.free_requested, "fc": b.free_completed}[op[0]](n, n, 0, 0, op[1])
    return b.finish()


def final_parts(trace, name, params=None, capacity=None):
    obs = AttributionObserver(every=1)
    run_fast(trace, name, params=params, capacity_bytes=capacity, observer=obs)
    return obs.table().iloc[-1][list(CATEGORIES)].to_dict(), obs


def nonzero(parts):
    return {k: int(v) for k, v in parts.items() if v}


def test_direct_waste_is_device_rounding():
    """direct: a 3 MiB + 5 B request costs a 4 MiB device allocation; the rest is device rounding."""
    parts, _ = final_parts(one_stream([("a", 1, 3 * MiB + 5)]), "direct")
    assert nonzero(parts) == {"live_requested": 3 * MiB + 5, "device_rounding": MiB - 5}


def test_pytorch_split_remainder_is_a_free_sliver_and_rounding_is_rounding():
    """pytorch: 1.5 MiB + 1 B takes a 20 MiB segment, rounded to 512 B; the 18.5 MiB remainder is a sliver."""
    size = 3 * MiB // 2 + 1
    parts, _ = final_parts(one_stream([("a", 1, size)]), "pytorch")
    block = 3 * MiB // 2 + 512
    assert nonzero(parts) == {"live_requested": size, "rounding": block - size, "free_slivers": 20 * MiB - block}


def test_wholly_free_segment_is_cached_until_empty_cache():
    """A freed block that leaves its segment wholly free is releasable cache; empty_cache gives it back."""
    parts, _ = final_parts(one_stream([("a", 1, 12 * MiB), ("f", 1)]), "pytorch")
    assert nonzero(parts) == {"cached_segments": 12 * MiB}
    parts, _ = final_parts(one_stream([("a", 1, 12 * MiB), ("f", 1), ("e",)]), "pytorch")
    assert nonzero(parts) == {}


def test_pending_free_holds_the_whole_block():
    """Between free_requested and free_completed the whole block is 'pending_free'."""
    trace = one_stream([("a", 1, 12 * MiB), ("fr", 1), ("a", 2, 12 * MiB), ("fc", 1)])
    obs = AttributionObserver(every=1)
    run_fast(trace, "pytorch", observer=obs)
    table = obs.table()
    after_second_alloc = table[table["event_index"] == 2].iloc[0]
    assert after_second_alloc["pending_free"] == 12 * MiB
    assert after_second_alloc["live_requested"] == 12 * MiB
    assert table.iloc[-1]["cached_segments"] == 12 * MiB and table.iloc[-1]["pending_free"] == 0


def test_gc_queue_is_the_deferred_gc_queue():
    """deferred-gc below its threshold keeps freed blocks queued: exactly DeferredGC.queued_bytes."""
    trace = one_stream([("a", 1, 2 * MiB), ("a", 2, 3 * MiB), ("f", 1)])
    parts, obs = final_parts(trace, "deferred-gc", {"inner": "cupy", "threshold": "1GiB"})
    assert parts["gc_queue"] == 2 * MiB == obs.policy.queued_bytes
    assert parts["live_requested"] == 3 * MiB


def test_exact_growth_pays_device_rounding():
    """cupy cudaMallocs exactly 512 B for a 1-byte request; the device rounds that segment to 2 MiB."""
    parts, _ = final_parts(one_stream([("a", 1, 1)]), "cupy")
    assert nonzero(parts) == {"live_requested": 1, "rounding": 511, "device_rounding": 2 * MiB - 512}


def test_stranded_is_relative_to_the_last_requests_stream():
    """A block freed on stream 0 is stranded once stream 1 makes the latest request, not before."""
    trace = one_stream([("a", 1, 12 * MiB, 0), ("f", 1), ("a", 2, 1 * MiB, 1)])
    obs = AttributionObserver(every=1)
    run_fast(trace, "pytorch", observer=obs)
    table = obs.table().set_index("event_index")
    # Events: 0 alloc, 1 free requested, 2 free completed, 3 alloc on stream 1.
    assert table.loc[2, "cached_segments"] == 12 * MiB and table.loc[2, "stranded"] == 0
    assert table.loc[3, "stranded"] == 12 * MiB and table.loc[3, "cached_segments"] == 0
    assert reference_stream(obs.policy) == 1
    seen_from_0 = attribute(obs.policy, stream=0)   # stream 1's 2 MiB small segment holds 1 MiB free
    assert seen_from_0["stranded"] == 1 * MiB and seen_from_0["cached_segments"] == 12 * MiB


def test_expandable_segments_cache_whole_pages_only():
    """Expandable segments: whole free pages are releasable cache, the rest of a free block is a sliver."""
    parts, obs = final_parts(one_stream([("a", 1, 30 * MiB), ("a", 2, 5 * MiB), ("f", 1)]), "pytorch",
                             {"expandable_segments": "true"})
    assert parts["live_requested"] == 5 * MiB
    assert sum(parts.values()) == obs.policy.reserved_bytes == 40 * MiB
    assert parts["cached_segments"] == 20 * MiB and parts["free_slivers"] == 15 * MiB
    segs = segment_table(obs.policy)
    assert segs["size_bytes"].sum() == 40 * MiB


def test_segment_table_states():
    """A live block is drawn as requested + rounding; pending and free pieces keep their state."""
    trace = one_stream([("a", 1, 1000), ("a", 2, 2000), ("fr", 2)])
    _, obs = final_parts(trace, "pytorch")
    segs = segment_table(obs.policy)
    by_state = segs.groupby("state")["size_bytes"].sum().to_dict()
    assert by_state == {"requested": 1000, "rounding": 24, "pending_free": 2048, "free": 2 * MiB - 1024 - 2048}
    assert (segs["offset_bytes"] >= 0).all() and segs["segment"].nunique() == 1


def test_observer_samples_peak_and_periodically(traces):
    """every=None samples only new peaks (and big moves); the last forced sample is the reserved peak."""
    result, obs, table = attribute_run(traces[0], "pytorch", every=None, resolution=None, fast=True)
    assert table["reserved_bytes"].is_monotonic_increasing or len(table) == 1 or table.iloc[-1]["row"] == obs.calls - 1
    assert obs.peak_reserved == result.summary["peak_reserved_bytes"]
    assert obs.peak_event_index == result.summary["peak_event_index"]["reserved"]
    assert obs.peak_segments is not None and obs.peak_segments["size_bytes"].sum() == obs.peak_reserved
    assert "t_ns" in table.columns
    sparse = AttributionObserver(every=50, resolution=None)
    run_fast(traces[0], "pytorch", observer=sparse)
    assert len(sparse.table()) < sparse.calls / 10


def test_observer_rejects_a_bad_period():
    with pytest.raises(ValueError):
        AttributionObserver(every=0)


def test_attribute_on_a_fresh_policy_is_all_zero():
    policy = build_policy("pytorch", device=SimulatedDevice())
    assert set(attribute(policy).values()) == {0}


# ----------------------------------------------------------------------------- real snapshots
def snapshot_paths(shared_dir):
    paths = sorted((shared_dir / "traces" / "pytorch-snapshots").glob("*.pickle"))
    if not paths:
        pytest.skip("no snapshots in the shared folder")
    return paths


@pytest.mark.full
@pytest.mark.shared
def test_every_shared_snapshot_adds_up_with_the_pytorch_preset(shared_dir):
    """Every shared snapshot, every device, pytorch preset with the run's own settings: exact on every sample."""
    checked = 0
    for path in snapshot_paths(shared_dir):
        trace = read_trace(path)
        for device in trace.devices:
            obs = AttributionObserver(every=7)
            result = run_fast(trace, "pytorch", device=device, observer=obs)
            check_table(obs, result)
            assert segment_table(obs.policy)["size_bytes"].sum() == obs.policy.reserved_bytes
            checked += 1
    assert checked >= 10


@pytest.mark.full
@pytest.mark.shared
def test_multi_stream_snapshot_strands_memory(shared_dir):
    """Maphsge4 (ten streams): at the peak, memory is cached for streams other than the requesting one."""
    path = shared_dir / "traces" / "pytorch-snapshots" / "Maphsge4__snapshot.pickle"
    if not path.is_file():
        pytest.skip("Maphsge4 snapshot absent")
    result, obs, table = attribute_run(read_trace(path), "pytorch", every=None, fast=True)
    assert obs.peak["stranded"] > 0
    assert sum(obs.peak.values()) == result.summary["peak_reserved_bytes"]
