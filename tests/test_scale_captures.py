"""The shipped scale captures (traces/scales/) and the scripts that made and check them.

The leave-one-out test is the evidence behind the table of docs/scale.md: every series' held-out 2x point,
predicted from the smaller captures, must be within 2% (peak live) and 5% (peak reserved, pytorch
preset) of the captured truth.
"""

from __future__ import annotations

import gzip
import importlib
import json
import sys
import types
from fractions import Fraction
from pathlib import Path

import pytest

from .conftest import doc_quoting

TRACES = Path(__file__).resolve().parents[1] / "traces"
SCALES = TRACES / "scales"
sys.path.insert(0, str(TRACES))

capture_scales = importlib.import_module("capture_scales")
capture_gpu_scales = importlib.import_module("capture_gpu_scales")
scale_loo = importlib.import_module("scale_loo")
scale_analysis = importlib.import_module("scale_analysis")


def test_every_grid_point_is_shipped_with_its_sidecar():
    names = {capture_scales.capture_name(p["model"], p["batch"], p["seq"]) for p in capture_scales.grid()}
    assert len(names) == 18
    total = 0
    for name in names:
        gz, meta = SCALES / f"{name}.json.gz", SCALES / f"{name}.meta.json"
        assert gz.exists() and meta.exists(), name
        info = json.loads(meta.read_text())
        assert info["gz_bytes"] == gz.stat().st_size
        assert info["kept"]["total_allocated_mismatches"] == 0 and info["kept"]["ev_idx_strictly_increasing"]
        total += gz.stat().st_size
    assert total < 6_000_000


def test_real_captures_get_operator_attribution():
    from allocsim.scale import load_input

    item = load_input(str(SCALES / "bert_b2_s128.json.gz"), Fraction(2))
    sites = item.key_source.sites
    assert item.key_source.origin == "operators" and len(sites) == len(item.alloc_id)
    outside = [int(item.size_bytes[k]) for k, site in enumerate(sites) if not site]
    # Only Python numbers wrapped into 0-dim double tensors by the argument parser (8 bytes, before
    # the op starts) are outside every op; they are keyed by their order among such allocations.
    assert 0 < len(outside) < 0.3 * len(sites) and set(outside) == {8}
    assert item.steps.source == "markers" and len(item.steps.body) == 2


@pytest.mark.full
@pytest.mark.parametrize("model", ["bert", "gpt2"])
def test_leave_one_out_meets_the_targets(model):
    rows = scale_loo.loo_rows(SCALES, models=(model,), two_point=False)
    assert len(rows) == 2
    for row in rows:
        assert abs(row["live_error"]) <= scale_loo.LIVE_TARGET, row
        assert abs(row["reserved_error"]) <= scale_loo.RESERVED_TARGET, row
        assert row["aligned_share"] > 0.95


@pytest.mark.full
def test_readme_find_max_example_is_what_find_max_prints():
    from allocsim.scale import Scaler, find_max, load_input

    marker = "--find-max --multiple-of 64\n...\n"
    block = doc_quoting(marker).split(marker, 1)[1].split("```", 1)[0]
    quoted = [line for line in block.splitlines() if line.strip()]
    files = scale_analysis.series_files(SCALES, "gpt2", "seq")
    scaler = Scaler([load_input(str(p), Fraction(v)) for p, v in files], "seq")
    found = find_max(scaler, 6 << 30, multiple=64)
    printed = found.format_text().splitlines()
    assert len(quoted) == 7 and all(line in printed for line in quoted), (quoted, printed)
    assert (found.bound.value, found.recorded.value, found.advised.value) == (896, 832, 896)


def test_filter_keeps_memory_markers_and_enclosing_ops_only():
    raw = {"schemaVersion": 1, "traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
        {"ph": "X", "cat": "cpu_op", "name": "aten::linear", "pid": 1, "tid": 1, "ts": 10, "dur": 20,
         "args": {"External id": 7}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::view", "pid": 1, "tid": 1, "ts": 40, "dur": 5},
        {"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": 1, "tid": 2, "ts": 10, "dur": 20},
        {"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 15,
         "args": {"Addr": 64, "Bytes": 8, "Total Allocated": 108, "Ev Idx": 3}},
        {"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 50,
         "args": {"Addr": 64, "Bytes": -8, "Total Allocated": 100, "Ev Idx": 4}},
        {"ph": "f", "name": "flow", "ts": 1},
    ]}
    out, counts = capture_scales.filter_scale_trace(raw, keep_stack=False)
    names = [e["name"] for e in out["traceEvents"]]
    assert names == ["ProfilerStep#1", "aten::linear", "[memory]", "[memory]"]   # view: no memory; empty: other thread
    assert "args" not in out["traceEvents"][1]
    assert out["schemaVersion"] == 1
    assert counts["total_allocated_baseline_bytes"] == 100 and counts["total_allocated_mismatches"] == 0
    assert all("Ev Idx" not in e.get("args", {}) and "Total Allocated" not in e.get("args", {})
               for e in out["traceEvents"])


