"""Sweep results (one row per trace x policy x parameters): a heatmap over two axes and the Pareto front."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pandas as pd

from matplotlib.colors import LogNorm
from matplotlib.ticker import FuncFormatter

from ._common import new_axes

DEFAULT_OBJECTIVES = ("peak_reserved_bytes", "alloc_latency_ns.p99")


def metric_scale(metric: str) -> tuple[float, str]:
    """Divisor and unit for drawing ``metric``: bytes in GiB, nanoseconds in µs, else as is."""
    if metric.endswith("_bytes"):
        return float(1 << 30), "GiB"
    if "_ns" in metric:
        return 1e3, "µs"
    return 1.0, ""


def metric_label(metric: str) -> str:
    """``peak_reserved_bytes`` -> ``peak reserved (GiB)``."""
    scale, unit = metric_scale(metric)
    name = metric.replace("_bytes", "").replace("alloc_latency_ns.", "allocation latency ").replace("_", " ")
    return f"{name} ({unit})" if unit else name


def varying_params(rows: pd.DataFrame) -> list[str]:
    """``param.*`` columns that take more than one value (the sweep's axes), in column order."""
    cols = [c for c in rows.columns if c.startswith("param.")]
    return [c for c in cols if rows[c].astype(str).nunique() > 1]


#: Shorter names of long parameters, for axis and point labels.
SHORT_NAMES = {"garbage_collection_threshold": "gc_threshold", "expandable_segments": "expandable",
               "roundup_power2_divisions": "power2_divisions", "max_non_split_rounding": "non_split_rounding",
               "fraction_of_gpu_memory_to_use": "gpu_fraction"}


def short_name(column: str) -> str:
    """``param.garbage_collection_threshold`` -> ``gc_threshold``."""
    name = column.removeprefix("param.")
    return SHORT_NAMES.get(name, name)


def config_labels(rows: pd.DataFrame, columns: Sequence[str] | None = None, *,
                  with_policy: bool | None = None) -> pd.Series:
    """A short text per row: ``max_split_size=256MiB, expandable_segments=true`` (policy first if several)."""
    columns = list(columns if columns is not None else varying_params(rows))
    if with_policy is None:
        with_policy = "policy" in rows.columns and rows["policy"].nunique() > 1
    parts = []
    for _, row in rows.iterrows():
        items = [f"{short_name(c)}={row[c]}" for c in columns if pd.notna(row[c])]
        if with_policy:
            items.insert(0, str(row["policy"]))
        parts.append(", ".join(items) or str(row.get("policy", "")))
    return pd.Series(parts, index=rows.index)


def _failed(rows: pd.DataFrame) -> np.ndarray:
    bad = np.zeros(len(rows), dtype=bool)
    if "error" in rows.columns:
        bad |= rows["error"].notna().to_numpy()
    if "oom_count" in rows.columns:
        bad |= rows["oom_count"].fillna(0).to_numpy() > 0
    return bad


def plot_sweep_heatmap(rows: pd.DataFrame, *, x: str | None = None, metric: str = "peak_reserved_bytes",
                       ax: Any = None, title: str | None = None) -> Any:
    """Heatmap of ``metric`` with one parameter across and every combination of the others down.

    ``x`` names a parameter (``max_split_size`` or ``param.max_split_size``; default: the one with
    most values). Cells are annotated; runs that hit OOM or failed are marked. Returns the Axes.
    """
    axes = varying_params(rows)
    if x is not None and not x.startswith("param."):
        x = "param." + x
    if x is None:
        x = max(axes, key=lambda c: rows[c].astype(str).nunique()) if axes else None
    if x is None:
        raise ValueError("no parameter varies in these sweep rows: nothing to put on a heatmap axis")
    others = [c for c in axes if c != x]
    data = rows.assign(_x=rows[x].astype(str), _y=config_labels(rows, others),
                       _bad=_failed(rows))
    xs = list(dict.fromkeys(data["_x"]))
    ys = list(dict.fromkeys(data["_y"]))
    scale, unit = metric_scale(metric)
    grid = np.full((len(ys), len(xs)), np.nan)
    bad = np.zeros_like(grid, dtype=bool)
    for _, r in data.iterrows():
        i, j = ys.index(r["_y"]), xs.index(r["_x"])
        value = r.get(metric)
        grid[i, j] = float(value) / scale if value is not None and pd.notna(value) else np.nan
        bad[i, j] = bool(r["_bad"])
    ax = new_axes(ax, figsize=(5.5 + 1.2 * len(xs), 1.8 + 0.45 * len(ys)))
    finite = grid[np.isfinite(grid)]
    # A metric spanning orders of magnitude (latency) gets a log colour scale, or one cell hides the rest.
    log = len(finite) > 0 and finite.min() > 0 and finite.max() / finite.min() > 100
    norm = LogNorm(finite.min(), finite.max()) if log else None
    image = ax.imshow(np.ma.masked_invalid(grid), cmap="YlOrRd", aspect="auto", norm=norm)
    if len(finite):
        mid = np.sqrt(finite.min() * finite.max()) if log else (finite.min() + finite.max()) / 2
    else:
        mid = 0
    for i in range(len(ys)):
        for j in range(len(xs)):
            text = "—" if np.isnan(grid[i, j]) else _number(grid[i, j])
            if bad[i, j]:
                text += "\nOOM" if not np.isnan(grid[i, j]) else " failed"
            ax.text(j, i, text, ha="center", va="center", fontsize="small",
                    color="white" if np.isfinite(grid[i, j]) and grid[i, j] > mid else "black")
    ax.set_xticks(range(len(xs)), xs)
    ax.set_yticks(range(len(ys)), ys, fontsize="small")
    ax.set_xlabel(short_name(x))
    ax.figure.colorbar(image, ax=ax, label=metric_label(metric) + (", log scale" if log else ""), shrink=0.9)
    ax.set_title(title or f"{metric_label(metric)} per configuration")
    return ax


def _number(value: float) -> str:
    """About 3 significant digits, fixed point (no scientific notation, no dropped trailing zeros)."""
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"


def pareto_mask(values: np.ndarray) -> np.ndarray:
    """Rows (of an n x k array, all objectives minimised) that no other row dominates."""
    n = len(values)
    keep = np.ones(n, dtype=bool)
    for i in range(n):
        dominated = (values <= values[i]).all(axis=1) & (values < values[i]).any(axis=1)
        keep[i] = not dominated.any()
    return keep


def plot_pareto(rows: pd.DataFrame, objectives: Sequence[str] = DEFAULT_OBJECTIVES, *, ax: Any = None,
                winner: Any = None, winner_label: str = "winner", title: str | None = None,
                annotate: bool = True) -> Any:
    """Scatter every finished configuration on two objectives (both lower = better); join the Pareto front.

    Runs that failed or hit OOM are drawn as grey crosses and never on the front. ``winner`` (a
    row, e.g. ``allocsim winners``' pick) gets a star. Returns the Axes.
    """
    if len(objectives) != 2:
        raise ValueError("a Pareto plot needs exactly two objectives")
    ox, oy = objectives
    for metric in objectives:
        if metric not in rows.columns:
            raise ValueError(f"no column {metric!r} in the sweep rows (a --fast sweep has no latency)")
    sx, _ = metric_scale(ox)
    sy, _ = metric_scale(oy)
    bad = _failed(rows) | rows[ox].isna().to_numpy() | rows[oy].isna().to_numpy()
    ok = rows[~bad]
    ax = new_axes(ax, figsize=(9, 5.5))
    if bad.any():
        failed = rows[bad & rows[ox].notna().to_numpy() & rows[oy].notna().to_numpy()]
        ax.scatter(failed[ox] / sx, failed[oy] / sy, marker="x", color="#999999", label="hit OOM / failed")
    values = ok[[ox, oy]].to_numpy(dtype=float)
    front = ok[pareto_mask(values)].sort_values([ox, oy]) if len(ok) else ok
    distinct = len(ok[[ox, oy]].drop_duplicates())
    ax.scatter(ok[ox] / sx, ok[oy] / sy, color="#8fbce6", edgecolor="#1f5fa8", s=30,
               label=f"configuration ({len(ok)}" + (f"; {len(ok) - distinct} share a point" if distinct < len(ok)
                                                     else "") + ")")
    points = front.drop_duplicates([ox, oy])
    ax.plot(points[ox] / sx, points[oy] / sy, "-o", color="#c8323c", ms=7, drawstyle="steps-post",
            label=f"Pareto front ({len(points)} point{'s' if len(points) != 1 else ''}"
                  + (f", {len(front)} configurations)" if len(front) > len(points) else ")"))
    if annotate and len(front):
        labels = config_labels(rows, varying_params(rows)).loc[front.index]
        for (key, group) in front.groupby([ox, oy], sort=False):
            text = labels.loc[group.index[0]]
            if len(group) > 1:
                text += f"\n(+{len(group) - 1} more with the same result)"
            ax.annotate(text, (key[0] / sx, key[1] / sy), xytext=(6, 6), textcoords="offset points",
                        fontsize="x-small", color="#7a1f25")
    if winner is not None:
        ax.plot([winner[ox] / sx], [winner[oy] / sy], marker="*", ms=18, color="#e08a1e", ls="none",
                markeredgecolor="black", label=winner_label)
    ax.margins(0.08)
    ax.set_xlabel(metric_label(ox) + " — lower is better")
    ax.set_ylabel(metric_label(oy) + ", log scale — lower is better")
    if len(ok) and (ok[oy] > 0).all() and ok[oy].max() / ok[oy].min() > 20:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{v:g}"))
    else:
        ax.set_ylabel(metric_label(oy) + " — lower is better")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize="small", framealpha=0.9)
    ax.set_title(title or "Trade-off between memory and latency")
    return ax
