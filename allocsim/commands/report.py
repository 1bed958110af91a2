"""``allocsim report TRACE [--policy P ...] [--capacity SIZE] [--advise] -o report.html``: one offline HTML page.

The page (``allocsim.report``) works opened from disk with no network: the verdict of each policy
first (the line ``allocsim run TRACE --policy P --fast`` ends with), memory by category, recorded vs
simulated timelines that zoom without losing a peak, the segment/block map at the peak of reserved
memory and at the end of each run (hover a block for its size, category, lifetime and stack), the
code-site tables and, with ``--advise``, the settings that fit with their paste-ready lines.
Exit status: 0 the page was written, 4 it was written from a trace that stops before its script's
end (each verdict says ``INCOMPLETE TRACE``; ``--allow-incomplete``: 0), 2 a usage or input error
(one line on stderr).

``build_report`` replays each ``--policy`` exactly as ``allocsim run TRACE --policy P --fast``
replays it (the ``run`` command's own code, so the verdict line is the one ``run`` prints), with its
code sites and categories; ``allocsim.report`` draws the page from what the runs return, with the
segment maps of a second replay (``report.maps``). ``--advise`` adds ``allocsim advise``'s
recommendations.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Callable

from ..errors import AllocsimError
from ..output_file import check_output_file
from ..output_marks import is_report_page
from ..units import parse_bytes
from .common import add_incomplete_arg, add_trace_args, incomplete_status


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
               "exit status: 0 = written, 4 = written from a trace that stops before its script's end (an\n"
               "  incomplete capture; --allow-incomplete: 0), 2 = usage or input error",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_trace_args(parser)
    parser.add_argument("--policy", action="append", metavar="NAME[:SETTINGS]",
                        help="policy to replay (repeatable; default pytorch), as in `allocsim run`")
    parser.add_argument("--capacity", metavar="SIZE", help="device memory (default: what the recording implies)")
    parser.add_argument("--device", type=int, metavar="N", help="device to replay (required if the trace has several)")
    parser.add_argument("--sites", type=int, default=10, metavar="N", help="code sites per table (default 10)")
    parser.add_argument("--advise", action="store_true", help="add the settings that fit (allocsim advise --fast)")
    parser.add_argument("-o", "--out", required=True, metavar="REPORT.html", help="the HTML file to write")
    add_incomplete_arg(parser)
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
    started = time.perf_counter()
    from ..capture_folder import is_capture_folder_path

    if is_capture_folder_path(args.trace):
        from .per_rank import report_folder

        if args.sites < 1:
            print(f"allocsim report: error: --sites must be >= 1, got {args.sites}", file=sys.stderr)
            return 2
        return report_folder(args, build_report, _read_options(args))
    try:
        if args.sites < 1:
            raise ValueError(f"--sites must be >= 1, got {args.sites}")
        check_output_file(args.out, ours=is_report_page, what="a page allocsim report wrote")   # before any work
        html, data = build_report(args.trace, args.policy or ["pytorch"], capacity=args.capacity, device=args.device,
                                  sites=args.sites, advise=args.advise, read_options=_read_options(args))
        with open(args.out, "w", encoding="utf-8", errors="backslashreplace") as fh:
            fh.write(html)
    except (AllocsimError, ValueError, OSError) as exc:
        print(f"allocsim report: error: {exc}", file=sys.stderr)
        return 2
    size = os.path.getsize(args.out)
    for run in data["runs"]:
        print(f"{run['label']}: {run['verdict']}")
    print(f"wrote {args.out} ({size / 2**20:.2f} MiB) in {time.perf_counter() - started:.1f} s")
    return incomplete_status("report", data.get("incomplete_reason") or "", args, 0)


def _run_args(trace_path: str, policy: str, capacity: str | None, device: int | None, sites: int,
              read_options: list[str]) -> argparse.Namespace:
    """The arguments ``allocsim run`` would parse for this policy (``--fast``)."""
    from ..cli import build_parser

    argv = ["run", trace_path, "--policy", policy, "--fast", "--sites", str(sites), *read_options]
    if capacity is not None:
        argv += ["--capacity", capacity]
    if device is not None:
        argv += ["--device", str(device)]
    return build_parser().parse_args(argv)


def build_report(trace_path: str, policies: list[str], *, capacity: str | None = None, device: int | None = None,
                 sites: int = 10, advise: bool = False, read_options: list[str] | None = None,
                 log: Callable[[str], None] = lambda message: None) -> tuple[str, dict[str, Any]]:
    """(the page's HTML, its data) for ``trace_path`` replayed under each of ``policies``."""
    import numpy as np

    from ..engine import select_device
    from ..metrics.categories import categorize
    from ..metrics.sites.rule import SiteFilter, SiteIndex
    from ..report.data import PolicyRun, report_data
    from ..report.maps import segment_maps
    from ..report.page import render
    from ..runner import resolve_capacity
    from .common import load_trace, note_picked_device
    from .run import execute, format_run, resolve_policy

    read_options = list(read_options or [])
    first = _run_args(trace_path, policies[0], capacity, device, sites, read_options)
    trace = load_trace(first)
    note_picked_device("report", trace, device)
    trace = select_device(trace, device)
    from ..metrics.state import is_state_only

    if is_state_only(trace):
        raise ValueError(f"{trace.meta.source or trace_path} records the final state only, no history to replay: "
                         f"`allocsim run {trace_path} --policy pytorch` reports that state")
    runs = []
    for text in policies:
        args = _run_args(trace_path, text, capacity, device, sites, read_options)
        log(f"replaying {text}")
        result = execute(args, trace)
        name, params = resolve_policy(args.policy, args.settings, args.alloc_conf, args.env_alloc_conf)
        verdict = format_run(result).rpartition("\n")[2]
        cap = resolve_capacity(trace, None if capacity is None else parse_bytes(capacity, round_down=True))
        runs.append(PolicyRun(label=text, result=result, verdict_line=verdict,
                              maps=segment_maps(trace, name, params, cap.bytes, result.summary)))
    categories = categorize(trace)
    index = SiteIndex(trace, SiteFilter())
    program = index._program
    advice = advice_text = None
    if advise:
        log("searching the allocator's settings (advise)")
        advice, advice_text = _advise(trace_path, policies[0], capacity, device)
    data = report_data(trace, runs, categories, np.asarray(program, dtype=bool), advice, advice_text)
    if trace.meta.incomplete:        # each run's verdict line says so already (run's own code)
        data["incomplete_reason"] = trace.meta.incomplete
    return render(data), data


def _advise(trace_path: str, policy: str, capacity: str | None, device: int | None) -> tuple[dict, str]:
    """``allocsim advise --fast``'s JSON object and text for the first policy's allocator."""
    from ..advise.advice import advise
    from ..advise.report import advice_to_dict, format_advice
    from ..settings.alloc_conf import parse_policy_spec
    name = parse_policy_spec(policy).name
    advice = advise(trace_path, policy=name if name in ("pytorch", "paddle", "cupy") else "pytorch",
                    capacity_bytes=parse_bytes(capacity, round_down=True) if capacity else None, device=device, fast=True,
                    progress=False, log=lambda message: None)
    return advice_to_dict(advice), format_advice(advice)
