"""``allocsim sweep``: grids, tidy rows with every run metric, executors agree, journal and resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from allocsim.cli import main as cli_main
from allocsim.sweep import (PERF_COLUMNS, DaskExecutor, InProcessExecutor, ProcessPoolExecutor, SweepStopped,
                            build_configs, flatten, journal_dir, read_metadata, run_sweep)
from allocsim.sweep import worker
from allocsim.sweep.grid import load_grid_file, parse_grid_item, split_values
from allocsim.trace import write_trace
from allocsim.trace.reading.builder import TraceBuilder
from allocsim.units import MiB

REPO = Path(__file__).resolve().parents[1]
BERT = REPO / "traces" / "bert_fp32.json.gz"


def write_tiny(path: Path, n: int = 40, streams: int = 1) -> Path:
    """A small two-phase trace: growing allocations, half freed, more allocations, all freed."""
    b = TraceBuilder(str(path), "test")
    t, live = 0, []
    for i in range(n):
        t += 1000
        addr = 0x10000 * (i + 1)
        b.alloc(t, t, 0, i % streams, addr, ((i * 7) % 13 + 1) * MiB + 512 * i)
        live.append((addr, i % streams))
        if i % 3 == 2:
            t += 500
            a, s = live.pop(0)
            b.free(t, t, 0, s, a)
    for a, s in live:
        t += 200
        b.free(t, t, 0, s, a)
    write_trace(b.finish(), path)
    return path


@pytest.fixture
def tiny(tmp_path) -> Path:
    return write_tiny(tmp_path / "tiny.parquet")


def det(df: pd.DataFrame) -> pd.DataFrame:
    """The deterministic part of a results frame."""
    return df.drop(columns=[c for c in PERF_COLUMNS if c in df.columns]).reset_index(drop=True)


def cli(capsys, *argv) -> tuple[int, str, str]:
    code = cli_main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


# ----------------------------------------------------------------------------- grids
def test_split_values_keeps_bracketed_commas():
    assert split_values("none, 256MiB") == ["none", "256MiB"]
    assert split_values("[256:1,512:2,>:8],4") == ["[256:1,512:2,>:8]", "4"]
    assert parse_grid_item("roundup_power2_divisions=[256:1,>:8],none") == (
        "roundup_power2_divisions", ["[256:1,>:8]", "none"])


@pytest.mark.parametrize("item", ["max_split_size", "=1,2", "max_split_size=", "max_split_size=1,,2"])
def test_malformed_grid_items_are_refused(item):
    with pytest.raises(ValueError, match="--grid"):
        parse_grid_item(item)


def test_cartesian_product_size_and_order():
    configs = build_configs(["pytorch"], ["max_split_size=none,64MiB,256MiB", "garbage_collection_threshold=0,0.6",
                                          "expandable_segments=false,true"], ["memory_fraction=1"])
    assert len(configs) == 12
    assert [c.order for c in configs] == list(range(12))
    first = configs[0]
    assert first.params == {"memory_fraction": 1.0, "max_split_size": None, "garbage_collection_threshold": 0.0,
                            "expandable_segments": False}
    assert configs[-1].texts == {"memory_fraction": "1.0", "max_split_size": "256MiB",
                                 "garbage_collection_threshold": "0.6", "expandable_segments": "true"}
    assert len({c.params_json for c in configs}) == 12


def test_equal_values_are_one_config_and_aliases_are_canonical():
    configs = build_configs(["pytorch"], ["max_split_size_bytes=256MiB,268435456,none,-1"])
    assert [c.params for c in configs] == [{"max_split_size": 268435456}, {"max_split_size": None}]


@pytest.mark.full
def test_unknown_key_is_an_error_naming_policy_and_valid_keys():
    with pytest.raises(ValueError, match=r"policy 'direct' has no parameter 'max_split_size'.*--grid-file"):
        build_configs(["direct"], ["max_split_size=none,256MiB"])
    with pytest.raises(ValueError, match=r"no listed policy has parameter 'threshold'.*direct: none"):
        build_configs(["pytorch", "direct"], ["threshold=0"])
    with pytest.raises(ValueError, match="unknown policy"):
        build_configs(["nosuch"], [])
    with pytest.raises(ValueError, match="nothing to sweep"):
        build_configs([], [])


def test_grid_file_scopes_keys_per_policy(tmp_path):
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps({
        "pytorch": {"max_split_size": ["none", "256MiB"], "garbage_collection_threshold": [0, 0.6]},
        "deferred-gc": {"threshold": ["0", "64MiB", "1GiB"]}}))
    configs = build_configs([], [], [], grid)
    assert [c.policy for c in configs].count("pytorch") == 4
    assert [c.params["threshold"] for c in configs if c.policy == "deferred-gc"] == [0, 64 * MiB, 1024 * MiB]
    # --policy restricts the file's policies; a file key repeated on the command line is refused
    assert {c.policy for c in build_configs(["deferred-gc"], [], [], grid)} == {"deferred-gc"}
    with pytest.raises(ValueError, match="also given on the command line"):
        build_configs(["deferred-gc"], ["threshold=0"], [], grid)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"pytorch": {"threshold": [0]}}))
    with pytest.raises(ValueError, match="bad.json.*'pytorch' has no parameter 'threshold'"):
        build_configs([], [], [], bad)
    bad.write_text("[1, 2]")
    with pytest.raises(ValueError, match="expected a JSON object"):
        load_grid_file(bad)


def test_deferred_gc_accepts_its_inner_policys_keys():
    assert len(build_configs(["deferred-gc"], ["threshold=0,1MiB", "chunk_size=0,2MiB"])) == 4
    with pytest.raises(ValueError, match="no parameter 'max_split_size'"):
        build_configs(["deferred-gc"], ["max_split_size=none"])
    configs = build_configs(["deferred-gc"], ["max_split_size=none,64MiB"], ["inner=pytorch"])
    assert configs[1].params == {"inner": "pytorch", "max_split_size": 64 * MiB}


# ----------------------------------------------------------------------------- rows
def test_rows_hold_every_run_json_metric(tmp_path, tiny, capsys):
    out = tmp_path / "r.parquet"
    code, stdout, err = cli(capsys, "sweep", tiny, "--policy", "pytorch", "--grid", "max_split_size=none,32MiB",
                            "--set", "memory_fraction=1", "--capacity", "1GiB", "-o", out, "--workers", "1",
                            "--json")
    assert code == 0, err
    report = json.loads(stdout)
    assert report["rows"] == 2 and report["computed"] == 2 and report["complete"] and "sweep" not in err
    df = pd.read_parquet(out)
    assert list(df.columns[:4]) == ["trace", "trace_sha256", "policy", "params_json"]
    for col in ("param.max_split_size", "param.memory_fraction", "error", "wall_seconds", "row_key"):
        assert col in df.columns
    assert df["param.max_split_size"].tolist() == ["none", "32MiB"]
    assert df["error"].isna().all()
    # each row equals `allocsim run --json` for the same config, metric for metric (code sites are a
    # report of one run, not a metric: --sites 0 leaves them out)
    code, stdout, _ = cli(capsys, "run", tiny, "--policy", "pytorch", "--set", "max_split_size=32MiB",
                          "--set", "memory_fraction=1", "--capacity", "1GiB", "--json", "--sites", "0")
    expected = {k: v for k, v in flatten(json.loads(stdout)).items() if k not in PERF_COLUMNS}
    row = df.iloc[1].to_dict()
    missing = [k for k in expected if k not in row]
    assert not missing
    for key, value in expected.items():
        if key == "device":   # a key column: the sweep's --device option (the row's identity), not run's answer
            assert row["replayed_device"] == value      # run's answer has its own column
            continue
        assert row[key] == value or (value is None and pd.isna(row[key])), key
    assert "alloc_latency_ns.p99" in df.columns and "sim_seconds" in df.columns


@pytest.mark.parametrize("grid, message", [
    ("garbage_collection_threshold=0,banana", "parameter garbage_collection_threshold='banana'"),
    ("garbage_collection_threshold=0,1.5", "garbage_collection_threshold must be in [0, 1)"),
    ("max_split_size=none,10MiB", "max_split_size must be at least 20971520 bytes"),
    ("max_split_size=none,12parsecs", "parameter max_split_size='12parsecs'"),
])
def test_a_grid_value_that_cannot_work_is_refused_before_the_sweep(tmp_path, tiny, capsys, grid, message):
    with pytest.raises(ValueError, match="policy pytorch"):
        build_configs(["pytorch"], [grid])
    out = tmp_path / "r.parquet"
    code, _, err = cli(capsys, "sweep", tiny, "--policy", "pytorch", "--grid", grid, "--fast", "-o", out)
    assert code == 2 and message in err and err.count("\n") == 1
    assert not out.exists() and not journal_dir(out).exists()


def failing_for(monkeypatch, bad_params_json: str) -> None:
    """Make the worker fail (like a config that breaks while running) for one params point."""
    real = worker.simulate_summary

    def simulate(task, trace):
        if task.params_json == bad_params_json:
            raise RuntimeError("broke while running")
        return real(task, trace)

    monkeypatch.setattr(worker, "simulate_summary", simulate)


def test_failing_config_is_a_row_not_a_crash(tmp_path, tiny, monkeypatch):
    configs = build_configs(["pytorch"], ["garbage_collection_threshold=0,0.5"])
    failing_for(monkeypatch, configs[1].params_json)
    report = run_sweep([str(tiny)], configs, output=tmp_path / "r.parquet", fast=True)
    df = pd.read_parquet(tmp_path / "r.parquet")
    assert report.rows == 2 and report.errors == 1 and report.complete
    assert df["error"].isna().tolist() == [True, False]
    assert df["error"][1] == "RuntimeError: broke while running"
    assert df["peak_reserved_bytes"].isna().tolist() == [False, True]


def test_bad_grid_exits_2_before_anything_runs(tmp_path, tiny, capsys):
    out = tmp_path / "r.parquet"
    code, _, err = cli(capsys, "sweep", tiny, "--policy", "direct", "--grid", "max_split_size=none", "-o", out)
    assert code == 2 and "has no parameter 'max_split_size'" in err and err.count("\n") == 1
    assert not out.exists() and not journal_dir(out).exists()
    code, _, err = cli(capsys, "sweep", tmp_path / "missing.parquet", "--policy", "direct", "-o", out)
    assert code == 2 and "trace not found" in err


def test_traces_load_once_per_worker(tmp_path, tiny):
    worker.clear_cache()
    worker.LOADS.clear()
    configs = build_configs(["bestfit"], ["alignment=512,1024,2048", "chunk=2MiB,4MiB"])
    run_sweep([str(tiny)], configs, output=tmp_path / "r.parquet", fast=True)
    assert worker.LOADS == [os.path.abspath(tiny)]


# ----------------------------------------------------------------------------- executors
def _mixed_configs(tmp_path):
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps({"pytorch": {"max_split_size": ["none", "32MiB"], "memory_fraction": [1],
                                            "garbage_collection_threshold": [0, 0.5]},
                                "deferred-gc": {"threshold": ["0", "8MiB"]}}))
    return build_configs([], [], [], grid)


@pytest.mark.full
def test_process_pool_and_dask_give_rows_equal_to_in_process(tmp_path):
    from dask.distributed import LocalCluster

    traces = [str(write_tiny(tmp_path / "a.parquet")), str(write_tiny(tmp_path / "b.parquet", n=60, streams=2))]
    configs = _mixed_configs(tmp_path)
    opts = dict(capacity_bytes=512 * MiB)
    run_sweep(traces, configs, output=tmp_path / "one.parquet", executor=InProcessExecutor(), **opts)
    run_sweep(traces, configs, output=tmp_path / "pool.parquet", executor=ProcessPoolExecutor(2), **opts)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        report = run_sweep(traces, configs, output=tmp_path / "dask.parquet",
                           executor=DaskExecutor(address=cluster.scheduler_address), **opts)
    assert report.computed == 2 * len(configs) == 12
    one = pd.read_parquet(tmp_path / "one.parquet")
    assert len(one) == 12 and one["error"].isna().all() and one["alloc_latency_ns.p99"].notna().all()
    assert one["trace"].tolist() == [traces[0]] * 6 + [traces[1]] * 6
    for other in ("pool", "dask"):
        df = pd.read_parquet(tmp_path / f"{other}.parquet")
        assert list(df.columns) == list(one.columns)
        pd.testing.assert_frame_equal(det(df), det(one))


# ----------------------------------------------------------------------------- journal and resume
def test_interrupted_sweep_resumes_without_recomputing(tmp_path, tiny):
    configs = build_configs(["pytorch"], ["max_split_size=none,32MiB,64MiB,128MiB", "expandable_segments=false,true"])
    out = tmp_path / "r.parquet"
    with pytest.raises(SweepStopped):
        run_sweep([str(tiny)], configs, output=out, fast=True, stop_after_rows=3)
    parts = sorted(journal_dir(out).glob("row-*.json"))
    assert len(parts) == 3
    first = {json.loads(p.read_text())["row_key"]: json.loads(p.read_text()) for p in parts}
    meta = read_metadata(out)
    assert meta["complete"] is False and meta["rows"] == 3 and meta["expected_rows"] == 8
    report = run_sweep([str(tiny)], configs, output=out, fast=True, executor=ProcessPoolExecutor(2))
    assert (report.skipped, report.computed, report.rows, report.complete) == (3, 5, 8, True)
    df = pd.read_parquet(out)
    assert len(df) == 8 and read_metadata(out)["complete"] is True
    for key, row in first.items():   # wall-clock figures unchanged: these rows were not re-run
        again = df[df["row_key"] == key].iloc[0]
        assert again["wall_seconds"] == row["wall_seconds"] and again["sim_seconds"] == row["sim_seconds"]
    assert [p.name for p in journal_dir(out).iterdir()][0].startswith("batch-")   # compacted
    report = run_sweep([str(tiny)], configs, output=out, fast=True)
    assert (report.skipped, report.computed) == (8, 0)
    pd.testing.assert_frame_equal(pd.read_parquet(out), df)


@pytest.mark.full
def test_sigkilled_sweep_resumes(tmp_path, tiny):
    out = tmp_path / "r.parquet"
    argv = [sys.executable, "-m", "allocsim", "sweep", str(tiny), "--policy", "pytorch", "--grid",
            "max_split_size=none,32MiB,64MiB,128MiB,256MiB", "--fast", "-o", str(out), "--workers", "1", "--json"]
    env = {**os.environ, "ALLOCSIM_SWEEP_KILL_AFTER_ROWS": "2"}
    killed = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL
    assert len(list(journal_dir(out).glob("row-*.json"))) == 2 and not out.exists()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["skipped"], report["computed"], report["rows"]) == (2, 3, 5)
    assert len(pd.read_parquet(out)) == 5


def test_errors_are_journaled_and_retried_on_request(tmp_path, tiny, monkeypatch):
    configs = build_configs(["pytorch"], ["garbage_collection_threshold=0,0.5"])
    failing_for(monkeypatch, configs[1].params_json)
    out = tmp_path / "r.parquet"
    run_sweep([str(tiny)], configs, output=out, fast=True)
    assert run_sweep([str(tiny)], configs, output=out, fast=True).computed == 0
    report = run_sweep([str(tiny)], configs, output=out, fast=True, retry_errors=True)
    assert (report.skipped, report.computed, report.errors) == (1, 1, 1)
    monkeypatch.undo()
    report = run_sweep([str(tiny)], configs, output=out, fast=True, retry_errors=True)
    assert (report.skipped, report.computed, report.errors) == (1, 1, 0)


def test_rows_key_on_content_options_and_params(tmp_path, tiny):
    configs = build_configs(["pytorch"], ["max_split_size=none,32MiB"])
    out = tmp_path / "r.parquet"
    run_sweep([str(tiny)], configs, output=out, fast=True)
    copy = tmp_path / "copy.parquet"
    copy.write_bytes(tiny.read_bytes())
    report = run_sweep([str(copy)], configs, output=out, fast=True)   # same content, other path
    assert report.computed == 0 and pd.read_parquet(out)["trace"].tolist() == [str(copy)] * 2
    assert run_sweep([str(tiny)], configs, output=out, fast=True, capacity_bytes=1 << 30).computed == 2
    assert run_sweep([str(tiny)], configs, output=out, fast=False).computed == 2
    widened = build_configs(["pytorch"], ["max_split_size=none,32MiB,64MiB"])
    assert run_sweep([str(tiny)], widened, output=out, fast=True).computed == 1


def test_unreadable_or_changed_trace_is_not_journaled(tmp_path, tiny, monkeypatch):
    import allocsim.sweep.driver as driver

    configs = build_configs(["pytorch"], ["max_split_size=none,32MiB"])
    monkeypatch.setattr(driver, "file_sha256", lambda path: "0" * 64)   # as if the file changed after hashing
    out = tmp_path / "r.parquet"
    report = run_sweep([str(tiny)], configs, output=out, fast=True)
    assert (report.rows, report.computed, len(report.failed), report.complete) == (0, 0, 2, False)
    assert "changed since the sweep started" in report.failed[0]
    assert not list(journal_dir(out).glob("row-*"))
    monkeypatch.undo()
    assert run_sweep([str(tiny)], configs, output=out, fast=True).computed == 2


@pytest.mark.full
def test_policy_specs_sweep_settings_side_by_side(tmp_path, tiny, capsys):
    out = tmp_path / "r.parquet"
    code, _, err = cli(capsys, "sweep", tiny, "--policy", "pytorch", "--policy", "pytorch:expandable_segments:True",
                       "--grid", "max_split_size=none,32MiB", "--fast", "-o", out)
    assert code == 0, err
    df = pd.read_parquet(out)
    assert df["policy"].tolist() == ["pytorch"] * 4
    assert [json.loads(p).get("expandable_segments") for p in df["params_json"]] == [None, None, True, True]
    assert df["device_maps"].tolist()[:2] == [0, 0] and (df["device_maps"][2:] > 0).all()
    code, stdout, _ = cli(capsys, "run", tiny, "--policy", "pytorch:expandable_segments:True,max_split_size_mb:32",
                          "--fast", "--json")
    assert json.loads(stdout)["peak_reserved_bytes"] == df["peak_reserved_bytes"][3]
    code, _, err = cli(capsys, "sweep", tiny, "--policy", "pytorch:expandable_segments:True",
                       "--grid", "expandable_segments=true,false", "-o", tmp_path / "x.parquet")
    assert code == 2 and "expandable_segments is also on the grid" in err


def test_cost_model_file_reaches_every_row(tmp_path, tiny, capsys):
    from allocsim.cost import CostModel

    model = tmp_path / "cal.json"
    CostModel.from_overrides({"malloc_base_ns": 123_000, "malloc_per_mib_ns": 0, "_granularity_bytes": 1 << 20}).save(model)
    out = tmp_path / "r.parquet"
    code, _, err = cli(capsys, "sweep", tiny, "--policy", "direct", "--cost-model", model, "-o", out)
    assert code == 0, err
    row = pd.read_parquet(out).iloc[0]
    code, stdout, _ = cli(capsys, "run", tiny, "--policy", "direct", "--cost-model", model, "--json")
    ran = json.loads(stdout)
    assert row["alloc_latency_ns.p50"] == ran["alloc_latency_ns"]["p50"] == 123_000
    assert row["peak_reserved_bytes"] == ran["peak_reserved_bytes"]
    # The default model pages in 2 MiB units and costs 10 us per call: a different row, not a resumed one.
    report = run_sweep([str(tiny)], build_configs(["direct"]), output=out)
    assert report.computed == 1
    default = pd.read_parquet(out).iloc[0]
    assert default["alloc_latency_ns.p50"] != 123_000 and default["peak_reserved_bytes"] >= row["peak_reserved_bytes"]


def test_multi_stream_rows_give_the_trace_order_memory_answer(tmp_path, capsys):
    path = write_tiny(tmp_path / "streams.parquet", n=60, streams=4)
    out = tmp_path / "r.parquet"
    code, _, err = cli(capsys, "sweep", path, "--policy", "pytorch", "--capacity", "1GiB", "-o", out)
    assert code == 0, err
    row = pd.read_parquet(out).iloc[0]
    code, stdout, _ = cli(capsys, "run", path, "--policy", "pytorch", "--capacity", "1GiB", "--fast", "--json")
    fast = json.loads(stdout)
    for key in ("peak_requested_bytes", "peak_reserved_bytes", "device_mallocs", "oom_count"):
        assert row[key] == fast[key], key
    assert row["timed_memory.streams"] == 4 and "alloc_latency_ns.p99" in row.index


def test_rows_journaled_by_other_code_are_recomputed(tmp_path, tiny, monkeypatch):
    import allocsim.sweep.tasks as tasks
    configs = build_configs(["pytorch"], ["max_split_size=none,64MiB"])
    out = tmp_path / "r.parquet"
    assert run_sweep([str(tiny)], configs, output=out, fast=True).computed == 2
    assert run_sweep([str(tiny)], configs, output=out, fast=True).skipped == 2
    monkeypatch.setattr(tasks, "code_identity", lambda: "0.1.0+edited")   # the same version, other code
    report = run_sweep([str(tiny)], configs, output=out, fast=True)
    assert (report.skipped, report.computed) == (0, 2)


def test_code_identity_follows_the_code_not_the_caches(tmp_path):
    from allocsim.code_identity import code_identity, package_digest
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "a.py").write_text("x = 1\n")
    (pkg / "sub" / "b.py").write_text("y = 2\n")
    first = package_digest(pkg)
    (pkg / "__pycache__").mkdir()
    (pkg / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\0" * 16)
    (pkg / "notes.txt").write_text("not code")
    assert package_digest(pkg) == first
    (pkg / "a.py").write_text("x = 2\n")
    assert package_digest(pkg) != first
    (pkg / "a.py").write_text("x = 1\n")
    assert package_digest(pkg) == first
    (pkg / "sub" / "b.py").rename(pkg / "b.py")   # moved between rooms
    assert package_digest(pkg) != first
    assert code_identity().startswith(__import__("allocsim").__version__ + "+")
