"""Low and high ends of what a CPU run cannot know, learned on calibrate rows only, and how they hold on check rows.

``python -m validate milabench --calibrate`` fits them (``fit_ranges``, into
``validate/milabench_calibration.json`` "ranges"; ``allocsim.gpu_ranges`` holds the same numbers and
a test keeps them equal); every evaluation then gives each row a low, a point and a high prediction
(``predict_range``) and ``range_summary`` says, per set: the share of rows whose truth lies inside
the range, the median width of the range (high - low, as a share of the point), the median absolute
error of the point, and the rows whose truth lies above the high end -- each such row is a card on
which allocsim would say FITS (its high end fits) while the real run needs more than the card has.

The terms (see ``allocsim.gpu_ranges`` for what each one is):

* context: the least and the most context0 (batch-0 value less the card's local memory) of the
  calibrate groups' benchmarks that run no cuDNN; a negative value (a group whose scripts do not
  reproduce the run: the old A100 table's torch 2.4 Bert fp16) is no context and is left out;
* cuDNN: its loaded kernels from the least to the most of the calibrate groups' cuDNN terms (groups
  with a context), and shares of the reserved peak, the least and the most by which a calibrate row that runs
  cuDNN differs from the point estimate (truth - point, over the replay's reserved peak), over the
  rows of calibrate groups whose every benchmark that runs no cuDNN is reproduced (the median absolute
  error of its rows at most ``REPRODUCED``: a group whose scripts or libraries are another program
  than the one measured says nothing of cuDNN) and xMem's Anova rows (RTX 3060; their ground truth has no context in it) whose
  own reruns agree with their ground truth within ``XMEM_RERUN_AGREEMENT``;
* placement (rows that run no cuDNN): shares of the reserved peak, the 5% quantile and the most of
  (truth - point) / reserved peak over the reproduced groups' rows that run no cuDNN (the replay does
  not know where the driver places segments, so how the allocator fragments);
* NVML's reserved memory (only in these NVML comparisons, never in a verdict): per card, from its
  ``nvidia-smi -q`` printout to its NVML total less the lowest CUDA total recorded for it.
"""

from __future__ import annotations

import json
import os
import statistics
from typing import Any

MiB = 1 << 20
#: The low end of a term is this quantile of what the calibrate rows show, the high end the most any of
#: them shows: a FITS (the high end fits) is never wrong on the calibration data, a DOES NOT FIT (the low
#: end does not fit) on at most this share of it. The costs are not alike: a high end set too low says
#: FITS where the run does not fit; a low end set too high only says DOES NOT FIT where it would.
LOW_QUANTILE = 0.05
#: Each benchmark that runs no cuDNN in a calibrate group must be predicted this well (median absolute
#: error of its rows) for the group's cuDNN rows to calibrate the cuDNN term: else the group's scripts
#: or libraries are not the run measured.
REPRODUCED = 0.10


def low_quantile(values: list[float]) -> float:
    """The ``LOW_QUANTILE`` of ``values`` (nearest rank, the lower one)."""
    ordered = sorted(values)
    return ordered[int(LOW_QUANTILE * (len(ordered) - 1))]


def context_range(calibration: dict[str, Any]) -> dict[str, Any]:
    """The least and the most context0 of the calibrate groups' benchmarks that run no cuDNN."""
    from validate.milabench import CUDNN_BENCHMARKS   # noqa: PLC0415

    values = []
    for group in calibration.get("terms", []):
        for bench, line in group.get("per_benchmark", {}).items():
            if bench in CUDNN_BENCHMARKS:
                continue
            context0 = line["at_batch_0_mib"] * MiB - group["local_bytes"]
            values.append({"group": f"{group['card']}, {group['libraries']}", "benchmark": bench,
                           "context0_bytes": int(context0), "kept": context0 >= 0})
    kept = [v["context0_bytes"] for v in values if v["kept"]]
    return {"low_bytes": int(low_quantile(kept)), "high_bytes": max(kept), "values": values}


#: An xMem row whose own reruns (the allocator not capped below its ground truth) peaked further than
#: this from its ground truth is not one measurement of one value: it calibrates nothing.
XMEM_RERUN_AGREEMENT = 0.05


def xmem_shares() -> tuple[list[dict[str, Any]], list[str]]:
    """(ground - prediction) / reserved peak of xMem's Anova rows at the calibrated ratios (their ground has
    no context), and the rows left out because their own reruns disagree with their ground truth."""
    from validate import xmem   # noqa: PLC0415

    with open(xmem.CALIBRATION_PATH, encoding="utf-8") as fh:
        cal = json.load(fh)
    ratios = [cal["cudnn_workspace_ratios"]["kernel"], cal["cudnn_workspace_ratios"]["pointwise_data"]]
    trial = next(t for t in cal["trials"] if t["ratios"] == ratios)
    rows = {r["folder"]: r for r in xmem.load_rows("calibrate")}
    out, left_out = [], []
    for row, reserved in zip(cal["rows"], trial["reserved_peak_bytes"]):
        ground = rows[row["folder"]]["ground_bytes"]
        off = [r["vs_ground"] for r in xmem.rerun_peaks(rows[row["folder"]]) if not r["binding"]]
        worst = max(off, key=abs) if off else 0.0
        if abs(worst) > XMEM_RERUN_AGREEMENT:
            left_out.append(f"xMem {row['folder']}: a rerun of it peaked {worst:+.1%} off its ground truth")
            continue
        predicted = reserved + cal["library_bytes"]
        out.append({"row": f"xMem {row['folder']}", "share": (ground - predicted) / reserved})
    return out, left_out


