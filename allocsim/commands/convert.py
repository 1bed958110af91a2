"""``allocsim convert TRACE -o OUT.parquet``: any supported trace into allocsim's own lossless format."""

from __future__ import annotations

import argparse
import sys

from ..output_file import check_trace_output
from ..trace import write_trace
from .common import add_trace_args, load_trace


def register(subparsers) -> None:
    """Add the ``convert`` subcommand."""
    parser = subparsers.add_parser("convert", help="convert a trace to allocsim Parquet (or CSV)",
                                   description="Read any supported trace and write it as allocsim Parquet "
                                               "(or CSV when OUT ends in .csv / .csv.gz), keeping initial state, "
                                               "recorded decisions and metadata.")
    add_trace_args(parser)
    parser.add_argument("-o", "--output", required=True, metavar="OUT", help="output path (.parquet, .csv, .csv.gz)")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    """Convert ``args.trace`` to ``args.output`` (bad OUT: exit 2 with one line, before reading the trace)."""
    try:
        check_trace_output(args.output)      # before reading: a bad OUT costs nothing
        trace = load_trace(args)
        write_trace(trace, args.output)
    except OSError as exc:
        print(f"allocsim convert: error: cannot write {args.output}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.output}: {len(trace.events)} events, {len(trace.initial_allocs)} initial allocations, "
          f"{len(trace.decisions)} recorded decisions")
    return 0
