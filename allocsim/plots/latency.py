"""How long allocations took (simulated): the share of allocations at least x slow, log-log, per policy."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import pandas as pd
from matplotlib.ticker import FuncFormatter

from ._common import new_axes

_PALETTE = ("#1f5fa8", "#c8323c", "#2ca58d", "#e08a1e", "#7b4fa0", "#6b4f3a", "#222222", "#f2cc4d", "#8fbce6")
_STYLES = ("-", "--", "-.", ":", (0, (5, 1, 1, 1)))
#: Latencies are clipped to this (in the display unit) so a zero-cost call stays on a log axis.
_FLOOR = 1e-3


def alloc_latencies(timeseries: pd.DataFrame) -> np.ndarray:
    """Latency (ns) of every allocation row of a timed run's time series (empty for fast runs)."""
    if "latency_ns" not in timeseries.columns:
        return np.array([], dtype=np.int64)
    return timeseries.loc[timeseries["kind"] == 1, "latency_ns"].to_numpy()


def _unit(median_ns: float) -> tuple[float, str]:
    """µs unless a typical allocation takes a millisecond or more."""
    return (1e6, "ms") if median_ns >= 1e6 else (1e3, "µs")


def _num(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _plain(value: float, _pos: int) -> str:
    return f"{value:g}"


def _percent(value: float, _pos: int) -> str:
    return f"{value * 100:g} %"


def _as_latencies(value: Any) -> np.ndarray:
    if hasattr(value, "timeseries"):
        value = value.timeseries
    if isinstance(value, pd.DataFrame):
        value = alloc_latencies(value)
    return np.sort(np.asarray(value, dtype=float))


def plot_latency(latencies: Mapping[str, Any] | Any, *, ax: Any = None, title: str | None = None) -> Any:
    """Share of allocations taking at least x (log-log, µs or ms), one line per label; p50/p99 marked.

    ``latencies`` maps a label (policy) to latencies in ns, or to a time series / ``RunResult``
    of a timed run; a single array or table is drawn unlabelled. This survival curve keeps the
    slow tail (where p99 lives) visible, which a plain CDF squeezes against 1. Returns the Axes.
    """
    if not isinstance(latencies, Mapping):
        latencies = {"": latencies}
    data = {label: v for label, v in ((k, _as_latencies(v)) for k, v in latencies.items()) if len(v)}
    ax = new_axes(ax)
    if not data:
        ax.text(0.5, 0.5, "no latency data (fast run: memory only)", ha="center", va="center",
                transform=ax.transAxes)
        ax.set_title(title or "Allocation latency")
        return ax
    scale, unit = _unit(max(float(np.median(v)) for v in data.values()))
    for k, (label, value) in enumerate(data.items()):
        color = _PALETTE[k % len(_PALETTE)]
        n = len(value)
        # One point per distinct latency (a cost model gives few): exact, and small for any trace length.
        distinct, counts = np.unique(value, return_counts=True)
        at_least = (n - np.cumsum(counts) + counts) / n
        shown = np.maximum(distinct / scale, _FLOOR)
        p50, p99 = np.percentile(value, [50, 99], method="inverted_cdf") / scale
        # Dashes let identical curves (several pools often agree) show through each other.
        # "pre": between two distinct latencies the share is that of the larger one.
        ax.step(shown, at_least, where="pre", color=color, lw=1.8, ls=_STYLES[k % len(_STYLES)],
                label=f"{label + ': ' if label else ''}p50 {_num(p50)} {unit}, p99 {_num(p99)} {unit}, "
                      f"max {_num(value[-1] / scale)} {unit}")
        for q, marker in ((p50, "s"), (p99, "o")):
            ax.plot([max(q, _FLOOR)], [float(np.mean(value / scale >= q))], marker=marker, color=color, ms=6,
                    ls="none")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(_plain))
    ax.yaxis.set_major_formatter(FuncFormatter(_percent))
    ax.set_xlabel(f"simulated allocation latency ({unit}, log scale)")
    ax.set_ylabel("share of allocations taking at least x")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="upper right", fontsize="small", framealpha=0.9)
    ax.set_title(title or "Allocation latency: share of allocations at least this slow (■ p50, ● p99)")
    return ax
