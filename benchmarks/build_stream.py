"""Build the engine benchmark's request stream: four real snapshots' requests, played one after another.

    python benchmarks/build_stream.py -o stream.parquet                    # ~1M requests, allocsim Parquet
    python benchmarks/build_stream.py -o stream.csv --requests 2000000     # the same kind of stream, RMM log CSV

Each round plays the request streams of four shared PyTorch snapshots in turn: their allocations
and completed frees, in recorded order (frees of blocks allocated before a recording began are
dropped; what a recording leaves allocated is freed at its end, so memory stays bounded). Every
allocation's size moves by a few 512-byte units (-3..+3, never below 1 byte) drawn from a seeded
generator, so no round repeats another exactly and every run of the script writes the same
stream. Rounds continue until the stream holds ``--requests`` requests (allocations + frees).
Pointers are never reused; each snapshot keeps its own stream ids (``--single-stream`` puts every
request on stream 0, for SimPy-versus-fast comparisons on one stream); times are 1 us apart.

``benchmarks/bench_engine.py`` builds the same stream in memory when given no ``--stream``.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from allocsim.engine import select_device  # noqa: E402
from allocsim.trace import read_trace, write_trace  # noqa: E402
from allocsim.trace.schema import EVENT_DTYPES, EventKind, Trace, TraceMeta  # noqa: E402

SNAPSHOT_DIR = REPO.parent / "shared" / "traces" / "pytorch-snapshots"
#: The four shared snapshots with the most requests (one of them with ten streams).
DEFAULT_SNAPSHOTS = ("kkaitlyn111__memory_ctx128_fullstep.pickle",
                     "Wedsonlin__medium_128_training_memory_snapshot.pickle",
                     "Maphsge4__snapshot.pickle",
                     "MercuryB1__cuda_memory_snapshot.pickle")
JITTER_UNITS = 3
UNIT_BYTES = 512
STEP_NS = 1_000


@dataclass
class Requests:
    """One snapshot's request stream: parallel arrays, allocations (``is_alloc``) and frees of local ids."""

    name: str
    is_alloc: np.ndarray   # bool
    local_id: np.ndarray   # int64, 0..n_allocs-1 in allocation order
    size: np.ndarray       # int64, the allocation's size on both its rows
    stream: np.ndarray     # int64

    @property
    def n_allocs(self) -> int:
        return int(self.is_alloc.sum())


def snapshot_requests(path: Path) -> Requests:
    """The allocations and completed frees of a snapshot's first device, every allocation freed by the end."""
    trace = read_trace(path)
    trace = select_device(trace, trace.devices[0])
    ev = trace.events
    kind, ids = ev["kind"].to_numpy(), ev["alloc_id"].to_numpy()
    allocs = kind == EventKind.ALLOC
    alloc_ids = ids[allocs]
    frees = (kind == EventKind.FREE_COMPLETED) & np.isin(ids, alloc_ids)   # not the blocks alive at the start
    keep = allocs | frees
    kept_ids, kept_alloc = ids[keep], allocs[keep]
    local = {aid: k for k, aid in enumerate(alloc_ids.tolist())}
    local_id = np.fromiter((local[a] for a in kept_ids.tolist()), dtype=np.int64, count=len(kept_ids))
    size_of = ev["size_bytes"].to_numpy()[allocs]
    stream_of = ev["stream"].to_numpy()[allocs]
    never_freed = np.setdiff1d(np.arange(len(alloc_ids)), local_id[~kept_alloc])
    local_id = np.concatenate([local_id, never_freed])
    is_alloc = np.concatenate([kept_alloc, np.zeros(len(never_freed), dtype=bool)])
    return Requests(path.name, is_alloc, local_id, size_of[local_id], stream_of[local_id])


