"""Engine throughput and memory: events/s of every policy in fast and SimPy mode on a >= 1M-event stream.

    python benchmarks/bench_engine.py                       # default: the largest shared snapshot
    python benchmarks/bench_engine.py --trace T --events 2000000 --policies direct,pytorch
    python benchmarks/bench_engine.py --modes fast --json

The stream repeats one real trace with fresh allocation ids per repetition. Memory stays bounded:
each repetition ends by freeing what it allocated and did not free, and repetitions after the first
drop the frees of allocations that were alive before the trace began (the first one frees them for
real). Each (policy, mode) runs in a forked child so its peak resident memory is its own; "bytes per
event" is that peak minus the parent's resident memory at the fork, divided by the events.
"events/s" is the engine's own figure (``RunResult.perf``: start state + replay loop, what
``allocsim run --json`` reports); "total s" adds building the time series and the summary.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from allocsim.device import SimulatedDevice  # noqa: E402
from allocsim.engine import run_fast, run_simpy, select_device  # noqa: E402
from allocsim.trace import read_trace  # noqa: E402
from allocsim.trace.schema import EVENT_DTYPES, EventKind, Trace  # noqa: E402

DEFAULT_TRACE = REPO.parent / "shared" / "traces" / "pytorch-snapshots" / "kkaitlyn111__memory_ctx128_fullstep.pickle"


def _closing_frees(events: pd.DataFrame) -> pd.DataFrame:
    """FREE_REQUESTED/FREE_COMPLETED at the end for allocations of ``events`` still alive at its end."""
    kind = events["kind"].to_numpy()
    ids = events["alloc_id"].to_numpy()
    allocated = ids[kind == EventKind.ALLOC]
    requested = set(ids[kind == EventKind.FREE_REQUESTED].tolist())
    completed = set(ids[kind == EventKind.FREE_COMPLETED].tolist())
    first = events.drop_duplicates("alloc_id").set_index("alloc_id")
    t_end = int(events["t_ns"].iloc[-1]) if len(events) else 0
    rows = []
    for aid in allocated.tolist():
        if aid in completed:
            continue
        size, stream, device = (int(first.at[aid, c]) for c in ("size_bytes", "stream", "device"))
        if aid not in requested:
            rows.append((t_end, int(EventKind.FREE_REQUESTED), aid, size, stream, device))
        rows.append((t_end, int(EventKind.FREE_COMPLETED), aid, size, stream, device))
    return pd.DataFrame(rows, columns=list(EVENT_DTYPES)).astype(EVENT_DTYPES)


def repeat_trace(trace: Trace, target_events: int) -> Trace:
    """Repeat ``trace`` until it has at least ``target_events`` events (fresh ids, bounded memory)."""
    events = trace.events
    initial_ids = set(trace.initial_allocs["alloc_id"].tolist())
    first = pd.concat([events, _closing_frees(events)], ignore_index=True)
    later_events = events[~events["alloc_id"].isin(initial_ids) | (events["kind"] == EventKind.MARKER)
                          | (events["kind"] == EventKind.EMPTY_CACHE)]
    later = pd.concat([later_events, _closing_frees(later_events)], ignore_index=True)
    reps = 1 + max(0, math.ceil((target_events - len(first)) / max(1, len(later))))
    span = int(events["t_ns"].iloc[-1] - events["t_ns"].iloc[0]) + 1_000 if len(events) else 1
    id_stride = int(max(events["alloc_id"].max(), trace.initial_allocs["alloc_id"].max()
                        if len(trace.initial_allocs) else 0)) + 1
    columns = {name: [] for name in EVENT_DTYPES}
    for rep in range(reps):
        block = first if rep == 0 else later
        for name in EVENT_DTYPES:
            col = block[name].to_numpy()
            if name == "t_ns":
                col = col + rep * span
            elif name == "alloc_id":
                is_mem = np.isin(block["kind"].to_numpy(), [EventKind.ALLOC, EventKind.FREE_REQUESTED,
                                                            EventKind.FREE_COMPLETED])
                col = np.where(is_mem, col + rep * id_stride, col)
            columns[name].append(col)
    big = pd.DataFrame({name: np.concatenate(parts).astype(EVENT_DTYPES[name]) for name, parts in columns.items()})
    return Trace(events=big, meta=trace.meta, labels=list(trace.labels), initial_allocs=trace.initial_allocs)


def _policy_names(requested: str | None) -> list[str]:
    try:
        from allocsim.policies.registry import policy_specs
        names = [spec.name for spec in policy_specs()]
    except ImportError:
        print("policy registry not available: benchmarking direct only", file=sys.stderr)
        names = ["direct"]
    if requested:
        wanted = [n.strip() for n in requested.split(",") if n.strip()]
        unknown = sorted(set(wanted) - set(names))
        if unknown:
            raise SystemExit(f"unknown policies {unknown}; known: {names}")
        names = wanted
    return names


def _build(name: str, trace: Trace):
    try:
        from allocsim.policies.registry import build_policy
    except ImportError:
        from allocsim.policies.direct import DirectPolicy
        return DirectPolicy(SimulatedDevice())
    return build_policy(name, device=SimulatedDevice(), allocator_settings=trace.meta.allocator_settings)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _one_run(name: str, mode: str, trace: Trace, repeat: int = 1) -> dict:
    best = None
    for _ in range(repeat):
        policy = _build(name, trace)
        started = time.perf_counter()
        result = run_fast(trace, policy) if mode == "fast" else run_simpy(trace, policy)
        total = time.perf_counter() - started
        sim = result.perf["sim_seconds"]
        if best is None or sim < best[0]:
            best = (sim, total, result.summary)
        del result, policy
    sim, total, s = best
    return {"policy": name, "mode": mode, "events": s["events_replayed"], "completed": s["completed"],
            "sim_seconds": round(sim, 3), "events_per_second": round(s["events_replayed"] / sim),
            "total_seconds": round(total, 3), "peak_reserved_bytes": s["peak_reserved_bytes"],
            "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def _child(conn, name, mode, trace, repeat):
    try:
        conn.send(_one_run(name, mode, trace, repeat))
    except Exception as exc:  # report, do not hang the parent
        conn.send({"policy": name, "mode": mode, "error": f"{type(exc).__name__}: {exc}"})
    conn.close()


def measure(name: str, mode: str, trace: Trace, repeat: int = 1) -> dict:
    """Run one (policy, mode) in a forked child; add ``bytes_per_event`` from its peak RSS."""
    baseline = _rss_bytes()
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child, name, mode, trace, repeat))
    proc.start()
    child.close()
    row = parent.recv()
    proc.join()
    if "max_rss_bytes" in row:
        row["bytes_per_event"] = round(max(0, row["max_rss_bytes"] - baseline) / max(1, row["events"]), 1)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default=str(DEFAULT_TRACE), help="trace to repeat (default: %(default)s)")
    parser.add_argument("--device", type=int, default=None, help="device of a multi-device trace")
    parser.add_argument("--events", type=int, default=1_000_000, help="minimum events in the stream")
    parser.add_argument("--policies", default=None, help="comma-separated names (default: all registered)")
    parser.add_argument("--modes", default="fast,simpy", help="fast, simpy or both (default: %(default)s)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per (policy, mode); the fastest is kept")
    parser.add_argument("--json", action="store_true", help="one JSON object per line instead of a table")
    args = parser.parse_args(argv)

    trace = read_trace(args.trace)
    if args.device is None and len(trace.devices) > 1:
        args.device = trace.devices[0]
    trace = select_device(trace, args.device)
    started = time.perf_counter()
    big = repeat_trace(trace, args.events)
    build_s = time.perf_counter() - started
    print(f"# {Path(args.trace).name}: {len(trace.events):,} events x repeated -> {len(big.events):,} events "
          f"({build_s:.1f} s to build); python {sys.version.split()[0]}, pid RSS {_rss_bytes() / 2**20:.0f} MiB",
          file=sys.stderr)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not args.json:
        print(f"{'policy':<14} {'mode':<6} {'events':>10} {'sim s':>7} {'events/s':>11} {'total s':>8} "
              f"{'peak RSS MiB':>12} {'B/event':>8}")
    for name in _policy_names(args.policies):
        for mode in modes:
            row = measure(name, mode, big, args.repeat)
            if args.json:
                print(json.dumps(row))
            elif "error" in row:
                print(f"{name:<14} {mode:<6} ERROR {row['error']}")
            else:
                print(f"{name:<14} {mode:<6} {row['events']:>10,} {row['sim_seconds']:>7.2f} "
                      f"{row['events_per_second']:>11,} {row['total_seconds']:>8.2f} "
                      f"{row['max_rss_bytes'] / 2**20:>12.0f} {row['bytes_per_event']:>8.0f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
