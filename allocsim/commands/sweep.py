"""``allocsim sweep TRACE... --policy NAME --grid KEY=V1,V2 -o RESULTS.parquet``: run a parameter grid.

One row per trace x policy x parameter point with every ``allocsim run --json`` metric (memory
figures in the trace's recorded stream order, as ``run`` reports them); without ``--capacity`` each
trace runs at the capacity its recording implies, if any (said in the output); rows are journaled as they
finish (``RESULTS.parquet.parts/``), so a killed sweep resumes where it stopped. ``--policy`` takes
specs (``pytorch:expandable_segments:True``) so settings can be compared side by side. Bad grids
(unknown policy or key, malformed items, a value that cannot parse or build its policy) exit 2
before anything runs; a config that fails while running is a row with an ``error``, and each distinct error is
printed with the rows it hit. Exit 0 when every row finished without an error, 1 when some did not
finish (rerun to finish them) or ended in an error, 130 on Ctrl-C (finished rows are kept).
"""

from __future__ import annotations

import argparse
import json
import sys

from ..errors import AllocsimError
from ..units import parse_bytes
from .common import add_cost_model_args, add_read_args, cost_model_from_args, trace_limits


def register(subparsers) -> None:
    """Add the ``sweep`` subcommand."""
    parser = subparsers.add_parser(
        "sweep", help="replay traces through a grid of policies and parameters (resumable, parallel)",
        description="Replay each TRACE through every point of each policy's parameter grid and write one\n"
                    "row per trace x policy x parameters with every `allocsim run --json` metric to a\n"
                    "Parquet file. Finished rows are journaled in RESULTS.parquet.parts/: rerunning the\n"
                    "same command skips them. Pick winners with `allocsim winners RESULTS.parquet`.",
        epilog="examples:\n"
               "  allocsim sweep traces/bert_fp32.json.gz --policy pytorch --capacity 16GiB \\\n"
               "      --set memory_fraction=1 --grid max_split_size=none,256MiB "
               "--grid garbage_collection_threshold=0,0.6 -o results.parquet\n"
               "  allocsim sweep T1 T2 --grid-file grid.json --fast -o results.parquet --dask local --workers 4\n"
               "  allocsim sweep T --policy pytorch --policy pytorch:expandable_segments:True --capacity 16GiB "
               "-o results.parquet\n"
               "grid file: {\"pytorch\": {\"max_split_size\": [\"none\", \"256MiB\"]}, "
               "\"deferred-gc\": {\"threshold\": [\"0\", \"64MiB\"]}}\n"
               "exit status: 0 = every row finished without an error, 1 = some row did not finish or ended in an "
               "error (each distinct error is printed with its rows), 2 = bad input",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("traces", nargs="+", metavar="TRACE", help="trace files (any format allocsim reads)")
    add_read_args(parser)
    parser.add_argument("--policy", action="append", default=[], metavar="NAME[:SETTINGS]",
                        help="policy to sweep (repeatable; default: the grid file's policies); pytorch:SETTINGS "
                             "takes PYTORCH_CUDA_ALLOC_CONF syntax, e.g. pytorch:expandable_segments:True, other "
                             "policies NAME:KEY:VALUE,...")
    parser.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2,...",
                        help="sweep a parameter over values (repeatable; applies to each --policy that has KEY, "
                             "the others run without it; a KEY no policy has is an error); "
                             "commas inside [...] stay in one value")
    parser.add_argument("--grid-file", metavar="FILE",
                        help="JSON object: policy -> {key: [values]} (keys scoped per policy)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="settings",
                        help="fix a parameter for every policy that has it (repeatable)")
    parser.add_argument("--capacity", metavar="SIZE",
                        help="device memory, e.g. 16GiB (default: for each trace the capacity its recording "
                             "implies, said in the output; else unlimited)")
    parser.add_argument("--device", type=int, metavar="N", help="device to replay (required if a trace has several)")
    parser.add_argument("--fast", action="store_true", help="no timing: memory results only, much faster")
    add_cost_model_args(parser)
    parser.add_argument("-o", "--output", required=True, metavar="RESULTS.parquet", help="results file to write")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--scheduler", metavar="ADDRESS",
                       help="run on an existing Dask cluster (tcp://HOST:PORT); traces must be readable there")
    where.add_argument("--dask", metavar="local", choices=["local"],
                       help="start a Dask LocalCluster of --workers processes")
    parser.add_argument("--workers", type=int, metavar="N",
                        help="worker processes (default: CPU count; 1 = run here, no pool)")
    parser.add_argument("--retry-errors", action="store_true",
                        help="recompute journaled rows that ended in an error")
    parser.add_argument("--json", action="store_true", help="print one JSON object (no progress bar)")
    parser.set_defaults(func=main)


