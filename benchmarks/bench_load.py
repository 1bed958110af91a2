"""Loading speed per format: allocsim's reader against the plain library parse of the same files.

    python benchmarks/bench_load.py                      # shared snapshots and Kineto files, a 1M-row
                                                         # RMM log and a 10M-event Parquet trace built here
    python benchmarks/bench_load.py --route reference    # the pure-Python reference readers instead
    python benchmarks/bench_load.py --frames-cost        # also: what keeping stack frames costs
    python benchmarks/bench_load.py --big /tmp/big.pickle    # also the big snapshot (make_big_snapshot.py),
                                                             # through `allocsim info` with its peak RSS
    python benchmarks/bench_load.py --json

Baselines, each the fastest plain parse a library gives of the same bytes:
  snapshot  CPython's C ``pickle.Unpickler`` whose ``find_class`` refuses every global (file read included)
  kineto    gzip decompression + stdlib ``json.loads``
  rmm-csv   ``pyarrow.csv.read_csv`` (type inference on)
  parquet   ``pyarrow.parquet.read_table``
"ours" is ``allocsim.read_trace`` end to end (format detection, parsing, validation, a ``Trace``) on
the route ``--route`` names (``auto``: the compiled readers when built). Each time is the best of
``--repeat`` runs; ratio = baseline time / our time (higher is better). "parquet (first read)" runs
each read in a fresh process (imports done first), as a user's first ``allocsim run`` does, and gives
the slowest and fastest of ``--repeat`` processes. On a machine shared with other work, rerun to see
the spread.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from allocsim.policies import kernel  # noqa: E402
from allocsim.trace import read_trace, write_trace  # noqa: E402
from allocsim.trace.reading import compiled  # noqa: E402
from allocsim.trace.schema import EVENT_DTYPES, EventKind, Trace, TraceMeta  # noqa: E402
from allocsim.trace.formats.snapshot.reader import read_snapshot  # noqa: E402

SHARED = REPO.parent / "shared" / "traces"


class _Refusing(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError("globals refused")


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def baseline_pickle(path: Path) -> None:
    with open(path, "rb") as fh:
        _Refusing(io.BytesIO(fh.read())).load()


def baseline_json(path: Path) -> None:
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    json.loads(data)


def rmm_log(folder: Path, rows: int) -> Path:
    """An RMM log of ``rows`` rows: the request stream of a shared snapshot, repeated."""
    source = SHARED / "pytorch-snapshots" / "kkaitlyn111__memory_ctx128_fullstep.pickle"
    trace = read_trace(source).for_device(0)
    ev = trace.events
    mem = ev.loc[ev["kind"].isin([EventKind.ALLOC, EventKind.FREE_COMPLETED])]
    kinds = np.where(mem["kind"].to_numpy() == EventKind.ALLOC, "allocate", "free")
    ids = mem["alloc_id"].to_numpy()
    sizes = mem["size_bytes"].to_numpy()
    reps = max(1, rows // len(mem) + 1)
    path = folder / "rmm.csv"
    with open(path, "w") as fh:
        fh.write("Thread,Time,Action,Pointer,Size,Stream\n")
        written, t_us = 0, 0
        for rep in range(reps):
            addr = (ids + rep * (len(ids) + 1) + 1) * 4096
            chunk = []
            for k, a, s in zip(kinds.tolist(), addr.tolist(), sizes.tolist()):
                t_us += 3
                chunk.append(f"1,{t_us // 3_600_000_000 % 24:02d}:{t_us // 60_000_000 % 60:02d}:"
                             f"{t_us // 1_000_000 % 60:02d}.{t_us % 1_000_000:06d},{k},0x{a:x},{s},0x0\n")
                written += 1
                if written >= rows:
                    break
            fh.write("".join(chunk))
            if written >= rows:
                break
    # Time of day must not wrap past midnight inside the log (it would be read as a new day).
    return path


def parquet_trace(folder: Path, events: int) -> Path:
    """A Parquet trace of ``events`` events (alloc/free pairs of a real size mix)."""
    n_pairs = events // 3
    ids = np.arange(n_pairs, dtype=np.int64)
    rng = np.random.default_rng(0)
    sizes = rng.choice([512, 4096, 1 << 20, 3 << 20], size=n_pairs).astype(np.int64)
    kind = np.empty(3 * n_pairs, dtype=np.uint8)
    kind[0::3], kind[1::3], kind[2::3] = EventKind.ALLOC, EventKind.FREE_REQUESTED, EventKind.FREE_COMPLETED
    frame = pd.DataFrame({
        "t_ns": np.arange(3 * n_pairs, dtype=np.int64), "kind": kind, "alloc_id": np.repeat(ids, 3),
        "size_bytes": np.repeat(sizes, 3), "stream": np.zeros(3 * n_pairs, np.int64),
        "device": np.zeros(3 * n_pairs, np.int16), "stack_id": np.full(3 * n_pairs, -1, np.int32)})
    path = folder / "big.parquet"
    write_trace(Trace(events=frame.astype(EVENT_DTYPES), meta=TraceMeta(format="synthetic")), path)
    return path


_FIRST_READ = """
import sys, time
from allocsim.policies import kernel
from allocsim.trace import read_trace
with kernel.route(sys.argv[2]):
    start = time.perf_counter()
    n = len(read_trace(sys.argv[1]).events)
    print(time.perf_counter() - start, n)
