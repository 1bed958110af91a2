"""``allocsim info`` and ``convert`` as a user runs them: real files, JSON keys, clean errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from allocsim.cli import main
from allocsim.trace import read_trace

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOTS = ROOT.parent / "shared" / "traces" / "pytorch-snapshots"

# (file, device, allocs, frees, streams): counted independently in shared/traces/README.md
README_COUNTS = [
    ("Constructor-Sun__memory_snapshot.pickle", 0, 2434, 1918, 1),
    ("Constructor-Sun__memory_snapshot.pickle", 1, 199, 175, 1),
    ("Constructor-Sun__memory_snapshot.pickle", 2, 392, 206, 1),
    ("MAGMA27__memory_snapshot.pickle", 0, 1721, 1721, 1),
    ("Maphsge4__snapshot.pickle", 0, 3058, 3053, 10),
    ("MercuryB1__cuda_memory_snapshot.pickle", 0, 2912, 2912, 1),
    ("Wedsonlin__medium_128_inference_memory_snapshot.pickle", 0, 1280, 1280, 1),
    ("Wedsonlin__medium_128_training_memory_snapshot.pickle", 0, 6526, 6305, 1),
    ("kkaitlyn111__memory_ctx128_fullstep.pickle", 0, 6771, 5894, 1),
    ("silmont2000__mem_snapshot.pickle", 0, 36, 26, 1),
    ("silmont2000__memory_forward_bf16_128.pickle", 0, 937, 937, 1),
    ("silmont2000__memory_forward_fp32_128.pickle", 0, 681, 681, 1),
]
REQUIRED_KEYS = {"format", "events", "allocs", "frees", "streams", "devices", "peak_live_bytes", "baseline_live_bytes"}


def run_json(capsys, *argv) -> dict:
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.full
@pytest.mark.shared
@pytest.mark.parametrize("name,device,allocs,frees,streams", README_COUNTS)
def test_info_matches_shared_readme(capsys, name, device, allocs, frees, streams):
    path = SNAPSHOTS / name
    if not path.exists():
        pytest.skip("../shared/traces is not beside this checkout")
    info = run_json(capsys, "info", str(path), "--device", str(device), "--json")
    assert REQUIRED_KEYS <= set(info)
    assert info["format"] == "pytorch-snapshot"
    # A request that failed in the real run (a recorded OOM) left no alloc entry but is an ALLOC event.
    assert (info["allocs"] - info["recorded_ooms"], info["frees"], info["streams"]) == (allocs, frees, streams)
    assert info["devices"] == [device]
    # Peaks justified from first principles: the in-window peak is at least the largest request,
    # and the peak with baseline never falls below either part.
    trace = read_trace(path).for_device(device)
    alloc_sizes = trace.events.loc[trace.events["kind"] == 1, "size_bytes"]
    assert info["peak_live_bytes"] >= int(alloc_sizes.max())
    assert info["peak_live_with_baseline_bytes"] >= max(info["peak_live_bytes"], info["baseline_live_bytes"])
    assert info["peak_live_with_baseline_bytes"] <= info["peak_live_bytes"] + info["baseline_live_bytes"]


def test_info_convert_round_trip(tmp_path, capsys):
    from tests.test_native_format import sample_trace
    from allocsim.trace import write_trace

    src = tmp_path / "src.csv"
    write_trace(sample_trace(), src)
    before = run_json(capsys, "info", str(src), "--json")
    assert main(["convert", str(src), "-o", str(tmp_path / "out.parquet")]) == 0
    capsys.readouterr()
    after = run_json(capsys, "info", str(tmp_path / "out.parquet"), "--json")
    for key in ("events", "allocs", "frees", "streams", "devices", "peak_live_bytes", "baseline_live_bytes",
                "peak_live_with_baseline_bytes", "recorded_decisions"):
        assert before[key] == after[key], key
    assert set(before["per_device"]) == {"0", "1"}
    assert before["baseline_allocs"] == 2 and before["per_device"]["0"]["baseline_live_bytes"] == 4096 + 1000
    assert before["baseline_live_bytes"] is None          # two GPUs: bytes per device only


def test_info_text_and_bad_files(tmp_path, capsys):
    from tests.test_native_format import sample_trace
    from allocsim.trace import write_trace

    src = tmp_path / "src.parquet"
    write_trace(sample_trace(), src)
    assert main(["info", str(src)]) == 0
    text = capsys.readouterr().out
    assert "peak_live_bytes" in text and "device 1:" in text
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [')
    assert main(["info", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.json" in err and "Traceback" not in err
    assert main(["info", str(src), "--device", "9"]) == 2
    assert "no device 9" in capsys.readouterr().err


BYTE_KEYS = ("baseline_live_bytes", "peak_live_bytes", "peak_live_with_baseline_bytes", "initial_reserved_bytes")


@pytest.mark.shared
@pytest.mark.parametrize("folder,name,reserved", [
    # shared/traces/README.md: device 0 has a 2 MB and a 40 MB segment, device 1 one of 40 MB.
    ("state-only-snapshots", "albi2_thesis-text-to-SQL_dump_snapshot.pickle", {"0": 44_040_192, "1": 41_943_040}),
    ("pytorch-snapshots", "Constructor-Sun__memory_snapshot.pickle", None),
])
def test_info_never_adds_the_memory_of_several_gpus(shared_dir, capsys, folder, name, reserved):
    """Each GPU is its own memory: the byte figures are per device, the whole-trace ones say so instead."""
    path = shared_dir / "traces" / folder / name
    info = run_json(capsys, "info", str(path), "--json", "--sites", "0")
    assert len(info["devices"]) > 1
    assert all(info[key] is None for key in BYTE_KEYS)
    assert info["bytes_counted"].startswith(f"per device only: GPUs {info['devices']} are separate memories")
    per_device = info["per_device"]
    assert sorted(per_device) == [str(d) for d in info["devices"]]
    for device, sub in per_device.items():       # each device's figures are its own, as --device gives them
        alone = run_json(capsys, "info", str(path), "--json", "--sites", "0", "--device", device)
        assert all(isinstance(sub[key], int) and sub[key] == alone[key] for key in BYTE_KEYS)
        assert "bytes_counted" not in alone
    if reserved is not None:
        assert {d: sub["initial_reserved_bytes"] for d, sub in per_device.items()} == reserved
    assert main(["info", str(path), "--sites", "0"]) == 0
    text = capsys.readouterr().out
    whole = text[:text.index("device 0:")]
    assert not any(line.startswith(key) for line in whole.splitlines() for key in BYTE_KEYS)
    assert "bytes_counted                  per device only" in whole
    assert text.count("initial_reserved_bytes") == len(info["devices"])


def test_info_keeps_host_and_pinned_memory_apart():
    """Paddle's host (-1) and pinned (-2) memories are two memories: no whole-trace byte figure adds them."""
    from allocsim.trace.reading.builder import TraceBuilder
    from allocsim.trace.inference.stats import summarize

    b = TraceBuilder("paddle.json", "paddle")
    b.alloc(0, 0, -1, 0, 0x1000, 4096)
    b.alloc(1, 1, -2, 0, 0x1000, 1000)
    trace = b.finish()
    whole = summarize(trace)
    assert whole["peak_live_bytes"] is None and whole["bytes_counted"].startswith("per device only: devices [-2, -1]")
    assert [summarize(trace.for_device(d))["peak_live_bytes"] for d in (-1, -2)] == [4096, 1000]


