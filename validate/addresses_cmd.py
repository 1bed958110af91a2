"""``python -m validate addresses FILE... [--json]``: where the driver put cudaMalloc segments in real snapshots."""

from __future__ import annotations

import argparse
import json

from .addresses import format_measure, measure


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``addresses`` subcommand."""
    parser = subparsers.add_parser(
        "addresses", help="measure where the CUDA driver placed cudaMalloc segments in PyTorch snapshots, and "
                          "how well each address order predicts the recorded tie-breaks",
        description="Count, in PyTorch memory snapshots, where each recorded cudaMalloc landed against the "
                    "segments live before it, the final segments' alignment, files of one process compared in "
                    "pairs, and replays with the segments placed by the simulated device in each address order.")
    parser.add_argument("files", nargs="+", metavar="FILE", help="snapshot pickles")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    """Measure and print; exit 0."""
    report = measure(args.files)
    print(json.dumps(report) if args.json else format_measure(report))
    return 0
