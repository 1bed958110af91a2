"""Metrics of a run: per-event samples, the summary (peaks, fragmentation, latency) and conservation.

Start with ``RunResult.summary`` / ``RunResult.timeseries`` from ``allocsim.engine``; this package
holds how they are computed (``summary``), the sample columns (``series``) and the accounting check
tests run on every event (``conservation``).
"""

from typing import Any

#: Each name and the module that owns it, imported on first use: importing a submodule (the code
#: sites' filter for ``--help``) does not load pandas through this package.
_OWNERS = {
    "ConservationError": "conservation", "ConservationObserver": "conservation", "conservation_error": "conservation",
    "Samples": "series", "build_timeseries": "series", "with_derived": "series",
    "RunInfo": "summary", "RunOutput": "summary", "distribution": "summary", "lower_bound_bytes": "summary",
    "summarize": "summary",
}
__all__ = list(_OWNERS)


def __getattr__(name: str) -> Any:
    if name in _OWNERS:
        import importlib

        return getattr(importlib.import_module(f".{_OWNERS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
