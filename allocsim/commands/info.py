"""``allocsim info TRACE``: counts, streams, devices, time span and live-byte peaks of a trace.

A snapshot with a recorded state and no history (dumped without ``_record_memory_history``) also
gets the state report of ``allocsim.metrics.state`` (JSON: ``state``): reserved, allocated and free
bytes by cause per device, and with ``--request SIZE`` whether that failed request was fragmentation
or exhaustion.
"""

from __future__ import annotations

import argparse

from ..metrics.state import format_state_report, is_state_only, state_report
from ..trace.stats import summarize
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
    parser.add_argument("--capacity", metavar="SIZE",
                        help="snapshot without history: the device's memory, to judge --request against it")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=main)


def add_state_args(parser: argparse.ArgumentParser) -> None:
    """Add ``--request SIZE``: the failed request the state report of a snapshot without history judges."""
    parser.add_argument("--request", metavar="SIZE",
                        help="snapshot without history: the request that failed (the 'Tried to allocate' of the "
                             "error), to tell fragmentation from exhaustion (default: the snapshot's oom entry)")


def state_options(args: argparse.Namespace) -> dict:
    """``request_bytes`` and ``capacity_bytes`` for ``state_report`` from the command line."""
    request = getattr(args, "request", None)
    capacity = getattr(args, "capacity", None)
    return {"request_bytes": parse_bytes(request) if request is not None else None,
            "capacity_bytes": parse_bytes(capacity) if capacity is not None else None}


def main(args: argparse.Namespace) -> int:
    """Print the summary of ``args.trace`` (and the recorded state of a snapshot without history)."""
    options = state_options(args)
    trace = load_trace(args)
    selected = select_device(trace, args.device)
    summary = summarize(selected)
    if args.device is None and len(trace.devices) > 1:
        summary["per_device"] = {str(d): summarize(trace.for_device(d)) for d in trace.devices}
    state = state_report(selected, **options) if is_state_only(selected) else None
    if state is not None:
        summary["state"] = state
    if args.json:
        print_json(summary)
    else:
        print(format_summary({k: v for k, v in summary.items() if k != "state"}))
        if state is not None:
            print()
            print(format_state_report(state))
    return 0


_BYTE_KEYS = ("peak_live_bytes", "baseline_live_bytes", "peak_live_with_baseline_bytes", "initial_reserved_bytes")


def format_summary(summary: dict, indent: str = "") -> str:
    """Render ``summarize()`` output as aligned text lines."""
    lines = []
    for key, value in summary.items():
        if key == "per_device":
            for device, sub in value.items():
                lines.append(f"{indent}device {device}:")
                lines.append(format_summary({k: v for k, v in sub.items() if k not in ("file", "format")}, indent + "  "))
            continue
        if key in ("repairs", "notes") and not value:
            continue
        if key in _BYTE_KEYS:
            value = f"{value:,} ({format_bytes(value)})"
        elif key == "time_span_ns":
            value = f"{value:,} ns ({value / 1e9:.3f} s)"
        elif isinstance(value, list) and key in ("repairs", "notes"):
            value = "\n" + "\n".join(f"{indent}  - {line}" for line in value)
        lines.append(f"{indent}{key:<30} {value}")
    return "\n".join(lines)
