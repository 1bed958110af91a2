"""``allocsim report TRACE [--policy P ...] [--capacity SIZE] [--advise] -o report.html``: one offline HTML page.

The page (``allocsim.report``) works opened from disk with no network: the verdict of each policy
first (the line ``allocsim run TRACE --policy P --fast`` ends with), memory by category, recorded vs
simulated timelines that zoom without losing a peak, the segment/block map at the peak of reserved
memory and at the end of each run (hover a block for its size, category, lifetime and stack), the
code-site tables and, with ``--advise``, the settings that fit with their paste-ready lines.
Exit status: 0 the page was written, 2 a usage or input error (one line on stderr).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from ..errors import AllocsimError
from .common import add_trace_args


def register(subparsers) -> None:
    """Add the ``report`` subcommand."""
    parser = subparsers.add_parser(
        "report", help="one self-contained HTML page of a trace's replays (works offline)",
        description="Replay TRACE under each --policy (as `allocsim run --fast` does) and write one HTML file "
                    "with everything inline: verdicts first, memory by category, recorded vs simulated "
                    "timelines, segment/block maps with stacks on hover, code sites, and (--advise) the "
                    "settings that fit.",
        epilog="examples:\n"
               "  allocsim report snapshot.pickle -o report.html\n"
               "  allocsim report snapshot.pickle --policy pytorch --policy pytorch:expandable_segments:True \\\n"
               "      --capacity 20GiB --advise -o report.html\n"
               "exit status: 0 = written, 2 = usage or input error",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_trace_args(parser)
    parser.add_argument("--policy", action="append", metavar="NAME[:SETTINGS]",
                        help="policy to replay (repeatable; default pytorch), as in `allocsim run`")
    parser.add_argument("--capacity", metavar="SIZE", help="device memory (default: what the recording implies)")
    parser.add_argument("--device", type=int, metavar="N", help="device to replay (required if the trace has several)")
    parser.add_argument("--sites", type=int, default=10, metavar="N", help="code sites per table (default 10)")
    parser.add_argument("--advise", action="store_true", help="add the settings that fit (allocsim advise --fast)")
    parser.add_argument("-o", "--out", required=True, metavar="REPORT.html", help="the HTML file to write")
    parser.set_defaults(func=main)


def _read_options(args: argparse.Namespace) -> list[str]:
    out = ["--lenient"] if args.lenient else []
    for item in args.limits or []:
        out += ["--limits", item]
    if args.max_events is not None:
        out += ["--max-events", str(args.max_events)]
    if args.max_decompressed is not None:
        out += ["--max-decompressed", str(args.max_decompressed)]
    return out


def main(args: argparse.Namespace) -> int:
    """Build the page and write it; 0 when written, 2 on bad input."""
    from ..report import build_report

    started = time.perf_counter()
    try:
        if args.sites < 1:
            raise ValueError(f"--sites must be >= 1, got {args.sites}")
        out_dir = os.path.dirname(os.path.abspath(args.out))
        if not os.path.isdir(out_dir):
            raise ValueError(f"-o {args.out}: folder {out_dir} does not exist")
        html, data = build_report(args.trace, args.policy or ["pytorch"], capacity=args.capacity, device=args.device,
                                  sites=args.sites, advise=args.advise, read_options=_read_options(args))
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write(html)
    except (AllocsimError, ValueError, OSError) as exc:
        print(f"allocsim report: error: {exc}", file=sys.stderr)
        return 2
    size = os.path.getsize(args.out)
    for run in data["runs"]:
        print(f"{run['label']}: {run['verdict']}")
    print(f"wrote {args.out} ({size / 2**20:.2f} MiB) in {time.perf_counter() - started:.1f} s")
    return 0
