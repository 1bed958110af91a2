"""``allocsim info TRACE``: counts, streams, devices, time span, live-byte peaks and allocation sites of a trace.

The top allocation sites (``--sites N``, ``--site-filter PATHS``; JSON ``sites``) count every
allocation of the trace, start state included, by the innermost frame of the program that made it:
by bytes allocated and by number of allocations (``allocsim.metrics.sites.rows.allocation_sites``).

A snapshot with a recorded state and no history (dumped without ``_record_memory_history``) also
gets the state report of ``allocsim.metrics.state`` (JSON: ``state``): reserved, allocated and free
bytes by cause per device, and with ``--request SIZE`` whether that failed request was fragmentation
or exhaustion.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..units import format_bytes, parse_bytes
from .common import add_trace_args, load_trace, print_json, select_device


def register(subparsers) -> None:
    """Add the ``info`` subcommand."""
    parser = subparsers.add_parser("info", help="what is in a trace: counts, streams, devices, peaks",
                                   description="Summarise a trace: format, events, allocations, frees, streams, "
                                               "devices, time span and live-byte peaks.")
    add_trace_args(parser)
    parser.add_argument("--device", type=int, help="only this device (default: all, and one section per device)")
    add_state_args(parser)
    add_site_args(parser)
    parser.add_argument("--capacity", metavar="SIZE",
                        help="snapshot without history: the device's memory, to judge --request against it")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=main)


def add_state_args(parser: argparse.ArgumentParser) -> None:
    """Add ``--request SIZE``: the failed request the state report of a snapshot without history judges."""
    parser.add_argument("--request", metavar="SIZE",
                        help="snapshot without history: the request that failed (the 'Tried to allocate' of the "
                             "error), to tell fragmentation from exhaustion (default: the snapshot's oom entry)")


def add_site_args(parser: argparse.ArgumentParser, what: str = "list") -> None:
    """Add ``--sites N`` and ``--site-filter PATHS`` (code sites: the innermost frame of the program)."""
    from ..metrics.sites.rule import DEFAULT_SKIP, RULE

    parser.add_argument("--sites", type=int, default=10, metavar="N",
                        help=f"code sites to {what} before 'other sites' (default 10; 0: no code sites). "
                             + RULE[0].upper() + RULE[1:].format(skip=", ".join(DEFAULT_SKIP)))
    parser.add_argument("--site-filter", action="append", metavar="PATHS",
                        help="more paths whose frames are not your program's (comma-separated, repeatable; a path "
                             "matches from a directory boundary, e.g. transformers/ or /home/me/lib/); 'none' drops "
                             f"the defaults ({', '.join(DEFAULT_SKIP)}; <stdlib> is Python's standard library)")


def site_options(args: argparse.Namespace) -> tuple[Any, int]:
    """(``SiteFilter``, how many sites) from ``--site-filter`` / ``--sites``; ``ValueError`` on bad values."""
    from ..metrics.sites.rule import SiteFilter

    if args.sites < 0:
        raise ValueError(f"--sites must be >= 0, got {args.sites}")
    return SiteFilter.parse(args.site_filter), args.sites


def state_options(args: argparse.Namespace) -> dict:
    """``request_bytes``, ``capacity_bytes`` (and the site options) for ``state_report`` from the command line."""
    request = getattr(args, "request", None)
    capacity = getattr(args, "capacity", None)
    out = {"request_bytes": parse_bytes(request, round_down=True) if request is not None else None,
           "capacity_bytes": parse_bytes(capacity, round_down=True) if capacity is not None else None}
    if hasattr(args, "sites"):
        out["site_filter"], out["top_sites"] = site_options(args)
    return out


def main(args: argparse.Namespace) -> int:
    """Print the summary of ``args.trace`` (and the recorded state of a snapshot without history)."""
    from ..metrics.categories import trace_categories
    from ..metrics.sites.rows import allocation_sites
    from ..metrics.state import format_state_report, is_state_only, state_report
    from ..trace.inference.stats import counted_part, summarize

    options = state_options(args)
    trace = load_trace(args)
    selected = select_device(trace, args.device)
    summary = summarize(selected)
    if args.device is None and len(trace.devices) > 1:
        summary["per_device"] = {str(d): summarize(trace.for_device(d)) for d in trace.devices}
    state = state_report(selected, **options) if is_state_only(selected) else None
    if state is not None:
        summary["state"] = state
    else:
        if len(selected.devices) <= 1 and len(selected):
            summary["categories"] = trace_categories(selected, options["site_filter"])
        if args.sites > 0:
            # The same memory as the byte figures: host allocations are not added to a GPU's sites.
            counted = counted_part(selected)
            summary["sites"] = allocation_sites(counted, top=args.sites, site_filter=options["site_filter"])
            if counted is not selected:
                summary["sites"]["counted"] = "GPU allocations only: host memory is another memory"
    if args.json:
        print_json(summary)
    else:
        print(format_summary({k: v for k, v in summary.items() if k not in ("state", "sites", "categories")}))
        if "categories" in summary:
            print()
            print(format_trace_categories(summary["categories"]))
        if state is not None:
            print()
            print(format_state_report(state))
        if "sites" in summary:
            print()
            print(format_allocation_sites(summary["sites"]))
    return 0


def format_trace_categories(categories: dict[str, Any]) -> str:
    """The trace's live bytes at its peak by memory category, then the rules and their evidence."""
    from ..metrics.categories import format_rules, format_split

    peak = categories["moments"]["at_peak"]
    lines = [f"Memory by category at the peak of live bytes: {format_split(categories['at_peak'], peak['bytes'])}",
             "  rules (first match wins; allocations and bytes each decided over the whole trace):"]
    return "\n".join(lines + format_rules(categories["rules"]))


