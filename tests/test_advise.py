"""``allocsim advise``: the settings that fit, their lines and commands, pruning, ties, JSON, errors."""

from __future__ import annotations

import json
import os
import pickle
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from allocsim.advise.advice import advise
from allocsim.advise.capacity import Bisection
from allocsim.advise.knobs import preset_for
from allocsim.advise.rank import Outcome, recommend, signature
from allocsim.cli import main
from allocsim.runner import Capacity, simulate_trace
from allocsim.sweep.flatten import flatten
from allocsim.trace import read_trace, write_trace
from allocsim.trace.reading.builder import TraceBuilder
from allocsim.units import MiB, format_bytes

from .conftest import doc_quoting

SNAPSHOTS = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "pytorch-snapshots"
#: The keys the JSON must have, as the command's documentation lists them.
TOP_KEYS = {"capacity_bytes", "capacity_source", "grid", "recommendations", "no_effect", "lower_bound_bytes",
            "fits_any"}
RECOMMENDATION_KEYS = {"alloc_conf", "settings", "peak_reserved_bytes", "headroom_bytes", "min_capacity_bytes",
                       "alloc_latency_ns", "command"}


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    """Runs journal into the test's folder, never the user's cache."""
    monkeypatch.setenv("ALLOCSIM_CACHE_DIR", str(tmp_path / "cache"))


def build(path: Path, steps: list[tuple[str, int, int]]) -> Path:
    """A one-stream trace from ("a", addr, size) / ("f", addr, 0) steps."""
    b = TraceBuilder(str(path), "test")
    for t, (what, addr, size) in enumerate(steps, 1):
        if what == "a":
            b.alloc(t, t * 1000, 0, 0, addr, size)
        else:
            b.free(t, t * 1000, 0, 0, addr)
    write_trace(b.finish(), path)
    return path


@pytest.fixture
def fragmented(tmp_path) -> Path:
    """60 MiB, freed; two 25 MiB blocks split from it; the first freed; then 30 MiB fits no free block."""
    return build(tmp_path / "frag.parquet", [("a", 1, 60 * MiB), ("f", 1, 0), ("a", 2, 25 * MiB), ("a", 3, 25 * MiB),
                                             ("f", 2, 0), ("a", 4, 30 * MiB), ("f", 3, 0), ("f", 4, 0)])


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def replay(capsys, command: str) -> dict:
    """Run a printed ``allocsim run ...`` command line here and return its JSON."""
    argv = shlex.split(command)
    assert argv[:2] == ["allocsim", "run"]
    code, out, _ = run_cli(capsys, *argv[1:], "--json", "--fast")
    data = json.loads(out)
    assert code == (0 if data["verdict"]["fits"] else 3)
    return data


# ----------------------------------------------------------------------------- the answer
@pytest.mark.full
def test_recommends_a_setting_that_fits_and_its_command_reproduces_it(tmp_path, fragmented, capsys):
    code, out, _ = run_cli(capsys, "advise", fragmented, "--capacity", "80MiB", "--workers", "1",
                           "-o", tmp_path / "runs.parquet", "--json")
    assert code == 0
    data = json.loads(out)
    assert TOP_KEYS <= set(data) and data["fits_any"] is True
    assert data["recorded"]["fits"] is False          # the recorded settings run out of memory at 80 MiB
    recs = data["recommendations"]
    assert recs and all(RECOMMENDATION_KEYS <= set(r) for r in recs)
    peaks = [(r["peak_reserved_bytes"], r["alloc_latency_ns"]["p99"]) for r in recs]
    assert peaks == sorted(peaks)
    for rec in recs:
        assert rec["headroom_bytes"] == 80 * MiB - rec["peak_reserved_bytes"] >= 0
        assert rec["command"].split()[-2:] == ["--capacity", "80MiB"]
        run = replay(capsys, rec["command"])
        assert run["verdict"]["fits"] is True and run["peak_reserved_bytes"] == rec["peak_reserved_bytes"]
        # The smallest capacity: it fits there and not one step (2 MiB) below.
        at_min = replay(capsys, rec["command"].replace("80MiB", str(rec["min_capacity_bytes"])))
        assert at_min["verdict"]["fits"] is True
        if rec["min_capacity_bytes"] - 2 * MiB >= 60 * MiB:   # below the 60 MiB request run refuses to start
            below = replay(capsys, rec["command"].replace("80MiB", str(rec["min_capacity_bytes"] - 2 * MiB)))
            assert below["verdict"]["fits"] is False
    # The line to paste is PyTorch's own syntax, the same as the command's --alloc-conf.
    first = recs[0]
    assert first["line"] == f"PYTORCH_CUDA_ALLOC_CONF={first['alloc_conf']}"
    assert f"--alloc-conf {first['alloc_conf']}" in first["command"]
    assert data["why"]["removed_bytes"] > 0 and data["why"]["removed_cause"]
    # Expandable segments alone fit below their own peak at 80 MiB: the cache is released on the OOM path.
    expandable = [r for r in recs if r["settings"] == {"expandable_segments": "True"}]
    assert expandable and expandable[0]["min_capacity_bytes"] < expandable[0]["peak_reserved_bytes"]


