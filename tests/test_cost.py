"""The cost model: latency from counter differences, overrides and the calibration file."""

from __future__ import annotations

import json

import pytest

from allocsim.cost import (COUNTER_NAMES, OP_FREE_COMPLETED, OP_FREE_REQUESTED, OP_MALLOC, OP_OTHER, CostModel,
                           snapshot)
from allocsim.device import SimulatedDevice
from allocsim.policies.direct import DirectPolicy
from allocsim.units import MiB


def counters(**values: int) -> tuple[int, ...]:
    """A snapshot tuple with the named counters set and the rest zero."""
    return tuple(values.get(name, 0) for name in COUNTER_NAMES)


ZERO = counters()


def test_no_device_call_costs_the_pool_constants():
    """A malloc served from cache costs pool_hit_ns; a free request free_request_ns; a completion nothing."""
    model = CostModel(pool_hit_ns=111, free_request_ns=22)
    assert model.call_cost(ZERO, ZERO, OP_MALLOC) == (111, False)
    assert model.call_cost(ZERO, ZERO, OP_FREE_REQUESTED) == (22, False)
    assert model.call_cost(ZERO, ZERO, OP_FREE_COMPLETED) == (0, False)
    assert model.call_cost(ZERO, ZERO, OP_OTHER) == (0, False)


def test_cudamalloc_cost_grows_with_size():
    """Each cudaMalloc costs base + per-MiB, and does not synchronise the device."""
    model = CostModel(malloc_base_ns=1000, malloc_per_mib_ns=10)
    small = model.call_cost(ZERO, counters(n_mallocs=1, malloc_bytes=2 * MiB))
    large = model.call_cost(ZERO, counters(n_mallocs=1, malloc_bytes=1024 * MiB))
    assert small == (1020, False)
    assert large == (1000 + 10 * 1024, False)
    two = model.cost_ns(ZERO, counters(n_mallocs=2, malloc_bytes=4 * MiB))
    assert two == 2 * 1000 + 40


def test_cudafree_pays_one_device_drain_per_call_and_synchronises():
    """cudaFrees cost base + per-MiB each plus one device_sync_ns per call, and sync the device."""
    model = CostModel(free_base_ns=100, free_per_mib_ns=1, device_sync_ns=5000)
    one = model.call_cost(ZERO, counters(n_frees=1, freed_bytes=2 * MiB), OP_FREE_COMPLETED)
    three = model.call_cost(ZERO, counters(n_frees=3, freed_bytes=6 * MiB), OP_OTHER)
    assert one == (100 + 2 + 5000, True)
    assert three == (300 + 6 + 5000, True)


def test_map_unmap_and_gc_costs():
    """Expandable-segment maps/unmaps and GC batches are charged; unmaps do not sync the whole device."""
    model = CostModel(map_base_ns=10, map_per_mib_ns=1, unmap_base_ns=20, unmap_per_mib_ns=2,
                      unmap_stream_sync_ns=300, gc_batch_ns=7)
    assert model.call_cost(ZERO, counters(n_maps=2, map_bytes=4 * MiB)) == (2 * 10 + 4, False)
    assert model.call_cost(ZERO, counters(n_unmaps=1, unmapped_bytes=2 * MiB)) == (20 + 4 + 300, False)
    assert model.call_cost(ZERO, counters(n_gc_batches=3), OP_OTHER) == (21, False)


def test_snapshot_reads_device_counters_and_defaults_missing_ones():
    """A device without map counters reads as 0; diffs of a real malloc/free cost what the model says."""
    device = SimulatedDevice()
    policy = DirectPolicy(device)
    before = snapshot(policy)
    assert before == ZERO
    policy.malloc(1, 3 * MiB)
    after = snapshot(policy)
    assert after[0] == 1 and after[1] == 4 * MiB
    model = CostModel(malloc_base_ns=1000, malloc_per_mib_ns=100)
    assert model.cost_ns(before, after) == 1000 + 400
    device.n_maps, device.map_bytes = 5, 10 * MiB   # what an expandable-segments device adds
    assert snapshot(policy)[4:6] == (5, 10 * MiB)


