"""Snapshots with no history: the recorded-state report of ``info`` and ``run`` (``allocsim.metrics.state``)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from allocsim.cli import main
from allocsim.metrics.state import (EXHAUSTION, FRAGMENTATION, HOW_TO_RECORD, NOT_AN_OOM, has_history,
                                    is_state_only, state_report)
from allocsim.trace import read_trace
from allocsim.trace.reading.safe_pickle import load_pickle

MiB = 1 << 20
BASE = 0x7F0000000000


def write(tmp_path: Path, data, name: str = "snap.pickle") -> Path:
    path = tmp_path / name
    with open(path, "wb") as fh:
        pickle.dump(data, fh)
    return path


def segment(addr: int, blocks: list[tuple[int, int, str]], *, pool: str = "large", stream: int = 0,
            expandable: bool = False, device: int = 0) -> dict:
    """A snapshot segment from (size, requested, state) blocks laid out from ``addr``."""
    out, cursor = [], addr
    for size, requested, state in blocks:
        out.append({"address": cursor, "size": size, "requested_size": requested, "state": state})
        cursor += size
    return {"device": device, "address": addr, "total_size": cursor - addr, "stream": stream,
            "segment_type": pool, "is_expandable": expandable, "blocks": out}


def synthetic(oom: dict | None = None) -> dict:
    """One wholly free 20 MiB segment, one 40 MiB segment with an 8 MiB sliver, one small segment."""
    segs = [
        segment(BASE, [(20 * MiB, 0, "inactive")]),
        segment(BASE + (1 << 30), [(12 * MiB, 12 * MiB - 100, "active_allocated"), (8 * MiB, 0, "inactive"),
                                   (20 * MiB, 20 * MiB, "active_allocated")]),
        segment(BASE + (2 << 30), [(512, 500, "active_allocated"), (2 * MiB - 512, 0, "inactive")], pool="small",
                stream=7),
    ]
    return {"segments": segs, "device_traces": [[] if oom is None else [oom]]}


def test_sums_causes_and_pools_on_a_synthetic_state(tmp_path):
    trace = read_trace(write(tmp_path, synthetic()))
    assert is_state_only(trace) and not has_history(trace)
    state = state_report(trace)["devices"]["0"]
    assert state["reserved_bytes"] == 62 * MiB
    assert state["allocated_bytes"] == 32 * MiB + 512
    assert state["requested_bytes"] == 32 * MiB - 100 + 500
    assert state["free_bytes"] == 30 * MiB - 512
    assert state["waste_bytes"] == {"cached_segments": 20 * MiB, "free_slivers": 10 * MiB - 512,
                                    "pending_free": 0, "rounding": 112}
    assert state["largest_free_block"] == {"bytes": 20 * MiB, "pool": "large", "stream": 0}
    assert state["per_pool"]["small"]["reserved_bytes"] == 2 * MiB
    assert state["per_stream"]["7"]["allocated_bytes"] == 512
    assert sum(p["free_bytes"] for p in state["per_pool"].values()) == state["free_bytes"]
    assert state["request"] is None and state["sites"]["note"]     # no frames recorded: all unattributed
    rows = {r["site"]: r for r in state["sites"]["rows"]}
    assert rows["unattributed"]["bytes"] == state["requested_bytes"] == state["sites"]["live_bytes"]
    assert rows["unattributed"]["count"] == 3 and rows["other sites"]["bytes"] == 0


def test_expandable_free_blocks_split_into_whole_pages_and_slivers(tmp_path):
    # A 60 MiB expandable segment (20 MiB pages): the free block [5, 60) MiB holds pages 20-40 and 40-60.
    seg = segment(BASE, [(5 * MiB, 5 * MiB, "active_allocated"), (55 * MiB, 0, "inactive")], expandable=True)
    trace = read_trace(write(tmp_path, {"segments": [seg], "device_traces": [[]]}))
    waste = state_report(trace)["devices"]["0"]["waste_bytes"]
    assert (waste["cached_segments"], waste["free_slivers"]) == (40 * MiB, 15 * MiB)


def test_recorded_oom_is_judged_fragmentation(tmp_path):
    # 30 MiB failed with 6 MiB free on the device: 34 MiB free in all, no block or cudaMalloc big enough.
    oom = {"action": "oom", "size": 30 * MiB, "stream": 0, "device_free": 6 * MiB, "time_us": 1}
    trace = read_trace(write(tmp_path, synthetic(oom)))
    assert is_state_only(trace)
    state = state_report(trace)["devices"]["0"]
    request = state["request"]
    assert request["source"] == "recorded OOM" and request["kind"] == FRAGMENTATION
    assert request["free_in_cache_bytes"] == 30 * MiB - 512 and request["device_free_bytes"] == 6 * MiB
    assert state["capacity_bytes"] == 62 * MiB + 6 * MiB
    packed = state["packed"]
    assert packed["free_bytes"] == 68 * MiB - (32 * MiB + 512) and packed["request_fits"] is True


def test_given_request_exhaustion_and_not_an_oom(tmp_path):
    trace = read_trace(write(tmp_path, synthetic()))
    exhausted = state_report(trace, request_bytes=100 * MiB, capacity_bytes=70 * MiB)["devices"]["0"]
    assert exhausted["request"]["kind"] == EXHAUSTION and exhausted["packed"]["request_fits"] is False
    fits = state_report(trace, request_bytes=19 * MiB)["devices"]["0"]["request"]
    assert fits["kind"] == NOT_AN_OOM and fits["largest_fitting_free_block_bytes"] == 20 * MiB
    # A 1 MiB request belongs to the small pool, whose free block (2 MiB - 512 B) holds it.
    small = state_report(trace, request_bytes=MiB)["devices"]["0"]["request"]
    assert small["pool"] == "small" and small["kind"] == NOT_AN_OOM


def _raw_sums(raw_segments: list, device: int) -> dict[str, int]:
    segs = [s for s in raw_segments if s.get("device", 0) == device]
    blocks = [b for s in segs for b in s["blocks"]]
    return {"reserved": sum(s["total_size"] for s in segs),
            "allocated": sum(b["size"] for b in blocks if b["state"] == "active_allocated"),
            "requested": sum(b["requested_size"] for b in blocks if b["state"] == "active_allocated"),
            "live": sum(b["size"] for b in blocks if b["state"] != "inactive"),
            "pending": sum(b["size"] for b in blocks if b["state"] not in ("inactive", "active_allocated"))}


@pytest.mark.full
@pytest.mark.shared
def test_final_state_of_every_shared_snapshot_read_without_history(tmp_path, shared_dir):
    files = sorted((shared_dir / "traces" / "pytorch-snapshots").glob("*.pickle"))
    assert files
    for path in files:
        raw = load_pickle(path)
        copy = dict(raw)
        copy["device_traces"] = [[] for _ in raw["device_traces"]]
        trace = read_trace(write(tmp_path, copy, path.name))
        assert is_state_only(trace), path.name
        report = state_report(trace)
        devices = sorted({s.get("device", 0) for s in raw["segments"]})
        assert sorted(map(int, report["devices"])) == devices, path.name
        for device in devices:
            state, sums = report["devices"][str(device)], _raw_sums(raw["segments"], device)
            assert sums["pending"] == 0, path.name   # none of these ends with a pending free
            assert state["reserved_bytes"] == sums["reserved"], path.name
            assert state["allocated_bytes"] == sums["allocated"], path.name
            assert state["requested_bytes"] == sums["requested"], path.name
            assert state["free_bytes"] == sums["reserved"] - sums["live"], path.name
            waste = state["waste_bytes"]
            assert waste["cached_segments"] + waste["free_slivers"] == state["free_bytes"], path.name
            assert waste["rounding"] == sums["allocated"] - sums["requested"], path.name
            assert sum(p["reserved_bytes"] for p in state["per_stream"].values()) == sums["reserved"]


@pytest.mark.shared
def test_state_only_shared_files(shared_dir):
    for path in sorted((shared_dir / "traces" / "state-only-snapshots").glob("*.pickle")):
        raw = load_pickle(path)
        trace = read_trace(path)
        assert is_state_only(trace), path.name
        report = state_report(trace)
        for device, state in report["devices"].items():
            sums = _raw_sums(raw["segments"], int(device))
            assert state["reserved_bytes"] == sums["reserved"], path.name
            assert state["active_bytes"] == sums["live"], path.name
            # The reader keeps blocks whose free waits on a stream as allocated (verl has nine).
            assert state["allocated_bytes"] + state["pending_free_bytes"] == sums["allocated"] + sums["pending"]
    two = state_report(read_trace(shared_dir / "traces" / "state-only-snapshots"
                                  / "albi2_thesis-text-to-SQL_dump_snapshot.pickle"))
    assert list(two["devices"]) == ["0", "1"]


def test_run_and_info_report_the_state(tmp_path, capsys):
    path = str(write(tmp_path, synthetic()))
    assert main(["run", path, "--policy", "pytorch", "--request", "30MiB", "--capacity", "68MiB"]) == 0
    out = capsys.readouterr().out
    assert "Recorded state of device 0" in out and "fragmentation" in out
    assert HOW_TO_RECORD[1:] in out and "nothing replayed" in out
    assert main(["run", path, "--policy", "pytorch", "--json", "-o", str(tmp_path / "out")]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["history"] is False and data["replayed"] is False and data["devices"]["0"]["reserved_bytes"] == 62 * MiB
    assert json.loads((tmp_path / "out" / "state.json").read_text()) == data
    assert main(["info", path, "--json", "--request", "1GiB"]) == 0
    info = json.loads(capsys.readouterr().out)
    # Without a capacity the device's free memory is unknown: the cache alone cannot hold 1 GiB.
    assert info["state"]["devices"]["0"]["request"]["kind"] == "unknown"
    assert main(["info", path]) == 0
    assert "Recorded state of device 0" in capsys.readouterr().out


def test_bad_request_size_is_one_line(tmp_path, capsys):
    path = str(write(tmp_path, synthetic()))
    assert main(["run", path, "--policy", "pytorch", "--request", "lots"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("allocsim run: error:") and len(err.strip().splitlines()) == 1


def _legacy(history) -> dict:
    """A PyTorch 2.0 snapshot: blocks without address, requested_size or frames, their stack in 'history'."""
    blocks = [{"size": 4 * MiB, "state": "active_allocated", "history": history},
              {"size": 16 * MiB, "state": "inactive"}]
    return {"segments": [{"device": 0, "address": BASE, "total_size": 20 * MiB, "allocated_size": 4 * MiB,
                          "active_size": 4 * MiB, "stream": 0, "segment_type": "large", "blocks": blocks}],
            "device_traces": [[]]}


def test_legacy_block_history_gives_the_stack_and_requested_size(tmp_path):
    frames = [{"filename": "/srv/app/model.py", "name": "build", "line": 12}]
    path = write(tmp_path, _legacy([{"addr": BASE, "real_size": 4 * MiB - 24, "frames": frames}]))
    state = state_report(read_trace(path))["devices"]["0"]
    assert state["waste_bytes"]["rounding"] == 24
    assert [row["site"] for row in state["sites"]["rows"] if row["count"]] == ["/srv/app/model.py:12 in build"]


def test_malformed_legacy_history_is_one_line(tmp_path, capsys):
    path = write(tmp_path, _legacy("not a list"))
    assert main(["info", str(path)]) == 2
    err = capsys.readouterr().err
    assert "'history' is not a list" in err and len(err.strip().splitlines()) == 1


@pytest.mark.shared
def test_oldest_oom_snapshot_names_the_code_sites_its_blocks_record(shared_dir):
    # Every live block of this PyTorch 2.0 file holds its allocation stack under 'history'.
    path = shared_dir / "traces" / "state-only-snapshots" / "Yiyi-philosophy_LLM-inference_oom_snapshot.pickle"
    raw = load_pickle(path)
    live = [b for s in raw["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
    recorded_site = {f"{b['history'][0]['frames'][0]['filename']}:{b['history'][0]['frames'][0]['line']} "
                     f"in {b['history'][0]['frames'][0]['name']}" for b in live}
    sites = state_report(read_trace(path))["devices"]["0"]["sites"]
    assert sites["note"] is None
    named = {row["site"]: row["bytes"] for row in sites["rows"] if row["count"] and row["frames"]}
    assert set(named) == recorded_site
    assert sum(named.values()) == sum(b["requested_size"] for b in live)


@pytest.mark.shared
def test_a_capacity_below_what_the_snapshot_reserved_is_refused(shared_dir, capsys):
    # The OOM snapshot reserved 11,844,714,496 bytes: a 10 GiB device cannot be the one it ran on
    # (it used to print "would leave -1.03 GiB free").
    path = shared_dir / "traces" / "state-only-snapshots" / "Yiyi-philosophy_LLM-inference_oom_snapshot.pickle"
    reserved = sum(s["total_size"] for s in load_pickle(path)["segments"])
    for command in (["run", str(path), "--policy", "pytorch"], ["info", str(path)]):
        assert main([*command, "--request", "2MiB", "--capacity", "10GiB"]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and len(captured.err.strip().splitlines()) == 1
        assert f"below the 11.03 GiB ({reserved:,} bytes) device 0 had reserved" in captured.err
    assert main(["run", str(path), "--policy", "pytorch", "--request", "2MiB", "--capacity", f"{reserved}B"]) == 0
    assert "-" not in capsys.readouterr().out.split("packed", 1)[1].split("\n", 1)[0]


@pytest.mark.shared
def test_a_snapshot_without_history_claims_no_start_or_peak(shared_dir, capsys):
    # Segments prove what was reserved when the snapshot was taken; the run's start and peak are not recorded.
    for path in sorted((shared_dir / "traces" / "state-only-snapshots").glob("*.pickle")):
        raw = load_pickle(path)
        assert main(["info", str(path), "--json", "--sites", "0"]) == 0
        recorded = json.loads(capsys.readouterr().out)["recorded"]
        for device, run in recorded.items():
            reserved = sum(s["total_size"] for s in raw["segments"] if s.get("device", 0) == int(device))
            assert run["final_reserved_bytes"] == reserved, path.name
            assert "peak_reserved_bytes" not in run and "start_reserved_bytes" not in run, path.name
        assert main(["info", str(path), "--sites", "0"]) == 0
        text = capsys.readouterr().out
        assert "when the snapshot was taken (no history: the start and the peak of the run are unknown)" in text
        assert "reserved at start" not in text, path.name
