"""Time and memory of ``allocsim capture`` from 125M to 70B parameters: ``python benchmarks/capture_scaling.py``.

Each configuration of ``benchmarks/decoder_train.py`` (a decoder built on the CPU, moved to ``cuda``,
one AdamW step) is captured in a fresh process, which reports the capture's wall seconds, the
largest resident set of the script's process (the capture child) and of allocsim's side (the
parent that builds the trace), the requests recorded and the peaks the allocator model saw. The
point: memory and time follow the number of operators, not the model's bytes. ``--configs`` picks
some; ``--json`` prints the rows for scripts. Prints a markdown table (docs/capture.md has it).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
CONFIG_ORDER = ("125m", "1.3b", "2.7b", "7b", "70b")


def parameters(config: str) -> int:
    """The configuration's parameter count, from its shapes (``decoder_train.CONFIGS``)."""
    sys.path.insert(0, HERE)
    from decoder_train import CONFIGS  # noqa: PLC0415

    d, layers, heads, kv_heads, d_ff, vocab, gated = CONFIGS[config]
    head_dim = d // heads
    block = d * d + d * 2 * kv_heads * head_dim + d * d + d * (2 if gated else 1) * d_ff + d_ff * d + 2 * d
    return layers * block + 2 * vocab * d + d


def one(config: str, out_dir: str, seq: int) -> dict:
    """Capture one configuration in this process; the row of figures."""
    from allocsim.gpus import find_gpu  # noqa: PLC0415
    from allocsim.torch_capture.session import capture  # noqa: PLC0415

    out = os.path.join(out_dir, f"decoder_{config}.parquet")
    t0 = time.perf_counter()
    result, _trace = capture([sys.executable, os.path.join(HERE, "decoder_train.py"), "--config", config,
                              "--seq", str(seq)], out, steps=1, gpu=find_gpu("H100").capture_properties())
    seconds = time.perf_counter() - t0
    return {"config": config, "parameters": parameters(config), "status": result.status,
            "seconds": round(seconds, 1), "allocations": result.summary.get("allocs", 0),
            "child_max_rss_bytes": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024,
            "parent_max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "peak_allocated_bytes": result.summary.get("peak_allocated_bytes", 0),
            "peak_reserved_bytes": result.summary.get("peak_reserved_bytes", 0)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", choices=CONFIG_ORDER, default=list(CONFIG_ORDER))
    parser.add_argument("--seq", type=int, default=512, help="tokens per sequence (batch 1)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--out-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.one, args.out_dir, args.seq)))
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as out_dir:
        for config in args.configs:
            done = subprocess.run([sys.executable, __file__, "--one", config, "--out-dir", out_dir, "--seq",
                                   str(args.seq)], capture_output=True, text=True)
            if done.returncode != 0:
                print(done.stderr[-2000:], file=sys.stderr)
                return 1
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    gib = 1 << 30
    print(f"| model | parameters | fp32 weights | capture s | script's RSS | allocsim's RSS | requests | "
          f"peak allocated | peak reserved |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['config']} | {r['parameters']:,} | {4 * r['parameters'] / gib:.1f} GiB | {r['seconds']:.1f} | "
              f"{r['child_max_rss_bytes'] / (1 << 20):.0f} MiB | {r['parent_max_rss_bytes'] / (1 << 20):.0f} MiB | "
              f"{r['allocations']:,} | {r['peak_allocated_bytes'] / gib:.2f} GiB | "
              f"{r['peak_reserved_bytes'] / gib:.2f} GiB |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
