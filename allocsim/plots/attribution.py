"""Where reserved memory went: the attribution parts stacked over time, and per policy at the peak."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from ..units import format_bytes
from ._common import (CATEGORIES, CATEGORY_COLORS, DEFAULT_MAX_POINTS, LABELS, downsample, gib, new_axes, policy_label,
                      time_axis)


def _present(df: pd.DataFrame) -> list[str]:
    """Categories that are ever non-zero (empty legend entries only confuse)."""
    return [c for c in CATEGORIES if c in df.columns and (df[c] != 0).any()]


def plot_attribution(table: pd.DataFrame, summary: Mapping[str, Any] | None = None, *, ax: Any = None,
                     title: str | None = None, max_points: int = DEFAULT_MAX_POINTS) -> Any:
    """Stack the parts of reserved memory (GiB) over time from an attribution table; return the Axes.

    ``table`` is ``attribute_run``'s third value (or ``with_time(observer.table(), ts)``); the top
    of the stack is reserved memory. The peak sample is marked.
    """
    ax = new_axes(ax)
    x, xlabel = time_axis(table, summary)
    cats = _present(table)
    rows = downsample(x, {c: table[c].to_numpy() for c in [*cats, "reserved_bytes"]}, max_points)
    ys = [gib(table[c].to_numpy()[rows]) for c in cats]
    ax.stackplot(x[rows], *ys, step="post", colors=[CATEGORY_COLORS[c] for c in cats],
                 labels=[LABELS[c] for c in cats], linewidth=0)
    # Each band's upper edge as a line, lowest band drawn last: a spike shorter than a pixel, which a
    # fill alone would lose, still shows in its own colour.
    tops = np.cumsum(ys, axis=0) if ys else []
    for k in reversed(range(len(cats))):
        ax.plot(x[rows], tops[k], drawstyle="steps-post", color=CATEGORY_COLORS[cats[k]], lw=0.7)
    peak = table.loc[table["at_peak"]] if "at_peak" in table.columns else table.iloc[0:0]
    if len(peak):
        i = int(np.flatnonzero(table["at_peak"].to_numpy())[0])
        waste = int(peak["reserved_bytes"].iloc[0] - peak["live_requested"].iloc[0])
        ax.axvline(x[i], color="black", lw=0.8, ls="--")
        # Near the right edge the note goes to the left of the line, so it stays inside the axes.
        right = len(x) > 1 and x[i] > x[0] + 0.7 * (x[-1] - x[0])
        ax.annotate(f"peak {format_bytes(int(peak['reserved_bytes'].iloc[0]))}\n"
                    f"({format_bytes(waste)} not live data)", (x[i], gib(peak["reserved_bytes"].iloc[0])),
                    xytext=(-6 if right else 6, -4), textcoords="offset points", va="top",
                    ha="right" if right else "left", fontsize="small",
                    bbox={"boxstyle": "round,pad=0.25", "facecolor": "white", "alpha": 0.85, "edgecolor": "none"})
    ax.set_xlabel(xlabel)
    ax.set_ylabel("reserved memory (GiB)")
    ax.set_xlim(x[0] if len(x) else 0, x[-1] if len(x) else 1)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], labels[::-1], loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small",
              frameon=False)
    name = policy_label(summary)
    ax.set_title(title or f"Where reserved memory goes{' — ' + name if name else ''}")
    return ax


def plot_policy_comparison(table: pd.DataFrame, *, ax: Any = None, title: str | None = None,
                           lower_bound_bytes: int | None = None, label_column: str = "policy") -> Any:
    """Horizontal bars: each policy's reserved memory at its peak, split by cause (GiB); return the Axes.

    ``table`` has one row per policy: ``label_column`` and the ``CATEGORIES`` columns (the parts at
    the peak, e.g. ``comparison_table``'s output). A dashed line marks ``lower_bound_bytes``.
    """
    ax = new_axes(ax, figsize=(10, 1.2 + 0.55 * max(len(table), 2)))
    cats = _present(table)
    labels = table[label_column].astype(str).tolist()
    y = np.arange(len(table))[::-1]
    left = np.zeros(len(table))
    for c in cats:
        width = gib(table[c].to_numpy())
        ax.barh(y, width, left=left, color=CATEGORY_COLORS[c], label=LABELS[c], height=0.65)
        left += width
    total = table[list(cats)].sum(axis=1).to_numpy()
    for yi, tot in zip(y, total):
        over = f" (+{(tot / lower_bound_bytes - 1) * 100:.1f} %)" if lower_bound_bytes else ""
        ax.annotate(format_bytes(int(tot)) + over, (gib(tot), yi), xytext=(4, 0), textcoords="offset points",
                    va="center", fontsize="small")
    if lower_bound_bytes:
        ax.axvline(gib(lower_bound_bytes), color="black", ls="--", lw=1,
                   label=f"lower bound (peak live) {format_bytes(int(lower_bound_bytes))}")
    ax.set_yticks(y, labels)
    ax.set_xlabel("reserved memory at each policy's peak (GiB)"
                  + ("; in brackets: how much above the lower bound" if lower_bound_bytes else ""))
    ax.set_xlim(0, gib(max(total.max() if len(total) else 0, lower_bound_bytes or 0)) * 1.22 or 1)
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18 - 0.4 / max(len(table), 1)), ncol=3,
              fontsize="small", frameon=False)
    ax.set_title(title or "Peak reserved memory by policy, split by cause")
    return ax


def comparison_table(peaks: Mapping[str, Mapping[str, int]], extra: Mapping[str, Mapping[str, Any]] | None = None,
                     order: Sequence[str] | None = None) -> pd.DataFrame:
    """One row per policy from ``{label: parts at peak}`` (plus optional extra columns per label)."""
    labels = list(order or peaks)
    rows = []
    for label in labels:
        row = {"policy": label, **{c: int(peaks[label].get(c, 0)) for c in CATEGORIES}}
        row["peak_reserved_bytes"] = sum(row[c] for c in CATEGORIES)
        row.update((extra or {}).get(label, {}))
        rows.append(row)
    return pd.DataFrame(rows)
