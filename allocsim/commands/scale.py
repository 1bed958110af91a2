"""``allocsim scale TRACE@VALUE TRACE@VALUE ... --to VALUE -o OUT.parquet``: a trace at an unrun scale.

Reads two or more traces of the same program recorded at different values of one scale parameter,
aligns their allocations, fits each allocation's size as a law of the value and writes the trace at
``--to`` (allocsim Parquet, or CSV when OUT ends in .csv). Prints how it was built (``--json``: one
object). Then ``allocsim run OUT --policy pytorch --capacity 80GiB`` says whether it fits.
"""

from __future__ import annotations

import argparse
import sys

from ..errors import AllocsimError
from ..trace import write_trace
from .common import print_json


def register(subparsers) -> None:
    """Add the ``scale`` subcommand."""
    parser = subparsers.add_parser(
        "scale", help="predict the trace at a batch size / sequence length nobody has run",
        description="Align the allocations of traces recorded at different values of one scale parameter "
                    "(by operator and order within each training step), fit each allocation's size as a "
                    "constant / linear / quadratic law of the value, and write the trace at --to.")
    parser.add_argument("inputs", nargs="+", metavar="TRACE@VALUE",
                        help="a trace and the scale value it was recorded at, e.g. bert_b4.json.gz@4 (two or more)")
    parser.add_argument("--to", required=True, metavar="VALUE", dest="target", help="the scale value to predict")
    parser.add_argument("--name", choices=("batch", "seq"), default="batch",
                        help="what the value is (default batch); with two inputs, seq allows a pure seq^2 law")
    parser.add_argument("-o", "--output", required=True, metavar="OUT", help="output trace (.parquet, .csv, .csv.gz)")
    parser.add_argument("--device", type=int, metavar="N", help="device to use when the traces have several")
    parser.add_argument("--lenient", action="store_true", help="repair what can be repaired in bad input traces")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    """Build, write and report; 2 with one line on stderr on bad input."""
    from ..scale import scale_files

    try:
        result = scale_files(args.inputs, args.target, args.name, device=args.device, lenient=args.lenient)
        write_trace(result.trace, args.output)
    except (AllocsimError, ValueError, OSError) as exc:
        print(f"allocsim scale: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print_json({"output": args.output, **result.report.to_dict()})
    else:
        print(result.report.format_text())
        print(f"\nwrote {args.output}; next: allocsim run {args.output} --policy pytorch --capacity 80GiB")
    return 0