@pytest.mark.full
def test_text_report_names_grid_pruning_and_verdict(tmp_path, fragmented, capsys):
    code, out, _ = run_cli(capsys, "advise", fragmented, "--capacity", "80MiB", "--workers", "1", "--fast",
                           "-o", tmp_path / "runs.parquet")
    assert code == 0
    assert "grid: 2 x 5 x 3 = 30 settings" in out
    assert "no effect on this trace (each value tried alone changed nothing): max_split_size_mb" in out
    assert "still fits down to" in out and "allocsim run " in out
    assert out.strip().splitlines()[-1].startswith("FITS in 80.00 MiB: PYTORCH_CUDA_ALLOC_CONF=")


@pytest.mark.full
@pytest.mark.shared
@pytest.mark.parametrize("name", ["silmont2000__memory_forward_fp32_128.pickle",
                                  "silmont2000__memory_forward_bf16_128.pickle"])
def test_shared_snapshot_between_expandable_and_recorded_peak(tmp_path, capsys, name):
    path = SNAPSHOTS / name
    if not path.exists():
        pytest.skip("../shared/traces is not beside this checkout")
    trace = read_trace(path)
    recorded = simulate_trace(trace, "pytorch", {}, fast=True).summary["peak_reserved_bytes"]
    expandable = simulate_trace(trace, "pytorch", {"expandable_segments": True}, fast=True).summary
    capacity = (recorded + expandable["peak_reserved_bytes"]) // 2
    code, out, _ = run_cli(capsys, "advise", path, "--capacity", capacity, "--fast", "--workers", "1",
                           "-o", tmp_path / "runs.parquet", "--json")
    data = json.loads(out)
    assert code == 0 and data["fits_any"] and data["recorded"]["fits"] is False
    best = data["recommendations"][0]
    run = replay(capsys, best["command"])
    assert run["verdict"]["fits"] is True and run["peak_reserved_bytes"] == best["peak_reserved_bytes"]
    assert best["peak_reserved_bytes"] <= capacity < recorded


# ----------------------------------------------------------------------------- nothing fits
def test_below_peak_live_exits_1_and_shows_what_is_live(tmp_path, fragmented, capsys):
    code, out, _ = run_cli(capsys, "advise", fragmented, "--capacity", "50MiB", "-o", tmp_path / "r.parquet")
    assert code == 1
    assert "no allocator setting can fit: peak live 60.00 MiB > 50.00 MiB" in out
    assert "60.00 MiB  allocation" in out and "by code site:" in out
    code, out, _ = run_cli(capsys, "advise", fragmented, "--capacity", "50MiB", "--json")
    data = json.loads(out)
    assert code == 1 and data["fits_any"] is False and data["recommendations"] == []
    assert data["live_at_peak"]["live_bytes"] == data["lower_bound_bytes"] == 60 * MiB
    # A trace without frames: every live byte is unattributed, and the note says why.
    rows = {r["site"]: r for r in data["sites"]["rows"]}
    assert list(rows) == ["other sites", "unattributed"] and "frames" in data["sites"]["note"]
    assert rows["unattributed"]["bytes"] == 60 * MiB and rows["other sites"]["bytes"] == 0


