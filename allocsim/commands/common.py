"""Pieces every subcommand shares: reading a trace with a clean error, picking a device, the cost model."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from ..cost import CostModel
from ..errors import AllocsimError
from ..trace import read_trace
from ..trace.reading.limits import DEFAULT_LIMITS, Limits, parse_limit_options

if TYPE_CHECKING:
    from ..trace.schema import Trace


def add_trace_args(parser: argparse.ArgumentParser) -> None:
    """Add the TRACE argument and the options every trace-reading command takes."""
    parser.add_argument("trace", metavar="TRACE", help="trace file (PyTorch snapshot, Kineto JSON, RMM CSV, allocsim "
                        "Parquet/CSV), or a capture folder of a distributed job (run, advise, report: per rank)")
    add_read_args(parser)


def add_read_args(parser: argparse.ArgumentParser) -> None:
    """Add ``--lenient`` and the limit options (``--limits``, ``--max-events``, ``--max-decompressed``)."""
    parser.add_argument("--lenient", action="store_true",
                        help="repair what can be repaired in a bad trace (every repair is reported) instead of failing")
    parser.add_argument("--limits", action="append", metavar="KEY=VALUE",
                        help="raise a cap on what a trace file may make the reader do, e.g. "
                             "--limits events=5e8,memory_bytes=64GiB (caps: " + ", ".join(Limits.names()) + ")")
    parser.add_argument("--max-events", metavar="N", help="same as --limits events=N")
    parser.add_argument("--max-decompressed", metavar="SIZE", help="same as --limits decompressed_bytes=SIZE")


def trace_limits(args: argparse.Namespace) -> Limits:
    """The ``Limits`` that ``--limits``, ``--max-events`` and ``--max-decompressed`` ask for."""
    limits = DEFAULT_LIMITS.with_overrides(parse_limit_options(getattr(args, "limits", None)))
    if getattr(args, "max_events", None) is not None:
        limits = limits.with_overrides({"events": args.max_events}, "--max-events")
    if getattr(args, "max_decompressed", None) is not None:
        limits = limits.with_overrides({"decompressed_bytes": args.max_decompressed}, "--max-decompressed")
    return limits


def read_args(args: argparse.Namespace) -> tuple[str, ...]:
    """The read options as given (``--lenient``, ``--limits``, ...), to repeat them in a printed command."""
    out: list[str] = ["--lenient"] if getattr(args, "lenient", False) else []
    for item in getattr(args, "limits", None) or []:
        out += ["--limits", item]
    for flag, name in (("--max-events", "max_events"), ("--max-decompressed", "max_decompressed")):
        if getattr(args, name, None) is not None:
            out += [flag, getattr(args, name)]
    return tuple(out)


def load_trace(args: argparse.Namespace) -> Trace:
    """Read ``args.trace`` honouring ``--lenient`` and the limit options."""
    return read_trace(args.trace, lenient=args.lenient, limits=trace_limits(args))


def select_device(trace: Trace, device: int | None) -> Trace:
    """Return the part of ``trace`` on ``device``; None keeps all devices."""
    if device is None:
        return trace
    if device not in trace.devices:
        raise AllocsimError(f"{trace.meta.source}: no device {device} in this trace (devices: {trace.devices})")
    return trace.for_device(device)


def note_picked_device(command: str, trace: Trace, device: int | None) -> None:
    """Say on stderr which device is replayed when ``--device`` was not given and the trace's only GPU is picked."""
    from ..engine import picked_device_note

    note = picked_device_note(trace.devices) if device is None else None
    if note:
        print(f"allocsim {command}: note: {note}", file=sys.stderr)


def add_incomplete_arg(parser: argparse.ArgumentParser) -> None:
    """Add ``--allow-incomplete``: judge a trace that stops before its script's end as it is."""
    from ..metrics.verdict import EXIT_INCOMPLETE

    parser.add_argument("--allow-incomplete", action="store_true",
                        help="use a trace that stops before its script's end (an allocsim capture whose script "
                             "raised, exited with an error, was interrupted or reached --timeout) as it is: the "
                             "verdict still says INCOMPLETE TRACE, but the exit status is the verdict's instead of "
                             f"{EXIT_INCOMPLETE}")


def incomplete_status(command: str, reason: str, args: argparse.Namespace, status: int) -> int:
    """``status``, or ``EXIT_INCOMPLETE`` (said on stderr) when the trace stops early and ``--allow-incomplete`` is not given."""
    from ..metrics.verdict import ALLOW_INCOMPLETE, EXIT_INCOMPLETE

    if not reason or getattr(args, "allow_incomplete", False):
        return status
    print(f"allocsim {command}: the trace stops before its script's end ({reason}): exit status {EXIT_INCOMPLETE}; "
          f"{ALLOW_INCOMPLETE} judges it as it is", file=sys.stderr)
    return EXIT_INCOMPLETE


def print_json(data: Any) -> None:
    """Print one JSON object, keys in a stable order."""
    json.dump(data, sys.stdout, indent=2, sort_keys=False)
    sys.stdout.write("\n")


def add_cost_model_args(parser: argparse.ArgumentParser) -> None:
    """Add ``--cost-model FILE`` and ``--cost KEY=NS`` (what timed runs cost, and a calibrated device)."""
    parser.add_argument("--cost-model", metavar="FILE",
                        help="cost model JSON (calibration file): call latencies for timed runs and the "
                             "calibrated device footprint (_granularity_bytes) for every run")
    parser.add_argument("--cost", action="append", default=[], metavar="KEY=NS",
                        help="override one cost model constant, e.g. --cost device_sync_ns=50000 (repeatable)")


def cost_model_from_args(args: argparse.Namespace) -> CostModel | None:
    """The cost model of ``--cost-model FILE`` with ``--cost`` overrides; None when neither is given."""
    path, items = getattr(args, "cost_model", None), getattr(args, "cost", None) or []
    if not path and not items:
        return None
    base = CostModel.load(path) if path else CostModel()
    overrides = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--cost {item!r}: expected KEY=NS")
        overrides[key.strip()] = value.strip()
    return CostModel.from_overrides(overrides, base=base) if overrides else base
