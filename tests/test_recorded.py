"""What the trace layer infers from a recording: exact start state, empty_cache calls, OOM path, capacity.

Synthetic snapshots (``tests/recorder.py``) pin each rule; the shared real snapshots check that a
replay of every device from what the reader inferred reproduces the real run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from allocsim.engine import run_fast
from allocsim.trace import read_trace, write_trace
from allocsim.trace.inference import start_state
from allocsim.trace.inference.recorded import recorded_run
from allocsim.trace.schema import EventKind
from allocsim.units import KiB, MiB
from validate.fidelity import check_trace

from .recorder import BASE, S1, Recorder

SNAPSHOTS = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "pytorch-snapshots"
EMPTY_CACHE = int(EventKind.EMPTY_CACHE)


# ---------------------------------------------------------------------- the placement rule
def ring_buffer_snapshot() -> Recorder:
    """A block allocated before the window whose unsplit tail hides how big the free region after it is.

    Segment X: p (requested 43 MiB + 64 KiB, so round_size says that much, but the allocator left
    the 960 KiB remainder unsplit: the block is 44 MiB), then 20 MiB free. Segment Y: a live 43.5 MiB
    block, then 20.5 MiB free. An 8 MiB request takes the best fit: X's 20 MiB region.
    """
    rec = Recorder()
    x, y = BASE, BASE + 64 * MiB
    rec.before(x, 64 * MiB, S1, blocks=[(x, 44 * MiB, 43 * MiB + 64 * KiB)])
    rec.before(y, 64 * MiB, S1, blocks=[(y, 43 * MiB + 512 * KiB, 43 * MiB + 512 * KiB)])
    rec.alloc(x + 44 * MiB, 8 * MiB, S1)     # the start of the real free block
    rec.free(x, S1)                          # p's free: the only thing the window knows of it
    rec.free(x + 44 * MiB, S1)
    return rec


def test_first_placement_in_a_free_region_tells_where_it_began(tmp_path):
    trace = read_trace(ring_buffer_snapshot().dump(tmp_path / "ring.pickle"))
    blocks = trace.initial_blocks[trace.initial_blocks["segment_addr"] == BASE]
    assert blocks[["addr", "size_bytes", "state"]].values.tolist() == [
        [BASE, 44 * MiB, "active_allocated"], [BASE + 44 * MiB, 20 * MiB, "inactive"]]
    assert any("first allocation in the free region" in note for note in trace.meta.notes)
    assert check_trace(trace, 0)["match_rate"] == 1.0


def test_without_the_placement_rule_the_replay_picks_the_wrong_block(tmp_path, monkeypatch):
    monkeypatch.setattr(start_state, "_first_placements", lambda *args: {})
    trace = read_trace(ring_buffer_snapshot().dump(tmp_path / "ring.pickle"))
    rep = check_trace(trace, 0)
    assert rep["mismatch_causes"] == {"wrong segment": 1}
    assert rep["first_mismatch"]["real"]["offset"] == 44 * MiB


def test_a_region_merged_with_a_freed_predecessor_teaches_nothing(tmp_path):
    rec = Recorder()
    x = BASE
    rec.before(x, 64 * MiB, S1, blocks=[(x, 44 * MiB, 43 * MiB + 64 * KiB)])
    rec.free(x, S1)                          # p freed first: its tail merges with the region
    rec.alloc(x, 8 * MiB, S1)                # the placement is at the merged block's start
    rec.alloc(x + 8 * MiB, 50 * MiB, S1)
    trace = read_trace(rec.dump(tmp_path / "merged.pickle"))
    blocks = trace.initial_blocks
    assert blocks["size_bytes"].tolist() == [43 * MiB + 64 * KiB, 20 * MiB + 960 * KiB]
    assert check_trace(trace, 0)["match_rate"] == 1.0


# ---------------------------------------------------------------------- releases and capacity
def release_snapshot(second_request: int) -> Recorder:
    """A whole free segment A is released right before a request that gets a new segment C.

    If A could have served the request, the allocator would never have tried a cudaMalloc: the
    release was the program's ``empty_cache()``. If not, it was the out-of-memory path.
    """
    rec = Recorder()
    a, b, c = BASE, BASE + 64 * MiB, BASE + 256 * MiB
    rec.segment_alloc(a, 20 * MiB, S1)
    rec.alloc(a, 4 * MiB, S1)
    rec.segment_alloc(b, 40 * MiB, S1)
    rec.alloc(b, 40 * MiB, S1)
    rec.free(a, S1)
    rec.segment_free(a)
    segment = 20 * MiB if second_request < 10 * MiB else second_request
    rec.segment_alloc(c, segment, S1)
    rec.alloc(c, second_request, S1)
    rec.free(c, S1)
    rec.free(b, S1)
    return rec


def test_a_release_before_a_request_the_cache_could_serve_is_empty_cache(tmp_path):
    trace = read_trace(release_snapshot(4 * MiB).dump(tmp_path / "ec.pickle"))
    run = recorded_run(trace, 0)
    assert (run.empty_cache_calls, run.oom_path_releases, run.ooms) == (1, 0, [])
    assert run.release_points[0]["reason"].startswith("a cached block fitted")
    kinds = trace.events["kind"].tolist()
    # alloc, alloc, free_requested, free_completed, EMPTY_CACHE, alloc ...
    assert kinds[4] == EMPTY_CACHE and kinds.count(EMPTY_CACHE) == 1
    assert trace.decisions.loc[trace.decisions["action"] == "segment_free", "event_index"].tolist() == [4]
    assert run.capacity_bytes is None and run.capacity_source.startswith("not inferred")
    s = run_fast(trace, "pytorch").summary
    assert (s["peak_reserved_bytes"], s["device_mallocs"], s["device_frees"]) == (60 * MiB, 3, 1)


def test_a_release_before_a_request_no_cached_block_fits_is_the_oom_path(tmp_path):
    trace = read_trace(release_snapshot(30 * MiB).dump(tmp_path / "oom_path.pickle"))
    run = recorded_run(trace, 0)
    assert (run.empty_cache_calls, run.oom_path_releases) == (0, 1)
    assert EMPTY_CACHE not in trace.events["kind"].tolist()
    point = run.release_points[0]
    assert point["mode"] == "oom_path" and point["failed_demand_bytes"] == 90 * MiB
    # The device held the peak (70 MiB) and refused 90 MiB.
    assert run.peak_reserved_bytes == 70 * MiB
    assert run.capacity_bytes == 70 * MiB and run.capacity_range == (70 * MiB, 90 * MiB - 1)
    s = run_fast(trace, "pytorch", capacity_bytes=run.capacity_bytes).summary
    assert (s["peak_reserved_bytes"], s["device_mallocs"], s["device_frees"], s["oom_count"]) == (70 * MiB, 3, 1, 0)
    # Without the capacity nothing forces the release: the what-if keeps A cached.
    s = run_fast(trace, "pytorch").summary
    assert (s["peak_reserved_bytes"], s["device_frees"]) == (90 * MiB, 0)


def test_a_recorded_oom_is_a_failed_request_and_gives_the_capacity(tmp_path):
    rec = Recorder()
    a, b = BASE, BASE + 64 * MiB
    rec.segment_alloc(a, 20 * MiB, S1)
    rec.alloc(a, 20 * MiB, S1)
    rec.segment_alloc(b, 30 * MiB, S1)
    rec.alloc(b, 30 * MiB, S1)
    rec.oom(64 * MiB, S1, device_free=10 * MiB)
    rec.free(a, S1)
    trace = read_trace(rec.dump(tmp_path / "oom.pickle"))
    run = recorded_run(trace, 0)
    assert len(run.ooms) == 1
    oom = run.ooms[0]
    assert (oom.requested_bytes, oom.device_free_bytes, oom.reserved_bytes) == (64 * MiB, 10 * MiB, 50 * MiB)
    assert trace.events["kind"].iat[oom.event_index] == EventKind.ALLOC
    assert trace.events["size_bytes"].iat[oom.event_index] == 64 * MiB
    assert run.capacity_bytes == 60 * MiB and "recorded OOM" in run.capacity_source
    s = run_fast(trace, "pytorch", capacity_bytes=run.capacity_bytes).summary
    assert s["oom_count"] == 1 and s["oom"]["event_index"] == oom.event_index
    assert check_trace(trace, 0)["match_rate"] == 1.0


def test_recorded_facts_survive_convert_and_for_device(tmp_path):
    trace = read_trace(release_snapshot(4 * MiB).dump(tmp_path / "ec.pickle"))
    out = tmp_path / "ec.parquet"
    write_trace(trace, out)
    back = read_trace(out)
    assert back.meta.recorded == trace.meta.recorded
    assert back.events["kind"].tolist() == trace.events["kind"].tolist()
    one = back.for_device(0)
    assert recorded_run(one, 0).release_points == recorded_run(trace, 0).release_points


# ---------------------------------------------------------------------- real snapshots
def _shared_devices():
    if not SNAPSHOTS.is_dir():
        return [pytest.param(None, None, marks=pytest.mark.skip(reason="../shared/traces is absent"))]
    out = []
    for path in sorted(SNAPSHOTS.glob("*.pickle")):
        devices = [0, 1, 2] if path.name.startswith("Constructor-Sun") else [0]
        out += [pytest.param(path, d, id=f"{path.name.split('__')[0]}-{path.stem[-12:]}-dev{d}") for d in devices]
    return out


_traces: dict[Path, object] = {}


@pytest.mark.full
@pytest.mark.shared
@pytest.mark.parametrize("path,device", _shared_devices())
def test_replaying_what_the_reader_inferred_reproduces_the_real_run(path, device):
    if path not in _traces:
        _traces[path] = read_trace(path)
    trace = _traces[path]
    run = recorded_run(trace, device)
    s = run_fast(trace, "pytorch", device=device, capacity_bytes=run.capacity_bytes).summary
    real = (run.peak_reserved_bytes, run.segment_allocs, run.segment_frees, run.segment_maps,
            run.segment_unmaps, len(run.ooms))
    ours = (s["peak_reserved_bytes"], s["device_mallocs"], s["device_frees"], s["device_maps"],
            s["device_unmaps"], s["oom_count"])
    assert ours == real


@pytest.mark.shared
def test_what_the_shared_snapshots_prove():
    def facts(name: str, device: int = 0):
        path = SNAPSHOTS / name
        if path not in _traces:
            _traces[path] = read_trace(path)
        return recorded_run(_traces[path], device)

    if not SNAPSHOTS.is_dir():
        pytest.skip("../shared/traces is absent")
    mercury = facts("MercuryB1__cuda_memory_snapshot.pickle")
    assert (mercury.empty_cache_calls, mercury.oom_path_releases, mercury.capacity_bytes) == (28, 0, None)
    maphsge4 = facts("Maphsge4__snapshot.pickle")
    assert (maphsge4.empty_cache_calls, maphsge4.oom_path_releases) == (0, 39)
    assert maphsge4.capacity_bytes == maphsge4.peak_reserved_bytes == 22_519_218_176
    sun = facts("Constructor-Sun__memory_snapshot.pickle", 1)
    assert len(sun.ooms) == 1 and sun.oom_path_releases == 1
    # reserved at the OOM plus the free bytes the driver reported
    assert sun.capacity_bytes == sun.ooms[0].reserved_bytes + sun.ooms[0].device_free_bytes == 84_298_432_512


@pytest.mark.full
@pytest.mark.shared
@pytest.mark.parametrize("path,device", _shared_devices())
def test_allocsim_run_with_nothing_else_gives_the_real_run(path, device, capsys):
    """`allocsim run FILE --policy pytorch --device N --json`: the recording's peak, device calls, OOMs."""
    import json

    from allocsim.cli import main

    code = main(["run", str(path), "--policy", "pytorch", "--device", str(device), "--json"])
    out = json.loads(capsys.readouterr().out)
    real = out["recorded"]
    assert out["reproduction"]["reproduces"], out["reproduction"]
    for key in ("peak_reserved_bytes", "device_mallocs", "device_frees", "device_maps", "device_unmaps", "oom_count"):
        assert out[key] == real[key], key
    assert code == (3 if real["oom_count"] else 0)
    if real["capacity_bytes"] is not None:
        assert out["verdict"]["capacity_bytes"] == real["capacity_bytes"]
        assert out["verdict"]["capacity_source"] == "inferred"


@pytest.mark.shared
def test_a_recorded_start_state_bigger_than_the_device_is_placed_anew():
    path = SNAPSHOTS / "MAGMA27__memory_snapshot.pickle"
    if path not in _traces:
        _traces[path] = read_trace(path)
    trace = _traces[path]
    start = int(trace.initial_segments["size_bytes"].sum())
    s = run_fast(trace, "pytorch", capacity_bytes=start - 128 * MiB).summary
    assert s["start_state"] == "allocated" and "placed anew" in s["start_state_note"]
    assert s["peak_reserved_bytes"] <= start - 128 * MiB or s["oom_count"] > 0
