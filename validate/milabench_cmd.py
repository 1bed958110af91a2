"""``python -m validate milabench``: allocsim's CPU capture + the GPU's own memory against milabench's measured tables."""

from __future__ import annotations

import argparse
import json
import os
import sys

from . import milabench


def register(subparsers) -> None:
    """Add the ``milabench`` subcommand."""
    parser = subparsers.add_parser(
        "milabench", help="capture milabench's benchmarks on the CPU and compare with its measured GPU memory",
        description=milabench.__doc__.split("\n")[0])
    parser.add_argument("--set", choices=("check", "calibrate", "all"), default="all",
                        help="rows to evaluate (default: all; calibrate: L40S and A100 tables, check: H100, H200)")
    parser.add_argument("--calibrate", action="store_true",
                        help="fit the context and cuDNN terms on the calibrate rows and write "
                             "validate/milabench_calibration.json, then evaluate --set")
    parser.add_argument("--card", action="append", default=None, metavar="CARD",
                        help="only the rows of this card (L40S, A100-SXM4-80GB, H100, H200; repeatable)")
    parser.add_argument("--work", default="milabench-work", metavar="DIR", help="where captures are kept and reused")
    parser.add_argument("--python", default=sys.executable, metavar="PYTHON",
                        help="the interpreter that runs the benchmark scripts (torch, torchvision, transformers "
                             "4.49); default: this one")
    parser.add_argument("--jobs", type=int, default=2, help="captures at a time (default 2)")
    parser.add_argument("--extract", metavar="GITDIR",
                        help="rebuild validate/milabench_rows.json from a milabench clone (bare works) and stop")
    parser.add_argument("--summary", action="store_true",
                        help="one line per card and benchmark instead of one per row")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.set_defaults(func=main)


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def main(args: argparse.Namespace) -> int:
    """Extract, calibrate or evaluate, and print the tables."""
    if args.extract:
        data = milabench.extract(args.extract)
        milabench.dump_rows(data)
        usable = sum(milabench.usable(r) for r in data["rows"])
        print(f"{len(data['rows'])} rows ({usable} reproduced) written to validate/milabench_rows.json")
        return 0
    data = milabench.load()
    rows = milabench.select(data["rows"], "all")
    if args.card:
        rows = [r for r in rows if r["card"] in args.card]
    calibration = None
    if args.calibrate:
        calibration = milabench.calibrate(rows, args.work, args.python, args.jobs, _log)
        with open(milabench.CALIBRATION_PATH, "w", encoding="utf-8") as fh:
            json.dump(calibration, fh, indent=1)
        ranges = calibration["ranges"]
        print(f"terms written to validate/milabench_calibration.json\n\n{milabench.format_terms(calibration)}\n")
        print(f"ranges: context0 {ranges['context0_low_bytes'] / milabench.MiB:.0f} to "
              f"{ranges['context0_high_bytes'] / milabench.MiB:.0f} MiB; cuDNN {ranges['cudnn_share_low']:+.1%} to "
              f"{ranges['cudnn_share_high']:+.1%} of the reserved peak\n")
    elif os.path.exists(milabench.CALIBRATION_PATH):
        with open(milabench.CALIBRATION_PATH, encoding="utf-8") as fh:
            calibration = json.load(fh)
    chosen = [r for r in rows if args.set == "all" or r["set"] == args.set]
    results = milabench.evaluate(chosen, args.work, args.python, args.jobs, calibration, _log)
    if args.json:
        print(json.dumps({"results": results, "calibration": calibration}, indent=1, default=str))
        return 0
    if calibration and not args.calibrate:
        print(milabench.format_terms(calibration) + "\n")
    print(milabench.format_summary(results) if args.summary else milabench.format_tables(results))
    if calibration and calibration.get("ranges"):
        from . import milabench_ranges

        print("\nThe ranges (low and high end of every unknown term):\n")
        print(milabench_ranges.format_range_summary(results))
        wrong = milabench_ranges.false_fits_on_models([r for r in results if r["set"] == "check"])
        print(f"\ncheck rows x GPU models where allocsim says FITS and the real run needs more: {len(wrong)}"
              + "".join(f"\n  {w['row']} on {w['gpu']}" for w in wrong[:20]))
    for which in ("calibrate", "check"):
        s = milabench.summarize([r for r in results if r["set"] == which])
        if s["rows"]:
            print(f"\nall {which} rows ({s['rows']}): median absolute error {s['median_abs_error']:.1%}, worst "
                  f"{s['worst_error']:+.1%} ({s['worst_row']}), more than 5% below the truth: {s['under_5pct']}")
    failed = [r for r in results if "failed" in r]
    for r in failed:
        print(f"capture failed: {r['card']} {r['benchmark']} {r['batch']}: {r['failed'][-200:]}")
    return 0
