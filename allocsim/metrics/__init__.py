"""Metrics of a run: per-event samples, the summary (peaks, fragmentation, latency) and conservation.

Start with ``RunResult.summary`` / ``RunResult.timeseries`` from ``allocsim.engine``; this package
holds how they are computed (``summary``), the sample columns (``series``) and the accounting check
tests run on every event (``conservation``).
"""

from .conservation import ConservationError, ConservationObserver, conservation_error
from .series import Samples, build_timeseries, with_derived
from .summary import RunInfo, RunOutput, distribution, lower_bound_bytes, summarize

__all__ = [
    "ConservationError", "ConservationObserver", "conservation_error",
    "Samples", "build_timeseries", "with_derived",
    "RunInfo", "RunOutput", "distribution", "lower_bound_bytes", "summarize",
]