def cudnn_shares(results: list[dict[str, Any]], cudnn: bool = True) -> tuple[list[dict[str, Any]], list[str]]:
    """Per calibrate row that runs cuDNN (``cudnn`` False: that runs none), in a reproduced group:
    (truth - point) / reserved peak; and the groups left out."""
    from validate.milabench import CUDNN_BENCHMARKS, library_key   # noqa: PLC0415

    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in results:
        if r.get("set") == "calibrate" and "error" in r:
            groups.setdefault((r["card"], library_key(r)), []).append(r)
    shares, left_out = [], []
    for (card, lib), group in sorted(groups.items()):
        plain: dict[str, list[float]] = {}
        for r in group:
            if r["benchmark"] not in CUDNN_BENCHMARKS:
                plain.setdefault(r["benchmark"], []).append(abs(r["error"]))
        off = {b: statistics.median(errors) for b, errors in plain.items() if statistics.median(errors) > REPRODUCED}
        if not plain or off:
            left_out.append(f"{card}, {lib}: " + ("no rows that run no cuDNN" if not plain else
                            "not reproduced: " + ", ".join(f"{b} off by a median {e:.1%}" for b, e in sorted(off.items()))))
            continue
        for r in group:
            if (r["benchmark"] in CUDNN_BENCHMARKS) == cudnn and r["reserved_peak_bytes"] > 0:
                shares.append({"row": f"{card} {r['benchmark']} {r['batch']}",
                               "share": (r["ground_bytes"] - r["predicted_bytes"]) / r["reserved_peak_bytes"]})
    return shares, left_out


def fit_ranges(calibration: dict[str, Any], results: list[dict[str, Any]]) -> dict[str, Any]:
    """The ranges of the unknown terms from the calibrate rows (``results``: evaluated under ``calibration``)."""
    context = context_range(calibration)
    shares, left_out = cudnn_shares(results)
    more, unstable = xmem_shares()
    shares += more
    left_out += unstable
    values = [s["share"] for s in shares]
    placement, _left = cudnn_shares(results, cudnn=False)
    placed = [p["share"] for p in placement]
    kernels = [g["cudnn_bytes"] for g in calibration.get("terms", [])
               if "cudnn_bytes" in g and g.get("context0_bytes", -1) >= 0]
    return {"context0_low_bytes": context["low_bytes"], "context0_high_bytes": context["high_bytes"],
            "cudnn_kernels_low_bytes": min(kernels), "cudnn_kernels_high_bytes": max(kernels),
            "cudnn_share_low": round(low_quantile(values), 4), "cudnn_share_high": round(max(values), 4),
            "placement_share_low": round(low_quantile(placed), 4), "placement_share_high": round(max(placed), 4),
            "context_values": context["values"], "cudnn_shares": shares, "cudnn_groups_left_out": left_out,
            "placement_shares": placement,
            "about": "fitted on calibrate rows only (milabench L40S and old A100 tables, xMem's Anova rows); each "
                     f"range from the {LOW_QUANTILE:.0%} quantile to the most of what the rows show: context0 of the "
                     "batch-0 values less local memory of the benchmarks that run no cuDNN (negative values left "
                     "out); cuDNN's share of (truth - point) / reserved peak of the rows that run cuDNN in groups "
                     f"whose every benchmark that runs no cuDNN is reproduced (median absolute error at most "
                     f"{REPRODUCED:.0%}) and of xMem's Anova rows whose reruns agree with them; placement's share of "
                     "the same for those groups' rows that run no cuDNN"}


def nvml_reserved_range(card: str) -> tuple[int, int, int]:
    """(low, point, high) of NVML's reserved memory on a milabench card, in bytes."""
    from allocsim.gpus import find_gpu   # noqa: PLC0415
    from validate.milabench import CARDS   # noqa: PLC0415

    c = CARDS[card]
    point = c["nvml_reserved_mib"] * MiB
    implied = c["nvml_total_mib"] * MiB - c.get("cuda_total_bytes", find_gpu(c["model"]).total_bytes)
    if not c.get("recorded"):
        lows = [v["nvml_reserved_mib"] * MiB for v in CARDS.values() if v.get("recorded")]
        return min(lows), point, max(point, implied)
    return min(point, implied), point, max(point, implied)


