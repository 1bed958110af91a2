"""``allocsim capture [-o TRACE] [--steps N] -- python SCRIPT ARGS``: a CUDA run's allocations, recorded on the CPU.

The script runs unchanged in a child process of the interpreter named after ``--`` (``cuda`` hard-coded
in it is fine: see ``allocsim.torch_capture``), and the trace it would allocate on one GPU is written to
TRACE (Parquet; ``.csv`` for CSV). Replay it with ``allocsim run TRACE --policy pytorch --gpu NAME``.
The script is the user's own code and runs as the user; the trace it leaves is read back like any other.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from ..units import format_bytes

#: The child's status when the script raised: the trace up to the error is still written.
EXIT_SCRIPT_FAILED = 3


def register(subparsers) -> None:
    """Add the ``capture`` subcommand."""
    parser = subparsers.add_parser(
        "capture", help="record what a PyTorch script would allocate on a GPU, running it on the CPU",
        description="Run a PyTorch training script unchanged on a machine without a GPU (cuda mapped to the "
                    "meta device: no compute, exact tensor sizes, the CUDA code path) and write the trace of "
                    "the allocations its CUDA run would make. Example: allocsim capture -o run.parquet "
                    "--steps 4 -- python train.py --batch 64",
        epilog="cuDNN's convolution workspaces are requests in the trace, sized by a model calibrated on an RTX "
               "3060 (allocsim.torch_capture.cudnn); ALLOCSIM_CUDNN_WORKSPACE_RATIO=R or R,P sets other ratios (R: "
               "of the larger feature map for kernels larger than 1x1, P: of the gradient for 1x1 backward data; R "
               "alone sets both; 0: none). "
               "Exit status: 0 = trace written, 2 = usage error, 3 = the script raised (the trace up to the "
               "error is written)")
    parser.add_argument("-o", "--output", metavar="TRACE",
                        help="trace to write (default: SCRIPT's name with .capture.parquet, in the current folder)")
    parser.add_argument("--steps", type=int, default=0, metavar="N",
                        help="stop the script after N optimizer steps (default 0: run it to its end)")
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- PYTHON SCRIPT ARGS",
                        help="the command that runs the script, after --")
    parser.set_defaults(func=main)


def child_argv(command: list[str], out_path: str, steps: int) -> list[str]:
    """The child's command line: the user's interpreter running ``allocsim.torch_capture.child``."""
    python, script = command[0], command[1:]
    if python.endswith(".py"):           # `-- train.py ARGS`: this interpreter runs it
        python, script = sys.executable, command
    return [python, "-m", "allocsim.torch_capture.child", out_path, str(steps), "--", *script]


def default_output(command: list[str]) -> str:
    """``train.capture.parquet`` for ``python train.py`` (or ``python -m pkg.train``)."""
    if len(command) > 2 and command[1] == "-m":
        stem = command[2].rsplit(".", 1)[-1]
    else:
        script = command[1] if len(command) > 1 and not command[0].endswith(".py") else command[0]
        stem = os.path.splitext(os.path.basename(script))[0]
    return f"{stem or 'script'}.capture.parquet"


def main(args: argparse.Namespace) -> int:
    """Run the capture child and report the trace it wrote."""
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command or (len(command) < 2 and not command[0].endswith(".py")):
        print("allocsim capture: error: give the script after --, e.g. allocsim capture -- python train.py",
              file=sys.stderr)
        return 2
    if args.steps < 0:
        print(f"allocsim capture: error: --steps must be >= 0, got {args.steps}", file=sys.stderr)
        return 2
    argv = child_argv(command, "-", args.steps)
    script = argv[argv.index("--") + 1:]
    if script and script[0] != "-m" and not os.path.isfile(script[0]):
        print(f"allocsim capture: error: no script {script[0]!r}", file=sys.stderr)
        return 2
    out_path = args.output or default_output(command)
    env = dict(os.environ)
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    t0 = time.perf_counter()
    try:
        done = subprocess.run(child_argv(command, out_path, args.steps), env=env, stderr=subprocess.PIPE, text=True)
    except OSError as exc:
        print(f"allocsim capture: error: cannot start {command[0]!r}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    seconds = time.perf_counter() - t0
    lines = done.stderr.splitlines()
    summary = None
    if lines:
        try:
            summary = json.loads(lines[-1])
            lines = lines[:-1]
        except ValueError:
            summary = None
    if lines:
        sys.stderr.write("\n".join(lines) + "\n")
    if done.returncode == 2 and lines and lines[-1].startswith("allocsim capture: error:"):
        return 2                       # the child said why (a bad ALLOCSIM_CUDNN_WORKSPACE_RATIO)
    if summary is None or done.returncode not in (0, EXIT_SCRIPT_FAILED):
        print(f"allocsim capture: error: the capture of {' '.join(command)!r} wrote no trace "
              f"(exit {done.returncode}); is torch installed for {command[0]!r}?", file=sys.stderr)
        return 2
    print(f"capture: {summary['trace']}: {summary['allocs']:,} allocations, {summary['frees']:,} frees, "
          f"{summary['optimizer_steps']} optimizer steps, {summary.get('cudnn_workspaces', 0):,} of the "
          f"allocations cuDNN workspaces, peak allocated "
          f"{format_bytes(summary['peak_allocated_bytes'])} ({seconds:.1f} s)")
    if done.returncode == EXIT_SCRIPT_FAILED:
        print(f"capture: the trace stops where {summary['status'][4:]}", file=sys.stderr)
        return EXIT_SCRIPT_FAILED
    print(f"next: allocsim run {summary['trace']} --policy pytorch --gpu \"RTX 3060\"   (allocsim gpus lists GPUs)")
    return 0
