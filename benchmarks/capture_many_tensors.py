"""Time and memory of ``allocsim capture`` as the script's live tensors grow: ``python benchmarks/capture_many_tensors.py 100000``.

The script keeps N one-element CUDA tensors alive (``[torch.empty(1, device="cuda") for _ in
range(N)]``), so every request is live at once: the per-request cost of the capture child (the
dispatch modes, the tracker, the channel) and of allocsim's side (checking each record, the trace
builder, the allocator model) with nothing else to do. Each N is captured in a fresh process, which
prints the capture's wall seconds, the CPU seconds and largest resident set of each side, and the
allocations recorded. ``--json`` prints the rows for scripts.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import textwrap
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

SCRIPT = """
import sys, torch
keep = [torch.empty(1, device="cuda") for _ in range(int(sys.argv[1]))]
"""


def one(n: int, folder: str) -> dict:
    """Capture N live tensors in this process; the row of figures."""
    from allocsim.torch_capture.session import capture  # noqa: PLC0415

    script = os.path.join(folder, "many_tensors.py")
    with open(script, "w") as fh:
        fh.write(textwrap.dedent(SCRIPT))
    start = time.monotonic()
    result, _trace = capture([sys.executable, script, str(n)], os.path.join(folder, f"many{n}.parquet"))
    wall = time.monotonic() - start
    me, child = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"tensors": n, "status": result.status, "allocations": result.summary.get("allocs", 0),
            "wall_s": round(wall, 1), "allocsim_cpu_s": round(me.ru_utime + me.ru_stime, 1),
            "allocsim_rss_mib": round(me.ru_maxrss / 1024), "script_cpu_s": round(child.ru_utime + child.ru_stime, 1),
            "script_rss_mib": round(child.ru_maxrss / 1024)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("counts", nargs="*", type=int, default=[100_000], help="live tensors (default 100000)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)       # the worker: one count, this process
    args = parser.parse_args()
    if args.one is not None:
        with tempfile.TemporaryDirectory() as folder:
            print(json.dumps(one(args.one, folder)))
        return 0
    rows = []
    for n in args.counts:
        done = subprocess.run([sys.executable, __file__, "--one", str(n)], capture_output=True, text=True)
        if done.returncode != 0:
            print(done.stderr, file=sys.stderr)
            return done.returncode
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print("| live tensors | status | allocations | wall s | allocsim CPU s | allocsim RSS MiB | script CPU s | script RSS MiB |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['tensors']:,} | {r['status']} | {r['allocations']:,} | {r['wall_s']} | {r['allocsim_cpu_s']} | "
              f"{r['allocsim_rss_mib']} | {r['script_cpu_s']} | {r['script_rss_mib']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
