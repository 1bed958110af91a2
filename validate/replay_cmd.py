"""``python -m validate replay TRACE --policy NAME``: the same policy code on a real device, against its prediction.

Each policy is replayed on a real device (``--backend host``: host memory; ``--backend cupy``: a
CUDA GPU through CuPy), then simulated with the same parameters, footprint rule and cost model,
and the two are compared: peak bytes, device call counts, allocation latency p50/p99 (see
``validate.replay``). ``--real`` adds the real allocators (CuPy MemoryPool / MemoryAsyncPool,
PyTorch) against their presets; they need ``--backend cupy`` and are reported as skipped otherwise.
Writes ``report.md`` and ``results.json`` into ``-o DIR`` (default ``replay-BACKEND`` in the current folder).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from allocsim.cost import CostModel
from allocsim.metrics.summary import lower_bound_bytes
from allocsim.output_file import check_output_folder
from allocsim.trace import read_trace
from allocsim.trace.schema import EventKind, Trace
from allocsim.units import parse_bytes

from .devices import get_backend
from .real_allocators import REAL_ALLOCATORS, validate_real
from .replay import DEFAULT_POLICIES, ReplayOptions, footprint_rule, load_for_replay, validate_policy
from .report import describe_machine, policy_table, write_report

#: The output folder without ``-o``, in the current folder (never inside the installed package).
DEFAULT_OUT = "replay-{backend}"


def register(subparsers) -> None:
    """Add the ``replay`` subcommand."""
    p = subparsers.add_parser(
        "replay", help="replay a trace through policies on a real device and compare with the simulator",
        description=__doc__.split("\n\n")[1].replace("\n", " "))
    p.add_argument("trace", metavar="TRACE", help="trace file (any format allocsim reads)")
    p.add_argument("--policy", action="append", required=True, metavar="NAME",
                   help=f"policy (repeatable, or a comma list; 'all' = {','.join(DEFAULT_POLICIES)})")
    p.add_argument("--set", action="append", default=[], metavar="K=V", dest="settings",
                   help="policy parameter for every policy, or POLICY.K=V for one (repeatable)")
    p.add_argument("--backend", choices=("host", "cupy"), default="host", help="real device (default host)")
    p.add_argument("--cost-model", metavar="FILE", help="calibration file (python -m validate calibrate)")
    p.add_argument("--compute", action="store_true",
                   help="the trace's gaps are work: host busy-waits them, the GPU runs spin kernels per stream")
    p.add_argument("--time-scale", type=float, default=1.0, metavar="F", help="multiply gaps by F with --compute")
    p.add_argument("--real", action="append", default=[], metavar="NAME",
                   help=f"real allocators too: {', '.join(REAL_ALLOCATORS)} or all (GPU only)")
    p.add_argument("--capacity", metavar="SIZE", help="device capacity for both sides (default: unlimited)")
    p.add_argument("--device", type=int, metavar="N", help="trace device to replay (if the trace has several)")
    p.add_argument("--limit-events", type=int, metavar="N", help="replay only the first N events")
    p.add_argument("--touch", action="store_true", help="host: populate every mapping (RSS is then measured too)")
    p.add_argument("--real-addresses", action="store_true",
                   help="hand policies the real pointers instead of SimulatedDevice's addresses")
    p.add_argument("--granularity", metavar="SIZE", help="footprint rule granularity (default: calibration/backend)")
    p.add_argument("--small-granularity", metavar="SIZE", help="footprint rule below the granularity")
    p.add_argument("--device-id", type=int, default=0, help="CUDA device (cupy backend)")
    p.add_argument("--lenient", action="store_true", help="repair a bad trace instead of failing")
    p.add_argument("--note", action="append", default=[], metavar="TEXT", help="a paragraph for the report")
    p.add_argument("--json", action="store_true", help="print the per-policy comparison as JSON")
    p.add_argument("-o", "--out", metavar="DIR", help="output folder (default replay-BACKEND in the current folder); "
                                                       "its parent must exist")
    p.set_defaults(func=main)


def parse_policies(items: list[str]) -> list[str]:
    """``--policy`` values as a list (comma lists and 'all' expanded, duplicates dropped)."""
    out: list[str] = []
    for item in items:
        for name in item.split(","):
            name = name.strip()
            names = DEFAULT_POLICIES if name == "all" else (name,) if name else ()
            out += [n for n in names if n not in out]
    return out


def parse_real(items: list[str]) -> list[str]:
    out: list[str] = []
    for item in items:
        for name in item.split(","):
            name = name.strip()
            if not name:
                continue
            if name == "all":
                out += [n for n in REAL_ALLOCATORS if n not in out]
            elif name not in REAL_ALLOCATORS:
                raise ValueError(f"unknown real allocator {name!r}; known: {', '.join(REAL_ALLOCATORS)}, all")
            elif name not in out:
                out.append(name)
    return out


def parse_settings(items: list[str], policies: list[str]) -> dict[str, dict[str, str]]:
    """``--set`` values per policy: ``K=V`` for all, ``POLICY.K=V`` for one."""
    per: dict[str, dict[str, str]] = {p: {} for p in policies}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set {item!r}: expected KEY=VALUE")
        key = key.strip()
        scope, dot, rest = key.partition(".")
        if dot and scope in per:
            per[scope][rest] = value.strip()
        else:
            for p in per:
                per[p][key] = value.strip()
    return per


def trace_info(trace: Trace) -> dict[str, Any]:
    """What the report says about the trace."""
    kinds = trace.column("kind")
    return {"source": trace.meta.source, "format": trace.meta.format, "events": int(len(trace.events)),
            "allocs": int((kinds == EventKind.ALLOC).sum()), "streams": int(len(set(trace.column("stream").tolist()))),
            "devices": trace.devices, "initial_allocs": int(len(trace.initial_allocs)),
            "span_ns": int(trace.column("t_ns")[-1] - trace.column("t_ns")[0]) if len(kinds) else 0,
            "peak_live_bytes": lower_bound_bytes(trace), "allocator_settings": trace.meta.allocator_settings}


def run_validation(trace: Trace, policies: list[str], backend_name: str, *,
                   settings: dict[str, dict[str, str]] | None = None, cost_model: CostModel | None = None,
                   cost_model_path: str | None = None, options: ReplayOptions | None = None,
                   real: list[str] | None = None, touch: bool = False, device_id: int = 0,
                   log=None) -> dict[str, Any]:
    """Validate every policy (and real allocator) on one backend; return one run of the report."""
    options = options or ReplayOptions()
    say = log or (lambda _m: None)
    backend = get_backend(backend_name, touch=touch, device_id=device_id)
    started = time.perf_counter()
    g, sg = footprint_rule(cost_model, backend, options)
    run: dict[str, Any] = {
        "trace": trace_info(trace), "backend": backend_name,
        "options": {"compute": options.compute, "time_scale": options.time_scale,
                    "capacity_bytes": options.capacity_bytes, "real_addresses": options.real_addresses,
                    "touch": touch},
        "cost_model": {"file": cost_model_path,
                       "source": (cost_model.provenance.get("_source") if cost_model else None)},
        "granularity_bytes": g, "small_granularity_bytes": sg, "policies": [], "real_allocators": [], "notes": [],
    }
    if cost_model is not None and backend_name == "host" and bool(cost_model.provenance.get("_touch")) != touch:
        run["notes"].append(f"the calibration was made with touch={cost_model.provenance.get('_touch')} and this "
                            f"replay runs with touch={touch}: host malloc latencies are not comparable")
    if cost_model is not None and cost_model.provenance.get("_backend") not in (None, backend_name):
        run["notes"].append(f"the calibration file is for backend {cost_model.provenance.get('_backend')!r}, "
                            f"not {backend_name!r}")
    for name in policies:
        say(f"policy {name}")
        t0 = time.perf_counter()
        try:
            row = validate_policy(trace, name, backend, params=(settings or {}).get(name), cost_model=cost_model,
                                  options=options)
        except NotImplementedError as exc:
            row = {"policy": name, "skipped": str(exc)}
        row["seconds"] = round(time.perf_counter() - t0, 3)
        run["policies"].append(row)
    for name in real or []:
        say(f"real allocator {name}")
        t0 = time.perf_counter()
        try:
            row = validate_real(trace, name, backend, cost_model=cost_model, options=options)
        except Exception as exc:  # one real allocator failing must not lose the others' results
            row = {"name": name, "preset": REAL_ALLOCATORS[name], "error": f"{type(exc).__name__}: {exc}"}
        row["seconds"] = round(time.perf_counter() - t0, 3)
        run["real_allocators"].append(row)
    run["seconds"] = round(time.perf_counter() - started, 3)
    return run


def comparison_json(run: dict[str, Any]) -> dict[str, Any]:
    """The ``--json`` output: the headline comparison per policy and per real allocator."""
    keys = ("predicted_peak_bytes", "measured_peak_bytes", "peak_error_pct", "predicted_p50_ns", "measured_p50_ns",
            "latency_error_pct", "predicted_p99_ns", "measured_p99_ns", "p99_error_pct",
            "predicted_device_mallocs", "measured_device_mallocs", "predicted_device_frees",
            "measured_device_frees", "predicted_device_maps", "measured_device_maps", "predicted_device_unmaps",
            "measured_device_unmaps", "device_counter_peak_bytes", "measured_rss_peak_bytes",
            "predicted_pool_peak_bytes", "measured_pool_peak_bytes", "pool_peak_error_pct",
            "predicted_makespan_ns", "measured_total_ns", "targets", "notes", "skipped", "error")
    return {
        "trace": run["trace"]["source"], "backend": run["backend"], "cost_model": run["cost_model"]["file"],
        "policies": {r["policy"]: {k: r[k] for k in keys if k in r} for r in run["policies"]},
        "real_allocators": {r["name"]: {"preset": r["preset"], **{k: r[k] for k in keys if k in r}}
                            for r in run["real_allocators"]},
    }


def main(args: argparse.Namespace) -> int:
    out_dir = args.out or DEFAULT_OUT.format(backend=args.backend)
    check_output_folder(out_dir)      # before the replay: a bad -o is one line, not a lost run
    policies = parse_policies(args.policy)
    if not policies:
        raise ValueError("no policy given")
    real = parse_real(args.real)
    settings = parse_settings(args.settings, policies)
    cost_model = CostModel.load(args.cost_model) if args.cost_model else None
    options = ReplayOptions(
        compute=args.compute, time_scale=args.time_scale,
        capacity_bytes=parse_bytes(args.capacity) if args.capacity else None,
        granularity_bytes=parse_bytes(args.granularity) if args.granularity else None,
        small_granularity_bytes=parse_bytes(args.small_granularity) if args.small_granularity else None,
        real_addresses=args.real_addresses)
    if args.time_scale <= 0:
        raise ValueError("--time-scale must be > 0")
    trace = load_for_replay(read_trace(args.trace, lenient=args.lenient), device=args.device,
                            limit_events=args.limit_events)
    log = (lambda m: print(f"validate replay: {m}", file=sys.stderr)) if not args.json else None
    run = run_validation(trace, policies, args.backend, settings=settings, cost_model=cost_model,
                         cost_model_path=args.cost_model, options=options, real=real, touch=args.touch,
                         device_id=args.device_id, log=log)
    doc = {"title": f"{trace.meta.source} on {args.backend}",
           "machine": describe_machine(args.backend, device_id=args.device_id),
           "runs": [run], "preamble": list(args.note)}
    paths = write_report(doc, out_dir)
    if args.json:
        from allocsim.commands.common import print_json
        from allocsim.metrics.summary import jsonable

        print_json(jsonable(comparison_json(run)))
    else:
        print("\n".join(policy_table(run["policies"])))
        if run["real_allocators"]:
            print()
            print("\n".join(policy_table(run["real_allocators"], label="allocator")))
        print(f"\nwrote {paths['markdown']} and {paths['json']}")
    return 0
