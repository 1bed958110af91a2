"""Kineto's deviceProperties: the card a trace was recorded on, read on both routes, and run --gpu against it."""

from __future__ import annotations

import json

import pytest

from allocsim.gpus import find_gpu
from allocsim.policies import kernel
from allocsim.trace import read_trace
from allocsim.trace.inference.device_props import recorded_devices
from allocsim.trace.reading import compiled

ROUTES = ["reference"] + (["compiled"] if compiled.ext is not None else [])


def _mem(ts, addr, nbytes):
    return {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": ts,
            "args": {"Addr": addr, "Bytes": nbytes, "Device Type": 1, "Device Id": 0,
                     "Total Allocated": max(nbytes, 0) if ts == 1 else 0, "Total Reserved": 2 << 20}}


def _kineto(tmp_path, props):
    doc = {"schemaVersion": 1, "deviceProperties": props,
           "traceEvents": [_mem(1, 4096, 1 << 20), _mem(2, 4096, -(1 << 20))]}
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    return path


GOOD = {"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85018279936, "computeMajor": 9}


@pytest.mark.parametrize("route", ROUTES)
def test_device_properties_are_read_and_bad_entries_left_out(tmp_path, route):
    bad = [{"id": "1", "totalGlobalMem": 5}, {"id": 2, "totalGlobalMem": True}, {"id": 3}, 7,
           {"id": 4, "name": "x\nY", "totalGlobalMem": -1}]
    with kernel.route(route):
        trace = read_trace(_kineto(tmp_path, [GOOD, *bad]))
    assert trace.meta.device_properties == {"0": {"name": "NVIDIA H100 80GB HBM3", "total_bytes": 85018279936}}
    assert "5 deviceProperties entries without an integer id and totalGlobalMem ignored" in trace.meta.notes


def test_device_properties_of_any_shape_never_fail_a_read():
    assert recorded_devices(None) == ({}, 0)
    assert recorded_devices({"id": 0}) == ({}, 1)
    got, unusable = recorded_devices([{"id": 1, "name": "A\u0007B" + "c" * 400, "totalGlobalMem": 10}] * 2000)
    assert got == {"1": {"name": "AB" + "c" * 253, "total_bytes": 10}} and unusable == 2000 - 1024


@pytest.mark.parametrize("route", ROUTES)
def test_run_gpu_says_whether_the_model_is_the_recorded_card(tmp_path, cli, route):
    path = _kineto(tmp_path, [GOOD])
    with kernel.route(route):
        code, out, _ = cli("run", path, "--policy", "pytorch", "--gpu", "H100", "--sites", "0", "--json")
        recorded = json.loads(out)["gpu_estimate"]["recorded_device"]
        assert code == 0 and recorded["same_model"] and recorded["total_matches"]
        code, out, _ = cli("run", path, "--policy", "pytorch", "--gpu", "A100 40GB", "--sites", "0")
    line = out.strip().splitlines()[-1]
    assert code == 0 and ("recorded on a different card: 'NVIDIA H100 80GB HBM3' (device 0, 79.18 GiB "
                          "totalGlobalMem), not A100 40GB") in line


def test_the_shared_h100_trace_records_the_h100_models_total(shared_dir, cli):
    path = shared_dir / "traces" / "kineto-gpu" / "AMD-AGI_TraceLens_h100_bert-small.json.gz"
    assert read_trace(path).meta.device_properties["0"]["total_bytes"] == find_gpu("H100").total_bytes
    code, out, _ = cli("run", path, "--device", "0", "--policy", "pytorch", "--gpu", "H100", "--sites", "0")
    line = out.strip().splitlines()[-1]
    assert code == 0 and line.startswith("FITS on H100 (79.18 GiB): needs")
