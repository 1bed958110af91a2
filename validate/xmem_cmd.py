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
                        help="fit the cuDNN workspace ratio and library_bytes on the calibrate rows and write "
                             "validate/xmem_calibration.json")
    parser.add_argument("--workspace-ratio", type=float, default=None, metavar="R",
                        help="evaluate with cuDNN workspaces at ratio R of the feature map (default: the calibrated "
                             "one; 0: none)")
    parser.add_argument("--work", default="xmem-work", metavar="DIR", help="where captures are kept and reused")
    parser.add_argument("--jobs", type=int, default=2, help="captures at a time (default 2)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    """Evaluate (or calibrate) and print the table."""
    if args.workspace_ratio is not None and not 0 <= args.workspace_ratio <= 100:
        print(f"validate xmem: error: --workspace-ratio must be in [0, 100], got {args.workspace_ratio}")
        return 2
    rows = xmem.load_rows("calibrate" if args.calibrate else args.set)
    if args.calibrate:
        fitted = xmem.calibrate(rows, args.work, "RTX 3060", args.jobs)
        with open(xmem.CALIBRATION_PATH, "w", encoding="utf-8") as fh:
            json.dump(fitted, fh, indent=1)
        print(f"cudnn_workspace_ratio = {fitted['cudnn_workspace_ratio']:g}, library_bytes = "
              f"{fitted['library_bytes']} (written to {xmem.CALIBRATION_PATH}; put them in "
              "allocsim.torch_capture.cudnn and allocsim.gpus)")
        for trial in fitted["trials"]:
            print(f"  ratio {trial['ratio']:g}: mean error {trial['mean_error']:.1%}, median "
                  f"{trial['median_error']:.1%}, library_bytes {trial['library_bytes']}, errors "
                  + ", ".join(f"{e:.1%}" for e in trial["errors"]))
        return 0
    results = xmem.evaluate(rows, args.work, "RTX 3060", args.jobs, args.workspace_ratio)
    if args.json:
        print(json.dumps({"results": results, "summary": xmem.summarize(results)}, indent=1))
    else:
        print(xmem.format_table(results))
    return 0
