"""A size that starts with a dash (``--capacity -5GiB``) gets one line from its option, not argparse's usage."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from allocsim.cli import attach_dash_values

SNAPSHOT = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "pytorch-snapshots" / \
    "silmont2000__mem_snapshot.pickle"


def test_dash_values_are_attached_to_their_option_only():
    assert attach_dash_values(["run", "T", "--capacity", "-5GiB", "--device", "-1"]) == \
        ["run", "T", "--capacity=-5GiB", "--device=-1"]
    # options, "--", an attached value and a value after a short option stay as they are
    assert attach_dash_values(["run", "--", "-5x"]) == ["run", "--", "-5x"]
    assert attach_dash_values(["--capacity=1GiB", "-5"]) == ["--capacity=1GiB", "-5"]
    assert attach_dash_values(["--fast", "--json"]) == ["--fast", "--json"]


@pytest.mark.shared
@pytest.mark.parametrize("command", ["run", "advise", "sweep"])
def test_negative_capacity_is_one_line_exit_2(tmp_path, command):
    if not SNAPSHOT.exists():
        pytest.skip("../shared/traces is not beside this checkout")
    argv = [sys.executable, "-m", "allocsim", command, str(SNAPSHOT), "--policy", "pytorch", "--capacity", "-5GiB"]
    if command == "sweep":
        argv += ["-o", str(tmp_path / "r.parquet")]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [f"allocsim {command}: error: not a size: '-5GiB' "
                                                "(examples: 4096, 512MiB, 80GiB)"]
