"""``allocsim advise TRACE [--policy pytorch] [--capacity SIZE]``: which setting makes the trace fit.

Searches the preset's real knobs (``allocsim.advise.knobs``) on the sweep machinery (parallel,
journaled, resumable; local by default, ``--dask local`` / ``--scheduler ADDR`` as in ``sweep``)
and prints the settings that fit, best first, each with the line to paste, the headroom, the
smallest capacity at which it still fits and the ``allocsim run`` command that replays it; then
why the best one fits. Capacity: ``--capacity SIZE``, else the one the recording implies, else it
asks for one. Exit status: 0 a setting fits, 1 none does or a run ended in an error (printed with
its runs), 4 the trace stops before its script's end (``INCOMPLETE TRACE`` in the last line;
``--allow-incomplete`` gives 0 or 1), 2 a usage or input error.
"""

from __future__ import annotations

import argparse
import sys

from ..errors import AllocsimError
from ..units import parse_bytes
from .common import (add_cost_model_args, add_incomplete_arg, add_trace_args, cost_model_from_args, incomplete_status,
                     print_json, read_args, trace_limits)
from .info import add_site_args, site_options

EXIT_NONE_FITS = 1
EXIT_STATUS_HELP = ("exit status: 0 = a setting fits, 1 = none does or some run ended in an error (each distinct "
                    "error is printed with its runs), 4 = the trace stops before its script's end (an incomplete "
                    "capture; --allow-incomplete: 0 or 1 as above), 2 = usage or input error")