@pytest.mark.shared
def test_recorded_oom_capacity_is_inferred_and_below_peak_live(capsys):
    path = SNAPSHOTS / "Constructor-Sun__memory_snapshot.pickle"
    if not path.exists():
        pytest.skip("../shared/traces is not beside this checkout")
    code, out, _ = run_cli(capsys, "advise", path, "--device", "1", "--json")
    data = json.loads(out)
    # The job asked for 5.3 GB more than the device held: no setting could have fitted it.
    assert code == 1 and data["capacity_source"] == "inferred"
    assert data["lower_bound_bytes"] > data["capacity_bytes"]
    # ... and advise names the code that holds the memory at the peak, to the byte.
    rows = data["sites"]["rows"]
    assert sum(r["bytes"] for r in rows) == data["lower_bound_bytes"] == data["live_at_peak"]["live_bytes"]
    assert rows[0]["site"].endswith("src/train/models.py:174 in update_nodes") and rows[0]["count"] == 12
    assert rows[-1] == {"site": "unattributed", "bytes": 0, "count": 0, "frames": []}
    # The failed 4.94 GiB request never got memory: demand, never live (the real run held 78.29 GiB).
    assert data["peak_live_granted_bytes"] < data["capacity_bytes"] < data["lower_bound_bytes"]
    code, out, _ = run_cli(capsys, "advise", path, "--device", "1")
    assert code == 1 and ".../src/train/models.py:174 in update_nodes" in out
    assert "peak live" not in out and "live allocations" not in out
    assert f"the real run held at most {format_bytes(data['peak_live_granted_bytes'])}" in out
    assert "what the program asks to hold at its peak of demand (after event 375)" in out
    # The site rule is the user's to change: with src/train/ skipped, the site is the frame outside it.
    code, out, _ = run_cli(capsys, "advise", path, "--device", "1", "--site-filter", "src/train/", "--sites", "2",
                           "--json")
    data = json.loads(out)
    rows = data["sites"]["rows"]
    assert code == 1 and "src/train/" in data["sites"]["rule"] and len(rows) == 4    # 2 sites, other, unattributed
    assert not any("src/train/models.py" in r["site"] for r in rows)
    assert sum(r["bytes"] for r in rows) == data["lower_bound_bytes"]


def test_nothing_fits_shows_the_closest_and_how_much_it_misses(tmp_path, capsys):
    # One byte needs a 2 MiB segment (or page) under every PyTorch setting; the device has 1 MiB.
    path = build(tmp_path / "one.parquet", [("a", 1, 1), ("f", 1, 0)])
    code, out, _ = run_cli(capsys, "advise", path, "--capacity", "1MiB", "--fast", "--workers", "1", "--json")
    data = json.loads(out)
    assert code == 1 and data["fits_any"] is False and data["lower_bound_bytes"] == 1
    assert data["closest"]["min_capacity_bytes"] == 2 * MiB and data["closest"]["missing_bytes"] == MiB
    code, out, _ = run_cli(capsys, "advise", path, "--capacity", "1MiB", "--fast", "--workers", "1")
    assert code == 1 and "1.00 MiB (1,048,576 bytes) short" in out and out.strip().endswith("settings searched")


