"""A size that starts with a dash (``--capacity -5GiB``) gets one line from its option, not argparse's usage."""

from __future__ import annotations

from pathlib import Path

import pytest

from allocsim.cli import attach_dash_values
from allocsim.cli import main as cli_main

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
def test_negative_capacity_is_one_line_exit_2(tmp_path, capsys, command):
    if not SNAPSHOT.exists():
        pytest.skip("../shared/traces is not beside this checkout")
    argv = [command, str(SNAPSHOT), "--policy", "pytorch", "--capacity", "-5GiB"]
    if command == "sweep":
        argv += ["-o", str(tmp_path / "r.parquet")]
    code = cli_main(argv)
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [f"allocsim {command}: error: not a size: '-5GiB' "
                                        "(examples: 4096, 512MiB, 80GiB)"]
