"""``python -m validate xmem``: allocsim's CPU capture + GPU model against xMem's RTX 3060 ground truth."""

from __future__ import annotations

import argparse
import json

from . import xmem


def register(subparsers) -> None:
    """Add the ``xmem`` subcommand."""
    parser = subparsers.add_parser("xmem", help="capture xMem's CNN runs on the CPU and compare with its ground truth",
                                   description=xmem.__doc__.split("\n")[0])
    parser.add_argument("--set", choices=("check", "calibrate", "all"), default="check",
                        help="rows to evaluate (default: check, xMem's 002-Monte Carlo rows)")
    parser.add_argument("--calibrate", action="store_true",
                        help="fit library_bytes on the calibrate rows and write validate/xmem_calibration.json")
    parser.add_argument("--work", default="xmem-work", metavar="DIR", help="where captures are kept and reused")
    parser.add_argument("--jobs", type=int, default=2, help="captures at a time (default 2)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    """Evaluate (or calibrate) and print the table."""
    rows = xmem.load_rows("calibrate" if args.calibrate else args.set)
    results = xmem.evaluate(rows, args.work, "RTX 3060", args.jobs)
    if args.calibrate:
        fitted = xmem.calibrate(results)
        with open(xmem.CALIBRATION_PATH, "w", encoding="utf-8") as fh:
            json.dump(fitted, fh, indent=1)
        print(f"library_bytes = {fitted['library_bytes']} (written to {xmem.CALIBRATION_PATH})")
    if args.json:
        print(json.dumps({"results": results, "summary": xmem.summarize(results)}, indent=1))
    else:
        print(xmem.format_table(results))
    return 0
