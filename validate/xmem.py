"""Hold ``allocsim capture`` + ``run --gpu`` against xMem's published ground truth: ``python -m validate xmem``.

For each row of ``validate/xmem_rows.json`` (xMem's own runs on an RTX 3060), ``allocsim capture``
runs ``validate/xmem_train.py`` (xMem's training loop, ``cuda`` hard-coded) on this machine's CPU,
``allocsim run --policy pytorch --gpu "RTX 3060" --fast --json`` replays the trace, and allocsim's
prediction is ``gpu_estimate.total_bytes`` less the CUDA context, which xMem's ground truth leaves out.
Errors are |predicted - ground| / ground; a false "fits" is a prediction at or below ground - 5%.

Captures are taken with both cuDNN workspace ratios at 1 (see ``allocsim.torch_capture.cudnn``: a
larger kernel's workspace as large as its larger feature map, a 1x1 backward-data one as large as
the gradient it computes) and ``rescale_workspaces`` sets the ratios in force before the replay, so
one capture serves every pair. ``--calibrate`` fits, on the ``calibrate`` rows only (xMem's 001-Anova
set), first the two ratios (the pair of ``KERNEL_RATIOS`` x ``POINTWISE_DATA_RATIOS`` with the least
mean absolute error, each pair replayed in this process), then ``library_bytes`` (memory a CPU run
cannot see: loaded kernels) as the median of ground - reserved peak - cuBLAS workspaces, and writes
``validate/xmem_calibration.json``; the ``check`` rows (002-Monte Carlo) are only ever compared.
Captures are kept in ``--work`` and reused.
"""

from __future__ import annotations

import dataclasses
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
#: The interpreter that runs xmem_train.py (torch and torchvision); ``--python`` sets it.
PYTHON = sys.executable
#: Ratios --calibrate tries for kernels larger than 1x1 (0: no such workspaces) ...
KERNEL_RATIOS = (0.0, 0.25, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0)
#: ... and, with each, for 1x1 backward data (the Kineto step shows 0 or 1 times the gradient).
POINTWISE_DATA_RATIOS = (0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0)


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
            PYTHON, TRAIN_SCRIPT, row["model"], row["optimiser"], str(row["batch"])]
    # Captured with both workspace ratios at 1: rescale_workspaces sets any pair afterwards, so
    # fitting the ratios needs no second capture.
    env = dict(os.environ, ALLOCSIM_CUDNN_WORKSPACE_RATIO="1")
    done = subprocess.run(argv, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"capture of {_name(row)} failed ({done.returncode}): {done.stderr.strip()[-400:]}")
    return path, time.perf_counter() - t0


def rescale_workspaces(trace: Any, ratios: Any) -> Any:
    """``trace`` (captured at ratios 1,1) with every cuDNN workspace resized to ``ratios``; a size of 0 drops it.

    ``ratios`` is a ``cudnn.WorkspaceRatios`` or one number for both.
    """
    import numpy as np   # noqa: PLC0415

    from allocsim.torch_capture import cudnn   # noqa: PLC0415
    from allocsim.trace.schema import EventKind   # noqa: PLC0415

    ratios = as_ratios(ratios)
    events = trace.events
    kind = events["kind"].to_numpy()
    stack = events["stack_id"].to_numpy()
    sizes = events["size_bytes"].to_numpy().copy()
    new_size: dict[int, int] = {}
    for sid in np.unique(stack[(kind == EventKind.ALLOC) & (stack >= 0)]):
        frames = trace.stack(int(sid))
        parsed = cudnn.parse_label(frames[0][2]) if frames else None
        if parsed is not None:
            phase, x, w, y, groups, dtype_bytes = parsed
            new_size[int(sid)] = cudnn.workspace_bytes(phase, x, w, y, groups, dtype_bytes, ratios)
    is_ws = (kind == EventKind.ALLOC) & np.isin(stack, list(new_size))
    alloc_ids = events["alloc_id"].to_numpy()
    resized = {int(alloc_ids[i]): new_size[int(stack[i])] for i in np.flatnonzero(is_ws)}
    # The frees of a workspace carry its size too: every row of the allocation gets the new one.
    rows = np.flatnonzero(np.isin(alloc_ids, list(resized)) & (kind != EventKind.MARKER))
    for i in rows:
        sizes[i] = resized[int(alloc_ids[i])]
    dropped = {a for a, size in resized.items() if size <= 0}
    events = events.assign(size_bytes=sizes)
    if dropped:
        events = events[~events["alloc_id"].isin(dropped) | (events["kind"] == EventKind.MARKER)]
    # A capture has no recorded decisions or totals that point at event indices, so rows can go.
    meta = dataclasses.replace(trace.meta,
                               version_hints={**trace.meta.version_hints, "cudnn_workspace_ratios": ratios._asdict()},
                               notes=[*trace.meta.notes, f"cuDNN workspaces rescaled to ratios {ratios}"])
    return dataclasses.replace(trace, events=events.reset_index(drop=True), meta=meta)


