"""``allocsim run``: the verdict line, exit status, the capacity the recording implies, the recorded
column and whether a run reproduces the recording, and memory answers in the recorded stream order."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from allocsim.cli import main as cli_main
from allocsim.metrics.verdict import format_duration_ns, verdict
from allocsim.trace import write_trace
from allocsim.trace.reading.builder import TraceBuilder
from allocsim.trace.inference.recorded import RecordedOOM, RecordedRun, set_recorded_run
from allocsim.units import GiB, MiB, format_bytes

from .conftest import doc_quoting


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = cli_main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def two_blocks(path: Path, *, recorded: RecordedRun | None = None, times: bool = True) -> Path:
    """Two 3 MiB requests and their frees on one stream.

    Under PyTorch's rules both come from one 20 MiB large-pool segment (a request between 1 and
    10 MiB gets a kLargeBuffer segment and the second is split from its free rest): peak reserved
    20 MiB, one cudaMalloc, no cudaFree.
    """
    b = TraceBuilder(str(path), "test")
    t = lambda i: i * 1_000_000 if times else i   # noqa: E731
    b.alloc(0, t(1), 0, 0, 0x1000, 3 * MiB)
    b.alloc(1, t(2), 0, 0, 0x2000, 3 * MiB)
    b.free(2, t(3), 0, 0, 0x1000)
    b.free(3, t(4), 0, 0, 0x2000)
    trace = b.finish()
    trace.meta.time_synthesized = not times
    if recorded is not None:
        set_recorded_run(trace, recorded)
    write_trace(trace, path)
    return path


def real_run(**changes) -> RecordedRun:
    """What the real allocator did on ``two_blocks`` (derived by hand above), with ``changes``."""
    fields = dict(device=0, allocator="pytorch", settings=None, start_reserved_bytes=0,
                  peak_reserved_bytes=20 * MiB, final_reserved_bytes=20 * MiB, segment_allocs=1,
                  segment_alloc_bytes=20 * MiB, segment_frees=0, segment_free_bytes=0)
    fields.update(changes)
    return RecordedRun(**fields)


# ----------------------------------------------------------------------------- the verdict line
def test_verdict_lines_say_what_to_do():
    fits = verdict(capacity_bytes=16 * GiB, peak_reserved_bytes=6 * GiB, lower_bound_bytes=5 * GiB, oom=None)
    assert fits["fits"] is True and fits["headroom_bytes"] == 10 * GiB and fits["lower_bound_fits"] is True
    assert fits["line"] == "FITS in 16.00 GiB: peak reserved 6.00 GiB, headroom 10.00 GiB"
    oom = {"event_index": 1289, "t_rel_ns": 3_210_000_000, "requested_bytes": 64 * MiB,
           "reserved_bytes": 15 * GiB, "allocated_bytes": 14 * GiB, "live_bytes": 11 * GiB}
    out = verdict(capacity_bytes=16 * GiB, peak_reserved_bytes=15 * GiB, lower_bound_bytes=12 * GiB, oom=oom)
    assert out["fits"] is False and out["headroom_bytes"] is None and out["first_oom"] == oom
    assert out["line"] == ("OUT OF MEMORY in 16.00 GiB at event 1,289 (+3.21 s): 64.00 MiB requested, "
                           "15.00 GiB reserved, 11.00 GiB live")
    none = verdict(capacity_bytes=16 * GiB, peak_reserved_bytes=15 * GiB, lower_bound_bytes=19 * GiB, oom=oom)
    assert none["lower_bound_fits"] is False
    assert none["line"] == "no allocator setting can fit: peak live 19.00 GiB > 16.00 GiB"
    free = verdict(capacity_bytes=None, peak_reserved_bytes=6 * GiB, lower_bound_bytes=5 * GiB, oom=None)
    assert free["fits"] is None and "--capacity" in free["line"] and "6.00 GiB" in free["line"]
    assert format_duration_ns(1_400_000) == "1.40 ms" and format_duration_ns(800) == "800 ns"


def test_run_ends_with_the_verdict_and_exits_by_it(tmp_path, capsys):
    path = two_blocks(tmp_path / "t.parquet")
    code, out, _ = run_cli(capsys, "run", path, "--policy", "pytorch", "--capacity", "64MiB")
    assert code == 0
    assert out.strip().splitlines()[-1] == "FITS in 64.00 MiB: peak reserved 20.00 MiB, headroom 44.00 MiB"
    code, out, _ = run_cli(capsys, "run", path, "--policy", "pytorch", "--capacity", "10MiB", "--fast")
    assert code == 3
    # 10 MiB holds neither the 20 MiB segment nor a fallback 3 MiB one... but the peak live (6 MiB) fits.
    assert out.strip().splitlines()[-1] == ("OUT OF MEMORY in 10.00 MiB at event 0 (+0 ns): 3.00 MiB requested, "
                                            "0 B reserved, 0 B live")
    code, out, _ = run_cli(capsys, "run", path, "--policy", "pytorch", "--capacity", "5MiB", "--fast", "--json")
    data = json.loads(out)
    assert code == 3 and data["verdict"]["lower_bound_fits"] is False
    assert data["verdict"]["line"] == "no allocator setting can fit: peak live 6.00 MiB > 5.00 MiB"
    assert set(data["verdict"]) >= {"fits", "capacity_bytes", "capacity_source", "headroom_bytes", "first_oom",
                                    "lower_bound_fits"}
    code, out, _ = run_cli(capsys, "run", path, "--policy", "pytorch", "--fast")
    assert code == 0 and "give --capacity SIZE" in out.strip().splitlines()[-1]


def test_oom_time_is_relative_to_the_trace_start_and_left_out_when_made_up(tmp_path, capsys):
    b = TraceBuilder("t", "test")
    b.alloc(0, 5_000_000_000, 0, 0, 0x1000, 8 * MiB)
    b.free(1, 6_000_000_000, 0, 0, 0x1000)
    b.alloc(2, 8_210_000_000, 0, 0, 0x2000, 30 * MiB)   # event 3: a free is two events
    write_trace(b.finish(), tmp_path / "t.parquet")
    # A pool that keeps its cached 8 MiB on OOM: 38 MiB needed, 30 MiB live.
    code, out, _ = run_cli(capsys, "run", tmp_path / "t.parquet", "--policy", "bestfit", "--set", "oom_release=none",
                           "--capacity", "32MiB", "--fast")
    assert code == 3 and out.splitlines()[-1] == ("OUT OF MEMORY in 32.00 MiB at event 3 (+3.21 s): 30.00 MiB "
                                                  "requested, 8.00 MiB reserved, 0 B live")
    path = two_blocks(tmp_path / "n.parquet", times=False)
    code, out, _ = run_cli(capsys, "run", path, "--policy", "pytorch", "--capacity", "10MiB", "--fast")
    assert code == 3 and "at event 0: 3.00 MiB requested" in out.splitlines()[-1]


def test_ambiguous_and_too_small_capacities_are_refused(tmp_path, capsys):
    path = two_blocks(tmp_path / "t.parquet")
    code, _, err = run_cli(capsys, "run", path, "--policy", "pytorch", "--capacity", "16G")
    assert code == 2 and "ambiguous: say 16GiB (1024-based) or 16GB (1000-based)" in err
    code, _, err = run_cli(capsys, "run", path, "--policy", "pytorch", "--capacity", "2MiB")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "below the largest single request of this trace (3.00 MiB, 3,145,728 bytes at event 0)" in err


# ----------------------------------------------------------------------------- capacity from the recording
def test_capacity_defaults_to_the_inferred_one_and_the_output_says_so(tmp_path, capsys):
    rec = real_run(capacity_bytes=64 * MiB, capacity_range=(60 * MiB, 70 * MiB),
                   capacity_source="released segments on the OOM path imply 60-70 MiB")
    path = two_blocks(tmp_path / "t.parquet", recorded=rec)
    code, out, _ = run_cli(capsys, "run", path, "--policy", "pytorch")
    lines = out.strip().splitlines()
    # The recording proves a range, so the inferred capacity is said as a lower bound, with that range.
    assert code == 0 and lines[-1] == ("FITS in at least 64.00 MiB (inferred; the recording proves 60.00 MiB to "
                                       "70.00 MiB): peak reserved 20.00 MiB, headroom at least 44.00 MiB")
    assert any(line.startswith("capacity at least 64.00 MiB inferred from the recording: released segments")
               for line in lines)
    code, out, _ = run_cli(capsys, "run", path, "--policy", "pytorch", "--json")
    v = json.loads(out)["verdict"]
    assert (v["capacity_bytes"], v["capacity_source"]) == (64 * MiB, "inferred")
    assert v["capacity_note"].startswith("released segments")
    code, out, _ = run_cli(capsys, "run", path, "--policy", "pytorch", "--capacity", "10MiB", "--json")
    v = json.loads(out)["verdict"]
    assert code == 3 and (v["capacity_bytes"], v["capacity_source"]) == (10 * MiB, "given")


def test_a_recorded_failed_request_does_not_block_the_recorded_capacity(tmp_path, capsys):
    """A request the real run failed may exceed the device: the recorded capacity is not refused for it."""
    b = TraceBuilder("t", "test")
    b.alloc(0, 1000, 0, 0, 0x1000, 3 * MiB)
    b.alloc(1, 2000, 0, 0, 0x2000, 100 * MiB)    # the request the real run failed
    trace = b.finish()
    set_recorded_run(trace, real_run(ooms=[RecordedOOM(1, 2000, 100 * MiB, 0, 40 * MiB, 20 * MiB)],
                                     capacity_bytes=60 * MiB, capacity_source="test"))
    write_trace(trace, tmp_path / "t.parquet")
    code, out, err = run_cli(capsys, "run", tmp_path / "t.parquet", "--policy", "pytorch", "--fast", "--json")
    data = json.loads(out)
    assert code == 3, err
    assert data["verdict"]["first_oom"]["event_index"] == 1 and data["reproduction"]["reproduces"] is True
    code, _, err = run_cli(capsys, "run", tmp_path / "t.parquet", "--policy", "pytorch", "--capacity", "60MiB")
    assert code == 3 and not err


# ----------------------------------------------------------------------------- recorded beside simulated
def test_recorded_column_and_a_run_that_reproduces_the_recording(tmp_path, capsys):
    path = two_blocks(tmp_path / "t.parquet", recorded=real_run())
    code, out, _ = run_cli(capsys, "run", path, "--policy", "pytorch", "--fast")
    assert code == 0
    assert "| Simulated vs recorded" in out
    assert any(line.startswith("|   peak reserved") and line.count("20.00 MiB") == 2 and "equal" in line
               for line in out.splitlines())
    assert "reproduces the recording: peak reserved, cudaMalloc calls, cudaFree calls, OOMs equal" in out
    code, out, _ = run_cli(capsys, "run", path, "--policy", "pytorch", "--fast", "--json")
    data = json.loads(out)
    assert data["recorded"]["peak_reserved_bytes"] == 20 * MiB and data["recorded"]["device_mallocs"] == 1
    assert data["reproduction"] == {"reproduces": True, "what_if": [], "mismatches": [],
                                    "line": data["reproduction"]["line"]}


def test_a_replay_that_disagrees_with_the_recording_says_so(tmp_path, capsys):
    path = two_blocks(tmp_path / "t.parquet", recorded=real_run(peak_reserved_bytes=40 * MiB, segment_allocs=2))
    code, out, _ = run_cli(capsys, "run", path, "--policy", "pytorch", "--fast")
    assert "does NOT reproduce the recording" in out
    assert "peak reserved 20.00 MiB vs 40.00 MiB recorded; cudaMalloc calls 1 vs 2 recorded" in out
    beside = out[out.index("| Simulated vs recorded"):].splitlines()
    rows = {cells[1].strip(): cells[4].strip() for cells in (line.split("|") for line in beside) if len(cells) == 6}
    assert rows["peak reserved"] == "-20.00 MiB" and rows["cudaMalloc"] == "-1"   # simulated minus recorded
    code, out, _ = run_cli(capsys, "run", path, "--policy", "pytorch", "--fast", "--json")
    repro = json.loads(out)["reproduction"]
    assert repro["reproduces"] is False
    assert {m["metric"] for m in repro["mismatches"]} == {"peak_reserved_bytes", "device_mallocs"}


@pytest.mark.parametrize("argv, reason", [
    (["--policy", "cupy"], "policy cupy is not the recorded allocator (pytorch)"),
    (["--policy", "pytorch", "--alloc-conf", "expandable_segments:True"],
     "settings changed: expandable_segments:True (recorded: expandable_segments:False)"),
    (["--policy", "pytorch:max_split_size_mb:64"], "settings changed: max_split_size_mb:64 (recorded: default)"),
    (["--policy", "pytorch", "--capacity", "100MiB"], "capacity 100.00 MiB is not the recorded device's"),
])
def test_what_if_runs_say_why_they_are_not_the_recording(tmp_path, capsys, argv, reason):
    rec = real_run(capacity_bytes=64 * MiB, capacity_range=(60 * MiB, 70 * MiB), capacity_source="test")
    path = two_blocks(tmp_path / "t.parquet", recorded=rec)
    code, out, err = run_cli(capsys, "run", path, *argv, "--fast")
    assert code == 0, err
    line = next(line for line in out.splitlines() if line.startswith("what-if, not the recorded run: "))
    assert reason in line
    code, out, _ = run_cli(capsys, "run", path, *argv, "--fast", "--json")
    repro = json.loads(out)["reproduction"]
    assert repro["reproduces"] is None and any(reason in r for r in repro["what_if"])


def test_settings_recorded_by_the_snapshot_are_the_baseline(tmp_path, capsys):
    """A snapshot that recorded expandable segments: running with them is no change; without them is."""
    b = TraceBuilder("t", "test")
    b.meta.allocator_settings = {"expandable_segments": True, "max_split_size": -1}
    b.alloc(0, 1000, 0, 0, 0x1000, 3 * MiB)
    trace = b.finish()
    set_recorded_run(trace, real_run(settings={"expandable_segments": True}, peak_reserved_bytes=None,
                                     segment_allocs=None, segment_frees=None))
    write_trace(trace, tmp_path / "t.parquet")
    code, out, _ = run_cli(capsys, "run", tmp_path / "t.parquet", "--policy", "pytorch", "--fast", "--json")
    assert json.loads(out)["reproduction"]["reproduces"] is True
    code, out, _ = run_cli(capsys, "run", tmp_path / "t.parquet", "--policy", "pytorch", "--fast", "--json",
                           "--alloc-conf", "expandable_segments:False")
    assert json.loads(out)["reproduction"]["what_if"] == [
        "settings changed: expandable_segments:False (recorded: expandable_segments:True)"]


def test_no_recording_no_recorded_column(tmp_path, capsys):
    path = two_blocks(tmp_path / "t.parquet")
    code, out, _ = run_cli(capsys, "run", path, "--policy", "pytorch", "--fast", "--json")
    data = json.loads(out)
    assert data["recorded"] is None and data["reproduction"] is None
    code, out, _ = run_cli(capsys, "run", path, "--policy", "pytorch", "--fast")
    assert "Simulated vs recorded" not in out and "recording" not in out


# ----------------------------------------------------------------------------- stream order
def crossing_streams(path: Path) -> Path:
    """Two streams whose recorded interleaving keeps the peak low, while timed delays raise it.

    Stream 1 allocates 8 MiB and frees it before stream 2 allocates its 8 MiB, 1 us later. In the
    timed replay every cudaMalloc costs 10 us + 1 us per MiB, pushing stream 1's free past stream
    2's allocation: both blocks are live together and the peak doubles.
    """
    b = TraceBuilder(str(path), "test")
    b.alloc(0, 1_000, 0, 1, 0x1000, 8 * MiB)
    b.free(1, 2_000, 0, 1, 0x1000)
    b.alloc(2, 3_000, 0, 2, 0x2000, 8 * MiB)
    b.free(3, 4_000, 0, 2, 0x2000)
    write_trace(b.finish(), path)
    return path


def test_memory_answer_follows_the_recorded_stream_order(tmp_path, capsys):
    path = crossing_streams(tmp_path / "t.parquet")
    code, out, _ = run_cli(capsys, "run", path, "--policy", "direct", "--fast", "--json")
    fast = json.loads(out)
    code, out, _ = run_cli(capsys, "run", path, "--policy", "direct", "--json")
    timed = json.loads(out)
    assert fast["peak_requested_bytes"] == timed["peak_requested_bytes"] == 8 * MiB
    assert fast["peak_reserved_bytes"] == timed["peak_reserved_bytes"]
    assert timed["mode"] == "simpy" and timed["alloc_latency_ns"]["count"] == 2
    beside = timed["timed_memory"]
    assert beside["differs"] is True and beside["streams"] == 2 and beside["peak_requested_bytes"] == 16 * MiB
    code, out, _ = run_cli(capsys, "run", path, "--policy", "direct")
    assert "| Memory by replay order" in out and "follow the recorded order of the 2 streams" in out
    # 12 MiB: enough in the recorded order; the timed order alone would have run out.
    code, out, _ = run_cli(capsys, "run", path, "--policy", "direct", "--capacity", "12MiB", "--json")
    data = json.loads(out)
    assert code == 0 and data["verdict"]["fits"] is True and data["timed_memory"]["oom_count"] == 1
    code, _, _ = run_cli(capsys, "run", path, "--policy", "direct", "--capacity", "12MiB", "--fast")
    assert code == 0


def test_output_dir_keeps_the_timed_series_beside(tmp_path, capsys):
    path = crossing_streams(tmp_path / "t.parquet")
    code, _, _ = run_cli(capsys, "run", path, "--policy", "direct", "-o", tmp_path / "out")
    assert code == 0
    assert {p.name for p in (tmp_path / "out").iterdir()} == {"summary.json", "timeseries.parquet", "perf.json",
                                                               "timeseries_timed.parquet"}


def test_maphsge4_fast_and_default_agree(shared_dir, capsys):
    """Ten streams: at 16 GiB with expandable segments the recorded order fails at event 98; the timed
    order (which fails later) is shown beside it, never instead of it."""
    path = shared_dir / "traces" / "pytorch-snapshots" / "Maphsge4__snapshot.pickle"
    argv = ["run", path, "--policy", "pytorch", "--capacity", "16GiB", "--alloc-conf", "expandable_segments:True",
            "--json"]
    code_fast, out, _ = run_cli(capsys, *argv, "--fast")
    fast = json.loads(out)
    code, out, _ = run_cli(capsys, *argv)
    timed = json.loads(out)
    assert code_fast == code == 3
    assert fast["oom"]["event_index"] == timed["oom"]["event_index"] == 98
    for key in ("peak_requested_bytes", "peak_reserved_bytes", "device_maps", "oom_count"):
        assert fast[key] == timed[key], key
    assert timed["timed_memory"]["differs"] is True and timed["timed_memory"]["oom_event_index"] == 1289
    assert timed["verdict"]["line"] == fast["verdict"]["line"] == \
        "no allocator setting can fit: peak live 19.37 GiB > 16.00 GiB"
    code, out, _ = run_cli(capsys, "run", path, "--policy", "pytorch", "--json")
    unlimited = json.loads(out)
    assert unlimited["peak_live_lower_bound_bytes"] == 20_802_383_104
    assert unlimited["timed_memory"]["peak_requested_bytes"] > unlimited["peak_requested_bytes"]


@pytest.mark.full
def test_the_readme_oom_story_is_what_run_prints(shared_dir, capsys):
    """Every `allocsim run $S ...` line of the README's OOM story (its tour) is followed by the verdict it prints."""
    marker = "**The OOM story** on a real snapshot"
    story = doc_quoting(marker).split(marker, 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    lines = [line.strip() for line in story.strip().splitlines()]
    snapshot = shared_dir / "traces" / "pytorch-snapshots" / "Maphsge4__snapshot.pickle"
    checked = 0
    for line, expected in zip(lines, lines[1:]):
        if not line.startswith("allocsim run $S") or not expected.startswith("# "):
            continue
        argv = line.split("#")[0].split()[3:]   # after "allocsim run $S"
        code, out, err = run_cli(capsys, "run", snapshot, *argv, "--fast")
        assert code in (0, 3), err
        assert out.strip().splitlines()[-1] == expected[2:], line
        checked += 1
    assert checked == 4


def test_a_mismatch_that_rounds_away_shows_its_bytes(shared_dir, capsys):
    """OWLv2 on an H100: the replay's peak allocated is 195,072 bytes over the recorded one, both 2.52 GiB."""
    path = shared_dir / "traces" / "kineto-gpu" / "AMD-AGI_TraceLens_h100_owlv2.json.gz"
    code, out, _ = run_cli(capsys, "run", path, "--policy", "pytorch", "--device", "0", "--fast", "--json")
    summary = json.loads(out)
    line = summary["reproduction"]["line"]
    hidden = {m["metric"]: m["simulated"] - m["recorded"] for m in summary["reproduction"]["mismatches"]
              if format_bytes(m["simulated"]) == format_bytes(m["recorded"])}
    assert code == 0 and hidden, line
    for metric, gap in hidden.items():
        # A difference that rounds away says its bytes, so the line never reads "2.52 GiB vs 2.52 GiB" alone.
        assert f"{gap:+,} bytes" in line, (metric, line)


def test_an_oom_while_placing_the_start_state_is_said_so(shared_dir, capsys):
    """Wedsonlin's inference snapshot starts with 1,763,704,832 bytes reserved: in 1600 MiB its start
    allocations are placed anew and one of them fails before the first event of the trace."""
    path = shared_dir / "traces" / "pytorch-snapshots" / "Wedsonlin__medium_128_inference_memory_snapshot.pickle"
    code, out, _ = run_cli(capsys, "run", path, "--policy", "pytorch", "--capacity", "1600MiB", "--fast", "--json")
    got = json.loads(out)
    assert code == 3 and got["oom"]["event_index"] < 0 and got["start_state"] == "allocated"
    code, out, _ = run_cli(capsys, "run", path, "--policy", "pytorch", "--capacity", "1600MiB", "--fast")
    assert "event -1" not in out and "first OOM at the start state" in out
    assert "request has no recorded frames" in out and "came from unattributed" not in out


def test_a_recorded_oom_request_is_demand_never_live(shared_dir, capsys):
    """Constructor-Sun's GPU 1 ran out of memory asking for 5,308,694,528 bytes: that request never got
    memory, so no figure may call it live. The real run reserved 84,202,749,952 bytes at most."""
    from allocsim.trace import read_trace
    from allocsim.trace.inference.recorded import recorded_run

    path = shared_dir / "traces" / "pytorch-snapshots" / "Constructor-Sun__memory_snapshot.pickle"
    recorded = recorded_run(read_trace(path), 1)
    failed = recorded.ooms[0].requested_bytes
    code, out, _ = run_cli(capsys, "info", path, "--device", "1", "--json", "--sites", "0")
    info = json.loads(out)
    assert code == 0 and info["peak_live_bytes"] <= recorded.peak_reserved_bytes < info["peak_demand_bytes"]
    assert info["peak_demand_bytes"] == info["peak_live_bytes"] + failed
    assert info["categories"]["moments"]["at_peak"]["bytes"] == info["peak_live_bytes"]
    code, out, _ = run_cli(capsys, "run", path, "--device", "1", "--policy", "pytorch", "--fast", "--json")
    run = json.loads(out)
    assert code == 3 and run["peak_live_granted_bytes"] == info["peak_live_bytes"]
    assert run["peak_live_lower_bound_bytes"] == info["peak_demand_bytes"]
    assert run["verdict"]["line"].startswith(f"no allocator setting can fit: peak demand "
                                             f"{format_bytes(info['peak_demand_bytes'])} > ")
    assert f"the real run held at most {format_bytes(info['peak_live_bytes'])}" in run["verdict"]["line"]
    assert "peak live" not in run["verdict"]["line"]


def test_a_peak_that_is_the_cached_start_layout_is_not_called_a_need(shared_dir, capsys):
    """charliesabino's 2.7B run at 512 starts with 46,646,951,936 bytes reserved, cached by the sizes the
    same process ran before, and never calls cudaMalloc: its replay fits in 41 GiB, so without a capacity
    the line may not say the run needs the 43.44 GiB."""
    path = shared_dir / "traces" / "scale-series" / "charliesabino_cs336-assignment2_2.7B-512-fwd-memory-snapshot.pickle"
    code, out, _ = run_cli(capsys, "run", path, "--policy", "pytorch", "--fast", "--sites", "0", "--json")
    got = json.loads(out)
    assert code == 0 and got["peak_event_index"]["reserved"] < 0 and got["start_state"] == "recorded"
    line = got["verdict"]["line"]
    assert "the run needs" not in line and "the start layout it loaded" in line
    code, out, _ = run_cli(capsys, "run", path, "--policy", "pytorch", "--fast", "--sites", "0", "--json",
                           "--capacity", "41GiB")
    smaller = json.loads(out)
    assert code == 0 and smaller["verdict"]["fits"] and got["peak_reserved_bytes"] > 41 * GiB