# ----------------------------------------------------------------------------- pruning and ties
@pytest.mark.full
def test_pruned_knobs_change_nothing_alone_and_the_grid_is_complete(tmp_path, fragmented):
    advice = advise(str(fragmented), capacity_bytes=80 * MiB, fast=True, output=str(tmp_path / "r.parquet"))
    grid = advice.grid
    assert [k.name for k in grid.no_effect] == ["max_split_size_mb"]
    trace = read_trace(fragmented)
    base = flatten(simulate_trace(trace, "pytorch", {}, capacity=Capacity(80 * MiB, "given"),
                                  fast=True).to_dict(include_perf=True))
    for knob in grid.knobs:
        alone = [signature(flatten(simulate_trace(trace, "pytorch", dict(c.params), capacity=Capacity(80 * MiB, "given"),
                                                  fast=True).to_dict(include_perf=True)))
                 for c in knob.choices[1:]]
        assert (knob in grid.no_effect) == all(s == signature(base) for s in alone), knob.name
    sizes = [len(k.choices) for k in grid.effective]
    assert grid.configurations == sizes[0] * sizes[1] * sizes[2] == 30
    assert len({o.changes for o in grid.outcomes}) == 30
    # Every recommended change makes a difference: undoing any one of them changes the run.
    by_changes = {o.changes: o for o in grid.outcomes}
    for rec in advice.recommendations:
        for i in range(len(rec.outcome.changes)):
            undone = rec.outcome.changes[:i] + rec.outcome.changes[i + 1:]
            assert signature(by_changes[undone].row) != signature(rec.outcome.row)


def _outcome(changes, peak, p99, order, extra=0):
    row = {"peak_reserved_bytes": peak, "alloc_latency_ns.p99": p99, "verdict.fits": True, "oom_count": 0,
           "completed": True, "error": None, "device_mallocs": extra, "params.x": str(changes)}
    return Outcome(changes=tuple(changes), params={}, row=row, order=order)


def test_ties_go_to_the_recorded_settings_then_fewest_changes():
    recorded = _outcome([], 100, 5, 0, extra=1)
    one = _outcome([("a", "1")], 100, 5, 1, extra=2)
    two = _outcome([("a", "1"), ("b", "2")], 100, 5, 2, extra=3)
    lower = _outcome([("b", "2")], 90, 9, 3, extra=4)
    faster = _outcome([("c", "3")], 100, 4, 4, extra=5)
    assert recommend([two, one, recorded, lower, faster], 200) == [lower, faster, recorded, one, two]


def test_settings_that_make_no_difference_are_not_recommended():
    base = _outcome([("a", "1")], 100, 5, 1)
    same = _outcome([("a", "1"), ("b", "2")], 100, 5, 0)   # b changes nothing: same figures as base
    assert recommend([same, base], 200) == [base]
    too_big = _outcome([("c", "3")], 300, 1, 2)
    assert recommend([too_big], 200) == []


def test_bisection_probes_spread_and_shrink():
    b = Bisection("x", fail_bytes=10 * MiB - 1, fit_bytes=30 * MiB, step_bytes=2 * MiB)
    assert b.probes(1) == [20 * MiB] and b.probes(3) == [14 * MiB, 20 * MiB, 24 * MiB]
    b.update({14 * MiB: False, 20 * MiB: True, 24 * MiB: True})
    assert (b.fail_bytes, b.fit_bytes) == (14 * MiB, 20 * MiB) and b.probes(1) == [18 * MiB]
    b.update({16 * MiB: True, 18 * MiB: True})
    assert b.done and b.fit_bytes == 16 * MiB and not b.contradictions
    c = Bisection("y", fail_bytes=0, fit_bytes=8 * MiB, step_bytes=2 * MiB)
    c.update({2 * MiB: True, 4 * MiB: False})
    assert c.fit_bytes == 2 * MiB and c.contradictions == [(2 * MiB, 4 * MiB)]


@pytest.mark.full
def test_cost_model_reaches_the_runs_the_step_and_the_command(tmp_path, fragmented, capsys):
    from allocsim.cost import CostModel

    model = tmp_path / "cal.json"
    CostModel.from_overrides({"_granularity_bytes": 1 << 20, "device_sync_ns": 50000}).save(model)
    code, out, _ = run_cli(capsys, "advise", fragmented, "--capacity", "80MiB", "--workers", "1", "--cost-model", model,
                           "-o", tmp_path / "r.parquet", "--json")
    data = json.loads(out)
    assert code == 0 and "steps of 1.00 MiB" in data["min_capacity_rule"]
    rows = pd.read_parquet(tmp_path / "r.parquet")
    timed = rows[~rows["fast"]]          # capacity probes replay without timing, so without a cost model
    assert len(timed) and (timed["cost_model.device_sync_ns"] == 50000).all()
    for rec in data["recommendations"]:
        assert f"--cost-model {model}" in rec["command"]
        run = replay(capsys, rec["command"])
        assert run["verdict"]["fits"] is True and run["peak_reserved_bytes"] == rec["peak_reserved_bytes"]


