"""Measure cuDNN's workspaces in a real GPU step: ``python validate/cudnn_evidence.py KINETO``.

KINETO is the Kineto ResNet-50 sample in ``../shared/traces/kineto-gpu/`` (batch 32 at 224x224, a
V100, ``cudnn.benchmark``, PyTorch of 2021; see ``validate/kineto_resnet50.py``). Inside each
``aten::cudnn_convolution*`` operator of the last profiled step, a GPU allocation that the same
operator frees again is that kernel's workspace (the output stays). The report gives, per phase and
for 1x1 against larger kernels, how many calls took one and its size over the convolution's larger
feature map: the quantity ``allocsim.torch_capture.cudnn`` models. This is evidence for the model's
shape only (another GPU, and ``benchmark`` picks the fastest engine, not the heuristic's first);
the ratio itself is fitted on xMem's Anova rows (``python -m validate xmem --calibrate``).
"""

from __future__ import annotations

import bisect
import gzip
import json
import statistics
import sys
from collections import defaultdict

#: Profiler operator -> phase.
PHASES = {"aten::cudnn_convolution": "forward",
          "aten::cudnn_convolution_backward_input": "backward data",
          "aten::cudnn_convolution_backward_weight": "backward filter"}


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def workspaces(path: str) -> list[dict]:
    """One row per cuDNN call of the last profiled step: phase, kernel area, workspace and feature-map bytes."""
    with gzip.open(path, "rt") as fh:
        events = json.load(fh)["traceEvents"]
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                   if e.get("ph") == "X" and e.get("name", "").startswith("ProfilerStep#"))
    t0, t1 = steps[-1]
    memory = sorted((e["ts"], int(e["args"]["Bytes"])) for e in events
                    if e.get("name") == "[memory]" and e["args"].get("Device Type") == 1 and t0 <= e["ts"] <= t1)
    stamps = [m[0] for m in memory]
    rows = []
    for op in events:
        phase = PHASES.get(op.get("name"))
        if phase is None or op.get("ph") != "X" or not t0 <= op["ts"] <= t1:
            continue
        lo, hi = bisect.bisect_left(stamps, op["ts"]), bisect.bisect_right(stamps, op["ts"] + op["dur"])
        inside = [b for _t, b in memory[lo:hi]]
        freed = [-b for b in inside if b < 0]
        taken = [b for b in inside if b > 0 and b in freed]
        dims = [d for d in op["args"].get("Input Dims", []) if isinstance(d, list) and len(d) == 4]
        # forward: (input, weight); backward data: (grad_output, weight); backward filter: (grad_output,
        # input). The profiler does not record the output, so the feature map is the one it shows.
        kernel = dims[1][2] * dims[1][3] if phase != "backward filter" else None
        maps = dims if phase == "backward filter" else dims[:1]
        # backward data computes the input's gradient: (N, C_in, H, W) with the output's H, W at stride 1
        gradient = (dims[0][0] * dims[1][1] * dims[0][2] * dims[0][3] * 4) if phase == "backward data" else None
        rows.append({"phase": phase, "dims": dims, "kernel_area": kernel,
                     "workspace_bytes": max(taken, default=0),
                     "feature_map_bytes": max(_numel(d) for d in maps) * 4, "gradient_bytes": gradient})
    return rows


def summary(rows: list[dict]) -> dict:
    """Calls, calls with a workspace, their bytes and the median ratio, per (phase, 1x1 or larger kernel).

    For 1x1 backward data, ``at_gradient_bytes`` counts the calls whose workspace is the bytes of the
    gradient they compute (to 1 MiB, stride 1 assumed): the quantity the model's second ratio scales.
    """
    groups: dict[str, list[float]] = defaultdict(list)
    total_bytes: dict[str, int] = defaultdict(int)
    at_gradient = 0
    for r in rows:
        if r["phase"] == "backward data" and r["kernel_area"] == 1 and r["workspace_bytes"] > 0:
            at_gradient += abs(r["workspace_bytes"] - r["gradient_bytes"]) < (1 << 20)
        if r["kernel_area"] is None:
            kind = "any kernel"      # the profiler gives backward-filter calls no weight shape
        else:
            kind = "1x1" if r["kernel_area"] == 1 else "larger than 1x1"
        groups[f"{r['phase']}, {kind}"].append(r["workspace_bytes"] / r["feature_map_bytes"])
        total_bytes[f"{r['phase']}, {kind}"] += r["workspace_bytes"]
    found = {k: {"calls": len(v), "with_workspace": sum(x > 0 for x in v), "workspace_bytes": total_bytes[k],
                 "median_ratio": round(statistics.median(v), 3), "max_ratio": round(max(v), 3)}
             for k, v in sorted(groups.items())}
    if "backward data, 1x1" in found:
        found["backward data, 1x1"]["at_gradient_bytes"] = at_gradient
    return found


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python validate/cudnn_evidence.py KINETO_TRACE.json.gz", file=sys.stderr)
        return 2
    print(json.dumps(summary(workspaces(argv[0])), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
