"""The fidelity check: the ``pytorch`` preset replays real snapshots decision by decision.

Real snapshots come from ``../shared/traces/pytorch-snapshots`` (skipped when absent). Synthetic
snapshots, written here as plain dicts pickled to a temporary file, exercise what the public ones
barely do: frees that complete long after they were requested on a multi-stream workload,
``empty_cache`` vs the OOM path, a recorded OOM, and start states with pre-window blocks.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pandas as pd
import pytest

from allocsim.device import DeviceOutOfMemory, SimulatedDevice
from allocsim.policies.pytorch import PyTorchPolicy
from allocsim.trace import read_trace
from allocsim.trace.schema import BLOCK_DTYPES, SEGMENT_DTYPES, frame_from_columns
from allocsim.units import MiB
from validate.__main__ import main as validate_main
from validate.fidelity import check_snapshot, check_trace, format_report

from .recorder import BASE, S1, S2, Recorder

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
SNAPSHOTS = SHARED / "traces" / "pytorch-snapshots"

SINGLE_STREAM = [
    "silmont2000__mem_snapshot.pickle",
    "silmont2000__memory_forward_fp32_128.pickle",
    "silmont2000__memory_forward_bf16_128.pickle",
    "MAGMA27__memory_snapshot.pickle",
    "MercuryB1__cuda_memory_snapshot.pickle",
    "Wedsonlin__medium_128_training_memory_snapshot.pickle",
    "Wedsonlin__medium_128_inference_memory_snapshot.pickle",
    "kkaitlyn111__memory_ctx128_fullstep.pickle",
]
MAPHSGE4 = "Maphsge4__snapshot.pickle"
CONSTRUCTOR_SUN = "Constructor-Sun__memory_snapshot.pickle"

_cache: dict[str, dict] = {}


def shared_report(name: str) -> dict:
    path = SNAPSHOTS / name
    if not path.is_file():
        pytest.skip(f"{path} is absent (real snapshots live in ../shared)")
    if name not in _cache:
        _cache[name] = check_snapshot(path)
    return _cache[name]


# ---------------------------------------------------------------------- real snapshots
@pytest.mark.full
@pytest.mark.shared
@pytest.mark.parametrize("name", SINGLE_STREAM)
def test_single_stream_snapshots_match_every_decision(name):
    report = shared_report(name)
    for rep in report["devices"].values():
        assert rep["decisions"] > 0
        assert rep["matched"] == rep["decisions"], rep["first_mismatch"]
        assert rep["match_rate"] == 1.0
        assert rep["predicted_peak_reserved_bytes"] == rep["real_peak_reserved_bytes"]
        assert rep["predicted_final_reserved_bytes"] == rep["real_final_reserved_bytes"]
        assert rep["predicted_segment_allocs"] == rep["real_segment_allocs"]
        assert rep["predicted_segment_sizes"] == rep["real_segment_sizes"]


@pytest.mark.shared
def test_mercuryb1_segment_frees_are_empty_cache_calls():
    rep = shared_report("MercuryB1__cuda_memory_snapshot.pickle")["devices"]["0"]
    # 28 runs of 15 segment_frees: each before a request a cached block would have served.
    assert rep["inferred_releases"] == {"empty_cache": 28}
    assert rep["real_segment_frees"] == rep["predicted_segment_frees"] == 420


@pytest.mark.shared
def test_maphsge4_ten_streams():
    rep = shared_report(MAPHSGE4)["devices"]["0"]
    assert rep["streams"] == 10
    assert rep["match_rate"] >= 0.99, rep["mismatch_causes"]
    assert rep["predicted_peak_reserved_bytes"] == rep["real_peak_reserved_bytes"]
    assert rep["predicted_segment_allocs"] == rep["real_segment_allocs"] == 584
    assert rep["predicted_segment_frees"] == rep["real_segment_frees"] == 579
    # Its segment frees are cudaMalloc failures: one device capacity explains all 39 of them ...
    assert rep["inferred_releases"] == {"oom_path": 39}
    assert rep["oom_path_capacity_check"]["consistent_with_one_capacity"]


@pytest.mark.shared
def test_maphsge4_replays_on_a_device_as_big_as_its_real_peak():
    """... so a device of exactly the real peak reserved reproduces them without forcing anything."""
    path = SNAPSHOTS / MAPHSGE4
    if not path.is_file():
        pytest.skip(f"{path} is absent")
    rep = check_snapshot(path, 0, capacity_bytes=22_519_218_176)
    assert rep["match_rate"] >= 0.99 and rep["predicted_segment_frees"] == 579
    assert rep["predicted_peak_reserved_bytes"] == rep["real_peak_reserved_bytes"]


@pytest.mark.shared
@pytest.mark.parametrize("device", ["0", "1", "2"])
def test_constructor_sun_expandable_segments(device):
    rep = shared_report(CONSTRUCTOR_SUN)["devices"][device]
    assert rep["expandable_segments"]
    assert rep["match_rate"] >= 0.99, rep["mismatch_causes"]
    assert rep["predicted_peak_reserved_bytes"] == rep["real_peak_reserved_bytes"]
    assert rep["predicted_segment_allocs"] == rep["real_segment_allocs"]
    if device == "1":
        # Maps and unmaps on the OOM path, then the real OOM (a request with no alloc entry).
        assert rep["by_kind"]["oom"] == {"decisions": 1, "matched": 1}
        assert rep["inferred_releases"] == {"oom_path": 1, "oom": 1}
        assert rep["real_segment_frees"] == rep["predicted_segment_frees"] == 6


@pytest.mark.shared
def test_command_json_keys_per_device_and_for_one_device():
    path = SNAPSHOTS / CONSTRUCTOR_SUN
    if not path.is_file():
        pytest.skip(f"{path} is absent")
    keys = {"decisions", "matched", "match_rate", "real_peak_reserved_bytes", "predicted_peak_reserved_bytes",
            "real_segment_allocs", "predicted_segment_allocs"}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert validate_main(["snapshot", str(path), "--json"]) == 0
    data = json.loads(out.getvalue())
    assert data["file"] == CONSTRUCTOR_SUN and set(data["devices"]) == {"0", "1", "2"}
    for rep in data["devices"].values():
        assert keys <= set(rep)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert validate_main(["snapshot", str(path), "--device", "2", "--json"]) == 0
    one = json.loads(out.getvalue())
    assert keys <= set(one) and one["device"] == 2 and one["real_segment_allocs"] == 78
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert validate_main(["snapshot", str(path), "--device", "1"]) == 0
    assert "decisions matched" in out.getvalue() and "peak reserved" in out.getvalue()


# ---------------------------------------------------------------------- synthetic snapshots

def deferred_free_snapshot(*, misplace_last: bool = False) -> Recorder:
    """Two streams; two frees complete long after they were requested (record_stream).

    D (stream 2) exists before the window with z live at its start; A and C (stream 1) are created
    in the window. While z's and x1's frees are pending their blocks must not be reused.
    """
    rec = Recorder()
    d, a, c = BASE, BASE + 64 * MiB, BASE + 128 * MiB
    rec.before(d, 20 * MiB, S2, blocks=[(d, 8 * MiB, 8 * MiB)])
    rec.free_requested(d, S2)                    # orphan: allocated before the window, free deferred
    rec.segment_alloc(a, 20 * MiB, S1)
    rec.alloc(a, 4 * MiB, S1)                    # x1, split: 16 MiB left at a + 4 MiB
    rec.alloc(d + 8 * MiB, 8 * MiB, S2)          # y1: z is pending, so the 12 MiB gap after it
    rec.free_requested(a, S1)                    # x1 freed, used by stream 2 for a while
    rec.alloc(a + 4 * MiB, 4 * MiB, S1)          # x2 does not take x1's block
    rec.alloc(a + 8 * MiB, 12 * MiB, S1)         # x3 exact fit
    rec.segment_alloc(c, 20 * MiB, S1)           # x4: nothing free on stream 1 (x1 still pending)
    rec.alloc(c, 4 * MiB, S1)
    for k in range(6):                           # stream 2 works meanwhile
        rec.alloc(d + 16 * MiB, 3 * MiB + 512 * k, S2, block=4 * MiB)   # unsplit: <= 1 MiB would be left
        rec.free(d + 16 * MiB, S2)
    rec.free_completed(d, S2)                    # z's free completes
    rec.alloc(d, 8 * MiB, S2)                    # y2: z's block is the best fit now
    rec.free_completed(a, S1)                    # x1's free completes
    x5 = c + 4 * MiB if misplace_last else a
    rec.alloc(x5, 4 * MiB, S1)                   # x5: best fit is x1's old block
    for addr, stream in ((x5, S1), (a + 4 * MiB, S1), (a + 8 * MiB, S1), (c, S1), (d + 8 * MiB, S2), (d, S2)):
        rec.free(addr, stream)
    return rec


def test_deferred_frees_on_two_streams_replay_exactly(tmp_path):
    path = deferred_free_snapshot().dump(tmp_path / "deferred.pickle")
    trace = read_trace(path)
    assert len(trace.initial_segments) == 1 and (trace.initial_blocks["alloc_id"] >= 0).sum() == 1
    rep = check_trace(trace, 0)
    assert rep["match_rate"] == 1.0, rep["first_mismatch"]
    assert rep["decisions"] == 13 + 2           # 13 alloc placements + 2 segment allocs
    assert rep["real_peak_reserved_bytes"] == rep["predicted_peak_reserved_bytes"] == 60 * MiB
    assert rep["inferred_releases"] == {}


def test_the_preset_does_not_reuse_a_block_before_its_free_completes():
    policy = PyTorchPolicy(SimulatedDevice(), record_decisions=True)
    x1 = policy.malloc(1, 4 * MiB, S1)
    policy.free_requested(1)                     # still in use by another stream
    x2 = policy.malloc(2, 4 * MiB, S1)
    assert x2 != x1 and x2 == x1 + 4 * MiB
    assert not policy.would_reuse(16 * MiB, S1) and policy.would_reuse(12 * MiB, S1)
    policy.free_completed(1)
    assert policy.malloc(3, 4 * MiB, S1) == x1
    assert policy.malloc(4, 4 * MiB, S2) not in (x1, x2)   # blocks are bound to their stream
    policy.check_invariants()


def test_a_misplaced_decision_is_reported_with_its_context(tmp_path):
    path = deferred_free_snapshot(misplace_last=True).dump(tmp_path / "misplaced.pickle")
    rep = check_snapshot(path, 0)
    assert rep["matched"] == rep["decisions"] - 1
    assert rep["mismatch_causes"] == {"wrong segment": 1}
    first = rep["first_mismatch"]
    assert first["request_size"] == 4 * MiB and first["stream"] == S1
    assert first["real"]["segment"] == BASE + 128 * MiB and first["real"]["offset"] == 4 * MiB
    assert first["ours"]["segment"] == BASE + 64 * MiB and first["ours"]["offset"] == 0
    seen = [(b["segment"], b["offset"], b["size"]) for b in first["free_blocks_seen"]]
    assert seen == [(BASE + 64 * MiB, 0, 4 * MiB), (BASE + 128 * MiB, 4 * MiB, 16 * MiB)]
    text = format_report(rep)
    assert "first mismatch" in text and "wrong segment" in text


def release_snapshot() -> Recorder:
    """One stream: empty_cache(), a cudaMalloc failure released by the OOM path, a real OOM."""
    rec = Recorder()
    e, f, g, h, i = (BASE + k * 64 * MiB for k in range(5))
    rec.segment_alloc(e, 20 * MiB, S1)
    rec.alloc(e, 4 * MiB, S1)
    rec.segment_alloc(f, 24 * MiB, S1)
    rec.alloc(f, 24 * MiB, S1)
    rec.free(e, S1)
    rec.free(f, S1)
    rec.segment_free(e)                          # torch.cuda.empty_cache(): large pool, by size
    rec.segment_free(f)
    rec.segment_alloc(g, 20 * MiB, S1)           # the next request needs a segment again
    rec.alloc(g, 4 * MiB, S1)
    rec.segment_alloc(h, 22 * MiB, S1)
    rec.alloc(h, 22 * MiB, S1)
    rec.free(h, S1)
    rec.segment_free(h)                          # cudaMalloc(30 MiB) failed: release, retry
    rec.segment_alloc(i, 30 * MiB, S1)
    rec.alloc(i, 30 * MiB, S1)
    rec.oom(64 * MiB, S1, device_free=10 * MiB)  # nothing left to release: OutOfMemoryError
    rec.free(g, S1)
    rec.free(i, S1)
    rec.segment_free(g)                          # a final empty_cache()
    rec.segment_free(i)
    return rec


def test_empty_cache_oom_path_and_oom_are_told_apart(tmp_path):
    path = release_snapshot().dump(tmp_path / "release.pickle")
    rep = check_snapshot(path, 0)
    assert rep["match_rate"] == 1.0, rep["first_mismatch"]
    assert [(p["mode"], p["releases"]) for p in rep["release_points"]] == [
        ("empty_cache", 2), ("oom_path", 1), ("oom", 0), ("empty_cache", 2)]
    assert rep["by_kind"]["oom"] == {"decisions": 1, "matched": 1}
    assert rep["real_peak_reserved_bytes"] == rep["predicted_peak_reserved_bytes"] == 50 * MiB
    assert rep["predicted_final_reserved_bytes"] == 0
    # Or with the device's capacity instead of forced failures: 50 MiB holds g + i, not h + i.
    rep = check_snapshot(path, 0, capacity_bytes=50 * MiB)
    assert rep["match_rate"] == 1.0, rep["first_mismatch"]


def test_a_segment_the_model_would_not_create_is_counted(tmp_path):
    rec = Recorder()
    rec.segment_alloc(BASE, 20 * MiB, S1)
    rec.alloc(BASE, 4 * MiB, S1)
    rec.segment_alloc(BASE + 64 * MiB, 20 * MiB, S1)
    rec.alloc(BASE + 64 * MiB, 12 * MiB, S1)     # a fits in the first segment: PyTorch would not do this
    rep = check_snapshot(rec.dump(tmp_path / "odd.pickle"), 0)
    assert rep["mismatch_causes"] == {"missing segment alloc": 1, "wrong segment": 1}
    assert rep["predicted_segment_allocs"] == 1 and rep["real_segment_allocs"] == 2


# ---------------------------------------------------------------------- start state
def test_a_gap_of_at_most_1mib_after_a_large_block_is_its_unsplit_tail(tmp_path):
    rec = Recorder()
    # A 20 MiB segment from before the window: a 19.5 MiB request took all of it (0.5 MiB left is
    # not > 1 MiB: not split). Only the free of the request is in the window.
    rec.before(BASE, 20 * MiB, S1, blocks=[(BASE, 20 * MiB, 19 * MiB + 512 * 1024)])
    rec.free(BASE, S1)
    rec.alloc(BASE, 20 * MiB, S1)
    rec.free(BASE, S1)
    trace = read_trace(rec.dump(tmp_path / "tail.pickle"))
    # round_size gives 19.5 MiB; the 0.5 MiB gap after it can only be its unsplit tail.
    assert trace.initial_blocks["size_bytes"].tolist() == [20 * MiB]
    assert trace.initial_allocs["block_size_bytes"].tolist() == [20 * MiB]
    assert sum("unsplit tail" in note for note in trace.meta.notes) == 1
    rep = check_trace(trace, 0)
    assert rep["match_rate"] == 1.0


def tables(segments: list[dict], blocks: list[dict]):
    seg = frame_from_columns({k: [s[k] for s in segments] for k in SEGMENT_DTYPES}, SEGMENT_DTYPES)
    blk = frame_from_columns({k: [b[k] for b in blocks] for k in BLOCK_DTYPES if k in block(0, 0, 0)},
                             BLOCK_DTYPES)
    return seg, blk


def block(seg: int, addr: int, size: int, aid: int = -1, requested: int = 0) -> dict:
    return {"device": 0, "segment_addr": seg, "addr": addr, "size_bytes": size, "requested_bytes": requested,
            "state": "inactive" if aid < 0 else "active_allocated", "alloc_id": aid}


def test_load_state_adopts_segments_and_binds_live_blocks():
    seg, blk = tables(
        [{"device": 0, "addr": BASE, "size_bytes": 20 * MiB, "stream": S1, "pool": "large", "is_expandable": False},
         {"device": 0, "addr": BASE + 32 * MiB, "size_bytes": 2 * MiB, "stream": S2, "pool": "small",
          "is_expandable": False}],
        [block(BASE, BASE, 4 * MiB, aid=7, requested=4 * MiB - 100), block(BASE, BASE + 4 * MiB, 16 * MiB),
         block(BASE + 32 * MiB, BASE + 32 * MiB, 1 * MiB), block(BASE + 32 * MiB, BASE + 33 * MiB, 1 * MiB)])
    policy = PyTorchPolicy(SimulatedDevice(), record_decisions=True)
    policy.load_state(seg, blk)
    policy.check_invariants()
    assert policy.reserved_bytes == 22 * MiB and policy.device.n_mallocs == 0
    assert policy.live[7] == (BASE, 4 * MiB - 100, 4 * MiB, S1)
    assert policy.small.size_at == {BASE + 32 * MiB: 2 * MiB}     # touching free pieces merged
    assert policy.malloc(8, 16 * MiB, S1) == BASE + 4 * MiB
    policy.free(7)
    addr = policy.malloc(9, 30 * MiB, S1)      # a new segment, below the adopted ones (the driver's top-down order)
    assert addr + 30 * MiB <= BASE and policy.decisions == [("segment_alloc", addr, 30 * MiB, S1)]
    policy.free(8)
    policy.empty_cache()
    assert [a for a, *_ in policy.decisions[1:]] == ["segment_free", "segment_free"]
    with pytest.raises(ValueError):
        PyTorchPolicy(SimulatedDevice()).load_state(seg, blk.iloc[1:])   # blocks must tile segments


def test_load_state_with_expandable_segments_keeps_the_unmapped_gaps():
    seg, blk = tables(
        [{"device": 0, "addr": BASE, "size_bytes": 40 * MiB, "stream": S1, "pool": "large", "is_expandable": True},
         {"device": 0, "addr": BASE + 60 * MiB, "size_bytes": 20 * MiB, "stream": S1, "pool": "large",
          "is_expandable": True}],
        [block(BASE, BASE, 10 * MiB, aid=1, requested=10 * MiB), block(BASE, BASE + 10 * MiB, 30 * MiB),
         block(BASE + 60 * MiB, BASE + 60 * MiB, 20 * MiB, aid=2, requested=20 * MiB)])
    policy = PyTorchPolicy(SimulatedDevice(), record_decisions=True, expandable_segments=True)
    policy.load_state(seg, blk)
    policy.check_invariants()
    assert policy.reserved_bytes == 60 * MiB
    # 50 MiB: the 30 MiB free block plus one 20 MiB page mapped into the gap after it.
    assert policy.malloc(3, 50 * MiB, S1) == BASE + 10 * MiB
    assert policy.decisions == [("segment_map", BASE + 40 * MiB, 20 * MiB, S1)]
    policy.free(3)
    policy.empty_cache()
    # Whole 20 MiB pages (from the range's base) inside the free block go back.
    assert policy.decisions[-1] == ("segment_unmap", BASE + 20 * MiB, 40 * MiB, S1)
    policy.check_invariants()


def test_device_replay_aids():
    device = SimulatedDevice()
    device.adopt(BASE, 20 * MiB)
    assert device.reserved_bytes == device.peak_reserved_bytes == 20 * MiB and device.n_mallocs == 0
    with pytest.raises(ValueError):
        device.adopt(BASE + 2 * MiB, 2 * MiB)                    # overlaps
    assert device.malloc(2 * MiB) >= BASE + 20 * MiB             # fresh addresses above adopted ranges
    device.hint_addresses([(BASE + 10 * MiB, 4 * MiB), (BASE - 64 * MiB, 4 * MiB)])
    assert device.malloc(4 * MiB) == BASE - 64 * MiB             # the first hint overlaps: skipped
    device.refuse(1)
    with pytest.raises(DeviceOutOfMemory):
        device.malloc(2 * MiB)
    device.malloc(2 * MiB)
    device.refuse(None)
    for _ in range(3):
        with pytest.raises(DeviceOutOfMemory):
            device.malloc(2 * MiB)
    device.refuse(0)
    device.malloc(2 * MiB)
    assert device.n_failed_mallocs == 4


def test_start_state_tables_from_a_trace_without_initial_state(tmp_path):
    rec = Recorder()
    rec.segment_alloc(BASE, 2 * MiB, S1, pool="small")
    rec.alloc(BASE, 1000, S1)
    trace = read_trace(rec.dump(tmp_path / "small.pickle"))
    assert trace.initial_segments.empty and trace.initial_blocks.empty
    rep = check_trace(trace)
    assert rep["devices"]["0"]["match_rate"] == 1.0
    assert isinstance(pd.DataFrame(rep["devices"]["0"]["release_points"]), pd.DataFrame)
