"""Kineto replays follow the recording: the inferred start layout, honest verdicts, no silent zero.

Real GPU Kineto traces come from ``../shared/traces/kineto-gpu`` (skipped when absent; CI has
them). The target: a ``pytorch`` replay's peak reserved within max(1%, 16 MiB) of the trace's own
``Total Reserved`` peak and its peak allocated within 0.1% of ``Total Allocated``'s, on both routes.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from allocsim.cli import main as cli_main
from allocsim.errors import TraceFormatError
from allocsim.policies import kernel
from allocsim.runner import Capacity, simulate_trace
from allocsim.trace import read_trace
from allocsim.trace.formats.kineto.layout import DeviceWindow, start_layout
from allocsim.trace.inference.recorded import recorded_run
from allocsim.trace.inference.stats import summarize
from allocsim.units import GiB, MiB

from .conftest import doc_quoting

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "kineto-gpu"
#: The 2021-format trace carries no Addr and is refused by the reader, so it has no replay.
GPU_TRACES = sorted(p.name for p in SHARED.glob("*.json.gz") if "resnet50" not in p.name)
TIMESFORMER = "AMD-AGI_TraceLens_h100_timesformer.json.gz"


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = cli_main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _path(shared_dir, name: str) -> Path:
    return shared_dir / "traces" / "kineto-gpu" / name


# ---------------------------------------------------------------------- the fidelity target
@pytest.mark.full
@pytest.mark.shared
@pytest.mark.parametrize("route", ["compiled", "reference"])
def test_every_shared_gpu_kineto_trace_meets_the_target(shared_dir, route):
    checked, figures = [], {}
    with kernel.route(route):
        for name in GPU_TRACES:
            trace = read_trace(_path(shared_dir, name))
            for device in [d for d in trace.devices if d >= 0]:
                one = trace.for_device(device)
                real = recorded_run(one, device)
                result = simulate_trace(one, "pytorch", fast=True)
                got = result.summary
                tolerance = max(real.peak_reserved_bytes // 100, 16 * MiB)
                assert abs(got["peak_reserved_bytes"] - real.peak_reserved_bytes) <= tolerance, (name, got["peak_reserved_bytes"], real.peak_reserved_bytes)
                assert abs(got["peak_allocated_bytes"] - real.peak_allocated_bytes) * 1000 <= real.peak_allocated_bytes, name
                assert got["start_state"] == "inferred", name      # the inferred layout was loaded
                checked.append(name)
                figures[name] = [real.peak_reserved_bytes, got["peak_reserved_bytes"], real.peak_allocated_bytes,
                                 got["peak_allocated_bytes"]]
    assert len(checked) == len(GPU_TRACES) == 6
    assert readme_table() == figures      # docs/fidelity.md's table is what these replays give


def readme_table() -> dict[str, list[int]]:
    """The Kineto fidelity table of docs/fidelity.md: trace -> [recorded, simulated reserved, recorded, simulated allocated]."""
    text = doc_quoting("| trace (`kineto-gpu/AMD-AGI_TraceLens_")
    rows = re.findall(r"^\| `([\w.-]+)` \| ([\d,]+) \| ([\d,]+) \| [^|]+ \| ([\d,]+) \| ([\d,]+) \|", text, re.M)
    return {f"AMD-AGI_TraceLens_{name}.json.gz": [int(v.replace(",", "")) for v in values]
            for name, *values in rows}


@pytest.mark.shared
def test_timesformer_fits_where_the_recording_fit(shared_dir):
    """Its replay used to need 6.46 GB while Total Reserved stays at 4.59 GB: the cache of the real
    allocator came from before the window. Now it reproduces the recording and fits in 4608 MiB."""
    trace = read_trace(_path(shared_dir, TIMESFORMER))
    one = trace.for_device(0)
    assert len(one.initial_segments) and int(one.initial_segments["size_bytes"].sum()) == 4_588_568_576
    assert any("start-of-window layout inferred" in n for n in trace.meta.notes)
    got = simulate_trace(one, "pytorch", capacity=Capacity(4608 * MiB), fast=True).summary
    assert got["oom_count"] == 0 and got["verdict"]["fits"] is True
    assert got["peak_reserved_bytes"] == 4_588_568_576 and got["reproduction"]["reproduces"] is True


@pytest.mark.shared
def test_an_oom_the_recording_disproves_says_so(shared_dir, capsys):
    """CuPy's pool runs out of memory in 4608 MiB where the recorded run fit: the verdict keeps the
    OOM but says the recording fit, by how much the replay asks for more, and why (text and JSON)."""
    argv = ["run", str(_path(shared_dir, TIMESFORMER)), "--policy", "cupy", "--device", "0",
            "--capacity", "4608MiB", "--fast", "--sites", "0"]
    code, out, _ = run_cli(capsys, *argv, "--json")
    verdict = json.loads(out)["verdict"]
    assert code == 3 and verdict["fits"] is False
    fit = verdict["recording_fit"]
    assert fit["recorded_peak_reserved_bytes"] == 4_588_568_576
    assert fit["recorded_headroom_bytes"] == 4608 * MiB - 4_588_568_576
    assert fit["replay_over_recorded_bytes"] == fit["replay_demand_bytes"] - 4_588_568_576 > 0
    assert any("cupy is not the recorded allocator" in why for why in fit["why"])
    code, out, _ = run_cli(capsys, *argv)
    last = out.strip().splitlines()[-1]
    assert code == 3 and last.startswith("OUT OF MEMORY in 4.50 GiB") and "the recording FIT in 4.50 GiB" in last


@pytest.mark.shared
def test_no_contradiction_note_when_the_recording_did_not_fit(shared_dir):
    trace = read_trace(_path(shared_dir, TIMESFORMER)).for_device(0)
    got = simulate_trace(trace, "pytorch", capacity=Capacity(4096 * MiB), fast=True).summary
    # 4096 MiB is below the recorded peak reserved: the recording proves nothing there.
    assert got["oom_count"] == 1 and got["verdict"]["recording_fit"] is None


@pytest.mark.shared
def test_an_inferred_start_layout_is_never_called_recorded(shared_dir):
    """Kineto records no segment: the start layout a replay loads, or cannot load, is the inferred one."""
    trace = read_trace(_path(shared_dir, "AMD-AGI_TraceLens_h100_bert-small.json.gz")).for_device(0)
    assert recorded_run(trace, 0).start_layout == "inferred"
    assert simulate_trace(trace, "pytorch", fast=True).summary["start_state"] == "inferred"
    # Below the 116 MiB the inferred layout reserves, it cannot exist: the live allocations are placed anew.
    got = simulate_trace(trace, "pytorch", capacity=Capacity(100 * MiB), fast=True).summary
    assert got["start_state"] == "allocated"
    assert got["start_state_note"].startswith("inferred start state not used: it reserves 121,634,816 bytes")
    why = got["reproduction"]["line"]
    assert "the inferred start state was not loaded" in why and "recorded start state" not in why


# ---------------------------------------------------------------------- no memory recorded
@pytest.mark.shared
def test_a_profile_without_memory_is_refused_with_how_to_record_it(shared_dir, tmp_path, capsys):
    """The same real profile with its [memory] events taken out, as profile_memory=False writes it."""
    doc = json.loads(gzip.open(_path(shared_dir, "AMD-AGI_TraceLens_h100_bert-small.json.gz")).read())
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("name") != "[memory]"]
    doc["profile_memory"] = 0
    path = tmp_path / "no_memory.json.gz"
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    for route in ("compiled", "reference"):
        with kernel.route(route), pytest.raises(TraceFormatError, match="profile_memory=True"):
            read_trace(path)
    for argv in (["run", path, "--policy", "pytorch"], ["info", path]):
        code, out, err = run_cli(capsys, *argv)
        assert code == 2 and out == "", argv
        assert "\n" not in err.strip() and "no [memory] events" in err and "profile_memory=True" in err, err


# ---------------------------------------------------------------------- info on mixed devices
@pytest.mark.shared
@pytest.mark.parametrize("name", ["AMD-AGI_TraceLens_h100_bert-small.json.gz", TIMESFORMER])
def test_info_does_not_add_host_memory_to_gpu_memory(shared_dir, name):
    trace = read_trace(_path(shared_dir, name))
    assert trace.devices == [-1, 0]
    whole, gpu, host = summarize(trace), summarize(trace.for_device(0)), summarize(trace.for_device(-1))
    assert host["peak_live_bytes"] > 0             # adding it would change the figures below
    for key in ("peak_live_bytes", "baseline_live_bytes", "peak_live_with_baseline_bytes", "initial_reserved_bytes"):
        assert whole[key] == gpu[key], key
    assert whole["peak_live_with_baseline_bytes"] == recorded_run(trace, 0).peak_allocated_bytes
    assert "host memory" in whole["bytes_counted"]


# ---------------------------------------------------------------------- the layout rules
def _window(reserved0, baseline, events, orphans=()):
    """events: (addr, nbytes, reserved after)."""
    return DeviceWindow(device=0, start_reserved_bytes=reserved0, baseline_bytes=baseline,
                        addr=[e[0] for e in events], nbytes=[e[1] for e in events],
                        reserved=[e[2] for e in events], orphans=list(orphans))


BASE = 1 << 40


def test_layout_from_addresses_pools_and_growth():
    R = 64 * MiB
    events = [(BASE, 30 * MiB, R),                       # large block at a segment start
              (BASE + 40 * MiB + 512, 4096, R),          # a small block: its 2 MiB chunk is a small segment
              (BASE, -30 * MiB, R),
              (BASE + 100 * MiB, 20 * MiB, R + 20 * MiB)]  # reserved grows: a segment made in the window
    layout = start_layout(_window(R, 5 * MiB, events), baseline_alloc_id=7)
    assert not isinstance(layout, str), layout
    by_addr = {a: (s, p) for a, s, p in layout.segments}
    assert by_addr[BASE] == (30 * MiB, "large")
    assert by_addr[BASE + 40 * MiB] == (2 * MiB, "small")
    assert BASE + 100 * MiB not in by_addr and layout.window_segments == 1
    # 64 - 30 - 2 = 32 MiB never touched: the 5 MiB allocated before the window and 27 MiB free.
    extra = [(a, s) for a, s, p in layout.segments if a > BASE + 120 * MiB]
    assert [s for _, s in extra] == [32 * MiB] and layout.untouched_free_bytes == 27 * MiB
    live = [b for b in layout.blocks if b[3] >= 0]
    assert live == [(extra[0][0], extra[0][0], 5 * MiB, 7)]
    assert sum(s for _, _, s, _ in layout.blocks) == R          # blocks tile exactly Total Reserved


def test_layout_puts_the_start_allocation_in_a_gap_when_nothing_is_untouched():
    # Reserved is one small segment the window shares with 600 KiB allocated before it.
    events = [(BASE + 614400, 512 * 1024, 2 * MiB)]
    layout = start_layout(_window(2 * MiB, 614400, events), baseline_alloc_id=3)
    assert not isinstance(layout, str), layout
    assert layout.segments == [(BASE, 2 * MiB, "small")]
    assert layout.blocks[0] == (BASE, BASE, 614400, 3)


@pytest.mark.parametrize("events, reason", [
    ([(BASE, 4 * MiB, 8 * MiB), (BASE, -4 * MiB, 6 * MiB)], "shrinks"),
    ([(BASE, 30 * MiB, 8 * MiB)], "no room"),
    ([(BASE + 1000, 4096, 8 * MiB)], "512-byte grid"),
])
def test_layout_refuses_what_the_rules_cannot_explain(events, reason):
    got = start_layout(_window(8 * MiB, 0, events), baseline_alloc_id=0)
    assert isinstance(got, str) and reason in got


def test_a_growth_beside_a_big_enough_free_block_is_another_pool():
    R = 40 * MiB
    events = [(BASE, 30 * MiB, R), (BASE, -30 * MiB, R),          # a 30 MiB cached block, free again
              (BASE + 200 * MiB, 12 * MiB, R + 12 * MiB)]          # yet a new segment for 12 MiB
    layout = start_layout(_window(R, 0, events), baseline_alloc_id=0)
    assert layout.other_pool_growths == [(2, 12 * MiB, 30 * MiB)]
    assert "another pool or stream" in layout.other_pool_sentence()
    # Growth with no free block big enough in the proven layout: nothing to say.
    events = [(BASE, 30 * MiB, R), (BASE + 200 * MiB, 12 * MiB, R + 12 * MiB)]
    assert start_layout(_window(R, 0, events), baseline_alloc_id=0).other_pool_growths == []


@pytest.mark.shared
def test_replays_say_why_they_differ_or_that_they_reproduce(shared_dir):
    """vLLM's graph capture made 13 segments that a one-pool replay serves from its cache: the
    reproduction says it differs and why; the ROCm microbenchmark's 3 segments are reproduced."""
    vllm = read_trace(_path(shared_dir, "AMD-AGI_TraceLens_vllm_piecewise_graph_capture.json.gz"))
    assert recorded_run(vllm, 0).segment_allocs == 13
    got = simulate_trace(vllm, "pytorch", fast=True).summary["reproduction"]
    assert got["reproduces"] is False and any("another pool or stream" in why for why in got["why"])
    assert "why: " in got["line"]
    norm = read_trace(_path(shared_dir, "AMD-AGI_TraceLens_normalization_layer_test.json.gz")).for_device(0)
    got = simulate_trace(norm, "pytorch", fast=True).summary
    assert got["device_mallocs"] == recorded_run(norm, 0).segment_allocs == 3
    assert got["reproduction"]["reproduces"] is True