@pytest.mark.shared
@pytest.mark.parametrize("folder,name", [
    ("state-only-snapshots", "albi2_thesis-text-to-SQL_dump_snapshot.pickle"),
    ("kineto-gpu", "AMD-AGI_TraceLens_h100_bert-small.json.gz"),
])
def test_each_device_section_has_only_its_own_notes(shared_dir, capsys, folder, name):
    """albi2's final segments hold 3 live blocks on GPU 0 and 1 on GPU 1; bert-small's notes about GPU 0's
    start-of-window state are no note of its host memory (-1)."""
    info = run_json(capsys, "info", str(shared_dir / "traces" / folder / name), "--json", "--sites", "0")
    for device, section in info["per_device"].items():
        about = [int(n.split(":", 1)[0].split()[1]) for n in section["notes"] if n.startswith("device ")]
        assert set(about) <= {int(device)}, (device, section["notes"])
        declared = [n for n in section["notes"] if "blocks live in the final segments were allocated" in n]
        if declared:
            count = int(declared[0].split(": ", 1)[-1].split()[0])
            assert count == section["baseline_allocs"], (device, declared)


@pytest.mark.shared
def test_sites_of_a_gpu_trace_with_host_memory_count_the_gpu_only(shared_dir, capsys):
    """bert-small's Kineto trace holds 109 GPU allocations (one start-of-window block besides) and 9 host
    ones: the site tables count the memory the byte figures count, the GPU's."""
    path = shared_dir / "traces" / "kineto-gpu" / "AMD-AGI_TraceLens_h100_bert-small.json.gz"
    info = run_json(capsys, "info", str(path), "--json")
    gpu = info["per_device"]["0"]
    assert info["bytes_counted"].startswith("GPU device(s) [0] only")
    assert info["sites"]["allocations"] == gpu["allocs"] + gpu["baseline_allocs"] < info["allocs"] + info["baseline_allocs"]
    assert sum(row["count"] for row in info["sites"]["by_count"]) == info["sites"]["allocations"]
    assert info["sites"]["counted"].startswith("GPU allocations only")
