"""``python -m validate snapshots``: capture the scripts behind the shared GPU snapshots and compare peaks."""

from __future__ import annotations

import argparse
import json

from . import snapshot_captures as sc


def register(subparsers) -> None:
    """Add the ``snapshots`` subcommand."""
    parser = subparsers.add_parser(
        "snapshots", help="capture the public scripts that wrote the shared scale-series snapshots and compare",
        description=sc.__doc__.split("\n")[0])
    parser.add_argument("--repos", required=True, metavar="DIR",
                        help="folder with each repository's files at the recipe's commit as DIR/OWNER+REPO/")
    parser.add_argument("--work", default="snapshot-work", metavar="DIR",
                        help="where captures are kept and reused (default: snapshot-work)")
    parser.add_argument("--shared", default=str(sc.DEFAULT_SHARED), metavar="DIR",
                        help="the shared data folder holding traces/scale-series/ (default: ../shared)")
    parser.add_argument("--extract-from", default=None, metavar="GITS",
                        help="first write each recipe's files into --repos from local clones GITS/OWNER+REPO "
                             "(bare or not, or with the clone in a 'repo' subfolder)")
    parser.add_argument("--only", nargs="+", default=None, metavar="TEXT",
                        help="only snapshots whose file name contains TEXT or whose series is TEXT")
    parser.add_argument("--jobs", type=int, default=2, help="captures at a time (default 2)")
    parser.add_argument("--timeout", type=float, default=None, metavar="S",
                        help="stop each capture after S seconds (what it recorded is kept)")
    parser.add_argument("--explain", type=int, default=0, metavar="N",
                        help="for each row off target, the first N places where the window's allocations differ")
    parser.add_argument("--explain-all", action="store_true", help="--explain every row, on target or not")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    """Capture, compare and print the table (or JSON)."""
    table = sc.load_recipes()
    if args.extract_from:
        for line in sc.extract_all(table, args.extract_from, args.repos):
            print(f"extract: {line}")
    rows = sc.evaluate(table, args.repos, args.work, args.shared, args.only, args.jobs, args.timeout,
                       args.explain or (5 if args.explain_all else 0), args.explain_all)
    if args.json:
        print(json.dumps({"rows": rows, "summary": sc.summarize(rows)}, indent=1))
    else:
        print(sc.format_table(rows))
        text = sc.format_divergences(rows)
        if text:
            print("\nWhere the windows differ (allocation sizes aligned in order, real vs capture):" + text)
    return 0