def test_layout_refuses_addresses_at_the_ends_of_the_address_space():
    top = (1 << 63) - 64 * MiB
    got = start_layout(_window(128 * MiB, 0, [(top, 4 * MiB, 128 * MiB)]), baseline_alloc_id=0)
    assert isinstance(got, str) and "address space" in got
    got = start_layout(_window(8 * MiB, 0, [(-(1 << 40), 4 * MiB, 8 * MiB)]), baseline_alloc_id=0)
    assert isinstance(got, str) and "address space" in got


@pytest.mark.shared
def test_a_fit_below_the_recorded_peak_that_the_replay_undercounts_is_not_proven(shared_dir, capsys):
    """The vLLM graph capture reserved 193,640,529,920 bytes; its one-pool replay reserves less and never
    calls cudaMalloc, so in 180 GiB it "fits" only because of what it misses: the verdict says so."""
    path = shared_dir / "traces" / "kineto-gpu" / "AMD-AGI_TraceLens_vllm_piecewise_graph_capture.json.gz"
    argv = ["run", str(path), "--policy", "pytorch", "--device", "0", "--capacity", "180GiB", "--fast", "--sites", "0"]
    code, out, _ = run_cli(capsys, *argv, "--json")
    got = json.loads(out)
    recorded_peak = got["recorded"]["peak_reserved_bytes"]
    assert recorded_peak > 180 * GiB and got["device_failed_mallocs"] == 0 and got["verdict"]["fits"] is True
    unproven = got["verdict"]["recording_exceeds"]
    assert unproven["recorded_peak_reserved_bytes"] == recorded_peak
    assert unproven["replay_under_recorded_bytes"] == recorded_peak - got["peak_reserved_bytes"] > 0
    assert "not proven" in got["verdict"]["line"] and unproven["why"] == got["recorded"]["unmodelled"]
    # At the recorded peak there is nothing left unproven: the replay's own mismatch line says the rest.
    code, out, _ = run_cli(capsys, "run", str(path), "--policy", "pytorch", "--device", "0", "--fast", "--sites", "0",
                           "--capacity", f"{recorded_peak}B", "--json")
    assert json.loads(out)["verdict"]["recording_exceeds"] is None


