"""Pieces every subcommand shares: reading a trace with a clean error and picking a device."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..errors import AllocsimError
from ..trace import Trace, read_trace


def add_trace_args(parser: argparse.ArgumentParser) -> None:
    """Add the TRACE argument and the options every trace-reading command takes."""
    parser.add_argument("trace", metavar="TRACE", help="trace file (PyTorch snapshot, Kineto JSON, RMM CSV, allocsim Parquet/CSV)")
    parser.add_argument("--lenient", action="store_true",
                        help="repair what can be repaired in a bad trace (every repair is reported) instead of failing")


def load_trace(args: argparse.Namespace) -> Trace:
    """Read ``args.trace`` honouring ``--lenient``."""
    return read_trace(args.trace, lenient=args.lenient)


def select_device(trace: Trace, device: int | None) -> Trace:
    """Return the part of ``trace`` on ``device``; None keeps all devices."""
    if device is None:
        return trace
    if device not in trace.devices:
        raise AllocsimError(f"{trace.meta.source}: no device {device} in this trace (devices: {trace.devices})")
    return trace.for_device(device)


def print_json(data: Any) -> None:
    """Print one JSON object, keys in a stable order."""
    json.dump(data, sys.stdout, indent=2, sort_keys=False)
    sys.stdout.write("\n")
