"""Memory over time: requested, allocated and reserved beside the lower bound, capacity and OOMs."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import pandas as pd

from ..units import format_bytes
from ._common import DEFAULT_MAX_POINTS, SERIES_STYLE, downsample, gib, new_axes, policy_label, time_axis


#: Allocated is drawn wider than requested so it shows where the two coincide.
_WIDTH = {"reserved_bytes": 1.5, "allocated_bytes": 2.6, "requested_bytes": 1.0}


def _unpack(result: Any, summary: Mapping[str, Any] | None, ooms: pd.DataFrame | None):
    """Accept a ``RunResult`` or its tables."""
    if hasattr(result, "timeseries"):
        return result.timeseries, summary or result.summary, ooms if ooms is not None else result.ooms
    return result, summary, ooms


def plot_timeline(result: Any, summary: Mapping[str, Any] | None = None, *, ooms: pd.DataFrame | None = None,
                  markers: pd.DataFrame | None = None, ax: Any = None, title: str | None = None,
                  max_points: int = DEFAULT_MAX_POINTS) -> Any:
    """Draw requested / allocated / reserved memory (GiB) over time; return the Axes.

    ``result`` is a ``RunResult`` or its ``timeseries`` table (then pass ``summary`` for the lower
    bound, capacity and OOM facts). ``markers`` (columns ``x``, ``label``) draws step boundaries.
    Series are downsampled to about ``max_points`` points with every peak kept exactly.
    """
    ts, summary, ooms = _unpack(result, summary, ooms)
    summary = summary or {}
    ax = new_axes(ax)
    x, xlabel = time_axis(ts, summary)
    series = {c: ts[c].to_numpy() for c in SERIES_STYLE if c in ts.columns}
    rows = downsample(x, series, max_points)
    for col, values in series.items():
        color, label = SERIES_STYLE[col]
        ax.plot(x[rows], gib(values[rows]), drawstyle="steps-post", color=color, lw=_WIDTH[col],
                label=f"{label}, peak {format_bytes(int(values.max()))}")
    lower = summary.get("peak_live_lower_bound_bytes")
    if lower:
        ax.axhline(gib(lower), color="#777777", ls="--", lw=1,
                   label=f"lower bound: peak live bytes {format_bytes(int(lower))}")
    capacity = summary.get("capacity_bytes")
    if capacity:
        ax.axhline(gib(capacity), color="#c8323c", ls=":", lw=1.5,
                   label=f"device capacity {format_bytes(int(capacity))}")
    _mark_ooms(ax, ts, x, ooms)
    _mark_steps(ax, markers)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("memory (GiB)")
    ax.set_ylim(bottom=0)
    ax.set_xlim(x[0] if len(x) else 0, x[-1] if len(x) else 1)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", frameon=False)
    name = policy_label(summary)
    ax.set_title(title or f"Memory over time{' — ' + name if name else ''}"
                 + _source_suffix(summary))
    return ax


def _source_suffix(summary: Mapping[str, Any]) -> str:
    source = ((summary.get("trace") or {}).get("source")) or ""
    return f"\n{source}" if source else ""


def _mark_ooms(ax: Any, ts: pd.DataFrame, x: np.ndarray, ooms: pd.DataFrame | None) -> None:
    """A red cross where each allocation failed (at the reserved level then) and a dotted line."""
    if ooms is None or not len(ooms):
        return
    ev = ts["event_index"].to_numpy()
    for k, (_, oom) in enumerate(ooms.iterrows()):
        hit = np.flatnonzero(ev == oom["event_index"])
        i = int(hit[0]) if len(hit) else len(x) - 1
        if k < 20:   # beyond that the lines would hide the curves; the crosses still show
            ax.axvline(x[i], color="#c8323c", lw=0.8, ls=":")
        ax.plot([x[i]], [gib(oom["reserved_bytes"])], marker="X", ms=10, color="#c8323c", ls="none",
                label=(f"out of memory: {format_bytes(int(oom['requested_bytes']))} requested"
                       + (f" (+{len(ooms) - 1} more)" if len(ooms) > 1 else "")) if k == 0 else None)


def _mark_steps(ax: Any, markers: pd.DataFrame | None) -> None:
    """Thin vertical lines with their labels at step boundaries."""
    if markers is None or not len(markers):
        return
    for xv, label in zip(markers["x"].tolist(), markers["label"].tolist()):
        ax.axvline(xv, color="#888888", lw=0.7, ls="-.")
        ax.annotate(str(label), (xv, 1.0), xycoords=("data", "axes fraction"), xytext=(3, -3),
                    textcoords="offset points", va="top", fontsize="x-small", color="#555555")


def step_markers(trace: Any, timeseries: pd.DataFrame, summary: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """``x``/``label`` of the trace's markers (e.g. ``ProfilerStep#1``) on the time axis of ``timeseries``."""
    kind = trace.column("kind")
    idx = np.flatnonzero(kind == 5)
    if not len(idx):
        return pd.DataFrame({"x": [], "label": []})
    x, _ = time_axis(timeseries, summary)
    ev = timeseries["event_index"].to_numpy()
    pos = {int(e): r for r, e in enumerate(ev)}
    rows = [(x[pos[int(i)]], trace.labels[int(trace.column("alloc_id")[i])]) for i in idx if int(i) in pos]
    return pd.DataFrame(rows, columns=["x", "label"])