def capacity_text(entry: dict) -> str:
    """One line on the capacity a trace's rows ran at (inferred ones say how)."""
    from ..units import format_bytes

    if entry["source"] == "inferred":
        from ..metrics.verdict import is_lower_bound

        least = "at least " if is_lower_bound("inferred", entry.get("range")) else ""
        return (f"capacity {least}{format_bytes(entry['capacity_bytes'])} for {entry['trace']}, inferred from the "
                f"recording: {entry['note']} (--capacity SIZE overrides it)")
    if entry["source"] is None:
        return f"capacity unlimited for {entry['trace']} (its recording implies none; give --capacity SIZE)"
    return ""


def next_commands(report) -> list[str]:
    """The ``allocsim winners`` commands that read these results: one per trace when there are several
    (``winners`` asks for ``--trace`` then)."""
    import shlex

    traces = list(dict.fromkeys(row["trace"] for row in report.finished_rows if row.get("error") is None))
    head = ["allocsim", "winners", report.output]
    if len(traces) <= 1:
        return [shlex.join(head)]
    return [shlex.join([*head, "--trace", trace]) for trace in traces]


def _text_report(report) -> str:
    from ..sweep.failures import format_error_groups

    lines = [line for line in map(capacity_text, report.capacities) if line]
    lines += [f"{report.rows} of {report.expected} rows in {report.output} "
             f"({report.computed} computed, {report.skipped} from the journal, {report.errors} with errors) "
             f"in {report.wall_seconds:.1f} s on {report.executor}"]
    lines += format_error_groups(report.error_groups())
    for failure in report.failed[:10]:
        lines.append(f"  not finished: {failure}")
    if report.failed:
        lines.append(f"{len(report.failed)} rows did not finish; rerun the same command to retry them")
    if report.rows > report.errors:
        lines += [f"next: {command}" for command in next_commands(report)]
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    """Build the grid (exit 2 on bad input), run the sweep, print the report."""
    from ..sweep import build_configs, executor_from_options, run_sweep

    try:
        from ..sweep.results import check_results_output

        check_results_output(args.output)
        configs = build_configs(args.policy, args.grid, args.settings, args.grid_file)
        capacity = parse_bytes(args.capacity, round_down=True) if args.capacity is not None else None
        cost_model = cost_model_from_args(args)
        executor = executor_from_options(args.workers, args.scheduler, args.dask)
        progress = not args.json and sys.stderr.isatty()
        report = run_sweep(args.traces, configs, output=args.output, capacity_bytes=capacity, device=args.device,
                           fast=args.fast, executor=executor, retry_errors=args.retry_errors, progress=progress,
                           cost_model=cost_model, infer_capacity=capacity is None, lenient=args.lenient,
                           limits=trace_limits(args))
    except (AllocsimError, ValueError, OSError) as exc:
        print(f"allocsim sweep: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"allocsim sweep: interrupted; finished rows are kept in {args.output}.parts "
              "(rerun the same command to resume)", file=sys.stderr)
        return 130
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(_text_report(report))
    return 0 if report.complete and not report.errors else 1