def predict_range(row: dict[str, Any], result: dict[str, Any], terms: dict[str, Any],
                  ranges: dict[str, Any] | None) -> dict[str, Any]:
    """The row's low and high prediction in NVML terms beside the point (``ranges`` None: the point at both ends)."""
    from validate.milabench import CUDNN_BENCHMARKS, local_bytes, CARDS   # noqa: PLC0415

    reserved = result["reserved_peak_bytes"]
    nvml_low, nvml_point, nvml_high = nvml_reserved_range(row["card"])
    point = reserved + terms["context_bytes"] + terms["cudnn_bytes"] + nvml_point
    if not ranges:
        return {"low_bytes": int(point), "high_bytes": int(point)}
    local = local_bytes(CARDS[row["card"]]["model"])
    ctx_low = min(terms["context_bytes"], ranges["context0_low_bytes"] + local)
    ctx_high = max(terms["context_bytes"], ranges["context0_high_bytes"] + local)
    cudnn_low = cudnn_high = terms["cudnn_bytes"]
    if row["benchmark"] not in CUDNN_BENCHMARKS:      # the placement term (no cuDNN: see allocsim.gpu_ranges)
        cudnn_low += min(0.0, ranges.get("placement_share_low", 0.0)) * reserved
        cudnn_high += max(0.0, ranges.get("placement_share_high", 0.0)) * reserved
    else:
        cudnn_low = min(cudnn_low, ranges["cudnn_kernels_low_bytes"]) + min(0.0, ranges["cudnn_share_low"]) * reserved
        cudnn_high = (max(cudnn_high, ranges["cudnn_kernels_high_bytes"])
                      + max(0.0, ranges["cudnn_share_high"]) * reserved)
    return {"low_bytes": int(reserved + ctx_low + cudnn_low + nvml_low),
            "high_bytes": int(reserved + ctx_high + cudnn_high + nvml_high)}


def range_summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Inside share, median width, median absolute error of the point, rows above the high end."""
    done = [r for r in results if "error" in r]
    if not done:
        return {"rows": 0}
    inside = [r["low_bytes"] <= r["ground_bytes"] <= r["high_bytes"] for r in done]
    widths = [(r["high_bytes"] - r["low_bytes"]) / r["predicted_bytes"] for r in done]
    above = [r for r in done if r["ground_bytes"] > r["high_bytes"]]
    below = [r for r in done if r["ground_bytes"] < r["low_bytes"]]
    return {"rows": len(done), "inside": sum(inside), "inside_share": sum(inside) / len(done),
            "median_width": statistics.median(widths), "median_abs_error": statistics.median(abs(r["error"]) for r in done),
            "above_high": len(above), "below_low": len(below),
            "above_rows": [f"{r['card']} {r['benchmark']} {r['batch']}" for r in above],
            "below_rows": [f"{r['card']} {r['benchmark']} {r['batch']}" for r in below]}


def false_fits_on_models(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every (row, GPU model) where allocsim's verdict is FITS and the real run needs more than the model has.

    The real run's need on the CUDA side is its ground less NVML's reserved memory of its card; the
    verdict is FITS when the high end on the CUDA side (high less NVML's high end) is within the
    model's total. The rows' own cards are among the models.
    """
    from allocsim.gpus import GPUS   # noqa: PLC0415

    out = []
    for r in results:
        if "error" not in r:
            continue
        nvml_low, nvml_point, nvml_high = nvml_reserved_range(r["card"])
        need = r["ground_bytes"] - nvml_point
        high = r["high_bytes"] - nvml_high
        for gpu in GPUS:
            if high <= gpu.total_bytes < need:
                out.append({"row": f"{r['card']} {r['benchmark']} {r['batch']}", "gpu": gpu.name,
                            "need_bytes": int(need), "high_bytes": int(high), "gpu_total_bytes": gpu.total_bytes})
    return out


def format_range_summary(results: list[dict[str, Any]]) -> str:
    """One line per (set, card) and per set: rows, inside, width, error, above the high end."""
    lines = ["| set | card | rows | truth inside the range | median width | median abs. error (point) | "
             "truth above the high end (a FITS where the run does not fit) | truth below the low end |",
             "|---|---|---|---|---|---|---|---|"]
    order = {"calibrate": 0, "check": 1}
    for which in sorted({r["set"] for r in results}, key=lambda w: order.get(w, 2)):
        for card in sorted({r["card"] for r in results if r["set"] == which}) + ["all"]:
            group = [r for r in results if r["set"] == which and (card == "all" or r["card"] == card)]
            s = range_summary(group)
            if not s["rows"]:
                continue
            lines.append(f"| {which} | {card} | {s['rows']} | {s['inside']} ({s['inside_share']:.1%}) | "
                         f"{s['median_width']:.1%} | {s['median_abs_error']:.1%} | {s['above_high']} | "
                         f"{s['below_low']} |")
    return "\n".join(lines)


def write_ranges(ranges: dict[str, Any], path: str) -> None:
    """Put ``ranges`` into the calibration file at ``path`` (its other keys kept)."""
    data = {}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    data["ranges"] = ranges
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1)
