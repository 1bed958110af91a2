"""``allocsim convert TRACE -o OUT.parquet``: any supported trace into allocsim's own lossless format."""

from __future__ import annotations

import argparse

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
    """Convert ``args.trace`` to ``args.output``."""
    trace = load_trace(args)
    write_trace(trace, args.output)
    print(f"wrote {args.output}: {len(trace.events)} events, {len(trace.initial_allocs)} initial allocations, "
          f"{len(trace.decisions)} recorded decisions")
    return 0