def format_allocation_sites(sites: dict[str, Any]) -> str:
    """The top allocation sites by bytes and by count, as text."""
    from ..metrics.sites.report import format_rows, skipped_words

    counted = f", {sites['counted']}" if sites.get("counted") else ""
    lines = [f"Allocation sites: {sites['allocations']:,} allocations by the innermost frame of the program "
             f"({skipped_words(sites)}){counted}"]
    if sites.get("note"):
        lines.append(f"  note: {sites['note']}")
    lines.append("  by bytes allocated")
    lines += format_rows(sites["by_bytes"])
    lines.append("  by number of allocations")
    lines += format_rows(sites["by_count"])
    return "\n".join(lines)


_BYTE_KEYS = ("peak_live_bytes", "baseline_live_bytes", "peak_live_with_baseline_bytes", "peak_demand_bytes",
              "initial_reserved_bytes")


def format_summary(summary: dict, indent: str = "") -> str:
    """Render ``summarize()`` output as aligned text lines."""
    lines = []
    for key, value in summary.items():
        if key == "per_device":
            for device, sub in value.items():
                lines.append(f"{indent}device {device}:")
                lines.append(format_summary({k: v for k, v in sub.items() if k not in ("file", "format", "incomplete")},
                                            indent + "  "))
            continue
        if key in ("repairs", "notes") and not value:
            continue
        if key in _BYTE_KEYS:
            if value is None:     # several GPUs: only per device (bytes_counted says so)
                continue
            value = f"{value:,} ({format_bytes(value)})"
        elif key == "time_span_ns":
            value = f"{value:,} ns ({value / 1e9:.3f} s)"
        elif isinstance(value, list) and key in ("repairs", "notes"):
            value = "\n" + "\n".join(f"{indent}  - {line}" for line in value)
        elif key == "recorded":
            if not value:
                continue
            value = "\n" + "\n".join(f"{indent}  device {device}: {_recorded_line(run)}" for device, run in value.items())
        lines.append(f"{indent}{key:<30} {value}")
    return "\n".join(lines)


def _recorded_line(run: dict[str, Any]) -> str:
    """What the recording proves about one device's real run, in one line."""
    def b(key: str) -> str:
        return format_bytes(run[key]) if run.get(key) is not None else "-"

    reserved = [run.get(k) for k in ("start_reserved_bytes", "peak_reserved_bytes", "final_reserved_bytes")]
    if reserved == [None, None, None]:
        # Paddle's host places (paddle-host): their current_reserved counts only what the host allocator caches.
        parts = [f"{run.get('allocator', 'unknown')} allocator; reserved bytes not recorded"]
    elif reserved[0] is None and reserved[1] is None:
        parts = [f"{run.get('allocator', 'unknown')} allocator; reserved {b('final_reserved_bytes')} when the "
                 "snapshot was taken (no history: the start and the peak of the run are unknown)"]
    else:
        parts = [f"{run.get('allocator', 'unknown')} allocator; reserved at start {b('start_reserved_bytes')}, "
                 f"peak {b('peak_reserved_bytes')}, end {b('final_reserved_bytes')}"]
    if run.get("peak_allocated_bytes") is not None:
        parts.append(f"peak allocated {b('peak_allocated_bytes')}")
    calls = [f"{run[k]:,} {name}" for k, name in (("segment_allocs", "cudaMalloc"), ("segment_frees", "cudaFree"),
                                                 ("segment_maps", "page maps"), ("segment_unmaps", "page unmaps"))
             if run.get(k)]
    if calls:
        parts.append(", ".join(calls))
    if run.get("empty_cache_calls"):
        parts.append(f"{run['empty_cache_calls']:,} empty_cache() calls")
    if run.get("oom_path_releases"):
        parts.append(f"{run['oom_path_releases']:,} releases on the out-of-memory path")
    if run.get("ooms"):
        parts.append(f"{run['ooms']:,} OOMs")
    if run.get("capacity_bytes") is not None:
        proven = run.get("capacity_range")
        if proven is not None and proven[1] != proven[0]:   # only a lower bound: say so, with the range
            from ..metrics.verdict import proven_range_text

            parts.append(f"capacity at least {b('capacity_bytes')} (the recording proves "
                         f"{proven_range_text(proven)}: {run.get('capacity_source')})")
        else:
            parts.append(f"capacity {b('capacity_bytes')} ({run.get('capacity_source')})")
    return "; ".join(parts)
