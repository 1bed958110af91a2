"""``allocsim advise`` end to end on the largest shared snapshot: settings tried and wall time, 1 and 2 workers.

    python benchmarks/bench_advise.py                       # kkaitlyn111 ctx128 full step at 56 GiB, timed
    python benchmarks/bench_advise.py --fast                # without timing (ranked by peak reserved)
    python benchmarks/bench_advise.py --trace FILE --capacity 20GiB --workers 1 2 4

Each worker count starts from an empty journal (a fresh temporary ``-o``), so every run is
simulated; the wall time covers everything ``advise`` does: reading the trace, the grid, the
smallest-capacity bisections, the "why" replays. 56 GiB lies between the snapshot's peak with
expandable segments (55.51 GB) and its recorded peak (61.11 GB): the recorded settings do not fit.
The recommendations must be the same for every worker count. Prints one markdown row per count.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from allocsim.advise.advice import advise  # noqa: E402
from allocsim.advise.report import advice_to_dict  # noqa: E402
from allocsim.sweep import make_executor  # noqa: E402
from allocsim.units import format_bytes, parse_bytes  # noqa: E402

DEFAULT_TRACE = REPO.parent / "shared" / "traces" / "pytorch-snapshots" / "kkaitlyn111__memory_ctx128_fullstep.pickle"


def one(trace: str, capacity: int, workers: int, fast: bool) -> tuple[dict, float]:
    """Run advise once from an empty journal; return its JSON and the wall time."""
    with tempfile.TemporaryDirectory(prefix="allocsim-bench-advise-") as tmp:
        started = time.perf_counter()
        advice = advise(trace, capacity_bytes=capacity, executor=make_executor(workers=workers),
                        output=str(Path(tmp) / "runs.parquet"), fast=fast)
        wall = time.perf_counter() - started
    return advice_to_dict(advice), wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default=str(DEFAULT_TRACE))
    parser.add_argument("--capacity", default="56GiB")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--fast", action="store_true", help="no timing (ranked by peak reserved)")
    args = parser.parse_args()
    if not Path(args.trace).exists():
        print(f"{args.trace}: not found (the shared traces live beside the repository)", file=sys.stderr)
        return 2
    capacity = parse_bytes(args.capacity)
    print(f"# {Path(args.trace).name} at {format_bytes(capacity)}, {'fast' if args.fast else 'timed'} replays")
    print("| workers | grid settings | distinct runs | wall s | runs/s | best setting | peak reserved | fits down to |")
    print("|---:|---:|---:|---:|---:|---|---:|---:|")
    answers = []
    for workers in args.workers:
        data, wall = one(args.trace, capacity, workers, args.fast)
        best = data["recommendations"][0] if data["recommendations"] else None
        answers.append([(r["alloc_conf"], r["peak_reserved_bytes"], r["min_capacity_bytes"])
                        for r in data["recommendations"]])
        runs = data["runs"]["distinct"]
        print(f"| {workers} | {data['grid']['configurations']} | {runs} | {wall:.1f} | {runs / wall:.1f} | "
              f"{best['alloc_conf'] if best else 'none fits'} | "
              f"{format_bytes(best['peak_reserved_bytes']) if best else '-'} | "
              f"{format_bytes(best['min_capacity_bytes']) if best else '-'} |", flush=True)
    if any(a != answers[0] for a in answers):
        print("recommendations differ between worker counts", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
