"""``allocsim convert TRACE -o OUT.parquet``: any supported trace into allocsim's own lossless format."""

from __future__ import annotations

import argparse
import os
import sys

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


#: What ``convert`` can write, by how OUT ends.
OUTPUT_SUFFIXES = (".parquet", ".csv", ".csv.gz")


def check_output(path: str) -> None:
    """Refuse, before reading anything, an OUT that cannot be written: unknown extension, missing folder."""
    if not path.endswith(OUTPUT_SUFFIXES):
        raise ValueError(f"-o {path}: unknown extension; name the output .parquet, .csv or .csv.gz")
    if os.path.isdir(path):
        raise ValueError(f"-o {path}: is a directory; give a file name")
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder):
        raise ValueError(f"-o {path}: folder {folder} does not exist; create it first")
    if not os.access(folder, os.W_OK):
        raise ValueError(f"-o {path}: folder {folder} is not writable")


def main(args: argparse.Namespace) -> int:
    """Convert ``args.trace`` to ``args.output`` (bad OUT: exit 2 with one line, before reading the trace)."""
    try:
        check_output(args.output)
        trace = load_trace(args)
        write_trace(trace, args.output)
    except OSError as exc:
        print(f"allocsim convert: error: cannot write {args.output}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.output}: {len(trace.events)} events, {len(trace.initial_allocs)} initial allocations, "
          f"{len(trace.decisions)} recorded decisions")
    return 0