# ----------------------------------------------------------------------------- other presets
@pytest.mark.full
@pytest.mark.parametrize("policy,prefix,line", [("paddle", "FLAGS_", "export FLAGS_"),
                                                ("cupy", "CUPY_", "CUPY_GPU_MEMORY_LIMIT=")])
def test_other_presets_search_their_own_knobs(tmp_path, fragmented, capsys, policy, prefix, line):
    code, out, _ = run_cli(capsys, "advise", fragmented, "--policy", policy, "--capacity", "200MiB", "--fast",
                           "--workers", "1", "-o", tmp_path / "r.parquet", "--json")
    data = json.loads(out)
    assert code == 0 and data["policy"] == policy and data["grid"]["knobs"]
    assert all(name.startswith(prefix) for name in data["grid"]["knobs"])
    for rec in data["recommendations"]:
        assert rec["alloc_conf"] is None
        assert rec["line"].startswith(line) or rec["recorded_settings"]
        run = replay(capsys, rec["command"])
        assert run["verdict"]["fits"] is True and run["peak_reserved_bytes"] == rec["peak_reserved_bytes"]


def test_pytorch_lines_over_recorded_settings():
    # A run recorded with expandable segments and max_split_size 128 MiB, turned back to PyTorch's defaults.
    preset = preset_for("pytorch", {"expandable_segments": True, "max_split_size": 128 * MiB}, 1 << 30)
    knobs = {k.name: k for k in preset.knobs()}
    assert knobs["expandable_segments"].recorded.text == "True" and knobs["max_split_size_mb"].recorded.text == "128"
    params = {"expandable_segments": False, "max_split_size": None}
    assert preset.paste_line(params) == "unset PYTORCH_CUDA_ALLOC_CONF (PyTorch's defaults)"
    assert preset.run_args(params) == ["--policy", "pytorch", "--alloc-conf", "expandable_segments:False",
                                       "--set", "max_split_size=none"]
    assert preset.paste_line({}) == "PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128,expandable_segments:True"


@pytest.mark.full
def test_a_process_pool_gives_the_same_advice(tmp_path, fragmented, capsys):
    answers = []
    for workers in ("1", "2"):
        code, out, _ = run_cli(capsys, "advise", fragmented, "--capacity", "80MiB", "--fast", "--workers", workers,
                               "-o", tmp_path / f"r{workers}.parquet", "--json")
        data = json.loads(out)
        assert code == 0
        answers.append([(r["alloc_conf"], r["peak_reserved_bytes"], r["min_capacity_bytes"])
                        for r in data["recommendations"]])
    assert answers[0] == answers[1] and answers[0]


# ----------------------------------------------------------------------------- journal, errors
@pytest.mark.full
def test_a_killed_advise_resumes_from_its_journal(tmp_path, fragmented):
    out = tmp_path / "runs.parquet"
    argv = [sys.executable, "-m", "allocsim", "advise", str(fragmented), "--capacity", "80MiB", "--fast",
            "--workers", "1", "-o", str(out), "--json"]
    env = {**os.environ, "ALLOCSIM_SWEEP_KILL_AFTER_ROWS": "5"}
    killed = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    runs = json.loads(done.stdout)["runs"]
    assert runs["reused"] == 5 and runs["computed"] == runs["distinct"] - 5
    assert len(pd.read_parquet(out)) == runs["distinct"]
    again = json.loads(subprocess.run(argv, capture_output=True, text=True, timeout=120).stdout)
    assert again["runs"]["computed"] == 0 and again["recommendations"] == json.loads(done.stdout)["recommendations"]


