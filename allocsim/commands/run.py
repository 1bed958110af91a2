"""``allocsim run TRACE --policy NAME``: replay a trace through one policy and report memory and latency.

By default the run is timed (SimPy engine, ``--cost-model FILE`` or the documented defaults);
``--fast`` skips time for pure memory questions. A trace with several devices needs ``--device N``.
An out-of-memory is a result (``oom`` in the report, exit code 0), not an error; bad input exits 2
with one line on stderr. The ``trace.meta.allocator_settings`` a PyTorch snapshot recorded apply to
the ``pytorch`` policy unless ``--set`` overrides them. With ``--json`` the output is one object:
the deterministic summary plus ``sim_seconds`` and ``events_per_second`` (wall clock).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..cost import CostModel
from ..device import SimulatedDevice
from ..engine import run_fast, run_simpy, select_device
from ..errors import AllocsimError
from ..units import parse_bytes
from .common import add_trace_args, load_trace, print_json


def register(subparsers) -> None:
    """Add the ``run`` subcommand."""
    parser = subparsers.add_parser(
        "run", help="replay a trace through one allocator policy",
        description="Replay TRACE through an allocator policy on a simulated device and report requested, "
                    "allocated and reserved memory beside the trace's lower bound, device calls, OOMs and "
                    "(unless --fast) allocation latency, sync stalls and makespan.")
    add_trace_args(parser)
    parser.add_argument("--policy", required=True, metavar="NAME", help="policy name (see `allocsim policies`)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="settings",
                        help="set a policy parameter (repeatable); sizes take units: --set max_split_size=200MiB")
    parser.add_argument("--capacity", metavar="SIZE", help="device memory, e.g. 80GiB (default: unlimited)")
    parser.add_argument("--device", type=int, metavar="N", help="device to replay (required if the trace has several)")
    parser.add_argument("--fast", action="store_true", help="no timing: memory results only, much faster")
    parser.add_argument("--continue-on-oom", action="store_true",
                        help="record every failed allocation, skip it and go on (default: stop at the first)")
    parser.add_argument("--cost-model", metavar="FILE", help="cost model JSON (calibration file) for timed runs")
    parser.add_argument("--cost", action="append", default=[], metavar="KEY=NS",
                        help="override one cost model constant, e.g. --cost device_sync_ns=50000 (repeatable)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("-o", "--out", metavar="OUT_DIR", dest="out_dir",
                        help="write summary.json, timeseries.parquet and perf.json there")
    parser.set_defaults(func=main)


def _pairs(items: list[str], option: str) -> list[tuple[str, str]]:
    out = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{option} {item!r}: expected KEY=VALUE")
        out.append((key.strip(), value.strip()))
    return out


def policy_params(settings: list[str]) -> dict[str, str]:
    """``--set KEY=VALUE`` items as a dict of strings (the registry checks names and converts values)."""
    return dict(_pairs(settings, "--set"))


def cost_model_from_args(args: argparse.Namespace) -> CostModel:
    """The cost model of ``--cost-model FILE`` (or the defaults) with ``--cost`` overrides applied."""
    base = CostModel.load(args.cost_model) if args.cost_model else CostModel()
    overrides = dict(_pairs(args.cost, "--cost"))
    return CostModel.from_overrides(overrides, base=base) if overrides else base


def device_for(capacity_bytes: int | None, cost_model: CostModel) -> SimulatedDevice:
    """A simulated device with the footprint rule a calibration measured (``_granularity_bytes`` keys), if any."""
    footprint = {}
    for key in ("granularity_bytes", "small_granularity_bytes"):
        value = cost_model.provenance.get(f"_{key}")
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"cost model _{key}: not a positive integer: {value!r}")
            footprint[key] = value
    return SimulatedDevice(capacity_bytes, **footprint)


def find_spec(name: str) -> Any:
    """The registry's ``PolicySpec`` called ``name``; ``ValueError`` listing the names if there is none."""
    from ..policies.registry import policy_specs

    specs = {spec.name: spec for spec in policy_specs()}
    if name not in specs:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(specs)}")
    return specs[name]


def execute(args: argparse.Namespace):
    """Run what ``args`` asks for and return the ``RunResult`` (raises on bad input)."""
    from ..policies.registry import build_policy

    capacity = parse_bytes(args.capacity) if args.capacity is not None else None
    calibrated = cost_model_from_args(args)
    cost_model = None if args.fast else calibrated
    spec = find_spec(args.policy)
    params = policy_params(args.settings)
    trace = select_device(load_trace(args), args.device)
    try:
        policy = build_policy(spec.name, device=device_for(capacity, calibrated), params=params or None,
                              allocator_settings=trace.meta.allocator_settings)
    except (KeyError, TypeError) as exc:
        raise ValueError(f"policy {spec.name}: {exc}") from None
    if args.fast:
        return run_fast(trace, policy, continue_on_oom=args.continue_on_oom)
    return run_simpy(trace, policy, cost_model, continue_on_oom=args.continue_on_oom)


def main(args: argparse.Namespace) -> int:
    """Replay, then print the report (text or ``--json``) and optionally save it; 2 on bad input."""
    try:
        result = execute(args)
        if args.out_dir:
            result.save(args.out_dir)
    except (AllocsimError, ValueError, OSError) as exc:
        print(f"allocsim run: error: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:   # the policy registry is missing or broken
        print(f"allocsim run: error: policy registry unavailable: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print_json(result.to_dict(include_perf=True))
    else:
        print(result.format_text())
    return 0
