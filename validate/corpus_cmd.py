"""``python -m validate corpus``: capture public training scripts unchanged and compare with their model arithmetic."""

from __future__ import annotations

import argparse
import json
import sys

from . import corpus


def register(subparsers) -> None:
    """Add the ``corpus`` subcommand."""
    parser = subparsers.add_parser(
        "corpus", help="capture public training scripts unchanged; categories vs model arithmetic; files changed",
        description=corpus.__doc__.split("\n")[0])
    parser.add_argument("--repos", required=True, metavar="DIR",
                        help="folder with each repository's files at the recipe's commit as DIR/OWNER+REPO/")
    parser.add_argument("--python", required=True, metavar="PYTHON",
                        help="the interpreter that runs the scripts (torch, torchvision, transformers, ... as "
                             "the recipes' 'pip' says)")
    parser.add_argument("--work", default="corpus-work", metavar="DIR",
                        help="where each configuration's copy, inputs and capture are kept (default: corpus-work)")
    parser.add_argument("--extract-from", default=None, metavar="GITS",
                        help="first write each recipe's files into --repos from local clones GITS/OWNER+REPO")
    parser.add_argument("--only", nargs="+", default=None, metavar="TEXT",
                        help="only configurations whose name contains TEXT")
    parser.add_argument("--jobs", type=int, default=2, help="captures at a time (default 2)")
    parser.add_argument("--timeout", type=float, default=None, metavar="S",
                        help="each capture's --timeout where its recipe gives none (default 600)")
    parser.add_argument("--fresh", action="store_true", help="capture again even where a capture of the recipe is kept")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    """Capture, compare and print the table (or JSON); exit 1 when a configuration is not clean."""
    table = corpus.load_recipes()
    if args.extract_from:
        for line in corpus.extract(table, args.extract_from, args.repos):
            print(f"extract: {line}", file=sys.stderr)
    rows = corpus.evaluate(table, args.repos, args.work, args.python, args.only, args.jobs, args.timeout, args.fresh)
    summary = corpus.summarize(rows)
    if args.json:
        print(json.dumps({"rows": rows, "summary": summary}, indent=1))
    else:
        print(corpus.format_table(rows))
        print(f"\n{summary['configurations']} configurations: {summary['unchanged']} ran unchanged, "
              f"{summary['complete']} complete traces, {summary['categories_exact']} with parameter, gradient and "
              f"optimizer-state bytes equal to the arithmetic, {summary['files_changed']} changed files")
    clean = summary["complete"] == summary["configurations"] == summary["categories_exact"] and not summary["files_changed"]
    return 0 if clean else 1
