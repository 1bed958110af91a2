"""What every plot shares: units, colours, the time axis and peak-preserving downsampling."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import pandas as pd

from ..metrics.attribution import CATEGORIES, LABELS
from ..units import GiB

#: Points per series drawn at most (about two per pixel column of a wide figure).
DEFAULT_MAX_POINTS = 4000

#: Colours of the attribution parts: blues for memory in use, warm tones for waste, greys for cache.
CATEGORY_COLORS = {
    "live_requested": "#1f5fa8",
    "rounding": "#8fbce6",
    "pending_free": "#7b4fa0",
    "gc_queue": "#e08a1e",
    "stranded": "#c8323c",
    "free_slivers": "#f2cc4d",
    "cached_segments": "#a9a9a9",
    "device_rounding": "#6b4f3a",
}

#: Segment-map block states -> (colour, legend text).
STATE_STYLE = {
    "requested": (CATEGORY_COLORS["live_requested"], "allocated: requested bytes"),
    "rounding": (CATEGORY_COLORS["rounding"], "allocated: rounding waste"),
    "pending_free": (CATEGORY_COLORS["pending_free"], "pending stream-ordered free"),
    "gc_queue": (CATEGORY_COLORS["gc_queue"], "in deferred-GC queue"),
    "free": (CATEGORY_COLORS["free_slivers"], "free (cached)"),
    "stranded": (CATEGORY_COLORS["stranded"], "free, cached for another stream"),
    "device_rounding": (CATEGORY_COLORS["device_rounding"], "device rounding"),
}

#: Line colours of the memory timeline.
SERIES_STYLE = {
    "reserved_bytes": ("#222222", "reserved (held from the device)"),
    "allocated_bytes": ("#1f5fa8", "allocated (blocks in use)"),
    "requested_bytes": ("#2ca58d", "requested (live bytes)"),
}

__all__ = ["CATEGORIES", "CATEGORY_COLORS", "DEFAULT_MAX_POINTS", "LABELS", "SERIES_STYLE", "STATE_STYLE",
           "downsample", "gib", "new_axes", "non_default_settings", "policy_label", "time_axis"]


def gib(values: Any) -> Any:
    """Bytes -> GiB (floats) for drawing."""
    return np.asarray(values, dtype=float) / GiB


def new_axes(ax: Any = None, figsize: tuple[float, float] = (10, 4.5)) -> Any:
    """Return ``ax`` or a fresh Axes on a new figure (pyplot, so notebooks show it)."""
    if ax is not None:
        return ax
    import matplotlib.pyplot as plt

    _fig, ax = plt.subplots(figsize=figsize, layout="constrained")
    return ax


def downsample(x: np.ndarray, columns: Mapping[str, np.ndarray], max_points: int = DEFAULT_MAX_POINTS) -> np.ndarray:
    """Row indices to draw: per x bucket the rows of each column's min and max, plus the first and last row.

    ``x`` must be sorted. Every column's exact maximum and minimum (and their first rows) survive,
    so a peak never disappears from a plot; with ``len(x) <= max_points`` every row is kept.
    """
    n = len(x)
    if n <= max_points:
        return np.arange(n)
    buckets = max(1, max_points // (2 * max(1, len(columns))))
    x = np.asarray(x, dtype=float)
    span = x[-1] - x[0]
    if span > 0:
        bucket = np.minimum(((x - x[0]) / span * buckets).astype(np.int64), buckets - 1)
    else:
        bucket = np.arange(n) * buckets // n
    keep = [np.array([0, n - 1])]
    starts = np.flatnonzero(np.r_[True, bucket[1:] != bucket[:-1]])
    rows = np.arange(n)
    for values in columns.values():
        values = np.asarray(values)
        # Sorted by (bucket, value, row), each bucket's first entry is the first row of its minimum;
        # sorted by (bucket, -value, row), the first row of its maximum (the peak row itself).
        keep.append(np.lexsort((rows, values, bucket))[starts])
        keep.append(np.lexsort((rows, -values, bucket))[starts])
    return np.unique(np.concatenate(keep))


def time_axis(timeseries: pd.DataFrame, summary: Mapping[str, Any] | None = None) -> tuple[np.ndarray, str]:
    """x values and axis label of a run's time series: simulated time, trace time, or event number.

    A trace without timestamps (``summary["trace"]["time_synthesized"]``) is drawn against the event
    number: its made-up times, even simulated on top, would suggest durations nobody measured.
    """
    synthesized = bool(((summary or {}).get("trace") or {}).get("time_synthesized"))
    if synthesized or ("t_ns" not in timeseries.columns and "sim_t_ns" not in timeseries.columns):
        rows = timeseries["row"].to_numpy() if "row" in timeseries.columns else np.arange(len(timeseries))
        return rows.astype(float), "event number (the trace has no timestamps)"
    if "sim_t_ns" in timeseries.columns:
        t = timeseries["sim_t_ns"].to_numpy()
        return (t - t[0]) / 1e9, "simulated time (s)"
    t = timeseries["t_ns"].to_numpy()
    return (t - t[0]) / 1e9, "trace time (s)"


def policy_label(summary: Mapping[str, Any] | None) -> str:
    """``pytorch``, ``pytorch (expandable_segments:True)`` or ``deferred-gc(paddle)``, from a run summary:
    the policy and every setting that is not its default (PyTorch's words for ``pytorch``)."""
    if not summary:
        return ""
    name = str(summary.get("policy", ""))
    inner = (summary.get("params") or {}).get("inner")
    if isinstance(inner, Mapping) and inner.get("name"):
        name = f"{name}({inner['name']})"
    settings = non_default_settings(summary)
    return f"{name} ({settings})" if settings else name


def _flat(params: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in params.items():
        if isinstance(value, Mapping):
            out.update(_flat(value, f"{prefix}{key}."))
        elif f"{prefix}{key}" != "inner.name":
            out[f"{prefix}{key}"] = value
    return out


def non_default_settings(summary: Mapping[str, Any]) -> str:
    """The run's settings that differ from its policy's defaults, as one comma-separated text ("" if none)."""
    from ..settings.alloc_conf import changed_settings
    from ..device import SimulatedDevice
    from ..metrics.summary import jsonable

    policy, params = str(summary.get("policy", "")), summary.get("params") or {}
    try:
        from ..policies.registry import build_policy

        inner = params.get("inner") if isinstance(params.get("inner"), Mapping) else None
        build_params = {"inner": inner["name"]} if inner and inner.get("name") else None
        defaults = jsonable(build_policy(policy, device=SimulatedDevice(None), params=build_params).params())
    except (ImportError, ValueError, TypeError, KeyError):
        return ""   # a result written by another version, or a policy this one does not know
    changes = changed_settings(policy, _flat(params), _flat(defaults))
    return ",".join(ours for ours, _ in changes)
