"""``allocsim capture [-o TRACE] [--steps N] [--gpu NAME] [--timeout S] -- python SCRIPT ARGS``: a CUDA run's allocations, recorded on the CPU.

The script runs unchanged in a child process of the interpreter named after ``--`` (``cuda`` hard-coded
in it is fine: see ``allocsim.torch_capture``); that interpreter needs torch and nothing else. The
trace it would allocate on one GPU is written to TRACE (Parquet; ``.csv`` for CSV). Replay it with
``allocsim run TRACE --policy pytorch --gpu NAME``. The script is the user's own code and runs as
the user, but what it writes (checkpoints, logs, removals, renames) goes to a scratch folder instead
of the user's files (``torch_capture.writeguard``); the summary says what went there. The trace it
leaves is read back like any other.
"""

from __future__ import annotations

import argparse
import os
import sys

from ..units import format_bytes

#: Exit statuses (the child's, passed on).
EXIT_USAGE = 2


def register(subparsers) -> None:
    """Add the ``capture`` subcommand."""
    parser = subparsers.add_parser(
        "capture", help="record what a PyTorch script would allocate on a GPU, running it on the CPU",
        description="Run a PyTorch training script unchanged on a machine without a GPU (cuda mapped to the "
                    "meta device: no compute, exact tensor sizes, the CUDA code path, autocast as on the GPU, "
                    "large CPU tensors never materialised) and write the trace of the allocations its CUDA run "
                    "would make. The interpreter after -- needs torch only. Example: allocsim capture -o "
                    "run.parquet --steps 4 -- python train.py --batch 64",
        epilog="cuDNN's convolution workspaces are requests in the trace, sized by a model calibrated on an RTX "
               "3060 (allocsim.torch_capture.cudnn); ALLOCSIM_CUDNN_WORKSPACE_RATIO=R or R,P sets other ratios (R: "
               "of the larger feature map for kernels larger than 1x1, P: of the gradient for 1x1 backward data; R "
               "alone sets both; 0: none). cuBLAS workspaces are requests too, one per thread and stream, sized "
               "for --gpu. Exit status: 0 = trace written, 2 = usage error or the capture could not start, "
               "3 = the script raised (the trace up to the error is written), 124 = --timeout reached, "
               "130 = interrupted (both write the trace up to there)")
    parser.add_argument("-o", "--output", metavar="TRACE",
                        help="trace to write (default: SCRIPT's name with .capture.parquet, in the current folder)")
    parser.add_argument("--steps", type=int, default=0, metavar="N",
                        help="stop the script after N optimizer steps (default 0: run it to its end)")
    parser.add_argument("--gpu", metavar="NAME", default=None,
                        help="the card torch.cuda reports (name, memory, compute capability, SMs) and whose "
                             "kernels and cuBLAS workspaces the trace follows (allocsim gpus lists them; "
                             "default: A100 80GB)")
    parser.add_argument("--timeout", type=float, default=None, metavar="S",
                        help="interrupt the script after S seconds and write what it recorded")
    parser.add_argument("--keep-writes", metavar="DIR", default=None,
                        help="keep what the script writes (checkpoints, logs: never written over your files, see "
                             "docs/capture.md) in DIR, a new folder (default: a temporary folder, deleted at the end)")
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- PYTHON SCRIPT ARGS",
                        help="the command that runs the script, after --")
    parser.set_defaults(func=main)


#: The card a capture reports when no --gpu is given.
DEFAULT_GPU = "A100 80GB"


def default_output(command: list[str]) -> str:
    """``train.capture.parquet`` for ``python train.py`` (or ``python -m pkg.train``)."""
    if len(command) > 2 and command[1] == "-m":
        stem = command[2].rsplit(".", 1)[-1]
    elif len(command) > 1 and command[1] == "-c":
        stem = "command"
    else:
        script = command[1] if len(command) > 1 and not command[0].endswith(".py") else command[0]
        stem = os.path.splitext(os.path.basename(script))[0]
    return f"{stem or 'script'}.capture.parquet"


def _usage(message: str) -> int:
    print(f"allocsim capture: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def main(args: argparse.Namespace) -> int:
    """Check everything the capture needs, run it, and report the trace it wrote."""
    from ..gpus import find_gpu
    from ..torch_capture.scratch import check_keep_folder
    from ..torch_capture.session import EXIT_OK, capture, check_script
    from ..output_file import check_trace_output as check_output

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command or (len(command) < 2 and not command[0].endswith(".py")):
        return _usage("give the script after --, e.g. allocsim capture -- python train.py")
    if args.steps < 0:
        return _usage(f"--steps must be >= 0, got {args.steps}")
    if args.timeout is not None and not args.timeout > 0:
        return _usage(f"--timeout must be a number of seconds > 0, got {args.timeout}")
    try:
        check_script(command)
        if args.keep_writes is not None:
            check_keep_folder(args.keep_writes)
        gpu = find_gpu(args.gpu if args.gpu is not None else DEFAULT_GPU)
        # Resolved and checked before the script runs: it may change directory, and a bad -o must
        # not be found after a long run.
        out_path = os.path.abspath(args.output or default_output(command))
        check_output(out_path)
    except ValueError as exc:
        return _usage(str(exc))
    try:
        result, _trace = capture(command, out_path, steps=args.steps, gpu=gpu.capture_properties(),
                                 timeout_s=args.timeout, keep_writes=args.keep_writes)
    except OSError as exc:
        return _usage(f"cannot write {out_path}: {exc.strerror or exc}")
    if result.trace_path is None:
        return _usage(result.message)
    summary = result.summary
    shown = args.output or os.path.relpath(out_path)
    print(f"capture: {shown}: {summary.get('allocs', 0):,} allocations, {summary.get('optimizer_steps', 0)} "
          f"optimizer steps, peak allocated {format_bytes(summary.get('peak_allocated_bytes', 0))}, peak reserved "
          f"{format_bytes(summary.get('peak_reserved_bytes', 0))} on {gpu.name} (torch {summary.get('torch', '?')}, "
          f"{result.seconds:.1f} s)")
    if result.writes_line:
        print(f"capture: {result.writes_line}")
    if result.status != EXIT_OK:
        print(f"capture: the trace stops where {result.message}", file=sys.stderr)
        return result.status
    print(f"next: allocsim run {shown} --policy pytorch --gpu \"{gpu.name}\"   (allocsim gpus lists GPUs)")
    return 0
