"""``allocsim --version`` and ``--help`` answer without loading the heavy libraries.

Behaviour, not timing (benchmarks/cli_start.py measures the time): a fresh interpreter imports
``allocsim.cli``, runs the option and reports which of pandas, numpy, matplotlib, pyarrow and
simpy it loaded; none may be.
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


def test_probe_sees_a_heavy_import():
    # The probe itself: a command that reads a trace does load pandas, and the probe says so.
    got = _probe("info", str(REPO / "traces" / "paddle" / "resnet_fp32.json.gz"), "--json")
    assert got["code"] == 0 and json.loads(got["out"])["format"] == "paddle"
    assert "pandas" in got["heavy"]
