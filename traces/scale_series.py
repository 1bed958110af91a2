#!/usr/bin/env python
"""Predict the largest size of each real GPU series of ``../shared/traces/scale-series`` from the smaller ones.

Each single-configuration series (one program, one precision, recorded at several context lengths)
is predicted at its largest size from the smaller sizes, and prediction and recording are replayed
through the ``pytorch`` preset (no timing). Prints a Markdown table of peak live and peak reserved,
predicted vs recorded, with the range the inputs leave open; then tries the mixed pair (the
charliesabino fp32 run at 128 with its autocast run at 256), which must be refused. Targets: peak
live within 2%, peak reserved within 5%, the truth inside the stated range. The last column says
how the prediction laid out its start-of-window state (``allocsim.scale.start_layout``).

    python traces/scale_series.py [--dir ../shared/traces/scale-series] [--json]
"""
from __future__ import annotations

import argparse
import json
import sys
from fractions import Fraction
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from allocsim.scale import load_input  # noqa: E402
from allocsim.scale.build import Scaler  # noqa: E402
from allocsim.scale.consistency import MixedInputs  # noqa: E402
from allocsim.scale.evaluate import peaks, relative_error  # noqa: E402

DEFAULT_DIR = HERE.parent.parent / "shared" / "traces" / "scale-series"

#: name -> (file pattern with {v}, sizes in order); the last size is predicted from the others.
SERIES = {
    "cherryni2022 medium": ("cherryni2022_cs336-assignment2-system_memory_nvtx_medium_{v}_forward.pickle",
                            (128, 256, 512, 1024)),
    "cherryni2022 small": ("cherryni2022_cs336-assignment2-system_memory_nvtx_small_{v}_forward.pickle",
                           (128, 256, 512, 1024)),
    "yyin-dev xl b4": ("yyin-dev_cs336-a2_xl_b4_fwd_ctx_{v}.pickle", (128, 256, 512)),
    "Hyperion-shuo large": ("Hyperion-shuo_assignment2-systems_memory_snapshot_large_cl{v}_fw_with_grad.pickle",
                            (128, 256, 512)),
    "charliesabino 2.7B fp32": ("charliesabino_cs336-assignment2_2.7B-{v}-fwd-memory-snapshot.pickle", (128, 256, 512)),
    "charliesabino 2.7B mixed": ("charliesabino_cs336-assignment2_2.7B-{v}-fwd-memory-snapshot_mixed.pickle",
                                 (128, 256, 512)),
}
#: Two inputs of different precisions: (file, value) pairs that must be refused.
MIXED_PAIR = (("charliesabino_cs336-assignment2_2.7B-128-fwd-memory-snapshot.pickle", 128),
              ("charliesabino_cs336-assignment2_2.7B-256-fwd-memory-snapshot_mixed.pickle", 256))
LIVE_TARGET, RESERVED_TARGET = 0.02, 0.05
#: How the prediction laid out its start-of-window state (``version_hints.scale.start_layout``).
LAYOUTS = {"steady": "weights as recorded, the rest as a step of the window leaves it",
           "cached": "the reference run's, cached segments and all (one process ran the inputs in turn)",
           "placed": "weights as recorded, the rest placed anew"}


def series_row(directory: Path, name: str, two_inputs: bool = False) -> dict:
    """Prediction of one series' largest size from the smaller ones (the two largest only if ``two_inputs``)."""
    pattern, values = SERIES[name]
    items = [load_input(str(directory / pattern.format(v=v)), Fraction(v)) for v in values]
    *inputs, truth = items
    if two_inputs:
        inputs = inputs[-2:]
    result = Scaler(inputs, "seq").at(truth.value)
    rng = result.report.prediction_range
    true = peaks(truth.trace)
    row = {"series": name, "inputs": ",".join(str(i.value) for i in inputs), "target": str(truth.value),
           "aligned_share": result.report.aligned_share, "undetermined": result.report.undetermined,
           "no_monomial": result.report.no_monomial,
           "start_layout": result.trace.meta.version_hints["scale"]["start_layout"]}
    for key in ("peak_live_bytes", "peak_reserved_bytes"):
        short = key.split("_")[1]
        row[f"pred_{short}"] = rng[key]["point"]
        row[f"low_{short}"], row[f"high_{short}"] = rng[key]["low"], rng[key]["high"]
        row[f"true_{short}"] = true[key]
        row[f"{short}_error"] = relative_error(rng[key]["point"], true[key])
        row[f"{short}_in_range"] = rng[key]["low"] <= true[key] <= rng[key]["high"]
    return row


def mixed_pair(directory: Path) -> str:
    """The refusal line for the mixed pair (or a line saying it was not refused)."""
    inputs = [load_input(str(directory / f), Fraction(v)) for f, v in MIXED_PAIR]
    try:
        Scaler(inputs, "seq").at(Fraction(512))
    except MixedInputs as exc:
        return f"refused: {exc}"
    return "NOT refused"


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f}"


def table(rows: list[dict]) -> str:
    """The rows as the Markdown table of the README."""
    out = ["| series | inputs | predicted at | peak live GB: predicted / recorded | error | range | "
           "peak reserved GB: predicted / recorded | error | range | start-of-window layout |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        def rng(short: str) -> str:
            if r[f"low_{short}"] == r[f"high_{short}"]:
                return "point"
            return f"{_gb(r[f'low_{short}'])}-{_gb(r[f'high_{short}'])}" + ("" if r[f"{short}_in_range"] else " (outside)")
        out.append(f"| {r['series']} | {r['inputs']} | {r['target']} | {_gb(r['pred_live'])} / {_gb(r['true_live'])} | "
                   f"{100 * r['live_error']:+.2f}% | {rng('live')} | {_gb(r['pred_reserved'])} / "
                   f"{_gb(r['true_reserved'])} | {100 * r['reserved_error']:+.2f}% | {rng('reserved')} | "
                   f"{LAYOUTS[r['start_layout']]} |")
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="the scale-series folder")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args()
    if not args.dir.is_dir():
        print(f"scale_series: {args.dir} is absent (the shared traces live there)", file=sys.stderr)
        return 2
    rows = [series_row(args.dir, name) for name in SERIES]
    refusal = mixed_pair(args.dir)
    if args.json:
        print(json.dumps({"rows": rows, "mixed_pair": refusal}, indent=2))
    else:
        print(table(rows))
        print()
        print(f"fp32 128 + autocast 256: {refusal}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
