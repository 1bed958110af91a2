"""``allocsim info TRACE``: counts, streams, devices, time span and live-byte peaks of a trace."""

from __future__ import annotations

import argparse

from ..trace.stats import summarize
from ..units import format_bytes
from .common import add_trace_args, load_trace, print_json, select_device


def register(subparsers) -> None:
    """Add the ``info`` subcommand."""
    parser = subparsers.add_parser("info", help="what is in a trace: counts, streams, devices, peaks",
                                   description="Summarise a trace: format, events, allocations, frees, streams, "
                                               "devices, time span and live-byte peaks.")
    add_trace_args(parser)
    parser.add_argument("--device", type=int, help="only this device (default: all, and one section per device)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    """Print the summary of ``args.trace``."""
    trace = load_trace(args)
    selected = select_device(trace, args.device)
    summary = summarize(selected)
    if args.device is None and len(trace.devices) > 1:
        summary["per_device"] = {str(d): summarize(trace.for_device(d)) for d in trace.devices}
    if args.json:
        print_json(summary)
    else:
        print(format_summary(summary))
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