"""


def first_reads(path: Path, route: str, repeat: int) -> list[float]:
    """Seconds of the first ``read_trace`` in each of ``repeat`` fresh processes."""
    times = []
    for _ in range(repeat):
        out = subprocess.run([sys.executable, "-c", _FIRST_READ, str(path), route], capture_output=True, text=True,
                             cwd=REPO, check=True)
        times.append(float(out.stdout.split()[0]))
    return times


def peak_rss_info(path: Path) -> tuple[int, float, int]:
    """(exit code, seconds, peak RSS bytes of `allocsim info` and its children)."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", "import sys; from allocsim.cli import main; sys.exit(main())",
                             "info", str(path), "--json"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            cwd=REPO)
    _, status, usage = os.wait4(proc.pid, 0)
    return os.waitstatus_to_exitcode(status), time.perf_counter() - start, usage.ru_maxrss * 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rmm-rows", type=int, default=1_000_000)
    parser.add_argument("--parquet-events", type=int, default=10_000_000)
    parser.add_argument("--big", type=Path, help="a big snapshot (benchmarks/make_big_snapshot.py)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--frames-cost", action="store_true",
                        help="also time the snapshots with stack frames dropped (what keeping them costs)")
    parser.add_argument("--route", choices=kernel.MODES, default="auto",
                        help="readers' route: compiled, the Python reference, or auto (compiled when built)")
    args = parser.parse_args()
    with kernel.route(args.route):
        run(args)