def test_filter_counts_a_total_that_is_not_recomputable():
    raw = {"traceEvents": [
        {"ph": "i", "name": "[memory]", "ts": 1, "args": {"Addr": 64, "Bytes": 8, "Total Allocated": 8, "Ev Idx": 2}},
        {"ph": "i", "name": "[memory]", "ts": 2, "args": {"Addr": 128, "Bytes": 8, "Total Allocated": 99, "Ev Idx": 1}},
    ]}
    _, counts = capture_scales.filter_scale_trace(raw, keep_stack=False)
    assert counts["total_allocated_mismatches"] == 1 and counts["ev_idx_strictly_increasing"] is False


def test_gpu_script_plans_one_process_per_grid_point(tmp_path, capsys):
    args = capture_gpu_scales.parse_args(["--grid", "bert", "--out-dir", str(tmp_path)])
    planned = capture_gpu_scales.plan(args)
    assert [capture_scales.capture_name(p["model"], p["batch"], p["seq"]) for p, _ in planned] == \
        [capture_scales.capture_name(p["model"], p["batch"], p["seq"]) for p in capture_scales.grid() if p["model"] == "bert"]
    pt, cmd = planned[0]
    assert cmd[cmd.index("--batch") + 1] == str(pt["batch"]) and "--grid" not in cmd
    (tmp_path / f"{capture_scales.capture_name(pt['model'], pt['batch'], pt['seq'])}.pickle.gz").write_bytes(b"x")
    args.skip_existing = True
    assert len(capture_gpu_scales.plan(args)) == len(planned) - 1
    assert capture_gpu_scales.main(["--list"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 18


def test_gpu_script_record_arguments_follow_the_installed_signature():
    args = capture_gpu_scales.parse_args(["--model", "bert", "--batch", "2", "--seq", "64"])

    def new_impl(enabled="all", context="all", stacks="all", max_entries=0, global_record_annotations=False):
        pass

    def old_impl(enabled="all", context="all", stacks="all", max_entries=0):
        pass

    assert capture_gpu_scales.record_kwargs(args, new_impl)["global_record_annotations"] is True
    assert "global_record_annotations" not in capture_gpu_scales.record_kwargs(args, old_impl)
    assert capture_gpu_scales.record_kwargs(args, None)["max_entries"] == 400_000


def test_gpu_script_counts_snapshot_entries_and_gzips_deterministically(tmp_path):
    snap = {"device_traces": [[{"action": "alloc"}, {"action": "free_requested"}, {"action": "alloc"}]],
            "segments": [{"device": 0}, {"device": 1}], "external_annotations": [{"name": "ProfilerStep#1"}]}
    counts = capture_gpu_scales.snapshot_counts(snap, 0)
    assert counts == {"trace_entries": 3, "actions": {"alloc": 2, "free_requested": 1},
                      "segments_at_dump": 1, "external_annotations": 1}
    assert capture_gpu_scales.snapshot_counts(snap, 3)["trace_entries"] == 0
    src = tmp_path / "s.pickle"
    src.write_bytes(b"payload" * 100)
    capture_gpu_scales.gzip_file(src, tmp_path / "a.gz")
    capture_gpu_scales.gzip_file(src, tmp_path / "b.gz")
    assert (tmp_path / "a.gz").read_bytes() == (tmp_path / "b.gz").read_bytes()
    assert gzip.decompress((tmp_path / "a.gz").read_bytes()) == src.read_bytes()


def test_gpu_script_without_cuda_exits_2_with_a_message(monkeypatch, capsys):
    fake = types.ModuleType("torch")
    fake.__version__ = "0+fake"
    fake.cuda = types.SimpleNamespace(is_available=lambda: False)
    fake.version = types.SimpleNamespace(cuda=None)
    monkeypatch.setitem(sys.modules, "torch", fake)
    assert capture_gpu_scales.main(["--model", "gpt2", "--batch", "2", "--seq", "64"]) == 2
    assert "CUDA is not available" in capsys.readouterr().err
