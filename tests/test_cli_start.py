"""``allocsim --version`` and ``--help`` answer without loading the heavy libraries, ``info`` without pandas.

Behaviour, not timing (benchmarks/cli_start.py measures the time): a fresh interpreter imports
``allocsim.cli``, runs the command and reports which of pandas, numpy, matplotlib, pyarrow and
simpy it loaded. ``--version`` and ``--help`` may load none; ``info`` on a small trace reads it
into numpy columns and may load numpy only (its DataFrames are built only where a command asks).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("pandas", "numpy", "matplotlib", "pyarrow", "simpy")

_PROBE = """
import contextlib, io, json, sys
from allocsim.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        code = main(sys.argv[1:])
    except SystemExit as exc:
        code = exc.code
print(json.dumps({"code": code, "out": out.getvalue(), "heavy": sorted(
    m for m in sys.modules if m.partition(".")[0] in %r)}))
""" % (HEAVY,)


def _probe(*argv: str) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", _PROBE, *argv], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("option", ["--version", "--help"])
def test_version_and_help_load_no_heavy_library(option):
    got = _probe(option)
    assert got["code"] == 0
    assert got["out"].startswith("allocsim 0.1.0 (policy kernel:" if option == "--version" else "usage: allocsim")
    assert got["heavy"] == []


SMALL_TRACE = REPO / "traces" / "paddle" / "resnet_fp32.json.gz"


@pytest.mark.parametrize("as_json", [False, True])
def test_info_on_a_small_trace_loads_numpy_but_not_pandas(as_json):
    # Whichever route ALLOCSIM_KERNEL picks (CI runs both): the summary, categories and sites come
    # from numpy columns. The probe sees numpy, so it does see heavy imports.
    got = _probe("info", str(SMALL_TRACE), *(["--json"] if as_json else []))
    assert got["code"] == 0
    if as_json:
        summary = json.loads(got["out"])
        assert summary["format"] == "paddle" and summary["allocs"] == 626 and summary["sites"]["by_bytes"]
    else:
        assert "peak_live_bytes" in got["out"] and "Allocation sites:" in got["out"]
    assert "numpy" in got["heavy"]
    assert not [m for m in got["heavy"] if m.partition(".")[0] in ("pandas", "pyarrow", "matplotlib", "simpy")]


def test_a_command_that_needs_a_dataframe_still_gets_one():
    # The probe itself on a command that does use pandas (a replay's results are DataFrames).
    got = _probe("run", str(SMALL_TRACE), "--policy", "direct")
    assert got["code"] == 0
    assert "pandas" in got["heavy"]
