"""``allocsim capture [-o TRACE] [--steps N] [--gpu NAME] [--timeout S] -- python SCRIPT ARGS``: a CUDA run's allocations, recorded on the CPU.

The script runs unchanged in a child process of the interpreter named after ``--`` (``cuda`` hard-coded
in it is fine: see ``allocsim.torch_capture``); that interpreter needs torch and nothing else, and the
command is read as Python reads it (``python -u train.py``, ``python -m pkg.train``, ``python -c
CODE``). The trace it would allocate on one GPU is written to TRACE (Parquet; ``.csv`` for CSV).
Replay it with ``allocsim run TRACE --policy pytorch --gpu NAME``. With ``--gpu`` the capture also
answers as that card does when its memory runs out (``torch.cuda.OutOfMemoryError``); without it the
card reported is an A100 80GB whose memory never runs out, so the trace shows what the script needs.
The script is the user's own code and runs as the user, but what it writes (checkpoints, logs,
removals, renames) goes to a scratch folder instead of the user's files (``torch_capture.writeguard``);
the summary says what went there. The trace it leaves is read back like any other.
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
                    "would make. The interpreter after -- needs torch only (2.4 to 2.15), and the trace follows its "
                    "release: give your training environment's. Example: allocsim capture -o "
                    "run.parquet --steps 4 -- python train.py --batch 64",
        epilog="cuDNN's convolution workspaces are requests in the trace, sized by a model calibrated on an RTX "
               "3060 (allocsim.torch_capture.cudnn); ALLOCSIM_CUDNN_WORKSPACE_RATIO=R or R,P sets other ratios (R: "
               "of the larger feature map for kernels larger than 1x1, P: of the gradient for 1x1 backward data; R "
               "alone sets both; 0: none). cuBLAS workspaces are requests too, one per thread and stream, sized "
               "for --gpu. Exit status: 0 = trace written, complete; 2 = usage error or the capture could not "
               "start; 3 = the script raised, exited with an error, was killed or ended without the capture's "
               "summary; 4 = the capture refused what the script did (a request over 1 PiB, CUDA work in a "
               "process the script started, a damaged channel); 124 = --timeout reached; 130 = interrupted; "
               "143 = allocsim was sent SIGTERM (the script gets it too). In every case but 2 the trace up to "
               "there is written, with a note saying why it stops")
    parser.add_argument("-o", "--output", metavar="TRACE|DIR",
                        help="trace to write (default: SCRIPT's name with .capture.parquet, in the current folder); "
                             "a folder (a name without an extension, or ending with /) for a distributed job: one trace per role of "
                             "ranks and manifest.json (default for torchrun: SCRIPT.capture/)")
    parser.add_argument("--steps", type=int, default=0, metavar="N",
                        help="stop the script after N optimizer steps (default 0: run it to its end)")
    parser.add_argument("--gpu", metavar="NAME", default=None,
                        help="the card torch.cuda reports (name, memory, compute capability, SMs) and whose "
                             "kernels and cuBLAS workspaces the trace follows; the script gets "
                             "torch.cuda.OutOfMemoryError where that card's memory for tensors runs out (allocsim "
                             "gpus lists them; default: an A100 80GB whose memory never runs out)")
    parser.add_argument("--timeout", type=float, default=None, metavar="S",
                        help="interrupt the script after S seconds and write what it recorded")
    parser.add_argument("--keep-writes", metavar="DIR", default=None,
                        help="keep what the script writes (checkpoints, logs: never written over your files, see "
                             "docs/capture.md) in DIR, a new folder (default: a temporary folder, deleted at the end)")
    parser.add_argument("--no-verify", action="store_true",
                        help="distributed job: do not capture a second rank of the largest role to check that its "
                             "ranks do the same work (one capture fewer)")
    parser.add_argument("--workers", type=int, default=None, metavar="N",
                        help="distributed job: captures at once after rank 0's (default: CPU count)")
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- PYTHON SCRIPT ARGS",
                        help="the command that runs the script, after --: python SCRIPT ARGS, or torchrun "
                             "[--nproc-per-node N] [--nnodes N] [-m] SCRIPT ARGS (or python -m torch.distributed.run)")
    parser.set_defaults(func=main)


#: The card a capture reports when no --gpu is given.
DEFAULT_GPU = "A100 80GB"


def default_output(command: list[str]) -> str:
    """``train.capture.parquet`` for ``python train.py`` (or ``python -m pkg.train``; ``command`` for ``python -c``)."""
    from ..torch_capture.command_line import script_of

    try:
        script = script_of(command)
    except ValueError:
        script = []
    if script[:1] == ["-m"] and len(script) > 1:
        stem = script[1].rsplit(".", 1)[-1]
    elif script[:1] == ["-c"]:
        stem = "command"
    else:
        stem = os.path.splitext(os.path.basename(script[0].rstrip("/")))[0] if script else ""
    return f"{stem or 'script'}.capture.parquet"


def default_folder(script: list[str]) -> str:
    """``train.capture`` for a job whose script is ``train.py`` (or ``-m pkg.train``)."""
    name = script[1].rsplit(".", 1)[-1] if script[:1] == ["-m"] and len(script) > 1 else (
        os.path.splitext(os.path.basename(script[0]))[0] if script else "")
    return f"{name or 'script'}.capture"


def _is_folder_output(path: str | None) -> bool:
    """Whether ``-o`` names a capture folder: it ends with a slash, is a folder, or has no extension."""
    if path is None:
        return False
    return path.endswith(("/", os.sep)) or os.path.isdir(path) or "." not in os.path.basename(path)


def _usage(message: str) -> int:
    print(f"allocsim capture: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def main(args: argparse.Namespace) -> int:
    """Check everything the capture needs, run it, and report the trace it wrote."""
    from ..gpus import allocator_capacity, find_gpu
    from ..torch_capture import torch_versions
    from ..torch_capture.scratch import check_keep_folder
    from ..output_file import check_trace_output as check_output
    from ..torch_capture.session import EXIT_OK, capture, check_script

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        return _usage("give the command after --, e.g. allocsim capture -- python train.py")
    if args.steps < 0:
        return _usage(f"--steps must be >= 0, got {args.steps}")
    if args.timeout is not None and not args.timeout > 0:
        return _usage(f"--timeout must be a number of seconds > 0, got {args.timeout}")
    from ..torch_capture.distributed.launcher import LaunchError
    from ..torch_capture.distributed.launchers import parse_launch

    try:
        launch = parse_launch(command)
    except LaunchError as exc:
        return _usage(str(exc))
    if launch.launcher or _is_folder_output(args.output):
        return _main_job(args, launch)
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
    # With --gpu the script meets that card's memory for tensors (allocsim gpus: the card's total less the
    # CUDA context and libraries; the capture's own cuBLAS workspaces are requests in it).
    memory_bytes = allocator_capacity(gpu, workspaces_in_trace=True) if args.gpu is not None else None
    try:
        result, _trace = capture(command, out_path, steps=args.steps, gpu=gpu.capture_properties(),
                                 memory_bytes=memory_bytes, timeout_s=args.timeout, keep_writes=args.keep_writes)
    except OSError as exc:
        return _usage(f"cannot write {out_path}: {exc.strerror or exc}")
    if result.trace_path is None:
        return _usage(result.message)
    summary = result.summary
    shown = args.output or os.path.relpath(out_path)
    if result.moved:
        shown = os.path.relpath(result.trace_path)
        print(f"capture: -o {args.output or os.path.relpath(out_path)}: {result.moved} now (the script made it while it "
              f"ran); the trace is in {shown} instead", file=sys.stderr)
    ooms = summary.get("out_of_memory_errors", 0)
    oom_text = (f", {ooms} CUDA out-of-memory error{'s' if ooms != 1 else ''} raised as the card would"
                if ooms else "")
    print(f"capture: {shown}: {summary.get('allocs', 0):,} allocations, {summary.get('optimizer_steps', 0)} "
          f"optimizer steps, peak allocated {format_bytes(summary.get('peak_allocated_bytes', 0))}, peak reserved "
          f"{format_bytes(summary.get('peak_reserved_bytes', 0))} on {gpu.name}{oom_text} "
          f"(torch {summary.get('torch') or '?'}, {result.seconds:.1f} s)")
    if result.writes_line:
        print(f"capture: {result.writes_line}")
    release = torch_versions.parse(summary.get("torch"))
    if release is not None and not torch_versions.supported(release):
        low, high = torch_versions.SUPPORTED
        print(f"capture: note: torch {summary.get('torch')} is outside the releases the capture is tested with "
              f"({low[0]}.{low[1]} to {high[0]}.{high[1]})", file=sys.stderr)
    if result.status != EXIT_OK:
        print(f"capture: the trace is incomplete: {result.message}", file=sys.stderr)
        return result.status
    print(f"next: allocsim run {shown} --policy pytorch --gpu \"{gpu.name}\"   (allocsim gpus lists GPUs)")
    return 0


def _main_job(args: argparse.Namespace, launch) -> int:
    """A distributed job (a launcher, or ``-o DIR``): one trace per role of ranks and a manifest, in a folder."""
    from ..gpus import find_gpu
    from ..torch_capture.distributed.capture_dir import capture_job
    from ..torch_capture.distributed.folder_check import check_job_folder

    if launch.script and launch.script[0] not in ("-m", "-c") and not os.path.isfile(launch.script[0]):
        return _usage(f"no script {launch.script[0]!r}")
    if getattr(args, "keep_writes", None) is not None:
        return _usage("--keep-writes keeps one capture's writes; a distributed job's captures keep none")
    if args.workers is not None and args.workers < 1:
        return _usage(f"--workers must be >= 1, got {args.workers}")
    try:
        gpu = find_gpu(args.gpu if args.gpu is not None else DEFAULT_GPU)
        shown = args.output or default_folder(launch.script)
        out_dir = os.path.abspath(shown)
        check_job_folder(out_dir, shown)
    except ValueError as exc:
        return _usage(str(exc))
    for note in launch.notes:
        print(f"capture: note: {note}", file=sys.stderr)
    interactive = sys.stderr.isatty()
    try:
        manifest = capture_job(launch, out_dir, steps=args.steps, gpu=gpu.capture_properties(), gpu_name=gpu.name,
                               timeout_s=args.timeout, verify=not args.no_verify,
                               workers=args.workers or os.cpu_count() or 1,
                               log=lambda m: print(f"capture: {m}", file=sys.stderr))
    except OSError as exc:
        return _usage(f"cannot write {shown}: {exc.strerror or exc}")
    del interactive
    for role in manifest.roles:
        ranks = role.to_dict()["ranks_text"]
        state = "" if role.status == EXIT_OK_JOB else f" (exit {role.status}: {role.message})"
        print(f"capture: {shown}/{role.trace or '-'}: ranks {ranks} ({len(role.ranks)}): {role.allocs:,} allocations, "
              f"peak allocated {format_bytes(role.peak_allocated_bytes)}, peak reserved "
              f"{format_bytes(role.peak_reserved_bytes)}{state}")
    print(f"capture: {shown}/manifest.json: world of {manifest.world_size} ranks, {len(manifest.roles)} role(s), "
          f"on {gpu.name} (torch {manifest.torch or '?'}, {manifest.seconds:.1f} s)")
    for note in manifest.notes:
        print(f"capture: note: {note}", file=sys.stderr)
    if manifest.status != EXIT_OK_JOB:
        print("capture: a capture stopped early; its trace holds what it recorded up to there", file=sys.stderr)
        return manifest.status
    print(f"next: allocsim run {shown} --policy pytorch --gpu \"{gpu.name}\"   (allocsim gpus lists GPUs)")
    return 0


EXIT_OK_JOB = 0