@pytest.mark.shared
def test_internal_fragmentation_of_a_trace_of_block_sizes_is_unknown(shared_dir, capsys):
    """Kineto records the allocator's block sizes (Bytes), never the requests: the rounding inside blocks
    cannot be known, and the replay's own re-rounding of those blocks is not it."""
    path = shared_dir / "traces" / "kineto-gpu" / "AMD-AGI_TraceLens_h100_qwen1.5-0.5b.json.gz"
    argv = ["run", str(path), "--policy", "pytorch", "--device", "0", "--fast", "--sites", "0"]
    code, out, _ = run_cli(capsys, *argv, "--json")
    assert code == 0 and json.loads(out)["at_peak_reserved"]["internal_fragmentation_bytes"] is None
    code, out, _ = run_cli(capsys, *argv)
    assert code == 0 and [line.split("|")[3].strip() for line in out.splitlines()
                          if "internal fragmentation" in line] == ["unknown"]


@pytest.mark.shared
def test_advise_explains_a_dropped_inferred_start_layout_as_run_does(shared_dir, capsys):
    """Below the 116 MiB the inferred layout reserves, advise's recorded-settings line gets run's what-if line."""
    path = _path(shared_dir, "AMD-AGI_TraceLens_h100_bert-small.json.gz")
    code, out, _ = run_cli(capsys, "run", str(path), "--policy", "pytorch", "--capacity", "110MiB", "--fast",
                           "--sites", "0", "--json")
    why = json.loads(out)["reproduction"]["line"]
    assert code == 0 and "the inferred start state was not loaded" in why
    code, out, _ = run_cli(capsys, "advise", str(path), "--capacity", "110MiB", "--fast")
    lines = out.splitlines()
    [at] = [i for i, line in enumerate(lines) if line.startswith("recorded settings (")]
    assert code == 0 and lines[at + 1] == f"   {why}"
