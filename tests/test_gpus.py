"""GPU models (``allocsim gpus``, ``run --gpu``) and the xMem comparison's bookkeeping (no torch needed)."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from allocsim.errors import AllocsimError
from allocsim.gpus import (CUBLAS_WORKSPACE_BYTES, GPUS, LIBRARY_BYTES_CALIBRATED, allocator_capacity, find_gpu,
                           gpu_estimate, lowest_recorded_ratio, model_of_card, proven_total_bytes,
                           recorded_device_check, workspace_bytes)
from allocsim.trace import write_trace
from allocsim.trace.reading.builder import TraceBuilder
from validate import xmem

REPO = Path(__file__).resolve().parents[1]
MiB = 1 << 20


def test_names_match_without_case_spaces_or_dashes():
    assert find_gpu("rtx3060").name == find_gpu("NVIDIA GeForce RTX 3060").name == "RTX 3060"
    assert find_gpu("a100-80gb").total_bytes == 81049 * MiB          # the PCIe card's recorded total, not 80 GiB
    with pytest.raises(AllocsimError, match="unknown GPU 'Voodoo'"):
        find_gpu("Voodoo")


def test_cublas_workspaces_follow_pytorch_defaults_per_architecture():
    # :4096:2:16:8 = 8 MiB + 128 KiB before Hopper, rounded to the 2 MiB a large segment takes; :4096:8 on sm90
    assert CUBLAS_WORKSPACE_BYTES == 8 * MiB + 128 * 1024
    assert workspace_bytes(find_gpu("RTX 3060")) == 2 * 10 * MiB
    assert workspace_bytes(find_gpu("H100")) == 2 * 32 * MiB


def test_estimate_adds_the_parts_and_judges_against_the_gpu():
    gpu = find_gpu("RTX 3060")
    small = gpu_estimate(gpu, 1 << 30)
    assert small["total_bytes"] == (1 << 30) + small["workspace_bytes"] + small["library_bytes"] + small["context_bytes"]
    assert small["fits"] is True
    # FITS only with the unknown terms at their high end: the capacity at that end is the most that fits
    assert gpu_estimate(gpu, allocator_capacity(gpu, end="high"))["fits"] is True
    assert gpu_estimate(gpu, allocator_capacity(gpu, end="high") + 1)["fits"] is False
    assert gpu_estimate(gpu, allocator_capacity(gpu) + 1)["verdict"] == "fits_unless"


def _trace(tmp_path, sizes):
    builder = TraceBuilder("t", "test")
    for i, size in enumerate(sizes):
        builder.alloc(i, i, 0, 0, 0x1000 + i * (1 << 34), size)
    path = tmp_path / "t.parquet"
    write_trace(builder.finish(), str(path))
    return path


def _run(*argv):
    return subprocess.run([sys.executable, "-m", "allocsim", *argv], capture_output=True, text=True, timeout=120)


@pytest.mark.full
def test_run_gpu_verdict_uses_the_memory_left_to_the_allocator(tmp_path):
    gpu = find_gpu("RTX 4060")
    fits = _trace(tmp_path, [1 << 30, 1 << 30])
    done = _run("run", str(fits), "--policy", "pytorch", "--fast", "--json", "--gpu", "RTX 4060", "--sites", "0")
    summary = json.loads(done.stdout)
    assert done.returncode == 0 and summary["gpu_estimate"]["fits"] is True
    assert summary["capacity_bytes"] == allocator_capacity(gpu)
    too_big = _trace(tmp_path, [4 << 30, 4 << 30])        # 8 GiB of tensors on an 8 GiB card
    done = _run("run", str(too_big), "--policy", "pytorch", "--fast", "--gpu", "4060", "--sites", "0")
    assert done.returncode == 3
    assert done.stdout.strip().splitlines()[-1].startswith("DOES NOT FIT on RTX 4060")


@pytest.mark.full
def test_run_gpu_refuses_bad_input_in_one_line(tmp_path):
    path = _trace(tmp_path, [1024])
    for extra in (["--gpu", "Voodoo"], ["--gpu", "T4", "--capacity", "1GiB"]):
        done = _run("run", str(path), "--policy", "pytorch", *extra)
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.full
def test_gpus_lists_every_model_with_sources():
    done = _run("gpus", "--json")
    rows = json.loads(done.stdout)["gpus"]
    assert {"RTX 3060", "A100 80GB", "H100"} <= {r["name"] for r in rows}
    assert all(set(r["sources"]) == {"total_bytes", "context_bytes", "library_bytes", "workspace_bytes"} for r in rows)


def test_library_bytes_is_what_the_anova_calibration_wrote():
    calibration = json.loads(Path(xmem.CALIBRATION_PATH).read_text())
    assert LIBRARY_BYTES_CALIBRATED == calibration["library_bytes"] == max(0, calibration["fitted_bytes"])
    from allocsim.torch_capture import cudnn

    fitted = calibration["cudnn_workspace_ratios"]
    assert cudnn.WORKSPACE_RATIOS_CALIBRATED == (fitted["kernel"], fitted["pointwise_data"])
    best = min(calibration["trials"],
               key=lambda t: (round(t["mean_error"], 3), t["ratios"][0] + t["ratios"][1], t["ratios"]))
    assert best["ratios"] == [fitted["kernel"], fitted["pointwise_data"]]
    assert [tuple(t["ratios"]) for t in calibration["trials"]] == [
        (k, p) for k in xmem.KERNEL_RATIOS for p in xmem.POINTWISE_DATA_RATIOS]
    calibrated = {row["folder"] for row in calibration["rows"]}
    assert calibrated == {r["folder"] for r in xmem.load_rows("calibrate")}
    assert all(folder.startswith("001-Anova/") for folder in calibrated)
    assert all(r["folder"].startswith("002-Monte Carlo/") for r in xmem.load_rows("check"))


def test_summary_counts_false_fits_at_five_percent_under():
    rows = [{"allocsim_error": e, "xmem_error": 2 * e, "allocsim_false_fit": f, "xmem_false_fit": True}
            for e, f in ((0.01, False), (0.02, True), (0.10, False))]
    summary = xmem.summarize(rows)
    assert summary["allocsim_median_error"] == 0.02 and summary["xmem_median_error"] == 0.04
    assert summary["allocsim_false_fits"] == pytest.approx(1 / 3) and summary["xmem_false_fits"] == 1.0


@pytest.mark.full
def test_the_calibration_replays_what_run_gpu_reports(tmp_path):
    """--calibrate replays in process: its peaks must be the ones ``run --gpu --fast`` reports for the same trace."""
    from allocsim.trace import read_trace

    builder = TraceBuilder("t", "test")
    sizes = [30 * MiB, 50 * MiB, 30 * MiB, 70 * MiB, 3 * MiB]
    for i, size in enumerate(sizes):
        builder.alloc(2 * i, 2 * i, 0, 0, 0x1000 + i * (1 << 34), size)
    builder.free(20, 20, 0, 0, 0x1000 + 1 * (1 << 34))          # a 50 MiB hole the 70 MiB request cannot use
    builder.alloc(21, 21, 0, 0, 0x1000 + 9 * (1 << 34), 60 * MiB)
    path = tmp_path / "frag.parquet"
    write_trace(builder.finish(), str(path))
    mine = xmem.replay_in_process(read_trace(str(path)), "RTX 3060")
    done = _run("run", str(path), "--policy", "pytorch", "--fast", "--json", "--gpu", "RTX 3060", "--sites", "0")
    summary = json.loads(done.stdout)
    assert done.returncode == 0
    assert mine["reserved_peak_bytes"] == summary["gpu_estimate"]["reserved_peak_bytes"] > sum(sizes)
    assert mine["allocated_peak_bytes"] == summary["peak_allocated_bytes"]


def test_breakdown_table_says_each_part_in_mib():
    row = {"set": "calibrate", "model": "M", "optimiser": "SGD", "batch": 8, "ground_bytes": 1000 * MiB,
           "allocated_peak_bytes": 700 * MiB, "reserved_peak_no_workspace_bytes": 900 * MiB,
           "cudnn_workspace_effect_bytes": -50 * MiB, "cublas_workspace_bytes": 20 * MiB, "library_bytes": 0,
           "allocsim_bytes": 870 * MiB, "gap_bytes": 130 * MiB, "cudnn_workspace_ratios": [4.0, 0.0]}
    lines = xmem.format_breakdown([row]).splitlines()
    assert lines[2] == "| calibrate | M | SGD | 8 | 1,000 | 700 | 900 | -50 | 20 | 870 | +130 (+13.0%) |"
    assert lines[-1] == "(MiB; cuDNN workspace ratios 4,0)"


def test_rerun_peaks_take_the_candidate_nearer_the_ground_and_skip_out_of_memory():
    row = {"ground_bytes": 2_000_000_000, "reruns": [
        {"tool": "a", "estimate_bytes": 1_900_000_000, "oom": False, "error": 0.05},    # 1.8 or 2.0 GB
        {"tool": "b", "estimate_bytes": 3_000_000_000, "oom": False, "error": 0.6},     # 1.8 or 4.2 GB
        {"tool": "c", "estimate_bytes": 1_000_000_000, "oom": True, "error": None}]}
    found = xmem.rerun_peaks(row, total_bytes=10_000_000_000)
    assert [(r["tool"], r["peak_bytes"], r["binding"]) for r in found] == [("a", 2_000_000_000, True),
                                                                           ("b", 1_800_000_000, False)]
    assert found[0]["cap_bytes"] == 1_900_000_000 and found[1]["vs_ground"] == pytest.approx(-0.1)
    calibrate = xmem.load_rows("calibrate")
    assert all(row.get("reruns") for row in calibrate) and not any("reruns" in r for r in xmem.load_rows("check"))


@pytest.mark.full
def test_validate_xmem_refuses_bad_ratios_in_one_line():
    for bad in ("1,2,3", "-1", "lots", "200"):
        done = subprocess.run([sys.executable, "-m", "validate", "xmem", "--workspace-ratio", bad], cwd=REPO,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and len(done.stdout.strip().splitlines()) == 1, (bad, done.stdout, done.stderr)
        assert "--workspace-ratio must be R or R,P" in done.stdout


# ------------------------------------------------------------------ what real cards report
def test_gpus_json_cites_a_recording_for_each_verified_card(cli):
    code, out, _ = cli("gpus", "--json")
    rows = json.loads(out)["gpus"]
    assert code == 0 and len(rows) == len(GPUS)
    verified = [r for r in rows if r["total_verified"]]
    assert {r["name"] for r in verified} >= {"H100", "V100 32GB", "A100 40GB", "A100 80GB", "L4", "T4"}
    for row in verified:
        source = row["sources"]["total_bytes"]
        # a repository (owner/name) or the project's shared recording, and the figure as it was printed
        assert re.search(r"[\w.-]+/[\w.-]+", source), source
        printed = {f"{row['total_bytes']}", f"{row['total_bytes'] >> 20} MB"}
        assert any(p in source for p in printed), (row["name"], source)
        assert row["total_bytes"] < row["nominal_bytes"]           # no card reaches its label
        assert row["proven_total_bytes"] == row["total_bytes"]
    for row in rows:
        if not row["total_verified"]:
            assert row["total_bytes"] == row["nominal_bytes"] and "unverified" in row["sources"]["total_bytes"]
            assert row["proven_total_bytes"] < row["nominal_bytes"]


class _Properties(msgspec.Struct):
    deviceProperties: list[dict] = []


def _device_properties(path):
    # msgspec skips traceEvents unparsed: the standard parser takes seconds on the V100 trace
    return msgspec.json.decode(gzip.decompress(path.read_bytes()), type=_Properties).deviceProperties


def test_h100_and_v100_32gb_totals_are_what_the_shared_traces_record(shared_dir):
    kineto = shared_dir / "traces" / "kineto-gpu"
    h100 = [p for f in sorted(kineto.glob("AMD-AGI_TraceLens_h100_*.json.gz")) for p in _device_properties(f)]
    assert len(h100) == 4 and {p["name"] for p in h100} == {"NVIDIA H100 80GB HBM3"}
    assert {p["totalGlobalMem"] for p in h100} == {find_gpu("H100").total_bytes} == {85_018_279_936}
    v100 = _device_properties(kineto / "pytorch_kineto_resnet50_nw0_1623143566756.json.gz")
    assert {p["name"] for p in v100} == {"Tesla V100-DGXS-32GB"}
    # the four cards of one box differ; the lowest is the run's own device 0 and is the one kept
    totals = {p["id"]: p["totalGlobalMem"] for p in v100}
    assert find_gpu("V100 32GB").total_bytes == min(totals.values()) == totals[0] == 34_084_028_416
    assert max(totals.values()) == 34_087_305_216
    assert model_of_card("Tesla V100-DGXS-32GB") is find_gpu("V100 32GB")
    assert model_of_card("NVIDIA H100 80GB HBM3") is find_gpu("H100")


def test_a_fit_on_an_unverified_card_near_its_label_is_not_proven():
    gpu = find_gpu("V100 16GB")
    assert not gpu.verified and gpu.total_bytes == 16 << 30
    high_context = gpu.context_bytes + (gpu.total_bytes - allocator_capacity(gpu, end="high")
                                        - (gpu.total_bytes - allocator_capacity(gpu)))
    parts = workspace_bytes(gpu) + gpu.library_bytes + high_context     # the terms at their high end
    proven = proven_total_bytes(gpu)
    assert proven == (16 << 30) * lowest_recorded_ratio().numerator // lowest_recorded_ratio().denominator
    near = gpu_estimate(gpu, gpu.total_bytes - parts)             # needs the whole label
    assert near["fits"] is True and near["fits_proven"] is False and "not proven" in near["caveat"]
    within = gpu_estimate(gpu, proven - parts)
    assert within["fits_proven"] is True and within["caveat"] is None
    over = gpu_estimate(gpu, gpu.total_bytes - parts + 1)
    assert over["fits"] is False and over["caveat"] is None
    recorded = find_gpu("V100 32GB")                               # a recorded total needs no caveat
    at_limit = gpu_estimate(recorded, allocator_capacity(recorded, end="high"))
    assert at_limit["fits_proven"] is True and at_limit["caveat"] is None


def test_run_gpu_verdict_on_an_unverified_card_says_not_proven(tmp_path, cli):
    gpu = find_gpu("RTX 4060")
    size = allocator_capacity(gpu, end="high") >> 21 << 21   # fills what the label leaves at the terms' high end
    assert gpu_estimate(gpu, size)["total_high_bytes"] > proven_total_bytes(gpu)
    path = _trace(tmp_path, [size])
    code, out, _ = cli("run", path, "--policy", "pytorch", "--fast", "--gpu", "RTX 4060", "--sites", "0", "--json")
    estimate = json.loads(out)["gpu_estimate"]
    assert code == 0 and estimate["fits"] is True and estimate["fits_proven"] is False
    code, out, _ = cli("run", path, "--policy", "pytorch", "--fast", "--gpu", "RTX 4060", "--sites", "0")
    line = out.strip().splitlines()[-1]
    assert code == 0 and line.startswith("FITS on RTX 4060 (8.00 GiB, label) (not proven: ") and "may have" in line


def test_recorded_device_check_names_another_card_and_a_different_total():
    h100 = find_gpu("H100")
    same = recorded_device_check(h100, 0, {"name": "NVIDIA H100 80GB HBM3", "total_bytes": h100.total_bytes})
    assert same["same_model"] and same["total_matches"]
    newer = recorded_device_check(h100, 0, {"name": "NVIDIA H100 80GB HBM3", "total_bytes": 85_045_477_376})
    assert newer["same_model"] and not newer["total_matches"] and "85,045,477,376 B" in newer["note"]
    other = recorded_device_check(find_gpu("A100 40GB"), 1, {"name": "NVIDIA H100 80GB HBM3", "total_bytes": 1 << 36})
    assert not other["same_model"] and "recorded on a different card: 'NVIDIA H100 80GB HBM3' (device 1" in other["note"]
    assert model_of_card("NVIDIA A100-SXM4-80GB") is find_gpu("A100 80GB")    # not the A10, not the 40GB
    assert model_of_card("NVIDIA A10G") is find_gpu("A10G") and model_of_card("NVIDIA A10") is find_gpu("A10")
    assert model_of_card("AMD Instinct MI300X") is None


def test_advise_on_an_unverified_card_says_its_capacity_is_the_label(tmp_path, cli):
    from allocsim.gpus import label_note

    path = _trace(tmp_path, [1 << 20])
    code, out, _ = cli("advise", path, "--gpu", "V100 16GB", "--fast", "--workers", "1", "--json")
    assert code == 0 and json.loads(out)["gpu_note"] == label_note(find_gpu("V100 16GB"))
    assert "is not proven to fit a real card" in label_note(find_gpu("V100 16GB"))
    code, out, _ = cli("advise", path, "--gpu", "V100 32GB", "--fast", "--workers", "1", "--json")
    assert code == 0 and "gpu_note" not in json.loads(out) and label_note(find_gpu("V100 32GB")) is None
