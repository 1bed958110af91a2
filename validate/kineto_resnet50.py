"""Hold a capture's requests against a real GPU step: ``python validate/kineto_resnet50.py CAPTURE KINETO``.

KINETO is the Kineto sample ``pytorch_kineto_resnet50_nw0_1623143566756.json.gz`` (pytorch/kineto
``tb_plugin/samples/resnet50_num_workers_0``: ResNet-50 training, batch 32 at 224x224, SGD with
momentum, ``cudnn.benchmark``, on a V100 with PyTorch of 2021), CAPTURE an ``allocsim capture`` of
``validate/kineto_resnet50_train.py``, the same loop. Its 2021 format gives each GPU allocation's
block size, not the request: a request rounded up to 512 bytes, or a larger free block handed out
whole when splitting it would leave 1 MiB or less (large pool) or under 512 bytes (small pool).
For the last profiled real step and the capture's fourth step (momentum buffers exist in both),
each captured request is matched to a real block of exactly its size, else to the smallest real
block the allocator could have handed out for it; what is left over on the real side are
allocations made inside kernels (cuDNN's workspaces), which a CPU capture cannot see.
"""

from __future__ import annotations

import bisect
import gzip
import json
import sys
from collections import Counter

from allocsim.trace import read_trace
from allocsim.trace.schema import EventKind

MiB = 1 << 20


def real_steps(path: str) -> list[Counter]:
    """Block sizes of the GPU allocations in each profiled step, in step order."""
    with gzip.open(path, "rt") as fh:
        events = json.load(fh)["traceEvents"]
    steps = sorted({(e["ts"], e["ts"] + e["dur"]) for e in events
                    if e.get("ph") == "X" and e.get("name", "").startswith("ProfilerStep#")})
    allocs = [(e["ts"], int(e["args"]["Bytes"])) for e in events if e.get("name") == "[memory]"
              and e["args"].get("Device Type") == 1 and e["args"].get("Bytes", 0) > 0]
    return [Counter(b for ts, b in allocs if t0 <= ts <= t1) for t0, t1 in steps]


def captured_steps(path: str) -> list[Counter]:
    """Request sizes of the capture between its step markers."""
    trace = read_trace(path)
    steps: list[Counter] = []
    for kind, value, size in zip(trace.events["kind"], trace.events["alloc_id"], trace.events["size_bytes"]):
        if kind == int(EventKind.MARKER):
            steps.append(Counter())
        elif kind == int(EventKind.ALLOC) and steps:
            steps[-1][int(size)] += 1
    return steps


def could_serve(request: int, block: int) -> bool:
    """Whether PyTorch's allocator could hand out ``block`` bytes for ``request`` (see the module doc)."""
    rounded = max(512, -(-request // 512) * 512)
    slack = MiB if rounded > MiB else 511
    return rounded <= block <= rounded + slack


def match(real: Counter, captured: Counter) -> dict[str, int]:
    """Exact matches, matches under the allocator's block rule, and what is left on each side."""
    exact = real & captured
    left_real = sorted((real - exact).elements())
    unmatched = 0
    served = 0
    for request in sorted((captured - exact).elements()):
        i = bisect.bisect_left(left_real, max(512, -(-request // 512) * 512))
        if i < len(left_real) and could_serve(request, left_real[i]):
            left_real.pop(i)
            served += 1
        else:
            unmatched += 1
    return {"real_allocations": sum(real.values()), "captured_requests": sum(captured.values()),
            "exact": sum(exact.values()), "served_by_rule": served, "captured_unmatched": unmatched,
            "real_left": len(left_real), "real_left_bytes": sum(left_real)}


def main(argv: list[str]) -> int:
    captured, real = captured_steps(argv[0]), real_steps(argv[1])
    report = match(real[-1], captured[3])
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
