"""``allocsim run --device N`` on real traces with several devices: N is replayed, and ``--json`` names it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"


def shared(rel: str) -> Path:
    path = TRACES / rel
    if not path.exists():
        pytest.skip("../shared/traces is not beside this checkout")
    return path


@pytest.mark.shared
def test_three_device_snapshot_replays_the_device_asked_for(cli):
    path = shared("pytorch-snapshots/Constructor-Sun__memory_snapshot.pickle")
    code, out, err = cli("run", path, "--policy", "pytorch", "--fast")
    assert code == 2 and out == "" and "has devices [0, 1, 2]; choose one with --device N" in err
    peaks = {}
    for device in (1, 2):
        code, out, err = cli("run", path, "--policy", "pytorch", "--fast", "--device", device, "--json")
        data = json.loads(out)
        assert code in (0, 3), err
        assert data["device"] == device and data["trace"]["devices"] == [device]
        peaks[device] = data["peak_reserved_bytes"]
    assert peaks[1] != peaks[2]    # two different replays, not one device twice


@pytest.mark.shared
def test_state_only_two_device_snapshot_reports_the_device_asked_for(cli):
    path = shared("state-only-snapshots/albi2_thesis-text-to-SQL_dump_snapshot.pickle")
    code, out, _ = cli("run", path, "--policy", "pytorch", "--device", "1")
    assert code == 0 and "Recorded state of device 1" in out and "device 0" not in out
    code, out, _ = cli("run", path, "--policy", "pytorch", "--device", "1", "--json")
    data = json.loads(out)
    assert code == 0 and data["device"] == 1 and list(data["devices"]) == ["1"]
    assert data["devices"]["1"]["reserved_bytes"] == 40 * 2**20   # device 1: one 40 MB expandable segment
    code, out, _ = cli("run", path, "--policy", "pytorch", "--json")
    data = json.loads(out)
    assert code == 0 and data["device"] is None and sorted(data["devices"]) == ["0", "1"]


@pytest.mark.shared
def test_kineto_host_memory_is_device_minus_one(cli):
    """A Kineto trace's step markers sit on its GPU; selecting host memory (-1) must not keep the GPU."""
    path = shared("kineto-gpu/AMD-AGI_TraceLens_h100_bert-small.json.gz")
    code, out, err = cli("run", path, "--policy", "pytorch", "--fast", "--device", "-1", "--json")
    assert code == 0, err
    host = json.loads(out)
    assert host["device"] == -1 and host["trace"]["devices"] == [-1]
    code, out, err = cli("run", path, "--policy", "pytorch", "--fast", "--device", "0", "--json")
    gpu = json.loads(out)
    assert code == 0 and gpu["device"] == 0 and gpu["trace"]["devices"] == [0]
    assert host["events"] < gpu["events"] and host["peak_requested_bytes"] != gpu["peak_requested_bytes"]


@pytest.mark.shared
def test_sweep_rows_name_the_device_they_replayed(cli, tmp_path):
    """``device`` stays the --device option (the row's key); ``replayed_device`` is run --json's ``device``."""
    import pandas as pd

    rows = {}
    for name, rel, option in (
            ("one", "pytorch-snapshots/silmont2000__mem_snapshot.pickle", []),
            ("three", "pytorch-snapshots/Constructor-Sun__memory_snapshot.pickle", ["--device", "2"])):
        path, out_file = shared(rel), tmp_path / f"{name}.parquet"
        code, _, err = cli("sweep", path, "--policy", "pytorch", "--fast", "--workers", "1", *option,
                           "-o", out_file)
        assert code == 0, err
        [row] = pd.read_parquet(out_file).to_dict("records")
        code, out, err = cli("run", path, "--policy", "pytorch", "--fast", "--sites", "0", *option, "--json")
        assert code in (0, 3), err
        ran = json.loads(out)
        assert row["replayed_device"] == ran["device"] and row["peak_reserved_bytes"] == ran["peak_reserved_bytes"]
        rows[name] = row
    assert pd.isna(rows["one"]["device"]) and rows["one"]["replayed_device"] == 0      # no --device given
    assert rows["three"]["device"] == rows["three"]["replayed_device"] == 2


@pytest.mark.shared
def test_a_gpu_trace_with_host_memory_replays_the_gpu_and_says_so(cli):
    path = shared("kineto-gpu/AMD-AGI_TraceLens_normalization_layer_test.json.gz")
    code, out, err = cli("run", path, "--policy", "pytorch", "--fast", "--json")
    assert code == 0 and err.strip() == ("allocsim run: note: device 0 replayed, the trace's only GPU (-1 is host "
                                         "memory: --device -1 replays it)")
    picked = json.loads(out)
    code, out, err = cli("run", path, "--policy", "pytorch", "--fast", "--device", "0", "--json")
    assert code == 0 and err == "" and json.loads(out)["device"] == picked["device"] == 0
    assert json.loads(out)["peak_reserved_bytes"] == picked["peak_reserved_bytes"]
