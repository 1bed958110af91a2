"""A static segment map: one row per device segment, its blocks coloured by state (like memory_viz)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from matplotlib.patches import Patch

from ..metrics.attribution import SEGMENT_STATES
from ..units import MiB, format_bytes
from ._common import STATE_STYLE, new_axes


def _row_label(seg: pd.Series) -> str:
    pool = "" if seg["pool"] in ("pool", "direct") else f"{seg['pool']}, "
    stream = f"stream {seg['stream']}" if seg["stream"] >= 0 else "direct"
    return f"{format_bytes(int(seg['segment_bytes']))} ({pool}{stream})"


def _group_identical(segments: pd.DataFrame, segs: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """One segment per layout that looks identical (same size, pool, stream, and pieces to within a
    two-thousandth of the widest segment: what a pixel can show) with its ``copies``; segment -> its row."""
    quantum = max(1, int(segs["footprint"].max()) // 2000) if len(segs) else 1
    keys = {}
    for seg, part in segments.groupby("segment", sort=False):
        keys[seg] = (tuple(part["offset_bytes"] // quantum), tuple(-(-part["size_bytes"] // quantum)),
                     tuple(part["state"]))
    first: dict = {}
    rep_of = {}
    for seg, r in segs.iterrows():
        rep_of[seg] = first.setdefault((r["segment_bytes"], r["pool"], r["stream"], keys[seg]), seg)
    copies = pd.Series(rep_of).value_counts()
    reps = segs.loc[list(dict.fromkeys(rep_of.values()))]
    return reps.assign(copies=copies.reindex(reps.index).to_numpy()), rep_of


def plot_segment_map(segments: pd.DataFrame, *, ax: Any = None, title: str | None = None,
                     max_segments: int = 40) -> Any:
    """Draw ``segment_table`` output: segments as rows (largest first), blocks coloured by state.

    x is the offset inside each segment in MiB, to scale. Segments with the same size and the
    same layout of blocks share one row ("x 36"). Beyond ``max_segments`` rows the remaining
    (smaller) segments are summed into one last row whose bar shows how their bytes split by
    state, so every reserved byte is on the picture. Returns the Axes.
    """
    ends = segments["offset_bytes"] + segments["size_bytes"]
    segs = (segments.assign(end=ends).groupby("segment", sort=False)
            .agg(segment_bytes=("segment_bytes", "first"), stream=("stream", "first"), pool=("pool", "first"),
                 addr=("segment_addr", "first"), footprint=("end", "max"))
            .sort_values(["footprint", "addr"], ascending=[False, True]))
    n_segments = len(segs)
    segs, rep_of = _group_identical(segments, segs)
    shown = segs.index[:max_segments]
    hidden = set(segs.index[max_segments:])
    rest = [seg for seg, rep in rep_of.items() if rep in hidden]
    n_rows = len(shown) + (1 if len(rest) else 0)
    ax = new_axes(ax, figsize=(11, 1.6 + 0.22 * max(n_rows, 4)))
    row_of = {seg: k for k, seg in enumerate(shown)}
    pieces = segments[segments["segment"].isin(shown)]
    for state in SEGMENT_STATES:
        part = pieces[pieces["state"] == state]
        if not len(part):
            continue
        color, _ = STATE_STYLE[state]
        rows = part["segment"].map(row_of).to_numpy()
        for r in np.unique(rows):
            sel = part[rows == r]
            ax.broken_barh(list(zip(sel["offset_bytes"].to_numpy() / MiB, sel["size_bytes"].to_numpy() / MiB)),
                           (r - 0.4, 0.8), facecolors=color, edgecolor="none")
    labels = [_row_label(segs.loc[s]) + (f" × {segs.loc[s, 'copies']}" if segs.loc[s, "copies"] > 1 else "")
              for s in shown]
    if len(rest):
        tail = segments[segments["segment"].isin(rest)]
        total = tail["size_bytes"].sum()
        widest = segs.loc[shown, "footprint"].max()
        scale = min(1.0, widest / max(1, total))   # concatenated to scale, shrunk only if wider than the rest
        left = 0.0
        for state in SEGMENT_STATES:
            size = tail.loc[tail["state"] == state, "size_bytes"].sum()
            if size:
                width = size * scale / MiB
                ax.broken_barh([(left, width)], (len(shown) - 0.4, 0.8), facecolors=STATE_STYLE[state][0],
                               edgecolor="white", hatch="//")
                left += width
        labels.append(f"{len(rest)} smaller segments, {format_bytes(int(total))}\n(hatched: end to end"
                      + (", shrunk to fit)" if scale < 1 else ")"))
    for r, seg in enumerate(shown):   # the outline of each segment, to scale
        ax.broken_barh([(0, segs.loc[seg, "segment_bytes"] / MiB)], (r - 0.4, 0.8), facecolors="none",
                       edgecolor="#444444", lw=0.5)
    ax.set_yticks(range(n_rows), labels, fontsize="x-small" if n_rows > 20 else "small")
    ax.set_ylim(n_rows - 0.5, -0.5)
    ax.set_xlim(left=0)
    ax.set_xlabel("offset inside the segment (MiB)")
    ax.grid(True, axis="x", alpha=0.3)
    present = [s for s in SEGMENT_STATES if (segments["state"] == s).any()]
    ax.legend([Patch(color=STATE_STYLE[s][0]) for s in present], [STATE_STYLE[s][1] for s in present],
              loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", frameon=False)
    total = int(segments["size_bytes"].sum())
    ax.set_title(title or f"Segment map: {n_segments} segments holding {format_bytes(total)}; "
                          "one row per segment, identical ones merged")
    return ax