@pytest.mark.parametrize("argv,message", [
    (["--capacity", "80MiB", "--policy", "bestfit"], "advise knows the knobs of pytorch, paddle, cupy"),
    (["--capacity", "80MiB", "--workers", "0"], "--workers must be >= 1"),
    (["--capacity", "80MiB", "--top", "0"], "--top must be >= 1"),
    (["--capacity", "16G"], "ambiguous"),
    ([], "implies no device capacity; give --capacity SIZE"),
])
def test_errors_are_one_line_exit_2(fragmented, capsys, argv, message):
    code, out, err = run_cli(capsys, "advise", fragmented, *argv)
    assert code == 2 and out == "" and message in err
    assert len(err.strip().splitlines()) == 1 and err.startswith("allocsim advise: error:")


@pytest.mark.full
def test_several_devices_or_no_history_exit_2(tmp_path, capsys):
    b = TraceBuilder("two.parquet", "test")
    for device in (0, 1):
        b.alloc(2 * device + 1, 1000 * (2 * device + 1), device, 0, 0x1000, MiB)
        b.free(2 * device + 2, 1000 * (2 * device + 2), device, 0, 0x1000)
    two = tmp_path / "two.parquet"
    write_trace(b.finish(), two)
    code, _, err = run_cli(capsys, "advise", two, "--capacity", "1GiB")
    assert code == 2 and "choose one with --device N" in err
    code, out, _ = run_cli(capsys, "advise", two, "--capacity", "1GiB", "--device", "1", "--fast", "--workers", "1",
                           "--json")
    assert code == 0 and json.loads(out)["device"] == 1
    snapshot = tmp_path / "state.pickle"
    seg = {"device": 0, "address": 1 << 40, "total_size": 2 * MiB, "stream": 0, "segment_type": "small",
           "blocks": [{"address": 1 << 40, "size": 2 * MiB, "requested_size": 0, "state": "inactive"}]}
    snapshot.write_bytes(pickle.dumps({"segments": [seg], "device_traces": [[]]}))
    code, _, err = run_cli(capsys, "advise", snapshot, "--capacity", "1GiB")
    assert code == 2 and "no history to replay" in err and len(err.strip().splitlines()) == 1


def test_missing_file_and_directory_exit_2(tmp_path, capsys):
    for target, message in ((tmp_path / "nope.pickle", "no such file"), (tmp_path, "is a directory")):
        code, _, err = run_cli(capsys, "advise", target, "--capacity", "1GiB")
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1


@pytest.mark.full
@pytest.mark.shared
def test_the_readme_advise_example_is_what_advise_prints(tmp_path, capsys):
    """The docs' advise output on Maphsge4 at 20 GiB, line for line (timing figures aside: run with --fast)."""
    path = SNAPSHOTS / "Maphsge4__snapshot.pickle"
    if not path.exists():
        pytest.skip("../shared/traces is not beside this checkout")
    marker = "allocsim advise $S --capacity 20GiB\n```\n\n```\n"
    block = doc_quoting(marker).split(marker, 1)[1].split("```", 1)[0]
    expected = [line for line in block.splitlines()
                if line.strip() and "p99" not in line and "timed replays" not in line and line.strip() != "2. ..."]
    code, out, _ = run_cli(capsys, "advise", path, "--capacity", "20GiB", "--fast", "--workers", "1",
                           "-o", tmp_path / "runs.parquet")
    assert code == 0
    printed = {line.rstrip().replace(str(path), "$S") for line in out.splitlines()}
    missing = [line for line in expected if line.rstrip() not in printed]
    assert not missing and len(expected) >= 12
    best = next(line for line in expected if line.strip().startswith("allocsim run $S"))
    run = replay(capsys, best.strip().replace("$S", str(path)))
    assert run["verdict"]["line"] == "FITS in 20.00 GiB: peak reserved 19.41 GiB, headroom 608.00 MiB"


