"""``allocsim gpus``: the GPU models ``run --gpu NAME`` knows, with each figure's source."""

from __future__ import annotations

import argparse

from ..gpus import gpu_rows, lowest_recorded_ratio
from ..units import format_bytes
from .common import print_json


def register(subparsers) -> None:
    """Add the ``gpus`` subcommand."""
    parser = subparsers.add_parser("gpus", help="list the GPU models run --gpu accepts",
                                   description="List the GPU models `allocsim run --gpu NAME` accepts: memory, "
                                               "CUDA context, libraries and cuBLAS workspaces, each with its source.")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    """Print the GPU table."""
    rows = gpu_rows()
    if args.json:
        print_json({"gpus": rows})
        return 0
    print(f"{'GPU':<11} {'sm':>3} {'memory':>11} {'recorded':>8} {'context':>11} {'libraries':>11} "
          f"{'workspaces':>11} {'for tensors':>12}  context range")
    for row in rows:
        print(f"{row['name']:<11} {row['sm']:>3} {format_bytes(row['total_bytes']):>11} "
              f"{'yes' if row['total_verified'] else 'no':>8} "
              f"{format_bytes(row['context_bytes']):>11} {format_bytes(row['library_bytes']):>11} "
              f"{format_bytes(row['workspace_bytes']):>11} {format_bytes(row['allocator_capacity_bytes']):>12}  "
              f"{format_bytes(row['context_low_bytes'])} to {format_bytes(row['context_high_bytes'])}")
    print("context range: the least and the most the CUDA context and loaded kernels took on the calibrated cards "
          "and library versions; a verdict says FITS only when the run fits with the most (allocsim.gpu_ranges)")
    print("sources (allocsim gpus --json has them per GPU):")
    for key, text in rows[0]["sources"].items():
        if key != "total_bytes":
            print(f"  {key}: {text}")
    print("  total_bytes: what a real card reported (CUDA totalGlobalMem, recorded: yes), the lowest recording "
          "kept; else the product label (recorded: no), where a fit above "
          f"{float(lowest_recorded_ratio()):.2%} of the label is not proven")
    return 0
