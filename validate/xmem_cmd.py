"""``python -m validate xmem``: allocsim's CPU capture + GPU model against xMem's RTX 3060 ground truth."""

from __future__ import annotations

import argparse
import json

from allocsim.output_file import write_output

from . import xmem


def register(subparsers) -> None:
    """Add the ``xmem`` subcommand."""
    parser = subparsers.add_parser("xmem", help="capture xMem's CNN runs on the CPU and compare with its ground truth",
                                   description=xmem.__doc__.split("\n")[0])
    parser.add_argument("--set", choices=("check", "calibrate", "all"), default="check",
                        help="rows to evaluate (default: check, xMem's 002-Monte Carlo rows)")
    parser.add_argument("--calibrate", action="store_true",
                        help="fit the two cuDNN workspace ratios and library_bytes on the calibrate rows and write "
                             "validate/xmem_calibration.json")
    parser.add_argument("--workspace-ratio", default=None, metavar="R[,P]",
                        help="evaluate with cuDNN workspaces at ratio R of the feature map for kernels larger than "
                             "1x1 and P of the gradient for 1x1 backward data (R alone: both; default: the "
                             "calibrated ones; 0: none)")
    parser.add_argument("--breakdown", action="store_true",
                        help="per row: allocated and reserved peaks without cuDNN workspaces, what the workspaces "
                             "add, and the gap left to the ground truth (replayed in this process)")
    parser.add_argument("--work", default="xmem-work", metavar="DIR", help="where captures are kept and reused")
    parser.add_argument("--jobs", type=int, default=2, help="captures at a time (default 2)")
    parser.add_argument("--python", default=None, metavar="PYTHON",
                        help="the interpreter that runs the training script (torch and torchvision; default: this one)")
    parser.add_argument("--milabench-terms", action="store_true",
                        help="also show each row with the cuDNN term fitted on milabench's calibrate rows "
                             "(validate/milabench_calibration.json) added, beside xMem's own Anova fit")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    """Evaluate (or calibrate) and print the table."""
    ratios = None
    if args.workspace_ratio is not None:
        try:
            values = [float(v) for v in args.workspace_ratio.split(",")]
            if len(values) > 2 or not all(0 <= v <= 100 for v in values):
                raise ValueError
        except ValueError:
            print(f"validate xmem: error: --workspace-ratio must be R or R,P with numbers in [0, 100], "
                  f"got {args.workspace_ratio!r}")
            return 2
        ratios = xmem.as_ratios_pair(values[0], values[-1])
    if args.python:
        xmem.PYTHON = args.python
    rows = xmem.load_rows("calibrate" if args.calibrate else args.set)
    if args.calibrate:
        fitted = xmem.calibrate(rows, args.work, "RTX 3060", args.jobs)
        # Asked for (--calibrate): the repository's own file, replaced through the one output check.
        write_output(xmem.CALIBRATION_PATH, json.dumps(fitted, indent=1), option="--calibrate")
        best = fitted["cudnn_workspace_ratios"]
        print(f"cudnn_workspace_ratios = {best['kernel']:g},{best['pointwise_data']:g}, library_bytes = "
              f"{fitted['library_bytes']} (written to {xmem.CALIBRATION_PATH}; put them in "
              "allocsim.torch_capture.cudnn and allocsim.gpus)")
        for trial in sorted(fitted["trials"], key=lambda t: t["mean_error"])[:10]:
            print(f"  ratios {trial['ratios'][0]:g},{trial['ratios'][1]:g}: mean error {trial['mean_error']:.1%}, "
                  f"median {trial['median_error']:.1%}, library_bytes {trial['library_bytes']}, errors "
                  + ", ".join(f"{e:.1%}" for e in trial["errors"]))
        return 0
    if args.breakdown:
        parts = xmem.breakdown(rows, args.work, "RTX 3060", args.jobs, ratios)
        if args.json:
            print(json.dumps(parts, indent=1))
        else:
            print(xmem.format_breakdown(parts))
            reruns = xmem.format_reruns(rows)
            if reruns:
                print("\nxMem's reruns of the same configuration (nearest candidate peak, see xmem.rerun_peaks):\n"
                      + reruns)
        return 0
    results = xmem.evaluate(rows, args.work, "RTX 3060", args.jobs, ratios)
    if args.json:
        print(json.dumps({"results": results, "summary": xmem.summarize(results)}, indent=1))
    else:
        print(xmem.format_table(results))
        if args.milabench_terms:
            print("\n" + xmem.format_with_cudnn_term(results))
    return 0
