"""``allocsim winners``: Pareto front, capacity fit, JSON shape, and commands that reproduce their row."""

from __future__ import annotations

import json
import shlex

import pandas as pd
import pytest

from allocsim.cli import main as cli_main
from allocsim.sweep import build_configs, run_sweep, write_results
from allocsim.sweep.pareto import pareto_front, select
from allocsim.units import GiB, MiB

from .test_sweep import write_tiny

OBJ = ["peak_reserved_bytes", "alloc_latency_ns.p99"]


def _row(name: str, peak_gib: float, p99_ns: int, **extra) -> dict:
    params = {"max_split_size": int(peak_gib * 1000)}   # any distinct params per row
    row = {"trace": "t.parquet", "trace_sha256": "ab" * 32, "policy": "pytorch",
           "params_json": json.dumps(params, sort_keys=True, separators=(",", ":")),
           "capacity_bytes": None, "device": None, "fast": False, "row_key": name, "error": None,
           "completed": True, "oom_count": 0, "peak_reserved_bytes": int(peak_gib * GiB),
           "alloc_latency_ns.p99": p99_ns}
    row.update(extra)
    return row


def hand_made() -> list[dict]:
    return [
        _row("A", 1, 5000), _row("B", 2, 2000), _row("C", 3, 1000),
        _row("D", 2, 3000),                    # dominated by B
        _row("E", 4, 4000),                    # dominated by B and C
        _row("F", 3, 1000, params_json='{"max_split_size":1}'),   # ties C: both on the front
        _row("G", 0.5, 100, error="ValueError: bad"),               # errors never win
        _row("H", 0.5, 100, completed=False, oom_count=1),          # OOM-stopped run: partial metrics
        _row("I", 1.5, 4000, oom_count=2, completed=True),          # completed with OOMs (continue-on-oom)
    ]


def cli(capsys, *argv) -> tuple[int, str, str]:
    code = cli_main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_pareto_front_excludes_dominated_rows():
    df = pd.DataFrame(hand_made())
    sel = select(df, OBJ, None)
    assert sel.pareto["row_key"].tolist() == ["A", "I", "B", "F", "C"]   # lexicographic; F < C by params_json
    assert sel.dropped == 2
    assert pareto_front(df[df["row_key"].isin(["D", "E"])], OBJ)["row_key"].tolist() == ["D"]
    # one objective: the minimum (and its ties) only
    assert pareto_front(df[df["error"].isna()], ["alloc_latency_ns.p99"])["row_key"].tolist() == ["H"]


def test_capacity_filter_and_lexicographic_winner():
    df = pd.DataFrame(hand_made())
    sel = select(df, OBJ, int(2.5 * GiB))
    assert sel.fits["row_key"].tolist() == ["A", "B", "D"]       # I ran out of memory; C, E, F too big
    assert sel.winner["row_key"] == "A"
    latency_first = select(df, ["alloc_latency_ns.p99", "peak_reserved_bytes"], int(2.5 * GiB))
    assert latency_first.winner["row_key"] == "B"
    assert select(df, OBJ, int(0.5 * GiB)).winner is None


def test_cli_json_shape_and_exit_codes(tmp_path, capsys):
    path = write_results(hand_made(), tmp_path / "r.parquet", complete=True, expected_rows=9)
    code, out, err = cli(capsys, "winners", path, "--capacity", "2.5GiB", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert set(data) == {"objectives", "capacity_bytes", "pareto", "fits", "winner"}
    assert data["objectives"] == OBJ and data["capacity_bytes"] == int(2.5 * GiB)
    assert len(data["pareto"]) == 5 and len(data["fits"]) == 3
    winner = data["winner"]
    assert winner["params"] == {"max_split_size": 1000} and winner["peak_reserved_bytes"] == GiB
    assert isinstance(winner["alloc_latency_ns.p99"], int)
    assert winner["command"].startswith("allocsim run t.parquet --policy pytorch --set max_split_size=1000")
    code, out, _ = cli(capsys, "winners", path, "--capacity", "2.5GiB", "--json", "--top", "1")
    assert len(json.loads(out)["fits"]) == 1
    code, out, _ = cli(capsys, "winners", path, "--capacity", "100MiB")
    assert code == 1 and "No configuration fits" in out
    code, out, _ = cli(capsys, "winners", path, "--minimise", "alloc_latency_ns.p99", "--then", "peak_reserved_bytes")
    assert code == 0 and "Pareto front (5)" in out and "GiB" in out and " ms" in out
    code, _, err = cli(capsys, "winners", path, "--minimise", "no_such_metric")
    assert code == 2 and "no metric 'no_such_metric'" in err


def test_several_traces_need_trace_option(tmp_path, capsys):
    rows = hand_made() + [_row("Z", 0.1, 10, trace="u.parquet", trace_sha256="cd" * 32)]
    path = write_results(rows, tmp_path / "r.parquet", complete=False, expected_rows=12)
    code, _, err = cli(capsys, "winners", path)
    assert code == 2 and "--trace" in err
    code, out, err = cli(capsys, "winners", path, "--trace", "u.parquet", "--json")
    assert code == 0 and json.loads(out)["winner"]["trace"] == "u.parquet"
    assert "incomplete sweep" in err


@pytest.mark.full
def test_commands_reproduce_their_rows(tmp_path, capsys):
    trace = write_tiny(tmp_path / "tiny.parquet", n=60, streams=2)
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps({
        "pytorch": {"max_split_size": ["none", "32MiB"], "garbage_collection_threshold": [0, 0.5],
                    "memory_fraction": [0.9]},
        "deferred-gc": {"threshold": ["0", "8MiB"], "chunk_size": ["0", "2MiB"]}}))
    out = tmp_path / "r.parquet"
    report = run_sweep([str(trace)], build_configs([], [], [], grid), output=out, capacity_bytes=GiB)
    assert report.complete and report.errors == 0
    code, stdout, err = cli(capsys, "winners", out, "--json")
    assert code == 0, err
    data = json.loads(stdout)
    rows = {json.dumps([r["policy"], r["params"]]): r for r in data["fits"]}
    assert len(rows) == 8
    for row in rows.values():
        argv = shlex.split(row["command"])
        assert argv[:2] == ["allocsim", "run"] and "--capacity" in argv
        code, stdout, err = cli(capsys, *argv[1:], "--json")
        assert code == 0, err
        summary = json.loads(stdout)
        assert summary["peak_reserved_bytes"] == row["peak_reserved_bytes"]
        assert summary["alloc_latency_ns"]["p99"] == row["alloc_latency_ns.p99"]


def test_fast_sweep_minimises_memory_only(tmp_path, capsys):
    trace = write_tiny(tmp_path / "tiny.parquet")
    out = tmp_path / "r.parquet"
    run_sweep([str(trace)], build_configs(["bestfit"], ["chunk=2MiB,64MiB"], ["growth=chunk"]), output=out, fast=True)
    code, stdout, err = cli(capsys, "winners", out, "--json")
    assert code == 0 and "alloc_latency_ns.p99" in err
    data = json.loads(stdout)
    assert data["objectives"] == ["peak_reserved_bytes"] and data["capacity_bytes"] is None
    assert data["winner"]["params"] == {"chunk": 2 * MiB, "growth": "chunk"}
    assert data["winner"]["command"].endswith("--set chunk=2MiB --set growth=chunk --fast")
