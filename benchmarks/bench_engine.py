"""Engine throughput and memory: requests/s of the compiled kernel and of the Python reference, per policy and mode.

    python benchmarks/bench_engine.py                                   # pytorch, fast + SimPy, both routes
    python benchmarks/bench_engine.py --policies all --routes compiled  # every policy on the kernel
    python benchmarks/bench_engine.py --stream stream.parquet           # a stream from build_stream.py (or .csv)
    python benchmarks/bench_engine.py --single-stream --no-peer         # SimPy versus fast on one stream
    python benchmarks/bench_engine.py --trace T --events 2000000        # one trace repeated instead
    python benchmarks/bench_engine.py --json

The default stream is ``build_stream.py``'s: about 1M requests from four shared snapshots played
one after another, sizes jittered by a few 512-byte units. A *request* is an allocation or a free
(an RMM log row; our free request and its completion count once); events/s counts our events.
Each (policy, mode, route) runs in a forked child so its peak resident memory is its own; "B/event"
is the child's peak resident memory during the run (Linux ``VmHWM``, reset when the run starts)
minus its resident memory then (the loaded stream and everything else the parent held), divided
by the events: what a run needs beyond the trace itself. "sim s" is the
engine's own figure (``RunResult.perf``: start state + replay loop, what ``allocsim run --json``
reports); "total s" adds building the time series and the summary.

If DynaPipe's simulator (``dynapipe/memory_opt/allocation_simulator.py`` of
awslabs/optimizing-multitask-training-through-dynamic-pipelines) has been fetched to
``benchmarks/peers/dynapipe_allocation_simulator.py`` (gitignored: never commit it), its
``TorchCachingAllocatorSimulator`` (kSmallSize set to PyTorch's 1 MiB) replays the same requests
side by side with the ``pytorch`` preset; otherwise only our rows are printed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import multiprocessing
import os
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from allocsim.device import SimulatedDevice  # noqa: E402
from allocsim.engine import run_fast, run_simpy, select_device  # noqa: E402
from allocsim.policies import kernel  # noqa: E402
from allocsim.trace import read_trace  # noqa: E402
from allocsim.trace.schema import EVENT_DTYPES, EventKind, Trace  # noqa: E402

PEER_FILE = Path(__file__).resolve().parent / "peers" / "dynapipe_allocation_simulator.py"


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


def _policy_names(requested: str) -> list[str]:
    from allocsim.policies.registry import policy_specs

    names = [spec.name for spec in policy_specs()]
    if requested == "all":
        return names
    wanted = [n.strip() for n in requested.split(",") if n.strip()]
    unknown = sorted(set(wanted) - set(names))
    if unknown:
        raise SystemExit(f"unknown policies {unknown}; known: {names}")
    return wanted


def _build(name: str, trace: Trace, route: str):
    from allocsim.policies.registry import build_policy

    with kernel.route(route):
        return build_policy(name, device=SimulatedDevice(), allocator_settings=trace.meta.allocator_settings)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _status_bytes(key: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def _reset_peak() -> int:
    """Start measuring peak resident memory from now (Linux clear_refs 5); return the resident bytes now."""
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")
    return _rss_bytes()


def _peak_since_reset() -> int:
    return _status_bytes("VmHWM:")


def requests_of(trace: Trace) -> int:
    """Allocations plus frees (a free request and its completion are one request, as in an RMM log)."""
    kind = trace.column("kind")
    return int(np.count_nonzero(kind == EventKind.ALLOC) + np.count_nonzero(kind == EventKind.FREE_COMPLETED))


def _one_run(name: str, mode: str, route: str, trace: Trace, repeat: int = 1) -> dict:
    best = None
    baseline = _reset_peak()
    for _ in range(repeat):
        policy = _build(name, trace, route)
        started = time.perf_counter()
        result = run_fast(trace, policy) if mode == "fast" else run_simpy(trace, policy)
        total = time.perf_counter() - started
        sim = result.perf["sim_seconds"]
        if best is None or sim < best[0]:
            best = (sim, total, result.summary, result.perf["policy_kernel"])
        del result, policy
    sim, total, s, ran = best
    requests = requests_of(trace)
    return {"policy": name, "mode": mode, "route": ran, "events": s["events_replayed"], "requests": requests,
            "completed": s["completed"], "sim_seconds": round(sim, 3), "total_seconds": round(total, 3),
            "requests_per_second": round(requests / sim), "events_per_second": round(s["events_replayed"] / sim),
            "requests_per_second_total": round(requests / total), "peak_reserved_bytes": s["peak_reserved_bytes"],
            "max_rss_bytes": _peak_since_reset(), "run_bytes": _peak_since_reset() - baseline}


def _peer_run(trace: Trace, repeat: int = 1) -> dict:
    """DynaPipe's TorchCachingAllocatorSimulator over the same requests (allocations and completed frees)."""
    spec = importlib.util.spec_from_file_location("dynapipe_allocation_simulator", PEER_FILE)
    peer = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = peer   # its dataclasses look their module up
    spec.loader.exec_module(peer)
    kind = trace.column("kind")
    keep = (kind == EventKind.ALLOC) | (kind == EventKind.FREE_COMPLETED)
    ops = list(zip((kind[keep] == EventKind.ALLOC).tolist(), trace.column("alloc_id")[keep].tolist(),
                   trace.column("size_bytes")[keep].tolist(), trace.column("stream")[keep].tolist()))
    best = None
    baseline = _reset_peak()
    for _ in range(repeat):
        sim = peer.TorchCachingAllocatorSimulator(
            1e12, peer.TorchCachingAllocatorConfig(kSmallSize=1 << 20))   # PyTorch's kSmallSize (1 MiB)
        blocks = {}
        malloc, free = sim.malloc, sim.free
        started = time.perf_counter()
        for is_alloc, aid, size, stream in ops:
            if is_alloc:
                blocks[aid] = malloc(size, stream)
            else:
                free(blocks.pop(aid))
        seconds = time.perf_counter() - started
        if best is None or seconds < best[0]:
            best = (seconds, sim.peak_backend_allocated_bytes)
    seconds, peak = best
    return {"policy": "dynapipe", "mode": "peer", "route": "python", "events": len(ops), "requests": len(ops),
            "completed": True, "sim_seconds": round(seconds, 3), "total_seconds": round(seconds, 3),
            "requests_per_second": round(len(ops) / seconds), "events_per_second": round(len(ops) / seconds),
            "requests_per_second_total": round(len(ops) / seconds), "peak_reserved_bytes": int(peak),
            "max_rss_bytes": _peak_since_reset(), "run_bytes": _peak_since_reset() - baseline}


