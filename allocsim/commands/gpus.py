"""``allocsim gpus``: the GPU models ``run --gpu NAME`` knows, with each figure's source."""

from __future__ import annotations

import argparse

from ..gpus import gpu_rows
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
    print(f"{'GPU':<11} {'sm':>3} {'memory':>11} {'context':>11} {'libraries':>11} {'workspaces':>11} "
          f"{'for tensors':>12}")
    for row in rows:
        print(f"{row['name']:<11} {row['sm']:>3} {format_bytes(row['total_bytes']):>11} "
              f"{format_bytes(row['context_bytes']):>11} {format_bytes(row['library_bytes']):>11} "
              f"{format_bytes(row['workspace_bytes']):>11} {format_bytes(row['allocator_capacity_bytes']):>12}")
    print("sources (allocsim gpus --json has them per GPU):")
    for key, text in rows[0]["sources"].items():
        if key != "total_bytes":
            print(f"  {key}: {text}")
    print("  total_bytes: NVIDIA's nominal memory per product, the RTX 3060's as NVML reported it in xMem's runs")
    return 0
