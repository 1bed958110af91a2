"""Sweep throughput and memory: 64 configurations over a >= 1M-event real-derived trace, per executor.

    python benchmarks/bench_sweep.py                          # full size: 1M events, 64 configs, timed
    python benchmarks/bench_sweep.py --events 100000 --configs 8 --fast      # a quick look
    python benchmarks/bench_sweep.py --large                  # 10M events, 2 workers: peak RSS < 24 GB?

The trace repeats a real one (default ``traces/bert_fp32.json.gz``) with fresh allocation ids
(``bench_engine.repeat_trace``), built in a child process and written to Parquet, so workers load
it from disk and the driver never holds it. Each executor (``1``: in-process, ``2``: a 2-process
pool, ``dask2``: a 2-worker ``LocalCluster``) runs the same configurations from an empty journal;
the rows must be identical (wall-clock columns aside). "peak RSS" is the largest sum of resident
memory over the driver and all its descendants (pool or Dask worker processes), sampled every
0.2 s; "worker max" is the largest single process.

Configurations: pytorch max_split_size {none, 64MiB, 256MiB, 1GiB} x garbage_collection_threshold
{0, 0.5, 0.7, 0.9} x expandable_segments {false, true} (32, memory_fraction 1; ``--capacity``
default 80GiB so GC can act) and deferred-gc inner {paddle, cupy, cuda-async, pytorch} x threshold
{0, 1MiB, 4MiB, 16MiB, 64MiB, 256MiB, 1GiB, 4GiB} (32), interleaved; ``--configs N`` keeps the first N.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from allocsim.sweep import (DaskExecutor, InProcessExecutor, ProcessPoolExecutor, build_configs,  # noqa: E402
                            journal_dir, run_sweep)
from allocsim.units import parse_bytes  # noqa: E402

DEFAULT_TRACE = REPO / "traces" / "bert_fp32.json.gz"
GiB = 1 << 30


def configs_64():
    """The 64 benchmark configurations, pytorch and deferred-gc interleaved (so a prefix mixes both)."""
    torch = build_configs(["pytorch"], ["max_split_size=none,64MiB,256MiB,1GiB",
                                        "garbage_collection_threshold=0,0.5,0.7,0.9",
                                        "expandable_segments=false,true"], ["memory_fraction=1"])
    gc = build_configs(["deferred-gc"], ["inner=paddle,cupy,cuda-async,pytorch",
                                         "threshold=0,1MiB,4MiB,16MiB,64MiB,256MiB,1GiB,4GiB"])
    mixed = [c for pair in zip(torch, gc) for c in pair]
    return mixed


def _build(base: str, events: int, device: int | None, out: str) -> None:
    from bench_engine import repeat_trace

    from allocsim.engine import select_device
    from allocsim.trace import read_trace, write_trace

    trace = read_trace(base)
    if device is None and len(trace.devices) > 1:
        device = trace.devices[0]
    trace = select_device(trace, device)
    write_trace(repeat_trace(trace, events), out)


def derived_trace(base: str, events: int, device: int | None, workdir: Path) -> Path:
    """``base`` repeated to >= ``events`` events as Parquet in ``workdir`` (built once, in a child process)."""
    path = workdir / f"{Path(base).name.split('.')[0]}-x{events}.parquet"
    if not path.exists():
        started = time.perf_counter()
        proc = multiprocessing.get_context("spawn").Process(target=_build, args=(base, events, device, str(path)))
        proc.start()
        proc.join()
        if proc.exitcode != 0:
            raise SystemExit(f"building the derived trace failed (exit {proc.exitcode})")
        print(f"# built {path} in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return path


class RssMonitor:
    """Sample the resident memory of this process and all its descendants; keep the peaks."""

    def __init__(self, interval_s: float = 0.2):
        import psutil

        self.me = psutil.Process()
        self.interval_s = interval_s
        self.peak_total = 0
        self.peak_single = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        import psutil

        total, single = 0, 0
        for proc in [self.me, *self.me.children(recursive=True)]:
            try:
                rss = proc.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            total += rss
            if proc.pid != self.me.pid:
                single = max(single, rss)
        self.peak_total = max(self.peak_total, total)
        self.peak_single = max(self.peak_single, single)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval_s)

    def __enter__(self) -> "RssMonitor":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def make(mode: str):
    if mode == "1":
        return InProcessExecutor()
    if mode.startswith("dask"):
        return DaskExecutor(workers=int(mode[4:] or 2))
    return ProcessPoolExecutor(int(mode))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default=str(DEFAULT_TRACE), help="real trace to repeat (default: %(default)s)")
    parser.add_argument("--device", type=int, help="device of a multi-device trace (default: the first)")
    parser.add_argument("--events", type=int, default=1_000_000, help="minimum events of the derived trace")
    parser.add_argument("--configs", type=int, default=64, help="configurations (<= 64)")
    parser.add_argument("--modes", default="1,2,dask2", help="executors: 1, 2 (pool), dask2 (default: %(default)s)")
    parser.add_argument("--fast", action="store_true", help="memory-only runs (default: timed, SimPy)")
    parser.add_argument("--capacity", default="80GiB", help="device capacity (default: %(default)s)")
    parser.add_argument("--large", action="store_true",
                        help="memory check: 10M events, 2 configs, a 2-process pool only (overrides the above)")
    parser.add_argument("--workdir", help="where the derived trace and results go (default: a temp dir, kept)")
    parser.add_argument("--json", action="store_true", help="one JSON object per executor")
    args = parser.parse_args(argv)
    if args.large:
        args.events, args.configs, args.modes = max(args.events, 10_000_000), min(args.configs, 2), "2"

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench_sweep-"))
    workdir.mkdir(parents=True, exist_ok=True)
    trace = derived_trace(args.trace, args.events, args.device, workdir)
    configs = configs_64()[:args.configs]
    capacity = parse_bytes(args.capacity)
    print(f"# {trace} ({trace.stat().st_size / 2**20:.0f} MiB), {len(configs)} configs, "
          f"{'fast' if args.fast else 'timed'}, capacity {args.capacity}, {os.cpu_count()} CPUs", file=sys.stderr)
    if not args.json:
        print(f"{'executor':<34} {'rows':>5} {'errors':>6} {'wall s':>9} {'speed-up':>8} "
              f"{'peak RSS GiB':>12} {'worker max GiB':>14}")
    baseline, reference = None, None
    for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
        out = workdir / f"results-{mode}.parquet"
        shutil.rmtree(journal_dir(out), ignore_errors=True)
        executor = make(mode)
        with RssMonitor() as rss:
            report = run_sweep([str(trace)], configs, output=out, capacity_bytes=capacity, fast=args.fast,
                               executor=executor, progress=sys.stderr.isatty() and not args.json)
        baseline = baseline or report.wall_seconds
        import pandas as pd

        from allocsim.sweep.flatten import PERF_COLUMNS
        rows = pd.read_parquet(out).drop(columns=list(PERF_COLUMNS))
        same = None
        if reference is None:
            reference = rows
        else:
            same = rows.equals(reference)
        row = {"executor": executor.name, "events": None, "configs": len(configs), "rows": report.rows,
               "errors": report.errors, "wall_seconds": round(report.wall_seconds, 2),
               "speed_up": round(baseline / report.wall_seconds, 2), "peak_rss_bytes": rss.peak_total,
               "worker_max_rss_bytes": rss.peak_single, "rows_identical_to_first": same}
        if args.json:
            print(json.dumps(row), flush=True)
        else:
            print(f"{executor.name:<34} {report.rows:>5} {report.errors:>6} {report.wall_seconds:>9.1f} "
                  f"{row['speed_up']:>8.2f} {rss.peak_total / GiB:>12.2f} {rss.peak_single / GiB:>14.2f}"
                  + ("" if same is None else f"  rows identical: {same}"), flush=True)
    if args.large and reference is not None:
        ok = rss.peak_total < 24 * GiB
        print(f"# large check: peak RSS {rss.peak_total / GiB:.2f} GiB "
              f"{'<' if ok else '>='} 24 GiB: {'OK' if ok else 'FAIL'}", file=sys.stderr)
        return 0 if ok else 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
