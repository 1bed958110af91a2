"""Code sites: the rule and its filter, rows that add up exactly, waste by site, the CLI's sites output."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from allocsim.cli import main
from allocsim.metrics.sites.rule import SiteFilter, SiteFilterError, SiteIndex
from allocsim.metrics.sites.timeline import site_timeline
from allocsim.metrics.sites.rows import allocation_sites, live_at_peak, site_rows
from allocsim.trace import read_trace, write_trace
from allocsim.trace.reading.builder import TraceBuilder
from allocsim.trace.reading.frames import FrameTable
from allocsim.trace.inference.recorded import recorded_run
from allocsim.trace.schema import FRAME_DTYPES, STACK_DTYPES, frame_from_columns
from allocsim.trace.inference.stats import live_bytes_series
from allocsim.units import MiB

from .conftest import doc_quoting

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "traces"
SNAPSHOTS = SHARED / "pytorch-snapshots"


def run_cli(capsys, *argv) -> tuple[int, str]:
    code = main([str(a) for a in argv])
    out, _ = capsys.readouterr()
    return code, out


def frame(filename: str, line: int, name: str = "f") -> dict:
    return {"filename": filename, "line": line, "name": name}


# ----------------------------------------------------------------------------- the rule
@pytest.mark.parametrize("filename, program", [
    ("/home/u/train.py", True),
    ("/opt/conda/lib/python3.11/threading.py", False),                                # the standard library
    ("/opt/conda/lib/python3.11/site-packages/torch/nn/modules/module.py", False),    # torch/
    ("/opt/conda/lib/python3.11/site-packages/transformers/modeling_utils.py", True),
    ("/usr/lib/python3/dist-packages/numpy/core/numeric.py", True),                   # Debian's site packages
    ("D:\\Dev\\.venv\\Lib\\site-packages\\torch\\nn\\modules\\module.py", False),
    ("C:\\Python311\\Lib\\threading.py", False),
    ("D:\\Dev\\proj\\model.py", True),
    ("torch/nn/functional.py", False),                                                 # Kineto's relative paths
    ("/src/torchvision/models/resnet.py", True),                                       # not torch/
    ("/src/mytorch/layer.py", True),
    ("<ipython-input-3-0123456789ab>", True), ("<frozen runpy>", False),
    ("CUDACachingAllocator.cpp", False), ("??", False), ("", False), ("/build/glibc/nptl/pthread_create.c", False),
])
def test_default_rule(filename, program):
    assert SiteFilter().is_program(filename) is program


def test_site_filter_adds_paths_and_none_drops_the_defaults():
    assert SiteFilter.parse(None).skip == ("<stdlib>", "torch/")
    f = SiteFilter.parse(["transformers/, /home/u/lib/", "transformers/"])
    assert f.skip == ("<stdlib>", "torch/", "transformers/", "/home/u/lib/")
    assert not f.is_program("/x/site-packages/transformers/a.py") and not f.is_program("/home/u/lib/b.py")
    assert f.is_program("/home/u/libs/b.py")                 # a path matches whole directories only
    bare = SiteFilter.parse(["none"])
    assert bare.skip == () and bare.is_program("/x/site-packages/torch/nn/functional.py")
    assert bare.is_program("/opt/conda/lib/python3.11/threading.py")
    assert not bare.is_program("CUDACachingAllocator.cpp")   # native frames never are the program
    assert SiteFilter.parse(["none,foo/"]).skip == ("foo/",)
    with pytest.raises(SiteFilterError):
        SiteFilter.parse(["x" * 1000])


# ----------------------------------------------------------------------------- a synthetic trace
A, B, C, D, E = ("/home/u/a.py", 1), ("/home/u/b.py", 2), ("/home/u/c.py", 3), ("/home/u/d.py", 4), ("/home/u/e.py", 5)


def synthetic(path: Path) -> Path:
    """Waste with a known owner under PyTorch's rules (each site's file is named after its allocation).

    A (4 MiB) makes a 20 MiB segment S1; B (6 MiB) is split from S1; C (12 MiB) makes its own 12 MiB
    segment; E (3 MiB, stream 1) makes a 20 MiB segment on stream 1. A, C and E are freed; then D
    (1000 B, small pool) makes a 2 MiB segment: the reserved peak (54 MiB). There, with B and D live:
    S1's free bytes are A's (the 4 MiB A occupied, and the 10 MiB no one occupied in A's segment),
    C's segment is cached (12 MiB, C's), E's is stranded on stream 1 (20 MiB, E's) and D's small
    segment is a sliver of 2 MiB - 1 KiB plus 24 B of rounding (D's).
    """
    frames = FrameTable(str(path))
    torch_frame = frame("/opt/conda/lib/python3.11/site-packages/torch/nn/functional.py", 10, "relu")
    main_frame = frame("/home/u/main.py", 9, "main")
    stacks = {k: frames.stack_id([*([torch_frame] if k == "A" else []), frame(*site), main_frame], "test")
              for k, site in zip("ABCDE", (A, B, C, D, E))}
    b = TraceBuilder(str(path), "test")
    steps = [("a", "A", 1, 4 * MiB, 0), ("a", "B", 2, 6 * MiB, 0), ("a", "C", 3, 12 * MiB, 0),
             ("a", "E", 4, 3 * MiB, 1), ("f", "A", 1, 0, 0), ("f", "C", 3, 0, 0), ("f", "E", 4, 0, 1),
             ("a", "D", 5, 1000, 0)]
    for t, (what, key, addr, size, stream) in enumerate(steps, 1):
        if what == "a":
            b.alloc(t, t * 1000, 0, stream, addr, size, stack_id=stacks[key])
        else:
            b.free(t, t * 1000, 0, stream, addr)
    tables = frames.tables()
    trace = b.finish(frames=frame_from_columns(tables["frames"], FRAME_DTYPES),
                     stacks=frame_from_columns(tables["stacks"], STACK_DTYPES))
    write_trace(trace, path)
    return path


def site(key: tuple[str, int]) -> str:
    return f"{key[0]}:{key[1]} in f"


def test_waste_and_peak_rows_on_a_synthetic_trace(tmp_path, capsys):
    path = synthetic(tmp_path / "s.parquet")
    code, out = run_cli(capsys, "run", path, "--policy", "pytorch", "--fast", "--json")
    data = json.loads(out)
    sites = data["sites"]
    assert code == 0 and data["peak_reserved_bytes"] == 54 * MiB
    peak = {r["site"]: r["bytes"] for r in sites["at_peak"]}
    assert peak == {site(C): 12 * MiB, site(B): 6 * MiB, site(A): 4 * MiB, site(E): 3 * MiB,
                    "other sites": 0, "unattributed": 0}
    assert sum(peak.values()) == data["peak_requested_bytes"] == 25 * MiB
    waste = {r["site"]: (r["bytes"], r["causes"]) for r in sites["waste"]}
    assert waste == {site(E): (20 * MiB, {"stranded": 20 * MiB}),
                     site(A): (14 * MiB, {"free_slivers": 14 * MiB}),
                     site(C): (12 * MiB, {"cached_segments": 12 * MiB}),
                     site(D): (2 * MiB - 1000, {"rounding": 24, "free_slivers": 2 * MiB - 1024}),
                     "other sites": (0, {}), "unattributed": (0, {})}
    moment = sites["moments"]["waste"]
    assert moment["bytes"] == sum(b for b, _ in waste.values()) == 54 * MiB - (6 * MiB + 1000)
    assert moment["causes"] == {"rounding": 24, "stranded": 20 * MiB, "free_slivers": 16 * MiB - 1024,
                                "cached_segments": 12 * MiB}
    a_row = next(r for r in sites["at_peak"] if r["site"] == site(A))
    assert a_row["frames"] == [site(A), "/home/u/main.py:9 in main"]      # torch's frame is not the program's
    assert sites["at_oom"] == [] and sites["moments"]["at_oom"] is None
    code, text = run_cli(capsys, "run", path, "--policy", "pytorch", "--fast", "--capacity", "1GiB")
    lines = text.splitlines()
    assert lines[-1].startswith("FITS") and "Code sites: the innermost frame of the program" in text
    assert any(line.strip().startswith("20.00 MiB") and "u/e.py:5 in f" in line and "another stream" in line
               for line in lines)


def test_site_filter_on_the_command_line(tmp_path, capsys):
    path = synthetic(tmp_path / "s.parquet")
    _, out = run_cli(capsys, "run", path, "--policy", "pytorch", "--fast", "--json", "--site-filter", "/home/u/a.py")
    rows = {r["site"]: r["bytes"] for r in json.loads(out)["sites"]["at_peak"]}
    assert rows["/home/u/main.py:9 in main"] == 4 * MiB and site(A) not in rows
    _, out = run_cli(capsys, "run", path, "--policy", "pytorch", "--fast", "--json", "--site-filter", "none")
    sites = json.loads(out)["sites"]
    assert sites["skipped_paths"] == [] and "(nothing)" in sites["rule"]
    rows = {r["site"]: r["bytes"] for r in sites["at_peak"]}
    assert rows["/opt/conda/lib/python3.11/site-packages/torch/nn/functional.py:10 in relu"] == 4 * MiB
    _, out = run_cli(capsys, "run", path, "--policy", "pytorch", "--fast", "--json", "--sites", "1")
    rows = json.loads(out)["sites"]["at_peak"]
    assert [r["site"] for r in rows] == [site(C), "other sites", "unattributed"] and rows[1]["sites"] == 3
    assert rows[1]["bytes"] == 13 * MiB and rows[1]["count"] == 3
    _, out = run_cli(capsys, "run", path, "--policy", "pytorch", "--fast", "--json", "--sites", "0")
    assert "sites" not in json.loads(out)
    code, _ = run_cli(capsys, "run", path, "--policy", "pytorch", "--sites", "-1")
    assert code == 2


def test_info_lists_allocation_sites_by_bytes_and_by_count(tmp_path, capsys):
    path = synthetic(tmp_path / "s.parquet")
    code, out = run_cli(capsys, "info", path, "--json", "--sites", "2")
    sites = json.loads(out)["sites"]
    assert code == 0 and sites["allocations"] == 5
    assert [(r["site"], r["bytes"], r["count"]) for r in sites["by_bytes"]] == [
        (site(C), 12 * MiB, 1), (site(B), 6 * MiB, 1), ("other sites", 7 * MiB + 1000, 3), ("unattributed", 0, 0)]
    assert sum(r["count"] for r in sites["by_count"]) == 5
    code, out = run_cli(capsys, "info", path)
    assert "Allocation sites: 5 allocations" in out and "by number of allocations" in out


# ----------------------------------------------------------------------------- every shared snapshot
def _snapshots() -> list[tuple[str, int]]:
    if not SNAPSHOTS.is_dir():
        return []
    out = []
    for path in sorted(SNAPSHOTS.glob("*.pickle")):
        devices = [0, 1, 2] if path.name.startswith("Constructor-Sun") else [0]
        out += [(path.name, d) for d in devices]
    return out


@pytest.mark.full
@pytest.mark.shared
@pytest.mark.parametrize("name, device", _snapshots() or [("absent", 0)])
def test_sites_add_up_exactly_on_every_shared_snapshot(name, device, shared_dir, capsys):
    path = SNAPSHOTS / name
    if not path.exists():
        pytest.skip("no shared snapshots")
    args = ["run", path, "--policy", "pytorch", "--fast", "--json", "--device", device]
    code, out = run_cli(capsys, *args)
    data = json.loads(out)
    sites = data["sites"]
    assert sum(r["bytes"] for r in sites["at_peak"]) == data["peak_requested_bytes"] == sites["moments"]["at_peak"]["bytes"]
    waste = sites["moments"]["waste"]
    assert sum(r["bytes"] for r in sites["waste"]) == waste["bytes"]
    assert waste["reserved_bytes"] == data["peak_reserved_bytes"]
    assert waste["bytes"] == waste["reserved_bytes"] - waste["live_requested_bytes"]
    assert sum(waste["causes"].values()) == waste["bytes"]
    for row in sites["waste"]:
        assert sum(row["causes"].values()) == row["bytes"]
    # ... and at a capacity 10 % below the recorded peak, where the run runs out of memory.
    capacity = data["peak_reserved_bytes"] * 9 // 10
    code, out = run_cli(capsys, *args, "--capacity", capacity)
    data = json.loads(out)
    if data["verdict"]["first_oom"] is not None:
        oom = data["sites"]["moments"]["at_oom"]
        assert sum(r["bytes"] for r in data["sites"]["at_oom"]) == oom["bytes"] == data["verdict"]["first_oom"]["live_bytes"]
        assert data["verdict"]["first_oom"]["site"] == oom["failed_request"]["site"]
    assert sum(r["bytes"] for r in data["sites"]["at_peak"]) == data["peak_requested_bytes"]


@pytest.mark.full
@pytest.mark.shared
@pytest.mark.parametrize("name, extra", [("MercuryB1__cuda_memory_snapshot.pickle", []),
                                         ("Maphsge4__snapshot.pickle", ["--capacity", "20GiB"]),
                                         ("Maphsge4__snapshot.pickle", ["--capacity", "20GiB", "--continue-on-oom"])])
def test_sites_of_timed_runs_and_runs_that_go_on_after_an_oom(name, extra, shared_dir, capsys):
    """Timed replays (one stream: SimPy order; ten streams: memory in trace order) and skipped failures add up too."""
    _, out = run_cli(capsys, "run", SNAPSHOTS / name, "--policy", "pytorch", "--json", *extra)
    data = json.loads(out)
    sites = data["sites"]
    assert sum(r["bytes"] for r in sites["at_peak"]) == data["peak_requested_bytes"]
    assert sum(r["bytes"] for r in sites["waste"]) == sites["moments"]["waste"]["bytes"]
    if data["oom"] is not None:
        assert sum(r["bytes"] for r in sites["at_oom"]) == data["verdict"]["first_oom"]["live_bytes"]
    if "--continue-on-oom" in extra:
        assert data["oom_count"] > 1


@pytest.mark.shared
def test_at_oom_names_the_failed_request_of_a_real_oom(shared_dir, capsys):
    path = SNAPSHOTS / "Constructor-Sun__memory_snapshot.pickle"
    trace = read_trace(path)
    oom = recorded_run(trace, 1).ooms[0]
    decision = trace.decisions.loc[trace.decisions["action"] == "oom"].iloc[0]
    assert int(trace.events["stack_id"].iloc[oom.event_index]) == int(decision["stack_id"]) >= 0
    code, out = run_cli(capsys, "run", path, "--policy", "pytorch", "--device", 1, "--fast", "--json")
    data = json.loads(out)
    failed = data["sites"]["moments"]["at_oom"]["failed_request"]
    assert code == 3 and data["oom"]["requested_bytes"] == failed["bytes"] == 5_308_694_528
    assert failed["site"] == "/mnt/data3/haoyangsun/CurProject/src/train/models.py:181 in update_nodes"
    assert failed["frames"][1] == "/mnt/data3/haoyangsun/CurProject/src/train/models.py:231 in forward"
    assert data["verdict"]["first_oom"]["site"] == failed["site"]
    _, text = run_cli(capsys, "run", path, "--policy", "pytorch", "--device", 1, "--fast")
    assert "the failed 4.94 GiB request came from .../src/train/models.py:181 in update_nodes" in text


@pytest.mark.shared
def test_decision_stacks_survive_convert(shared_dir, tmp_path):
    trace = read_trace(SNAPSHOTS / "Constructor-Sun__memory_snapshot.pickle")
    assert (trace.decisions["stack_id"].to_numpy() >= 0).mean() > 0.9
    for suffix in (".parquet", ".csv"):
        again = read_trace(write_trace(trace, tmp_path / f"t{suffix}") or tmp_path / f"t{suffix}")
        assert again.decisions["stack_id"].tolist() == trace.decisions["stack_id"].tolist()
        oom = again.decisions.loc[again.decisions["action"] == "oom"].iloc[0]
        stack = again.stack(int(oom["stack_id"]))
        assert ("/mnt/data3/haoyangsun/CurProject/src/train/models.py", 181, "update_nodes") in stack


@pytest.mark.shared
def test_state_report_sites_of_a_snapshot_without_history(shared_dir, capsys):
    path = SHARED / "state-only-snapshots" / "volcengine_verl_mem.pickle"
    code, out = run_cli(capsys, "info", path, "--json")
    state = json.loads(out)["state"]["devices"]["0"]
    rows = state["sites"]["rows"]
    assert sum(r["bytes"] for r in rows) == state["requested_bytes"] == state["sites"]["live_bytes"]
    assert rows[0]["site"].endswith("vllm/worker/cache_engine.py:83 in _allocate_kv_cache") and rows[0]["count"] == 24
    assert rows[-1]["site"] == "unattributed" and rows[-1]["count"] == 18


# ----------------------------------------------------------------------------- Kineto
def test_kineto_sites_are_the_enclosing_operators(capsys):
    path = ROOT / "traces" / "bert_fp32.json.gz"
    code, out = run_cli(capsys, "info", path, "--json")
    sites = json.loads(out)["sites"]
    assert "Kineto traces record no stack per allocation" in sites["note"]
    rows = {r["site"]: r["count"] for r in sites["by_count"]}
    assert rows == {"[op] ProfilerStep#1": 3543, "[op] ProfilerStep#2": 3543, "other sites": 0, "unattributed": 0}
    code, out = run_cli(capsys, "run", path, "--policy", "pytorch", "--fast", "--json")
    data = json.loads(out)
    peak = data["sites"]["at_peak"]
    assert sum(r["bytes"] for r in peak) == data["peak_requested_bytes"]
    assert {r["site"] for r in peak if r["bytes"]} <= {"[op] ProfilerStep#1", "[op] ProfilerStep#2"}


@pytest.mark.shared
def test_kineto_with_stack_names_python_frames_and_backward_nodes(shared_dir):
    trace = read_trace(SHARED / "kineto-gpu" / "AMD-AGI_TraceLens_h100_qwen1.5-0.5b.json.gz").for_device(0)
    names = SiteIndex(trace).names
    assert any(n.startswith("transformers/models/qwen2/modeling_qwen2.py:") for n in names)
    norm = read_trace(SHARED / "kineto-gpu" / "AMD-AGI_TraceLens_normalization_layer_test.json.gz").for_device(0)
    assert "[backward] NativeGroupNormBackward0" in SiteIndex(norm).names


@pytest.mark.shared
def test_snapshot_backward_pass_is_named_by_its_autograd_node(shared_dir):
    trace = read_trace(SNAPSHOTS / "kkaitlyn111__memory_ctx128_fullstep.pickle")
    peak = live_at_peak(trace)
    rows = site_rows(trace, peak.alloc_ids, peak.size_bytes, top=3).rows
    assert [r["site"] for r in rows[:3]] == ["/home/c-kaitwang/assignment1/cs336_basics/optimizers.py:82 in step",
                                             "/home/c-kaitwang/assignment1/cs336_basics/optimizers.py:84 in step",
                                             "[backward] BmmBackward0"]
    assert sum(r["bytes"] for r in rows) == peak.live_bytes


# ----------------------------------------------------------------------------- the timeline
@pytest.mark.full
def test_site_timeline_adds_up_to_live_bytes(tmp_path, capsys):
    trace = read_trace(synthetic(tmp_path / "s.parquet"))
    table = site_timeline(trace, top=2, max_points=4)
    _, total = live_bytes_series(trace)
    per_sample = table.groupby("sample")["live_bytes"].sum()
    events = table.drop_duplicates("sample")["event_index"].to_numpy()
    expected = [int(trace.initial_allocs["size_bytes"].sum()) if e < 0 else int(total[e]) for e in events]
    assert per_sample.tolist() == expected and int(total.max()) in expected      # the peak is kept
    assert list(dict.fromkeys(table["site"])) == [site(C), site(B), "other sites", "unattributed"]
    code, out = run_cli(capsys, "plot", tmp_path / "s.parquet", "--fast", "-o", tmp_path / "figs", "--sites", "3")
    assert code == 0 and (tmp_path / "figs" / "sites.png").is_file()
    assert (tmp_path / "figs" / "sites_timeline.parquet").is_file()


def test_allocation_sites_of_a_trace_without_frames(tmp_path):
    b = TraceBuilder("plain", "test")
    b.alloc(1, 1000, 0, 0, 1, 5 * MiB)
    sites = allocation_sites(b.finish())
    assert "no stack frames" in sites["note"]
    assert sites["by_bytes"][-1] == {"site": "unattributed", "bytes": 5 * MiB, "count": 1, "frames": []}
    assert np.array_equal(SiteIndex(b.finish()).site_of(np.array([-1, 3])), [-1, -1])


@pytest.mark.full
@pytest.mark.shared
@pytest.mark.parametrize("policy, params", [("pytorch", {}), ("pytorch", {"expandable_segments": True}),
                                            ("bestfit", {}), ("cupy", {}), ("paddle", {}), ("direct", {})])
def test_every_waste_byte_is_placed_by_the_walk(policy, params, shared_dir):
    """No cause is left to a residual: the walk places each byte the attribution counts (known policies)."""
    from allocsim.metrics.sites.waste import waste_total_check
    from allocsim.policies.registry import build_policy
    from allocsim.runner import device_for, resolve_capacity, simulate_trace, waste_by_site

    for name in ("kkaitlyn111__memory_ctx128_fullstep.pickle", "Maphsge4__snapshot.pickle"):
        trace = read_trace(SNAPSHOTS / name)
        capacity = resolve_capacity(trace, None)
        result = simulate_trace(trace, policy, params, capacity=capacity, fast=True)
        target = result.summary["at_peak_reserved"]["event_index"]
        charges = waste_by_site(trace, lambda: build_policy(policy, device=device_for(capacity.bytes),
                                                            params=dict(params),
                                                            allocator_settings=trace.meta.allocator_settings), target)
        assert charges.unexplained == {} and waste_total_check(charges) == charges.waste_bytes > 0
        assert charges.reserved_bytes == result.summary["peak_reserved_bytes"]


@pytest.mark.shared
def test_readme_sites_example_is_what_run_prints(shared_dir, capsys):
    """The code-site output docs/sites.md quotes on the OOM story's snapshot, line for line (its '...' lines elided)."""
    marker = "On the README's OOM story's snapshot at 20 GiB"
    block = doc_quoting(marker).split(marker, 1)[1].split("```", 2)[1]
    expected = [line for line in block.splitlines()[1:] if line.strip() and line.strip() != "..."]
    code, out = run_cli(capsys, "run", SNAPSHOTS / "Maphsge4__snapshot.pickle", "--policy", "pytorch",
                        "--capacity", "20GiB")
    lines = out.splitlines()
    positions = [lines.index(line) for line in expected]        # each line printed, in this order
    assert code == 3 and positions == sorted(positions) and len(expected) >= 10