def as_ratios(ratios: Any) -> Any:
    """``ratios`` as a ``cudnn.WorkspaceRatios`` (one number: both ratios)."""
    from allocsim.torch_capture import cudnn   # noqa: PLC0415

    if isinstance(ratios, cudnn.WorkspaceRatios):
        return ratios
    return cudnn.WorkspaceRatios(float(ratios), float(ratios))


def rescaled_path(path: str, ratios: Any) -> str:
    """The trace of ``path`` with workspaces at ``ratios``, written beside it once and reused."""
    ratios = as_ratios(ratios)
    out = path.replace(".parquet", f".ws{ratios.kernel:g}_{ratios.pointwise_data:g}.parquet")
    if not os.path.exists(out):
        from allocsim.trace import read_trace, write_trace   # noqa: PLC0415

        write_trace(rescale_workspaces(read_trace(path), ratios), out)
    return out


def replay(path: str, gpu: str) -> tuple[dict[str, Any], float]:
    """``allocsim run --gpu`` on the trace: its ``gpu_estimate`` and the seconds it took."""
    t0 = time.perf_counter()
    argv = [sys.executable, "-m", "allocsim", "run", path, "--policy", "pytorch", "--gpu", gpu, "--fast",
            "--json", "--sites", "0"]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode not in (0, 3):
        raise RuntimeError(f"run of {path} failed ({done.returncode}): {done.stderr.strip()[-400:]}")
    return json.loads(done.stdout)["gpu_estimate"], time.perf_counter() - t0


def evaluate(rows: list[dict[str, Any]], work: str, gpu: str, jobs: int,
             ratios: Any = None) -> list[dict[str, Any]]:
    """Capture and replay every row (``jobs`` captures at a time) at workspace ``ratios`` (default: calibrated)."""
    from allocsim.torch_capture import cudnn   # noqa: PLC0415

    os.makedirs(work, exist_ok=True)
    ratios = cudnn.WORKSPACE_RATIOS_CALIBRATED if ratios is None else as_ratios(ratios)

    def one(row):
        path, capture_s = capture(row, work)
        t0 = time.perf_counter()
        path = rescaled_path(path, ratios)
        capture_s += time.perf_counter() - t0
        estimate, run_s = replay(path, gpu)
        predicted = estimate["total_bytes"] - estimate["context_bytes"]
        ground = row["ground_bytes"]
        return {**row, "reserved_peak_bytes": estimate["reserved_peak_bytes"],
                "workspace_bytes": estimate["workspace_bytes"], "library_bytes": estimate["library_bytes"],
                "allocsim_bytes": predicted, "allocsim_error": abs(predicted - ground) / ground,
                "xmem_error": abs(row["xmem_bytes"] - ground) / ground,
                "allocsim_false_fit": predicted <= ground * (1 - FALSE_FIT_MARGIN),
                "xmem_false_fit": row["xmem_bytes"] <= ground * (1 - FALSE_FIT_MARGIN),
                "cudnn_workspace_ratios": list(ratios),
                "capture_s": round(capture_s, 1), "run_s": round(run_s, 1)}

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(one, rows))


