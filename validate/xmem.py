"""Hold ``allocsim capture`` + ``run --gpu`` against xMem's published ground truth: ``python -m validate xmem``.

For each row of ``validate/xmem_rows.json`` (xMem's own runs on an RTX 3060), ``allocsim capture``
runs ``validate/xmem_train.py`` (xMem's training loop, ``cuda`` hard-coded) on this machine's CPU,
``allocsim run --policy pytorch --gpu "RTX 3060" --fast --json`` replays the trace, and allocsim's
prediction is ``gpu_estimate.total_bytes`` less the CUDA context, which xMem's ground truth leaves out.
Errors are |predicted - ground| / ground; a false "fits" is a prediction at or below ground - 5%.

``--calibrate`` fits ``library_bytes`` (the memory a CPU run cannot see: loaded kernels, cuDNN
workspaces) as the median of ground - reserved peak - workspaces over the ``calibrate`` rows (xMem's
001-Anova set) and writes ``validate/xmem_calibration.json``; the ``check`` rows (002-Monte Carlo)
are only ever compared. Captures are kept in ``--work`` and reused.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROWS_PATH = os.path.join(HERE, "xmem_rows.json")
CALIBRATION_PATH = os.path.join(HERE, "xmem_calibration.json")
TRAIN_SCRIPT = os.path.join(HERE, "xmem_train.py")
FALSE_FIT_MARGIN = 0.05


def load_rows(which: str) -> list[dict[str, Any]]:
    """The rows of ``xmem_rows.json`` in set ``which`` ('check', 'calibrate' or 'all')."""
    with open(ROWS_PATH, encoding="utf-8") as fh:
        rows = json.load(fh)["rows"]
    return [r for r in rows if which == "all" or r["set"] == which]


def _name(row: dict[str, Any]) -> str:
    return f"{row['model']}_{row['optimiser']}_{row['batch']}"


def capture(row: dict[str, Any], work: str) -> tuple[str, float]:
    """The row's trace in ``work`` (captured now unless already there) and the capture's seconds (0: reused)."""
    path = os.path.join(work, _name(row) + ".parquet")
    if os.path.exists(path):
        return path, 0.0
    t0 = time.perf_counter()
    argv = [sys.executable, "-m", "allocsim", "capture", "-o", path, "--",
            sys.executable, TRAIN_SCRIPT, row["model"], row["optimiser"], str(row["batch"])]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"capture of {_name(row)} failed ({done.returncode}): {done.stderr.strip()[-400:]}")
    return path, time.perf_counter() - t0


def replay(path: str, gpu: str) -> tuple[dict[str, Any], float]:
    """``allocsim run --gpu`` on the trace: its ``gpu_estimate`` and the seconds it took."""
    t0 = time.perf_counter()
    argv = [sys.executable, "-m", "allocsim", "run", path, "--policy", "pytorch", "--gpu", gpu, "--fast",
            "--json", "--sites", "0"]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode not in (0, 3):
        raise RuntimeError(f"run of {path} failed ({done.returncode}): {done.stderr.strip()[-400:]}")
    return json.loads(done.stdout)["gpu_estimate"], time.perf_counter() - t0


def evaluate(rows: list[dict[str, Any]], work: str, gpu: str, jobs: int) -> list[dict[str, Any]]:
    """Capture and replay every row (``jobs`` captures at a time); one result dict per row."""
    os.makedirs(work, exist_ok=True)

    def one(row):
        path, capture_s = capture(row, work)
        estimate, run_s = replay(path, gpu)
        predicted = estimate["total_bytes"] - estimate["context_bytes"]
        ground = row["ground_bytes"]
        return {**row, "reserved_peak_bytes": estimate["reserved_peak_bytes"],
                "workspace_bytes": estimate["workspace_bytes"], "library_bytes": estimate["library_bytes"],
                "allocsim_bytes": predicted, "allocsim_error": abs(predicted - ground) / ground,
                "xmem_error": abs(row["xmem_bytes"] - ground) / ground,
                "allocsim_false_fit": predicted <= ground * (1 - FALSE_FIT_MARGIN),
                "xmem_false_fit": row["xmem_bytes"] <= ground * (1 - FALSE_FIT_MARGIN),
                "capture_s": round(capture_s, 1), "run_s": round(run_s, 1)}

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(one, rows))


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Median absolute error and false-fits share of allocsim and xMem over ``results``."""
    n = len(results)
    return {
        "rows": n,
        "allocsim_median_error": statistics.median(r["allocsim_error"] for r in results),
        "xmem_median_error": statistics.median(r["xmem_error"] for r in results),
        "allocsim_false_fits": sum(r["allocsim_false_fit"] for r in results) / n,
        "xmem_false_fits": sum(r["xmem_false_fit"] for r in results) / n,
    }


def calibrate(results: list[dict[str, Any]]) -> dict[str, Any]:
    """``library_bytes``: median of ground - reserved peak - workspaces over the calibration rows."""
    gaps = [r["ground_bytes"] - r["reserved_peak_bytes"] - r["workspace_bytes"] for r in results]
    fitted = int(statistics.median(gaps))
    # Memory the libraries hold cannot be negative: a negative median says the simulated reserved
    # peak already covers the calibration runs, and the model then adds nothing for libraries.
    return {"fitted_bytes": fitted, "library_bytes": max(0, fitted),
            "about": "median over xMem 001-Anova rows (RTX 3060) of ground - allocsim reserved peak - cuBLAS "
                     "workspaces (fitted_bytes), floored at 0 (library_bytes); allocsim.gpus."
                     "LIBRARY_BYTES_CALIBRATED holds library_bytes",
            "rows": [{"folder": r["folder"], "gap_bytes": g} for r, g in zip(results, gaps)]}


def format_table(results: list[dict[str, Any]]) -> str:
    """The README's table: one line per row, then the medians and false-fits shares."""
    def gib(value):
        return f"{value / (1 << 30):.2f}"

    lines = ["| model | optimiser | batch | ground GiB | xMem GiB (err) | allocsim GiB (err) | capture+run s |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['model']} | {r['optimiser']} | {r['batch']} | {gib(r['ground_bytes'])} | "
                     f"{gib(r['xmem_bytes'])} ({r['xmem_error']:.1%}) | {gib(r['allocsim_bytes'])} "
                     f"({r['allocsim_error']:.1%}) | {r['capture_s'] + r['run_s']:.0f} |")
    s = summarize(results)
    lines.append(f"\nmedian error: allocsim {s['allocsim_median_error']:.1%}, xMem {s['xmem_median_error']:.1%}; "
                 f"false fits (predicted <= ground - 5%): allocsim {s['allocsim_false_fits']:.0%}, "
                 f"xMem {s['xmem_false_fits']:.0%} ({s['rows']} rows)")
    return "\n".join(lines)
