"""``allocsim convert TRACE -o OUT.parquet``: any supported trace into allocsim's own lossless format."""

from __future__ import annotations

import argparse
import gzip
import os
import sys

from ..output_file import check_output_file
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
    check_output_file(path, ours=written_by_convert, what="a file allocsim convert wrote")


def written_by_convert(path: str) -> bool:
    """True for a file ``convert`` wrote (allocsim Parquet, or CSV starting ``# allocsim``), which it may replace."""
    try:
        if path.endswith(".parquet"):
            from ..trace.formats.native import open_parquet

            return b"allocsim" in (open_parquet(path, os.path.getsize(path)).schema_arrow.metadata or {})
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rb") as fh:
            return fh.read(len(b"# allocsim")) == b"# allocsim"
    except Exception:  # noqa: BLE001 - anything unreadable is not one of ours
        return False


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