def replay_in_process(trace: Any, gpu: str) -> dict[str, int]:
    """What ``run --gpu --fast`` reports of ``trace``, replayed here: reserved and allocated peaks."""
    from allocsim.gpus import allocator_capacity, find_gpu   # noqa: PLC0415
    from allocsim.runner import check_capacity, resolve_capacity, simulate_trace   # noqa: PLC0415

    capacity = resolve_capacity(trace, allocator_capacity(find_gpu(gpu)))
    check_capacity(trace, capacity)
    summary = simulate_trace(trace, "pytorch", {}, capacity=capacity, fast=True).summary
    return {"reserved_peak_bytes": int(summary["peak_reserved_bytes"] or 0),
            "allocated_peak_bytes": int(summary["peak_allocated_bytes"] or 0),
            "completed": bool(summary["completed"])}


def _row_grid(path: str, gpu: str) -> dict[tuple[float, float], dict[str, int]]:
    """Every ratio pair of the grid replayed on one row's capture (in a worker process)."""
    from allocsim.trace import read_trace   # noqa: PLC0415

    trace = read_trace(path)
    return {(k, p): replay_in_process(rescale_workspaces(trace, as_ratios_pair(k, p)), gpu)
            for k in KERNEL_RATIOS for p in POINTWISE_DATA_RATIOS}


def as_ratios_pair(kernel: float, pointwise_data: float) -> Any:
    """``cudnn.WorkspaceRatios(kernel, pointwise_data)``."""
    from allocsim.torch_capture import cudnn   # noqa: PLC0415

    return cudnn.WorkspaceRatios(float(kernel), float(pointwise_data))


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


def library_fit(results: list[dict[str, Any]]) -> tuple[int, int, list[int]]:
    """(fitted, floored at 0, per-row gaps): median of ground - reserved peak - cuBLAS workspaces."""
    gaps = [r["ground_bytes"] - r["reserved_peak_bytes"] - r["workspace_bytes"] for r in results]
    fitted = int(statistics.median(gaps))
    # Memory the libraries hold cannot be negative: a negative median says the simulated reserved
    # peak already covers the calibration runs, and the model then adds nothing for libraries.
    return fitted, max(0, fitted), gaps


def calibrate(rows: list[dict[str, Any]], work: str, gpu: str, jobs: int) -> dict[str, Any]:
    """Fit the two workspace ratios, then ``library_bytes``, on ``rows`` (the calibrate set only)."""
    from concurrent.futures import ProcessPoolExecutor   # noqa: PLC0415

    from allocsim.gpus import find_gpu, workspace_bytes   # noqa: PLC0415

    os.makedirs(work, exist_ok=True)
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        paths = [path for path, _s in pool.map(lambda r: capture(r, work), rows)]
    with ProcessPoolExecutor(max_workers=max(1, jobs)) as pool:
        grids = list(pool.map(_row_grid, paths, [gpu] * len(paths)))
    cublas = workspace_bytes(find_gpu(gpu))
    trials = []
    for pair in grids[0]:
        results = [{**row, **grid[pair], "workspace_bytes": cublas} for row, grid in zip(rows, grids)]
        _fitted, library, _gaps = library_fit(results)
        errors = [abs(r["reserved_peak_bytes"] + cublas + library - r["ground_bytes"]) / r["ground_bytes"]
                  for r in results]
        trials.append({"ratios": pair, "library_bytes": library, "median_error": statistics.median(errors),
                       "mean_error": statistics.fmean(errors), "errors": errors, "results": results})
    # Least mean error: every calibration row counts (a median of few rows is decided by one of them,
    # and the rows a workspace changes are the ones a median leaves out). Ties (to 0.1 %) go to the
    # smaller ratios: less memory than the evidence demands is not added.
    best = min(trials, key=lambda t: (round(t["mean_error"], 3), t["ratios"][0] + t["ratios"][1], t["ratios"]))
    fitted, library, gaps = library_fit(best["results"])
    return {"cudnn_workspace_ratios": {"kernel": best["ratios"][0], "pointwise_data": best["ratios"][1]},
            "fitted_bytes": fitted, "library_bytes": library,
            "about": "fitted on xMem 001-Anova rows (RTX 3060) only: the pair of cuDNN workspace ratios (kernels "
                     "larger than 1x1, 1x1 backward data) of KERNEL_RATIOS x POINTWISE_DATA_RATIOS with the least "
                     "mean absolute error (allocsim.torch_capture.cudnn.WORKSPACE_RATIOS_CALIBRATED holds it), "
                     "then the median of ground - allocsim reserved peak - cuBLAS workspaces (fitted_bytes), "
                     "floored at 0 (library_bytes; allocsim.gpus.LIBRARY_BYTES_CALIBRATED holds it)",
            "trials": [{"ratios": list(t["ratios"]), "library_bytes": t["library_bytes"],
                        "median_error": round(t["median_error"], 4), "mean_error": round(t["mean_error"], 4),
                        "errors": [round(e, 4) for e in t["errors"]],
                        "reserved_peak_bytes": [r["reserved_peak_bytes"] for r in t["results"]]} for t in trials],
            "rows": [{"folder": r["folder"], "reserved_peak_bytes": r["reserved_peak_bytes"],
                      "allocated_peak_bytes": r["allocated_peak_bytes"], "gap_bytes": g}
                     for r, g in zip(best["results"], gaps)]}