def build_stream(paths: list[Path], target_requests: int, seed: int = 0, single_stream: bool = False) -> Trace:
    """The benchmark stream as a ``Trace`` (each free as a free request and its completion at the same time)."""
    streams = [snapshot_requests(p) for p in paths]
    rng = np.random.default_rng(seed)
    parts, requests, next_id = [], 0, 0
    while requests < target_requests:
        for req in streams:
            jitter = rng.integers(-JITTER_UNITS, JITTER_UNITS + 1, size=req.n_allocs) * UNIT_BYTES
            sizes = np.maximum(req.size + jitter[req.local_id], 1)
            parts.append((req.is_alloc, req.local_id + next_id, sizes, req.stream * (not single_stream)))
            next_id += req.n_allocs
            requests += len(req.is_alloc)
            if requests >= target_requests:
                break
    is_alloc = np.concatenate([p[0] for p in parts])
    ids, sizes, stream = (np.concatenate([p[k] for p in parts]) for k in (1, 2, 3))
    # A free becomes FREE_REQUESTED then FREE_COMPLETED (what the RMM reader makes of a logged free).
    repeat = np.where(is_alloc, 1, 2)
    row = np.repeat(np.arange(len(is_alloc)), repeat)
    second = np.zeros(len(row), dtype=bool)
    second[np.cumsum(repeat) - 1] = repeat == 2
    kind = np.where(is_alloc[row], EventKind.ALLOC, np.where(second, EventKind.FREE_COMPLETED,
                                                             EventKind.FREE_REQUESTED)).astype(np.uint8)
    events = pd.DataFrame({"t_ns": row.astype(np.int64) * STEP_NS, "kind": kind, "alloc_id": ids[row],
                           "size_bytes": sizes[row], "stream": stream[row],
                           "device": np.zeros(len(row), dtype=np.int16)}).astype(EVENT_DTYPES)
    meta = TraceMeta(format="benchmark-stream", source=f"{len(streams)} snapshots, {requests:,} requests",
                     devices=[0], notes=[f"rounds of {', '.join(r.name for r in streams)}; seed {seed}"])
    return Trace(events=events, meta=meta)


def requests_of(trace: Trace) -> int:
    """Allocations plus frees (a free request and its completion are one request, as in an RMM log)."""
    kind = trace.column("kind")
    return int(np.count_nonzero(kind == EventKind.ALLOC) + np.count_nonzero(kind == EventKind.FREE_COMPLETED))


def write_rmm_csv(trace: Trace, path: Path) -> None:
    """Write the stream as an RMM ``logging_resource_adaptor`` log (never-reused pointers, hex streams)."""
    ev = trace.events
    keep = ev["kind"].to_numpy() != EventKind.FREE_REQUESTED
    kind = ev["kind"].to_numpy()[keep]
    ids, sizes, streams, t_ns = (ev[c].to_numpy()[keep] for c in ("alloc_id", "size_bytes", "stream", "t_ns"))
    pointers = 0x7F0000000000 + ids * 1024
    with open(path, "w", encoding="ascii") as fh:
        fh.write("Thread,Time,Action,Pointer,Size,Stream\n")
        for k, ptr, size, stream, t in zip(kind.tolist(), pointers.tolist(), sizes.tolist(), streams.tolist(),
                                           t_ns.tolist()):
            us = t // 1000
            clock = f"{us // 3_600_000_000:02d}:{us // 60_000_000 % 60:02d}:{us // 1_000_000 % 60:02d}.{us % 1_000_000:06d}"
            action = "allocate" if k == EventKind.ALLOC else "free"
            fh.write(f"1,{clock},{action},{ptr:#x},{size},{stream & 0xFFFFFFFFFFFFFFFF:x}\n")


def default_paths() -> list[Path]:
    """The four default snapshots under ``../shared``; SystemExit naming what is missing."""
    paths = [SNAPSHOT_DIR / name for name in DEFAULT_SNAPSHOTS]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise SystemExit(f"shared snapshots missing: {', '.join(missing)} (pass --snapshots FILE...)")
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--out", required=True, help="output file: .parquet (allocsim) or .csv (RMM log)")
    parser.add_argument("--requests", type=int, default=1_000_000, help="minimum requests (default: %(default)s)")
    parser.add_argument("--snapshots", nargs="+", help="snapshot files (default: four shared snapshots)")
    parser.add_argument("--seed", type=int, default=0, help="jitter seed (default: %(default)s)")
    parser.add_argument("--single-stream", action="store_true", help="every request on stream 0")
    args = parser.parse_args(argv)
    paths = [Path(p) for p in args.snapshots] if args.snapshots else default_paths()
    started = time.perf_counter()
    trace = build_stream(paths, args.requests, args.seed, args.single_stream)
    out = Path(args.out)
    if out.suffix == ".csv":
        write_rmm_csv(trace, out)
    else:
        write_trace(trace, out)
    print(f"{out}: {requests_of(trace):,} requests, {len(trace.events):,} events "
          f"({time.perf_counter() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
