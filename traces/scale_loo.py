#!/usr/bin/env python
"""Leave-one-out check of ``allocsim scale`` on the captures of ``traces/scales/``.

For each model and series, the held-out capture at 2x the largest input value is predicted from
the smaller ones (all of them, then only the largest two, to show what two-point assumptions cost)
and both are replayed through the ``pytorch`` preset (no timing). Prints a Markdown table of peak
live and peak reserved, predicted vs captured. Target: peak live within 2%, peak reserved within 5%.

    python traces/scale_loo.py [--dir traces/scales] [--json]
"""
from __future__ import annotations

import argparse
import json
import sys
from fractions import Fraction
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from allocsim.scale import load_input, scale_inputs  # noqa: E402
from allocsim.scale.evaluate import compare_peaks, relative_error  # noqa: E402
from allocsim.scale.steps import live_bytes  # noqa: E402
from capture_scales import MODELS  # noqa: E402
from scale_analysis import series_files  # noqa: E402

LIVE_TARGET, RESERVED_TARGET = 0.02, 0.05


def loo_rows(directory: Path, models=MODELS, series=("batch", "seq"), two_point: bool = True) -> list[dict]:
    """One row per (model, series, input set): predicted vs captured peaks at the held-out value."""
    rows = []
    for model in models:
        for name in series:
            files = series_files(directory, model, name)
            if not all(p.exists() for p, _ in files):
                continue
            items = [load_input(str(p), Fraction(v)) for p, v in files]
            *inputs, truth = items
            variants = [inputs] + ([inputs[-2:]] if two_point else [])
            for used in variants:
                result = scale_inputs(used, truth.value, name)
                naive = naive_peak_live(used, truth.value)
                cmp = compare_peaks(result.trace, truth.trace)
                rows.append({
                    "model": model, "series": name,
                    "inputs": ",".join(str(item.value) for item in used), "target": str(truth.value),
                    "aligned_share": result.report.aligned_share,
                    "aligned_bytes_share": result.report.aligned_bytes_share,
                    "laws": {k: v for k, v in result.report.laws.items() if v},
                    **{f"pred_{k}": v for k, v in cmp["predicted"].items()},
                    **{f"true_{k}": v for k, v in cmp["truth"].items()},
                    "live_error": cmp["live_error"], "reserved_error": cmp["reserved_error"],
                    "naive_peak_live_bytes": naive,
                    "naive_live_error": relative_error(naive, cmp["truth"]["peak_live_bytes"]),
                })
    return rows


def naive_peak_live(inputs, target) -> int:
    """What a straight line through the two largest inputs' peak live bytes says at ``target``."""
    (v0, p0), (v1, p1) = sorted((item.value, int(live_bytes(item.trace).max())) for item in inputs)[-2:]
    return int(p1 + (p1 - p0) * (target - v1) / (v1 - v0))


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f}"


def table(rows: list[dict]) -> str:
    """The rows as the Markdown table of the README."""
    out = ["| model | series | inputs | predicted at | aligned (allocs / bytes) | peak live MiB: predicted / captured | error "
           "| peak reserved MiB: predicted / captured | error | a line through the input peaks |",
           "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        out.append(
            f"| {r['model']} | {r['series']} | {r['inputs']} | {r['target']} | "
            f"{100 * r['aligned_share']:.1f}% / {100 * r['aligned_bytes_share']:.1f}% | "
            f"{_mib(r['pred_peak_live_bytes'])} / {_mib(r['true_peak_live_bytes'])} | {100 * r['live_error']:+.2f}% | "
            f"{_mib(r['pred_peak_reserved_bytes'])} / {_mib(r['true_peak_reserved_bytes'])} | "
            f"{100 * r['reserved_error']:+.2f}% | {_mib(r['naive_peak_live_bytes'])} ({100 * r['naive_live_error']:+.1f}%) |")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", type=Path, default=HERE / "scales")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    rows = loo_rows(args.dir)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(table(rows))
        full = [r for r in rows if len(r["inputs"].split(",")) > 2]
        ok = all(abs(r["live_error"]) <= LIVE_TARGET and abs(r["reserved_error"]) <= RESERVED_TARGET for r in full)
        print(f"\ntarget (all inputs): peak live within {LIVE_TARGET:.0%}, peak reserved within {RESERVED_TARGET:.0%}: "
              + ("met" if ok else "MISSED"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