def breakdown(rows: list[dict[str, Any]], work: str, gpu: str, jobs: int, ratios: Any = None) -> list[dict[str, Any]]:
    """Each row's gap, part by part: what the workspaces add to the simulated reserved peak and what stays missing.

    Replayed in this process: the reserved and allocated peaks without cuDNN workspaces and with
    ``ratios`` (default: calibrated), the cuBLAS workspaces and ``library_bytes`` of the GPU model,
    and ``gap_bytes`` = ground - prediction (positive: allocsim under-predicts).
    """
    from allocsim.gpus import find_gpu, workspace_bytes   # noqa: PLC0415
    from allocsim.torch_capture import cudnn   # noqa: PLC0415
    from allocsim.trace import read_trace   # noqa: PLC0415

    ratios = cudnn.WORKSPACE_RATIOS_CALIBRATED if ratios is None else as_ratios(ratios)
    model = find_gpu(gpu)
    cublas, library = workspace_bytes(model), model.library_bytes
    os.makedirs(work, exist_ok=True)
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        paths = [path for path, _s in pool.map(lambda r: capture(r, work), rows)]
    out = []
    for row, path in zip(rows, paths):
        trace = read_trace(path)
        bare = replay_in_process(rescale_workspaces(trace, 0.0), gpu)
        with_ws = replay_in_process(rescale_workspaces(trace, ratios), gpu)
        predicted = with_ws["reserved_peak_bytes"] + cublas + library
        out.append({"model": row["model"], "optimiser": row["optimiser"], "batch": row["batch"], "set": row["set"],
                    "ground_bytes": row["ground_bytes"], "xmem_bytes": row["xmem_bytes"],
                    "allocated_peak_bytes": bare["allocated_peak_bytes"],
                    "reserved_peak_no_workspace_bytes": bare["reserved_peak_bytes"],
                    "reserved_peak_bytes": with_ws["reserved_peak_bytes"],
                    "cudnn_workspace_effect_bytes": with_ws["reserved_peak_bytes"] - bare["reserved_peak_bytes"],
                    "cublas_workspace_bytes": cublas, "library_bytes": library, "allocsim_bytes": predicted,
                    "gap_bytes": row["ground_bytes"] - predicted, "cudnn_workspace_ratios": list(ratios)})
    return out


def format_breakdown(rows: list[dict[str, Any]]) -> str:
    """The breakdown as a table in MiB."""
    def mib(value):
        return f"{value / (1 << 20):,.0f}"

    lines = ["| set | model | optimiser | batch | ground | allocated peak | reserved, no cuDNN ws | cuDNN ws effect | "
             "cuBLAS + libraries | allocsim | gap (ground - allocsim) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['set']} | {r['model']} | {r['optimiser']} | {r['batch']} | {mib(r['ground_bytes'])} | "
                     f"{mib(r['allocated_peak_bytes'])} | {mib(r['reserved_peak_no_workspace_bytes'])} | "
                     f"{r['cudnn_workspace_effect_bytes'] / (1 << 20):+,.0f} | "
                     f"{mib(r['cublas_workspace_bytes'] + r['library_bytes'])} | {mib(r['allocsim_bytes'])} | "
                     f"{r['gap_bytes'] / (1 << 20):+,.0f} ({r['gap_bytes'] / r['ground_bytes']:+.1%}) |")
    return "\n".join(lines) + "\n(MiB; cuDNN workspace ratios " + (
        ",".join(f"{v:g}" for v in rows[0]["cudnn_workspace_ratios"]) if rows else "-") + ")"