def test_json_round_trip_keeps_values_and_provenance(tmp_path):
    """save then load gives the same model; keys starting with _ are provenance."""
    model = CostModel.from_overrides({"malloc_base_ns": 1234, "device_sync_ns": 0.5, "_device": "H200"})
    path = tmp_path / "cost.json"
    model.save(path)
    data = json.loads(path.read_text())
    assert data["_format"] == "allocsim-cost-model/1"
    assert data["_device"] == "H200"
    assert set(CostModel.constant_names()) <= set(data)
    loaded = CostModel.load(path)
    assert loaded == model
    assert loaded.provenance["_device"] == "H200"
    assert loaded.to_dict() == model.to_dict()


def test_partial_calibration_file_keeps_defaults(tmp_path):
    """Keys missing from a calibration file keep their default."""
    path = tmp_path / "partial.json"
    path.write_text(json.dumps({"pool_hit_ns": 42}))
    loaded = CostModel.load(path)
    assert loaded.pool_hit_ns == 42
    assert loaded.malloc_base_ns == CostModel().malloc_base_ns


@pytest.mark.parametrize("data, message", [
    ({"pool_hit": 1}, "unknown cost model keys"),
    ({"pool_hit_ns": -1}, ">= 0"),
    ({"pool_hit_ns": "fast"}, "not a number"),
    ([1, 2], "JSON object"),
])
def test_bad_calibration_files_raise_value_error(tmp_path, data, message):
    """Typos, negative or non-numeric values and non-objects are rejected with the file name."""
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=message):
        CostModel.load(path)


def test_unreadable_file_raises_value_error(tmp_path):
    """A missing or non-JSON file is a ValueError, not an OSError traceback."""
    with pytest.raises(ValueError, match="cannot read cost model"):
        CostModel.load(tmp_path / "missing.json")
    (tmp_path / "junk.json").write_text("{not json")
    with pytest.raises(ValueError, match="cannot read cost model"):
        CostModel.load(tmp_path / "junk.json")


def test_from_overrides_accepts_strings_and_a_base():
    """CLI strings parse as numbers; overrides stack on a base model."""
    base = CostModel(pool_hit_ns=1)
    model = CostModel.from_overrides({"device_sync_ns": "2500"}, base=base)
    assert model.pool_hit_ns == 1 and model.device_sync_ns == 2500.0
    assert model.to_dict()["device_sync_ns"] == 2500


def test_failed_device_calls_cost_a_malloc_attempt():
    """A cudaMalloc the device refused still took a call's time."""
    model = CostModel(malloc_base_ns=900)
    assert model.call_cost(ZERO, counters(n_failed_mallocs=2)) == (1800, False)
    policy = DirectPolicy(SimulatedDevice(capacity_bytes=2 * MiB))
    before = snapshot(policy)
    with pytest.raises(Exception):
        policy.malloc(1, 4 * MiB)
    assert model.cost_ns(before, snapshot(policy)) == 900


def test_snapshotter_matches_snapshot_for_plain_and_stacked_policies():
    """The engine's fast snapshot equals the generic one, also over an adaptor stack."""
    from allocsim.cost import snapshotter
    from allocsim.policies.base import Policy

    class Adaptor(Policy):
        def _do_malloc(self, alloc_id, size_bytes, stream):
            return self.upstream.malloc(alloc_id, size_bytes, stream), self.device.footprint(size_bytes)

    policy = DirectPolicy(SimulatedDevice())
    policy.malloc(1, 5 * MiB)
    policy.n_gc_batches = 2
    assert snapshotter(policy)() == snapshot(policy)
    stacked = Adaptor(policy)
    stacked.n_gc_batches = 3
    assert snapshotter(stacked)() == snapshot(stacked)
    assert snapshot(stacked)[8] == 5
