"""How long ``allocsim`` takes to answer: ``--version``, ``--help`` and ``info`` on a small shipped trace.

    python benchmarks/cli_start.py              # median of 7 runs each
    python benchmarks/cli_start.py --runs 15

Each command runs in a fresh interpreter (``python -m allocsim ...`` with this checkout first on
``PYTHONPATH``), as a user's shell would start it; ``python -c pass`` and ``python -c "import
pandas"`` are timed the same way for scale (the interpreter's own start, and the library that used
to make every command slow). Prints one markdown row per command: median, fastest and slowest wall
time in seconds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
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


def wall_times(argv: list[str], runs: int) -> list[float]:
    """Seconds each of ``runs`` fresh ``python argv`` processes took, start to exit."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run([sys.executable, *argv], cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - started)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=7, help="fresh processes per command (default 7)")
    args = parser.parse_args()
    print(f"| command | median s | fastest s | slowest s |  ({args.runs} runs, {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.1f})")
    print("|---|---:|---:|---:|")
    for label, argv in COMMANDS:
        times = wall_times(argv, args.runs)
        print(f"| `{label}` | {statistics.median(times):.2f} | {min(times):.2f} | {max(times):.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
