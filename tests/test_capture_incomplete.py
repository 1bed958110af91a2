"""Every way a captured script stops early leaves a trace that says so, and ``run`` on it never prints a bare FITS.

Real captures (``allocsim capture`` in a subprocess, as a user runs it) of a script that raises, one
missing a required argument, one interrupted by Ctrl-C (SIGINT to ``allocsim capture``), one stopped
by ``--timeout``, and one that reaches ``--steps N`` (complete). The five run at once.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

if os.environ.get("CI"):
    import torch  # noqa: F401  (CI installs it: a missing torch must fail, not skip)
else:
    pytest.importorskip("torch")

from allocsim.cli import main  # noqa: E402
from allocsim.metrics.verdict import EXIT_INCOMPLETE  # noqa: E402
from allocsim.trace import read_trace  # noqa: E402

pytestmark = pytest.mark.full      # five capture children (seconds each)

SCRIPT = """
import argparse, sys, time
import torch
parser = argparse.ArgumentParser()
parser.add_argument("--mode", required=True)
args = parser.parse_args()
model = torch.nn.Linear(256, 256).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    model(torch.randn(16, 256, device="cuda")).sum().backward()
    opt.step()
    if args.mode == "raise" and step == 1:
        raise ValueError("bad batch")
    if args.mode in ("sigint", "timeout"):
        print("ready", flush=True)
        time.sleep(600)
"""

#: case -> (capture options, script arguments, expected capture status, expected reason start)
CASES = {
    "raised": ([], ["--mode", "raise"], 3, "the script raised ValueError: bad batch; 2 optimizer steps recorded"),
    "missing argument": ([], [], 3, "the script exited with 2; 0 optimizer steps recorded"),
    # under heavy load the script may take longer than the grace period to end, and is killed: said too
    "ctrl-c": ([], ["--mode", "sigint"], 130, "interrupted (Ctrl-C)"),
    "timeout": (["--timeout", "45"], ["--mode", "timeout"], 124, "stopped after --timeout 45 s"),   # after torch loads
    "steps reached": (["--steps", "2"], ["--mode", "steps"], 0, ""),
}


def _capture(folder: Path, case: str) -> tuple[int, str, str]:
    options, script_args, _, _ = CASES[case]
    out = folder / f"{case.replace(' ', '-')}.parquet"
    command = [sys.executable, "-m", "allocsim", "capture", "-o", str(out), *options, "--",
               sys.executable, str(folder / "train.py"), *script_args]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=folder)
    if case == "ctrl-c":
        for line in proc.stdout:               # the script is in its loop: Ctrl-C reaches allocsim capture
            if line.strip() == "ready":
                proc.send_signal(signal.SIGINT)
                break
    stdout, stderr = proc.communicate(timeout=300)
    return proc.returncode, str(out), stderr


@pytest.fixture(scope="module")
def captures(tmp_path_factory) -> dict[str, tuple[int, str, str]]:
    folder = tmp_path_factory.mktemp("incomplete")
    (folder / "train.py").write_text(textwrap.dedent(SCRIPT))
    with concurrent.futures.ThreadPoolExecutor(len(CASES)) as pool:
        futures = {case: pool.submit(_capture, folder, case) for case in CASES}
        return {case: future.result() for case, future in futures.items()}


@pytest.mark.parametrize("case", list(CASES))
def test_the_capture_marks_how_it_stopped_and_run_says_so(captures, case, capsys):
    status, path, stderr = captures[case]
    _, _, expected_status, reason = CASES[case]
    assert status == expected_status, stderr
    assert read_trace(path).meta.incomplete.startswith(reason) if reason else read_trace(path).meta.incomplete == ""
    code = main(["run", path, "--policy", "pytorch", "--fast", "--gpu", "H100"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    if reason:
        assert code == EXIT_INCOMPLETE and last.startswith(f"INCOMPLETE TRACE ({reason}")
        assert "judged on the part recorded: FITS on H100" in last
    else:
        assert code == 0 and last.startswith("FITS on H100")


def test_json_of_an_interrupted_capture(captures, capsys):
    _, path, _ = captures["ctrl-c"]
    assert main(["run", path, "--policy", "pytorch", "--fast", "--json", "--allow-incomplete"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["incomplete"] is True and data["incomplete_reason"].startswith("interrupted (Ctrl-C)")
