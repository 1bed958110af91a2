"""What ``sweep`` and ``advise`` say after the runs, on real snapshots: errors with their rows, grid scope, next step."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pandas as pd
import pytest

from allocsim.sweep import worker

SNAPSHOTS = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "pytorch-snapshots"
SMALL = "silmont2000__mem_snapshot.pickle"
OTHER = "silmont2000__memory_forward_fp32_128.pickle"


def snapshot(name: str) -> Path:
    path = SNAPSHOTS / name
    if not path.exists():
        pytest.skip("../shared/traces is not beside this checkout")
    return path


def fail_when(monkeypatch, predicate, message: str) -> None:
    """Make every run whose task matches ``predicate`` raise ``KeyError(message)``, as a core bug would."""
    real = worker.simulate_summary

    def simulate(task, trace):
        if predicate(task):
            raise KeyError(message)
        return real(task, trace)

    monkeypatch.setattr(worker, "simulate_summary", simulate)


@pytest.mark.shared
def test_sweep_prints_each_distinct_error_with_its_rows_and_exits_1(tmp_path, cli, monkeypatch):
    path = snapshot(SMALL)
    fail_when(monkeypatch, lambda task: task.params.get("max_split_size") == 64 << 20, "60453126144")
    out = tmp_path / "r.parquet"
    code, text, _ = cli("sweep", path, "--policy", "pytorch", "--grid", "max_split_size=none,64MiB,128MiB",
                        "--grid", "roundup_power2_divisions=none,2", "--fast", "--workers", "1", "-o", out)
    assert code == 1
    assert "2 rows ended in an error (1 distinct" in text
    assert "  error: KeyError: '60453126144'" in text
    rows = [line for line in text.splitlines() if line.startswith("    in trace ")]
    assert len(rows) == 2 and all("max_split_size=64MiB" in line and "policy pytorch" in line for line in rows)
    assert {"roundup_power2_divisions=none", "roundup_power2_divisions=2"} == {
        part for line in rows for part in line.replace(",", " ").split() if part.startswith("roundup")}
    df = pd.read_parquet(out)
    assert df["error"].notna().sum() == 2 and len(df) == 6
    code, text, _ = cli("sweep", path, "--policy", "pytorch", "--grid", "max_split_size=none,64MiB,128MiB",
                        "--grid", "roundup_power2_divisions=none,2", "--fast", "--workers", "1", "-o", out, "--json")
    report = json.loads(text)
    assert code == 1 and report["errors"] == 2
    assert report["error_groups"] == [{"error": "KeyError: '60453126144'", "rows": 2,
                                       "examples": [line.strip()[len("in "):] for line in rows]}]


@pytest.mark.shared
def test_sweep_without_errors_exits_0(tmp_path, cli):
    code, text, _ = cli("sweep", snapshot(SMALL), "--policy", "pytorch", "--grid", "max_split_size=none,64MiB",
                        "--fast", "--workers", "1", "-o", tmp_path / "r.parquet")
    assert code == 0 and "ended in an error" not in text and "0 with errors" in text


@pytest.mark.full
@pytest.mark.shared
def test_advise_prints_failed_runs_and_exits_1(tmp_path, cli, monkeypatch):
    """8 GiB holds this run with any setting, so only the failed runs make the exit status 1."""
    fail_when(monkeypatch, lambda task: task.params.get("roundup_power2_divisions") == "16", "boom")
    argv = ["advise", snapshot(SMALL), "--capacity", "8GiB", "--fast", "--workers", "1", "-o", tmp_path / "runs.parquet"]
    code, text, _ = cli(*argv)
    assert code == 1 and "FITS in 8.00 GiB" in text
    head = next(line for line in text.splitlines() if "runs ended in an error" in line)
    failed = int(head.split()[0])
    assert failed > 0 and "(1 distinct" in head and "  error: KeyError: 'boom'" in text
    assert "roundup_power2_divisions=16" in text.split(head, 1)[1].splitlines()[2]
    code, text, _ = cli(*argv, "--json")    # the same runs, from the journal
    data = json.loads(text)
    assert code == 1 and data["fits_any"]
    assert [(g["error"], g["rows"]) for g in data["errors"]] == [("KeyError: 'boom'", failed)]


@pytest.mark.shared
def test_grid_key_applies_to_each_policy_that_has_it(tmp_path, cli):
    """README: --set and --grid apply to every listed policy that has the key; the others run without it."""
    out = tmp_path / "r.parquet"
    code, _, _ = cli("sweep", snapshot(SMALL), "--policy", "pytorch", "--policy", "direct",
                     "--grid", "max_split_size=none,64MiB", "--fast", "--workers", "1", "-o", out)
    df = pd.read_parquet(out)
    assert code == 0 and sorted(df["policy"]) == ["direct", "pytorch", "pytorch"]
    assert df.loc[df["policy"] == "direct", "param.max_split_size"].isna().all()
    assert sorted(df.loc[df["policy"] == "pytorch", "param.max_split_size"]) == ["64MiB", "none"]
    assert df["error"].isna().all()


@pytest.mark.shared
def test_next_commands_after_a_multi_trace_sweep_work(tmp_path, cli):
    out = tmp_path / "r.parquet"
    traces = [snapshot(SMALL), snapshot(OTHER)]
    code, text, _ = cli("sweep", *traces, "--policy", "pytorch", "--grid", "max_split_size=none,64MiB",
                        "--fast", "--workers", "1", "-o", out)
    nexts = [line[len("next: "):] for line in text.splitlines() if line.startswith("next: ")]
    assert code == 0 and len(nexts) == 2
    for command, trace in zip(nexts, traces):
        argv = shlex.split(command)
        assert argv[:2] == ["allocsim", "winners"] and argv[-2:] == ["--trace", str(trace)]
        code, text, err = cli(*argv[1:])
        assert code == 0, err
        assert "Winner:" in text and str(trace) in text
