"""``allocsim run`` on a PyTorch snapshot starts from the real allocator's recorded layout."""

from __future__ import annotations

from pathlib import Path

import pytest

from allocsim.engine import run_fast
from allocsim.trace import read_trace

SNAPSHOTS = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "pytorch-snapshots"


def snapshot(name: str):
    path = SNAPSHOTS / name
    if not path.exists():
        pytest.skip("../shared/traces is not beside this checkout")
    return read_trace(path)


@pytest.mark.shared
def test_ten_stream_snapshot_reproduces_real_device_calls_at_its_capacity():
    # Maphsge4 ran into its device limit 39 times; at that capacity the replay makes exactly the
    # real run's 584 cudaMallocs and 579 cudaFrees and peaks at the real reserved bytes.
    result = run_fast(snapshot("Maphsge4__snapshot.pickle"), "pytorch", capacity_bytes=22_519_218_176)
    s = result.summary
    assert s["start_state"] == "recorded"
    assert (s["device_mallocs"], s["device_frees"]) == (584, 579)
    assert s["peak_reserved_bytes"] == 22_519_218_176
    assert s["oom"] is None


@pytest.mark.shared
def test_recorded_start_state_gives_the_real_peak():
    s = run_fast(snapshot("kkaitlyn111__memory_ctx128_fullstep.pickle"), "pytorch").summary
    assert s["start_state"] == "recorded"
    assert s["peak_reserved_bytes"] == 61_111_009_280 and s["device_mallocs"] == 783


@pytest.mark.shared
def test_other_policies_and_conflicting_settings_reallocate_the_start_state():
    trace = snapshot("MAGMA27__memory_snapshot.pickle")
    assert run_fast(trace, "bestfit").summary["start_state"] == "allocated"
    s = run_fast(trace, "pytorch", params={"expandable_segments": True}).summary
    assert s["start_state"] == "allocated" and "expandable" in s["start_state_note"]
    # the start allocations are all there either way
    assert s["initial_alloc_bytes"] == int(trace.initial_allocs["size_bytes"].sum())
