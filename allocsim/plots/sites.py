"""Live memory over time, stacked by code site (the table of ``metrics.sites.timeline.site_timeline``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..metrics.sites.report import short_site
from ..metrics.sites.rows import OTHER, UNATTRIBUTED
from ..units import format_bytes
from ._common import gib, new_axes

#: Fixed colours of the two catch-all groups; sites take the tab20 colours in order.
_GROUP_COLORS = {OTHER: "#b0b0b0", UNATTRIBUTED: "#e3e3e3"}


def plot_site_timeline(table: pd.DataFrame, *, ax: Any = None, title: str | None = None,
                       time_synthesized: bool = False) -> Any:
    """Stack each site's live bytes (GiB) over time, largest site at the peak at the bottom; return the Axes.

    Each sample is drawn as a step from its bucket's first event (``from_*`` columns, the per-pixel
    rule of ``metrics.decimate``), so the drawn stack reaches the peak the title names.
    ``time_synthesized``: the trace has no timestamps, so the x axis is the event number.
    """
    from matplotlib import colormaps

    ax = new_axes(ax)
    wide = table.pivot(index="sample", columns="site", values="live_bytes")
    order = list(dict.fromkeys(table["site"]))
    wide = wide[order]
    first = table.drop_duplicates("sample").set_index("sample")
    ev_col, t_col = (("from_event_index", "from_t_ns") if "from_t_ns" in first.columns
                     else ("event_index", "t_ns"))   # tables written before the per-pixel rule
    if time_synthesized:
        x, xlabel = first[ev_col].to_numpy().astype(float) + 1, "event number (the trace has no timestamps)"
    else:
        t = first[t_col].to_numpy()
        x, xlabel = (t - t[0]) / 1e9, "trace time (s)"
    total = wide.sum(axis=1).to_numpy()
    peak = int(np.argmax(total)) if len(total) else 0
    palette = colormaps["tab20"].colors
    colors, labels = [], []
    for k, site in enumerate(order):
        colors.append(_GROUP_COLORS.get(site, palette[k % len(palette)]))
        at_peak = int(wide[site].iloc[peak]) if len(wide) else 0
        name = "unattributed (no frames)" if site == UNATTRIBUTED else short_site(site)
        labels.append(f"{name}: {format_bytes(at_peak)} at the peak")
    # Close the last step one column further so the last bucket has its width too.
    x_drawn = np.append(x, x[-1] + (x[-1] - x[0]) / max(len(x), 1)) if len(x) else x
    ax.stackplot(x_drawn, *[gib(np.append(wide[site].to_numpy(), wide[site].to_numpy()[-1:])) for site in order],
                 labels=labels, colors=colors, step="post", linewidth=0)
    if len(total):
        ax.axvline(x[peak], color="#333333", lw=0.8, ls=":")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("live memory (GiB)")
    ax.set_ylim(bottom=0)
    if len(x):
        ax.set_xlim(x_drawn[0], x_drawn[-1])
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="x-small", frameon=False,
              title="code site (innermost frame of the program)", title_fontsize="x-small")
    if len(total):
        ax.axhline(gib(total[peak]), color="#333333", lw=0.6, ls="--")
    ax.set_title(title or f"Live memory by code site (peak {format_bytes(int(total[peak]) if len(total) else 0)})")
    return ax