def register(subparsers) -> None:
    """Add the ``advise`` subcommand."""
    parser = subparsers.add_parser(
        "advise", help="which allocator setting makes a trace fit: the line to paste, best first",
        description="Search the allocator's real settings on TRACE at a capacity (given, or the one the "
                    "recording implies) and print the settings that fit, best first (peak reserved, then p99 "
                    "allocation latency), each with the line to paste, the headroom, the smallest capacity at "
                    "which it still fits and the `allocsim run` command that replays it; then why the best one "
                    "fits. Knobs that change nothing on the trace are reported and not combined.",
        epilog="examples:\n"
               "  allocsim advise snapshot.pickle --capacity 20GiB\n"
               "  allocsim advise snapshot.pickle --device 1 --json\n"
               "  allocsim advise trace.json.gz --policy paddle --capacity 16GiB --workers 4\n"
               "runs are journaled (-o RESULTS.parquet, else a cache folder): a rerun resumes and reuses them\n"
               + EXIT_STATUS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_trace_args(parser)
    parser.add_argument("--policy", default="pytorch", metavar="NAME",
                        help="allocator whose settings to search: pytorch (default), paddle or cupy")
    parser.add_argument("--capacity", metavar="SIZE",
                        help="device memory, e.g. 20GiB (default: what the recording implies)")
    parser.add_argument("--gpu", metavar="NAME",
                        help="advise for this GPU (see `allocsim gpus`): its memory less the CUDA context, libraries "
                             "and cuBLAS workspaces is the capacity")
    parser.add_argument("--device", type=int, metavar="N", help="device to advise on (required if several)")
    parser.add_argument("--top", type=int, default=3, metavar="N",
                        help="how many fitting settings to show, with their smallest capacity (default 3)")
    parser.add_argument("--fast", action="store_true",
                        help="no timing: rank by peak reserved alone (much faster)")
    add_cost_model_args(parser)
    parser.add_argument("-o", "--output", metavar="RESULTS.parquet",
                        help="write every run as a sweep results file, journaled beside it "
                             "(default: a cache folder: $ALLOCSIM_CACHE_DIR or ~/.cache/allocsim)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--scheduler", metavar="ADDRESS",
                       help="run on an existing Dask cluster (tcp://HOST:PORT); the trace must be readable there")
    where.add_argument("--dask", metavar="local", choices=["local"], help="start a Dask LocalCluster of --workers")
    parser.add_argument("--workers", type=int, metavar="N",
                        help="worker processes (default: CPU count; 1 = run here, no pool)")
    add_site_args(parser, "show (when nothing can fit: what holds the memory at the peak)")
    add_incomplete_arg(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--framework", action="store_true",
                        help="for a DeepSpeed or Megatron-LM job's capture folder: capture the job again with the "
                             "smallest framework change first (ZeRO stage, offload, recompute, a TP x PP split) "
                             "until one fits every rank (docs/advise.md)")
    parser.set_defaults(func=main)


def cost_args(args: argparse.Namespace) -> tuple[str, ...]:
    """The ``--cost-model`` / ``--cost`` and read options as given, for the ``allocsim run`` commands advise prints."""
    out: list[str] = ["--cost-model", args.cost_model] if args.cost_model else []
    for item in args.cost:
        out += ["--cost", item]
    return tuple(out) + read_args(args)


def _log(message: str) -> None:
    print(f"allocsim advise: {message}", file=sys.stderr)


def main(args: argparse.Namespace) -> int:
    """Search, print the advice; 0 when a setting fits, 1 when none does, 2 on bad input."""
    from ..advise.advice import advise
    from ..advise.report import advice_to_dict, format_advice
    from ..capture_folder import is_capture_folder_path
    from ..sweep import executor_from_options

    if is_capture_folder_path(args.trace):
        from .per_rank import advise_folder

        return advise_folder(args, cost_args(args), EXIT_NONE_FITS)
    try:
        if args.output is not None:
            from ..sweep.results import check_results_output

            check_results_output(args.output)
        capacity = parse_bytes(args.capacity, round_down=True) if args.capacity is not None else None
        gpu_note = gpu = None
        if args.gpu is not None:      # `--gpu ''` is refused by find_gpu, never ignored
            from ..gpus import find_gpu, label_note

            if capacity is not None:
                raise ValueError("give --gpu or --capacity, not both")
            gpu = find_gpu(args.gpu)
            gpu_note = label_note(gpu)
        cost_model = cost_model_from_args(args)
        site_filter, top_sites = site_options(args)
        executor = executor_from_options(args.workers, args.scheduler, args.dask)
        interactive = not args.json and sys.stderr.isatty()
        advice = advise(args.trace, policy=args.policy, capacity_bytes=capacity, device=args.device,
                        executor=executor, output=args.output, cost_model=cost_model, fast=args.fast, top=args.top,
                        progress=interactive, log=_log if interactive else (lambda message: None),
                        command_args=cost_args(args), lenient=args.lenient, limits=trace_limits(args),
                        site_filter=site_filter, top_sites=top_sites, gpu=gpu)
    except (AllocsimError, ValueError, OSError) as exc:
        print(f"allocsim advise: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("allocsim advise: interrupted; finished runs are journaled: rerun the same command to resume",
              file=sys.stderr)
        return 130
    bet = None
    if gpu is not None:
        from ..units import format_bytes

        bet = (f"--gpu {gpu.name}: the capacity is its memory less its own terms with what a CPU run cannot know "
               f"at the high end of its range ({format_bytes(advice.capacity_bytes)}), so a setting listed fits "
               "whatever those are within their ranges (allocsim gpus; docs/capture.md, 'Ranges you can bet on')")
    if args.json:
        print_json({**advice_to_dict(advice), **({"gpu_note": gpu_note} if gpu_note else {}),
                    **({"gpu_capacity_note": bet} if bet else {})})
    else:
        print(format_advice(advice))
        if bet:
            print(f"note: {bet}")
        if gpu_note:
            print(f"note: {gpu_note}")
    if advice.error_groups():   # a run that crashed leaves the search incomplete: never a clean 0
        status = EXIT_NONE_FITS
    else:
        status = 0 if advice.fits_any else EXIT_NONE_FITS
    return incomplete_status("advise", advice.incomplete, args, status)
