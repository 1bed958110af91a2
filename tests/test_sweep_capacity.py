"""``allocsim sweep`` without ``--capacity``: each trace at the capacity its recording implies, said so."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from allocsim.cli import main
from allocsim.trace import write_trace
from allocsim.trace.reading.builder import TraceBuilder
from allocsim.units import MiB

MAPHSGE4 = (Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "pytorch-snapshots"
            / "Maphsge4__snapshot.pickle")


def cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.shared
def test_sweep_defaults_to_the_inferred_capacity(tmp_path, capsys):
    if not MAPHSGE4.exists():
        pytest.skip("../shared/traces is not beside this checkout")
    out = tmp_path / "r.parquet"
    code, stdout, _ = cli(capsys, "sweep", MAPHSGE4, "--policy", "pytorch", "--fast", "-o", out, "--workers", "1",
                          "--json")
    assert code == 0
    report = json.loads(stdout)
    assert report["capacities"][0]["source"] == "inferred"
    assert report["capacities"][0]["capacity_bytes"] == 22_519_218_176     # the real peak reserved (README)
    row = pd.read_parquet(out).iloc[0]
    assert row["capacity_bytes"] == 22_519_218_176 and row["verdict.capacity_source"] == "inferred"
    assert bool(row["reproduction.reproduces"])          # the recorded run, replayed
    # Given explicitly, the same number is a different row: its verdict names another source.
    code, stdout, _ = cli(capsys, "sweep", MAPHSGE4, "--policy", "pytorch", "--fast", "-o", out, "--workers", "1",
                          "--capacity", "22519218176", "--json")
    assert code == 0 and json.loads(stdout)["computed"] == 1
    code, text, _ = cli(capsys, "sweep", MAPHSGE4, "--policy", "pytorch", "--fast", "-o", out, "--workers", "1")
    assert code == 0 and "inferred from the recording" in text and "--capacity SIZE overrides it" in text


def test_sweep_without_a_recorded_capacity_is_unlimited_and_says_so(tmp_path, capsys):
    b = TraceBuilder("t.parquet", "test")
    b.alloc(1, 1000, 0, 0, 0x1000, 4 * MiB)
    b.free(2, 2000, 0, 0, 0x1000)
    path = tmp_path / "t.parquet"
    write_trace(b.finish(), path)
    out = tmp_path / "r.parquet"
    code, text, _ = cli(capsys, "sweep", path, "--policy", "pytorch", "--fast", "-o", out, "--workers", "1")
    assert code == 0 and "capacity unlimited for" in text
    assert pd.isna(pd.read_parquet(out).iloc[0]["capacity_bytes"])