@pytest.mark.shared
@pytest.mark.parametrize("name,device", [("Maphsge4__snapshot.pickle", 0), ("MercuryB1__cuda_memory_snapshot.pickle", 0),
                                         ("Constructor-Sun__memory_snapshot.pickle", 1)])
def test_live_at_peak_adds_up_to_the_lower_bound(name, device):
    from allocsim.metrics.sites.rows import live_at_peak
    from allocsim.metrics.summary import lower_bound_bytes

    path = SNAPSHOTS / name
    if not path.exists():
        pytest.skip("../shared/traces is not beside this checkout")
    trace = read_trace(path).for_device(device)
    peak = live_at_peak(trace)
    assert peak.live_bytes == int(peak.size_bytes.sum()) == lower_bound_bytes(trace)
    assert len(set(peak.alloc_ids.tolist())) == len(peak.alloc_ids)
    largest = peak.largest(3)
    assert [item["size_bytes"] for item in largest] == sorted(peak.size_bytes.tolist(), reverse=True)[:3]


@pytest.mark.full
def test_advice_on_a_replay_short_of_the_recording_is_not_proven(tmp_path, capsys, shared_dir):
    """The vLLM graph capture's one-pool replay reserves 984 MiB less than the real run: advice in 180 GiB,
    below the recorded 180.34 GiB, fits only as far as that replay goes, and says so."""
    path = shared_dir / "traces" / "kineto-gpu" / "AMD-AGI_TraceLens_vllm_piecewise_graph_capture.json.gz"
    argv = ["advise", path, "--device", "0", "--capacity", "180GiB", "--fast", "-o", tmp_path / "runs.parquet"]
    code, out, _ = run_cli(capsys, *argv, "--json")
    data = json.loads(out)
    under = data["recorded"]["replay_under_recorded_bytes"]
    run = replay(capsys, f"allocsim run {path} --policy pytorch --device 0 --capacity 180GiB")
    assert code == 0 and data["fits_any"] and under == run["recorded"]["peak_reserved_bytes"] - run["peak_reserved_bytes"] > 0
    code, out, _ = run_cli(capsys, *argv)
    assert code == 0 and out.strip().splitlines()[-1].startswith("FITS in 180.00 GiB: ")
    assert f"but not proven: the recorded settings' replay falls {format_bytes(under)} short" in out.strip().splitlines()[-1]


# ----------------------------------------------------------------------------- a start layout the device cannot hold
def test_advise_says_why_the_replay_is_not_the_recorded_run_when_the_start_layout_is_dropped(tmp_path, capsys):
    """Below what the recorded start layout reserves, it is placed anew: advise prints run's own line for it."""
    from .recorder import BASE, S1, Recorder

    rec = Recorder()
    rec.before(BASE, 64 * MiB, S1, blocks=[(BASE, 8 * MiB, 8 * MiB)])      # 64 MiB cached, 8 MiB of it live
    for i in range(3):
        rec.alloc(BASE + (8 + 4 * i) * MiB, 4 * MiB, S1)
    for i in range(3):
        rec.free(BASE + (8 + 4 * i) * MiB, S1)
    path = rec.dump(tmp_path / "cached.pickle")
    assert main(["run", str(path), "--policy", "pytorch", "--capacity", "32MiB", "--fast", "--sites", "0",
                 "--json"]) == 0
    ran = json.loads(capsys.readouterr().out)
    why = ran["reproduction"]["line"]
    assert ran["start_state"] == "allocated" and "the recorded start state was not loaded" in why
    assert main(["advise", str(path), "--capacity", "32MiB", "--fast"]) == 0
    lines = capsys.readouterr().out.splitlines()
    [at] = [i for i, line in enumerate(lines) if line.startswith("recorded settings (")]
    assert lines[at + 1] == f"   {why}"
    assert main(["advise", str(path), "--capacity", "32MiB", "--fast", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["recorded"]["start_state_dropped"] == why
    assert main(["advise", str(path), "--capacity", "80MiB", "--fast", "--json"]) == 0     # the layout fits: loaded
    assert json.loads(capsys.readouterr().out)["recorded"]["start_state_dropped"] is None