def run(args: argparse.Namespace) -> None:
    rows = []
    route = compiled.status()

    def measure(fmt: str, path: Path, baseline, events: int | None = None) -> None:
        ours = best(lambda: read_trace(path), args.repeat)
        base = best(lambda: baseline(path), args.repeat)
        n = events if events is not None else len(read_trace(path).events)
        rows.append({"format": fmt, "file": path.name, "MB": round(path.stat().st_size / 1e6, 2), "events": n,
                     "ours_s": round(ours, 3), "baseline_s": round(base, 3), "ratio": round(base / ours, 2),
                     "events_per_s": int(n / ours) if ours else 0})

    snaps = sorted((SHARED / "pytorch-snapshots").glob("*.pickle"))
    for path in snaps:
        measure("snapshot", path, baseline_pickle)
    for path in sorted((SHARED / "kineto-gpu").glob("*.json.gz")) + sorted((REPO / "traces").glob("*.json.gz")):
        try:
            read_trace(path)
        except Exception:  # noqa: BLE001 - the 2021 file is refused by design
            continue
        measure("kineto", path, baseline_json)
    with tempfile.TemporaryDirectory() as folder:
        if snaps:
            rmm = rmm_log(Path(folder), args.rmm_rows)
            measure("rmm-csv", rmm, lambda p: pacsv.read_csv(p))
        pqt = parquet_trace(Path(folder), args.parquet_events)
        measure("parquet", pqt, lambda p: pq.read_table(p))
        firsts = first_reads(pqt, args.route, args.repeat)
        n_pq = rows[-1]["events"]
        rows.append({"format": "parquet (first read)", "file": pqt.name, "MB": rows[-1]["MB"], "events": n_pq,
                     "ours_s": round(min(firsts), 3), "ours_worst_s": round(max(firsts), 3),
                     "baseline_s": rows[-1]["baseline_s"], "ratio": round(rows[-1]["baseline_s"] / max(firsts), 2),
                     "events_per_s": int(n_pq / max(firsts)), "events_per_s_best": int(n_pq / min(firsts))})
    big = None
    if args.big is not None and args.big.exists():
        code, seconds, rss = peak_rss_info(args.big)
        big = {"file": args.big.name, "MB": round(args.big.stat().st_size / 1e6, 1), "exit": code,
               "info_s": round(seconds, 1), "peak_rss_GiB": round(rss / 2**30, 2)}
        measure("snapshot (big)", args.big, baseline_pickle)

    frames_cost = None
    if args.frames_cost and snaps:
        # The same reader with and without reading stack frames (read_snapshot(frames=False)).
        with_frames = sum(best(lambda p=p: read_snapshot(p), args.repeat) for p in snaps)
        without = sum(best(lambda p=p: read_snapshot(p, frames=False), args.repeat) for p in snaps)
        frames_cost = {"with_frames_s": round(with_frames, 3), "without_frames_s": round(without, 3),
                       "slower_by": round(with_frames / without - 1, 3)}

    if args.json:
        print(json.dumps({"route": route, "rows": rows, "big_info": big, "frames_cost": frames_cost}, indent=2))
        return
    print(f"readers: {route['route']} ({route['reason']})")
    print(f"{'format':<21}{'file':<52}{'MB':>8}{'events':>11}{'ours s':>9}{'lib s':>8}{'ratio':>7}{'events/s':>12}")
    for r in rows:
        print(f"{r['format']:<21}{r['file'][:51]:<52}{r['MB']:>8}{r['events']:>11,}{r['ours_s']:>9}"
              f"{r['baseline_s']:>8}{r['ratio']:>7}{r['events_per_s']:>12,}")
    for fmt in dict.fromkeys(r["format"] for r in rows):
        sel = [r for r in rows if r["format"] == fmt]
        if fmt == "parquet (first read)":
            r = sel[0]
            print(f"  {fmt}: {r['events_per_s']:,} events/s in the slowest of {args.repeat} fresh processes "
                  f"({r['ours_worst_s']} s), {r['events_per_s_best']:,} in the fastest ({r['ours_s']} s)")
            continue
        ours, base = sum(r["ours_s"] for r in sel), sum(r["baseline_s"] for r in sel)
        worst = min(sel, key=lambda r: r["ratio"])
        print(f"  {fmt}: all files, baseline/ours = {base / ours:.2f}; lowest file {worst['ratio']} ({worst['file']})")
    if frames_cost:
        print(f"shared snapshots with frames {frames_cost['with_frames_s']} s, without "
              f"{frames_cost['without_frames_s']} s: keeping frames costs {100 * frames_cost['slower_by']:.0f}%")
    if big:
        print(f"big snapshot {big['file']} ({big['MB']} MB): allocsim info exit {big['exit']}, "
              f"{big['info_s']} s, peak RSS {big['peak_rss_GiB']} GiB")


if __name__ == "__main__":
    main()
