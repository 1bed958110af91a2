"""What code sites cost: ``run --fast`` with and without them, and each table's own time.

    python benchmarks/bench_sites.py                        # every shared snapshot (../shared/traces)
    python benchmarks/bench_sites.py --trace big.pickle     # e.g. benchmarks/make_big_snapshot.py's output

For each trace: the plain replay (``--sites 0``), then ``run_sites`` (live at the peak and at the
first OOM, and the waste at the reserved peak, which replays the trace up to that peak with an engine
observer), ``allocation_sites`` (``info``) and ``site_timeline`` (``plot``). Reading the trace is not
timed. Prints one markdown row per trace; times are the best of ``--repeat`` runs.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from allocsim.commands.run import add_sites  # noqa: E402
from allocsim.metrics.sites.timeline import site_timeline  # noqa: E402
from allocsim.metrics.sites.rows import allocation_sites  # noqa: E402
from allocsim.runner import resolve_capacity, simulate_trace  # noqa: E402
from allocsim.trace import read_trace  # noqa: E402

SNAPSHOTS = REPO.parent / "shared" / "traces" / "pytorch-snapshots"


def best_of(repeat: int, fn) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def bench(path: Path, repeat: int) -> str:
    trace = read_trace(path)
    if len(trace.devices) > 1:
        trace = trace.for_device(trace.devices[0])
    capacity = resolve_capacity(trace, None)
    result = simulate_trace(trace, "pytorch", {}, capacity=capacity, fast=True)
    replay = best_of(repeat, lambda: simulate_trace(trace, "pytorch", {}, capacity=capacity, fast=True))
    sites = best_of(repeat, lambda: add_sites(result, trace, "pytorch", {}, capacity.bytes, None, None, 10, False))
    info = best_of(repeat, lambda: allocation_sites(trace))
    timeline = best_of(repeat, lambda: site_timeline(trace))
    return (f"| {path.name} | {len(trace.events):,} | {replay:.2f} | {sites:.2f} ({sites / replay:.1f}x) "
            f"| {info:.2f} | {timeline:.2f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", action="append", help="trace file (repeatable; default: the shared snapshots)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement, best kept (default 3)")
    args = parser.parse_args()
    paths = [Path(p) for p in args.trace] if args.trace else sorted(SNAPSHOTS.glob("*.pickle"))
    if not paths:
        print("no traces: give --trace FILE (the shared snapshots are not beside this checkout)", file=sys.stderr)
        return 2
    print("| trace | events | replay --fast (s) | run_sites (s, x replay) | allocation_sites (s) | site_timeline (s) |")
    print("|---|---:|---:|---:|---:|---:|")
    for path in paths:
        print(bench(path, args.repeat), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