def _child(conn, work, args):
    try:
        conn.send(work(*args))
    except Exception as exc:  # report, do not hang the parent
        conn.send({"policy": args[0] if isinstance(args[0], str) else "dynapipe", "error": f"{type(exc).__name__}: {exc}"})
    conn.close()


def measure(work, *args) -> dict:
    """Run ``work(*args)`` in a forked child; add ``bytes_per_event`` from its peak RSS beyond its start."""
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child, work, args))
    proc.start()
    child.close()
    row = parent.recv()
    proc.join()
    if "run_bytes" in row:
        row["bytes_per_event"] = round(max(0, row["run_bytes"]) / max(1, row["events"]), 1)
    return row


def load_stream(args) -> Trace:
    """The benchmark stream: --stream FILE, --trace T repeated to --events, or build_stream's default."""
    if args.stream:
        return read_trace(args.stream)
    if args.trace:
        trace = read_trace(args.trace)
        device = args.device if args.device is not None else trace.devices[0]
        return repeat_trace(select_device(trace, device), args.events)
    from build_stream import build_stream, default_paths

    return build_stream(default_paths(), args.requests, single_stream=args.single_stream)


def _print_row(row: dict, peer: dict | None) -> None:
    if "error" in row:
        print(f"{row['policy']:<14} {row.get('mode', ''):<6} ERROR {row['error']}", flush=True)
        return
    ratio = ""
    if peer is not None and row["policy"] == "pytorch" and row["mode"] == "fast":
        ratio = (f"{row['requests_per_second'] / peer['requests_per_second']:>6.1f}x "
                 f"({row['requests_per_second_total'] / peer['requests_per_second']:.1f}x total)")
    print(f"{row['policy']:<14} {row['mode']:<6} {row['route']:<9} {row['requests']:>10,} {row['sim_seconds']:>7.2f} "
          f"{row['requests_per_second']:>11,} {row['events_per_second']:>11,} {row['total_seconds']:>8.2f} "
          f"{row['max_rss_bytes'] / 2**20:>8.0f} {row['bytes_per_event']:>7.0f}  {ratio}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stream", help="a stream file (build_stream.py output: Parquet or RMM CSV)")
    parser.add_argument("--requests", type=int, default=1_000_000, help="requests in the default stream")
    parser.add_argument("--single-stream", action="store_true", help="the default stream with every request on stream 0")
    parser.add_argument("--trace", help="instead: repeat this trace to --events events")
    parser.add_argument("--device", type=int, default=None, help="device of a multi-device --trace")
    parser.add_argument("--events", type=int, default=1_000_000, help="minimum events for --trace")
    parser.add_argument("--policies", default="pytorch", help="comma-separated names or 'all' (default: %(default)s)")
    parser.add_argument("--modes", default="fast,simpy", help="fast, simpy or both (default: %(default)s)")
    parser.add_argument("--routes", default="compiled,reference", help="compiled, reference or both")
    parser.add_argument("--no-peer", action="store_true", help="skip DynaPipe's simulator even if fetched")
    parser.add_argument("--repeat", type=int, default=1, help="runs per row; the fastest is kept")
    parser.add_argument("--json", action="store_true", help="one JSON object per line instead of a table")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    trace = load_stream(args)
    print(f"# {trace.meta.source or args.trace}: {requests_of(trace):,} requests, {len(trace.events):,} events "
          f"({time.perf_counter() - started:.1f} s to load); python {sys.version.split()[0]}, "
          f"{kernel.describe()}", file=sys.stderr)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    routes = [r.strip() for r in args.routes.split(",") if r.strip()]
    peer = None
    if not args.no_peer and PEER_FILE.is_file():
        peer = measure(_peer_run, trace, args.repeat)
    elif not args.no_peer:
        print(f"# DynaPipe's simulator not fetched to {PEER_FILE.relative_to(REPO)}: our rows only", file=sys.stderr)
    if not args.json:
        print(f"{'policy':<14} {'mode':<6} {'route':<9} {'requests':>10} {'sim s':>7} {'requests/s':>11} "
              f"{'events/s':>11} {'total s':>8} {'RSS MiB':>8} {'B/event':>7}  vs peer")
    if peer is not None:
        print(json.dumps(peer), flush=True) if args.json else _print_row(peer, None)
        if "error" in peer:
            peer = None
    for name in _policy_names(args.policies):
        for mode in modes:
            for route in routes:
                row = measure(_one_run, name, mode, route, trace, args.repeat)
                print(json.dumps(row), flush=True) if args.json else _print_row(row, peer)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
