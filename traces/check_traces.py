#!/usr/bin/env python
"""Sanity-check the shipped traces (stdlib only: json + gzip).

For every ``traces/*.json.gz`` (or the files given on the command line) it
counts the Kineto ``[memory]`` events and replays them in file order to check
alloc/free pairing and the ``Total Allocated`` running counter. Prints a
Markdown table (used in traces/README.md) and, with ``-v``, per-file details.

    python traces/check_traces.py [-v] [FILE ...]
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
STEP_PREFIX = "ProfilerStep#"


def check(path: Path) -> dict:
    with gzip.open(path, "rt") as f:
        trace = json.load(f)
    ev = trace["traceEvents"]
    mem = [e for e in ev if e.get("name") == "[memory]"]
    steps = sorted((e for e in ev if e.get("name", "").startswith(STEP_PREFIX)), key=lambda e: e["ts"])
    other = [e for e in ev if e not in mem and e not in steps] if len(ev) != len(mem) + len(steps) else []

    live: dict[int, int] = {}
    running = 0
    orphan_frees = double_allocs = size_mismatch = total_alloc_mismatch = 0
    peak = 0
    ts_decreasing = 0
    prev_ts = float("-inf")
    idx = [e["args"].get("Ev Idx") for e in mem]
    for e in mem:
        a = e["args"]
        addr, nbytes = a["Addr"], a["Bytes"]
        if e["ts"] < prev_ts:
            ts_decreasing += 1
        prev_ts = e["ts"]
        if nbytes > 0:
            if addr in live:
                double_allocs += 1
            live[addr] = nbytes
        elif nbytes < 0:
            if addr not in live:
                orphan_frees += 1
            elif live.pop(addr) != -nbytes:
                size_mismatch += 1
        running += nbytes
        peak = max(peak, a["Total Allocated"])
        if a["Total Allocated"] != running:
            total_alloc_mismatch += 1

    in_step = 0
    for e in mem:
        if any(s["ts"] <= e["ts"] <= s["ts"] + s["dur"] for s in steps):
            in_step += 1

    b = [e["args"]["Bytes"] for e in mem]
    return dict(
        file=path.name,
        gz_bytes=path.stat().st_size,
        top_level_keys=sorted(k for k in trace if k != "traceEvents"),
        memory_events=len(mem),
        allocs=sum(1 for x in b if x > 0),
        frees=sum(1 for x in b if x < 0),
        zero_byte=sum(1 for x in b if x == 0),
        distinct_addr=len({e["args"]["Addr"] for e in mem}),
        device_types=sorted({e["args"]["Device Type"] for e in mem}),
        device_ids=sorted({e["args"]["Device Id"] for e in mem}),
        total_reserved_values=sorted({e["args"]["Total Reserved"] for e in mem}),
        arg_keys=sorted({k for e in mem for k in e["args"]}),
        steps=len(steps),
        step_ms=[round(s["dur"] / 1000, 1) for s in steps],
        other_events=len(other),
        mem_events_inside_steps=in_step,
        ev_idx_increasing=all(x < y for x, y in zip(idx, idx[1:])) if None not in idx else None,
        ts_decreasing=ts_decreasing,
        orphan_frees=orphan_frees,
        double_allocs=double_allocs,
        free_size_mismatch=size_mismatch,
        total_allocated_mismatch=total_alloc_mismatch,
        live_at_end=len(live),
        live_bytes_at_end=sum(live.values()),
        peak_total_allocated=peak,
        max_alloc=max((x for x in b if x > 0), default=0),
        min_alloc=min((x for x in b if x > 0), default=0),
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("files", nargs="*", type=Path)
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)
    files = args.files or sorted(HERE.glob("*.json.gz"))
    rows = [check(f) for f in files]
    print("| file | size (bytes) | [memory] events | allocs (Bytes>0) | frees (Bytes<0) | zero-byte | distinct Addr | Device Type | steps | orphan frees | live at end | peak Total Allocated (MiB) |")
    print("|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| `{r['file']}` | {r['gz_bytes']:,} | {r['memory_events']:,} | {r['allocs']:,} | {r['frees']:,} | {r['zero_byte']} "
            f"| {r['distinct_addr']:,} | {', '.join(map(str, r['device_types']))} | {r['steps']} | {r['orphan_frees']} "
            f"| {r['live_at_end']} | {r['peak_total_allocated'] / 2**20:,.1f} |"
        )
    if args.verbose:
        for r in rows:
            print(json.dumps(r))
    bad = [r["file"] for r in rows if r["total_allocated_mismatch"] or r["double_allocs"] or r["free_size_mismatch"]]
    if bad:
        print("inconsistent:", bad, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
