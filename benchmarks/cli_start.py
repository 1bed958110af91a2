"""How long ``allocsim`` takes to answer: ``--version``, ``--help`` and ``info`` on a small shipped trace.

    python benchmarks/cli_start.py                    # median of 7 runs each, bytecode cache off
    python benchmarks/cli_start.py --bytecode on      # as on a user's machine: allocsim's .pyc cached
    python benchmarks/cli_start.py --runs 15

Each command runs in a fresh interpreter (``python -m allocsim ...``), as a user's shell would
start it; ``python -c pass`` and ``python -c "import pandas"`` are timed the same way for scale
(the interpreter's own start, and the library that used to make every command slow). Prints one
markdown row per command: median, fastest and slowest wall time in seconds, and the median CPU
time (user + system) of the process, which a busy machine inflates less than the wall time.

Bytecode: the package runs from a fresh copy of ``allocsim/`` (compiled extensions included) in a
temporary folder, so the state of the cache is known. ``--bytecode off`` (the default) sets
``PYTHONDONTWRITEBYTECODE=1``, as the machine of docs/performance.md does: allocsim's modules are
compiled from source at every start. ``--bytecode on`` is a user's machine: Python writes allocsim's ``.pyc``
files on a first, untimed run and reads them afterwards. The standard library and the installed
packages use their installed ``.pyc`` files either way.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: The smallest trace shipped in traces/ (a Paddle ResNet profile, 47 kB gzip, 2.4k events).
SMALL_TRACE = REPO / "traces" / "paddle" / "resnet_fp32.json.gz"

COMMANDS = (
    ("python -c pass", ["-c", "pass"]),
    ('python -c "import pandas"', ["-c", "import pandas"]),
    ("allocsim --version", ["-m", "allocsim", "--version"]),
    ("allocsim --help", ["-m", "allocsim", "--help"]),
    (f"allocsim info traces/{SMALL_TRACE.relative_to(REPO / 'traces')}", ["-m", "allocsim", "info", str(SMALL_TRACE)]),
)


def child_env(package_root: Path, bytecode: bool) -> dict[str, str]:
    """The environment of a timed process: ``package_root`` first on the path, the bytecode cache on or off."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(package_root), os.environ.get("PYTHONPATH", "")]))
    env.pop("PYTHONPYCACHEPREFIX", None)
    if bytecode:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    else:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def run_times(argv: list[str], runs: int, cwd: Path, env: dict[str, str], warmup: bool
              ) -> tuple[list[float], list[float]]:
    """(wall, CPU) seconds of each of ``runs`` fresh ``python argv`` processes (after one untimed run if ``warmup``)."""
    walls, cpus = [], []
    for k in range(runs + (1 if warmup else 0)):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        subprocess.run([sys.executable, *argv], cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if k or not warmup:
            walls.append(wall)
            cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return walls, cpus


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=7, help="fresh processes per command (default 7)")
    parser.add_argument("--bytecode", choices=("off", "on"), default="off",
                        help="off: PYTHONDONTWRITEBYTECODE=1, allocsim compiled at every start (default); "
                             "on: allocsim's .pyc written by an untimed first run, then read")
    args = parser.parse_args()
    bytecode = args.bytecode == "on"
    print(f"| command | median s | fastest s | slowest s | median CPU s |  ({args.runs} runs, bytecode cache "
          f"{args.bytecode}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f})")
    print("|---|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory(prefix="cli_start_") as tmp:
        root = Path(tmp)
        shutil.copytree(REPO / "allocsim", root / "allocsim", ignore=shutil.ignore_patterns("__pycache__"))
        env = child_env(root, bytecode)
        for label, argv in COMMANDS:
            walls, cpus = run_times(argv, args.runs, root, env, warmup=bytecode)
            print(f"| `{label}` | {statistics.median(walls):.2f} | {min(walls):.2f} | {max(walls):.2f} "
                  f"| {statistics.median(cpus):.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
