"""Flatten a run summary into one tidy row: nested dicts become dotted columns (``alloc_latency_ns.p99``).

Lists become compact JSON text (``trace.devices`` -> ``"[0]"``), so every column holds scalars.
A nested dict that is None in this run (``oom``, ``alloc_latency_ns`` in fast mode) stays one
column holding None; ``results.write_results`` drops such a column when its dotted children exist.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

#: Wall-clock columns: they differ from run to run, so row equality ignores them.
PERF_COLUMNS = ("sim_seconds", "events_per_second", "wall_seconds")


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}, "c": [1, 2]}`` -> ``{"a.b": 1, "c": "[1,2]"}`` (insertion order kept)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, name + "."))
        elif isinstance(value, (list, tuple)):
            out[name] = json.dumps(value, separators=(",", ":"))
        else:
            out[name] = value
    return out


def deterministic(row: Mapping[str, Any]) -> dict[str, Any]:
    """``row`` without the wall-clock columns (what must match between executors and reruns)."""
    return {k: v for k, v in row.items() if k not in PERF_COLUMNS}
