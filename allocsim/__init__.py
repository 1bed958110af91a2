"""allocsim: replay real GPU allocation traces through allocator policies and see what memory they need.

Start with ``allocsim.read_trace(path)`` and ``allocsim.run(trace, "pytorch")``; the public API is
``allocsim.api`` (its names are also here, but for ``advise``, ``fit``, ``scale`` and ``sweep``, which
are submodules' names: use ``from allocsim.api import advise``); the command line is ``allocsim --help``.
"""

from typing import Any

from .version import __version__

#: The trace layer's names, imported on first use: ``import allocsim`` (and so ``allocsim --version``)
#: does not load pandas.
_TRACE = ("EventKind", "Trace", "read_trace", "write_trace")
#: The public API's functions, imported on first use too.
_API = ("ATTRIBUTION_LABELS", "ATTRIBUTION_PARTS", "GiB", "MiB", "RecordedRun", "RunResult", "attribute_run",
        "find_max", "format_advice", "format_bytes", "format_sites", "parse_alloc_conf", "parse_bytes",
        "recorded_run", "run", "short_site", "site_timeline", "winners")
__all__ = [*_TRACE, "__version__", *_API]


def __getattr__(name: str) -> Any:
    if name in _TRACE:
        from . import trace

        return getattr(trace, name)
    if name in _API:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'allocsim' has no attribute {name!r}")
