"""Figures from result tables: pure functions that draw on (and return) a matplotlib ``Axes``.

None of them reads or writes files; ``allocsim plot`` saves each figure beside the data it drew.
Pass ``ax=`` to draw into your own layout; without it each makes a new figure. Long time series
are downsampled for drawing (``downsample``: min and max per bucket, so peaks stay exact).

    from allocsim.runner import attribute_run
    from allocsim.plots import plot_timeline, plot_attribution, plot_segment_map
    result, observer, table = attribute_run(trace, "pytorch")
    plot_timeline(result); plot_attribution(table, result.summary); plot_segment_map(observer.peak_segments)
"""

from ._common import CATEGORY_COLORS, downsample, time_axis
from .attribution import comparison_table, plot_attribution, plot_policy_comparison
from .latency import alloc_latencies, plot_latency
from .segments import plot_segment_map
from .sites import plot_site_timeline
from .sweep import config_labels, pareto_mask, plot_pareto, plot_sweep_heatmap, varying_params
from .timeline import plot_timeline, step_markers

__all__ = [
    "CATEGORY_COLORS", "alloc_latencies", "comparison_table", "config_labels", "downsample", "pareto_mask",
    "plot_attribution", "plot_latency", "plot_pareto", "plot_policy_comparison", "plot_segment_map",
    "plot_site_timeline",
    "plot_sweep_heatmap", "plot_timeline", "step_markers", "time_axis", "varying_params",
]