def rerun_peaks(row: dict[str, Any], total_bytes: int = 12622168064) -> list[dict[str, Any]]:
    """What xMem's reruns of ``row`` peaked at: one entry per rerun that did not run out of memory.

    A rerun caps the allocator at ``round(estimate / total_bytes, 2)`` of the GPU and records
    ``error`` = |rerun peak - estimate| / ground, so its peak is estimate +- error x ground; the
    entry keeps the candidate nearer the ground truth (the smaller disagreement, a lower bound).
    ``binding`` says whether the cap was below the ground truth (then the rerun had less room
    than the ground run and may peak lower for that alone).
    """
    ground = row["ground_bytes"]
    out = []
    for rerun in row.get("reruns", []):
        if rerun["oom"] or rerun["error"] is None:
            continue
        cap = round(rerun["estimate_bytes"] / total_bytes, 2) * total_bytes
        spread = rerun["error"] * ground
        peak = min((rerun["estimate_bytes"] - spread, rerun["estimate_bytes"] + spread), key=lambda p: abs(p - ground))
        out.append({"tool": rerun["tool"], "cap_bytes": int(cap), "binding": cap < ground, "peak_bytes": int(peak),
                    "vs_ground": (peak - ground) / ground})
    return out


def format_reruns(rows: list[dict[str, Any]]) -> str:
    """The reruns of the calibrate rows, one line per row: each rerun's peak against the ground truth."""
    lines = []
    for row in rows:
        parts = [f"{r['tool']} cap {r['cap_bytes'] / 1e9:.3f} GB{' (binding)' if r['binding'] else ''}: "
                 f"{r['peak_bytes'] / 1e9:.3f} GB ({r['vs_ground']:+.1%})" for r in rerun_peaks(row)]
        if parts:
            lines.append(f"{row['model']} {row['optimiser']} {row['batch']}: ground {row['ground_bytes'] / 1e9:.3f} GB; "
                         + "; ".join(parts))
    return "\n".join(lines)


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
                 f"xMem {s['xmem_false_fits']:.0%} ({s['rows']} rows); cuDNN workspace ratios "
                 f"{','.join(f'{r:g}' for r in results[0]['cudnn_workspace_ratios']) if results else '-'}")
    return "\n".join(lines)


def milabench_cudnn_term() -> tuple[int, str]:
    """The cuDNN term fitted on milabench's calibrate rows (torch 2.6 / cuDNN 9.5, L40S) and where it comes from."""
    path = os.path.join(HERE, "milabench_calibration.json")
    with open(path, encoding="utf-8") as fh:
        terms = json.load(fh)["terms"]
    # the library version allocsim.gpus' context is fitted on (milabench's 2025 tables)
    best = max((t for t in terms if "cudnn_bytes" in t),
               key=lambda t: (t["libraries"].startswith("torch 2.6"), len(t.get("cudnn_rows", []))))
    return int(best["cudnn_bytes"]), f"{best['card']}, {best['libraries']}, {len(best['cudnn_rows'])} rows"


def format_with_cudnn_term(results: list[dict[str, Any]]) -> str:
    """Each row again with milabench's cuDNN term added (xMem's ground, NVML used minus the first sample, is
    taken after the context exists, so only the term for cuDNN's lazily loaded kernels can apply)."""
    term, source = milabench_cudnn_term()
    lines = [f"With milabench's cuDNN term ({term / (1 << 20):.0f} MiB, fitted on {source}) added:", "",
             "| model | optimiser | batch | ground GiB | allocsim + term GiB (err) |", "|---|---|---|---|---|"]
    errors, false_fits = [], 0
    for r in results:
        predicted = r["allocsim_bytes"] + term
        error = abs(predicted - r["ground_bytes"]) / r["ground_bytes"]
        errors.append(error)
        false_fits += predicted <= r["ground_bytes"] * (1 - FALSE_FIT_MARGIN)
        lines.append(f"| {r['model']} | {r['optimiser']} | {r['batch']} | {r['ground_bytes'] / (1 << 30):.2f} | "
                     f"{predicted / (1 << 30):.2f} ({error:.1%}) |")
    lines.append(f"\nmedian error {statistics.median(errors):.1%}, false fits {false_fits} of {len(results)}")
    return "\n".join(lines)
