"""What a user checks first about a trace: counts, span and live-byte peaks (``allocsim info``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .schema import EventKind, Trace


def live_bytes_series(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """Return (window_live_bytes, total_live_bytes) after each event, memory held until free completes.

    ``window_live_bytes`` counts only allocations made inside the trace; ``total_live_bytes`` adds the
    allocations alive when the trace began (the baseline), minus those freed so far.
    """
    kind = trace.column("kind")
    size = trace.column("size_bytes")
    ids = trace.column("alloc_id")
    baseline_ids = trace.initial_allocs["alloc_id"].to_numpy()
    is_alloc = kind == EventKind.ALLOC
    is_done = kind == EventKind.FREE_COMPLETED
    is_baseline = np.isin(ids, baseline_ids) & is_done
    window_delta = np.where(is_alloc, size, 0) - np.where(is_done & ~is_baseline, size, 0)
    baseline_delta = -np.where(is_baseline, size, 0)
    window = np.cumsum(window_delta, dtype=np.int64)
    baseline_total = int(trace.initial_allocs["size_bytes"].sum())
    total = window + baseline_total + np.cumsum(baseline_delta, dtype=np.int64)
    return window, total


def summarize(trace: Trace) -> dict[str, Any]:
    """Return the ``allocsim info`` fields for ``trace`` as a JSON-ready dict."""
    kind = trace.column("kind")
    t_ns = trace.column("t_ns")
    window, total = live_bytes_series(trace)
    baseline_bytes = int(trace.initial_allocs["size_bytes"].sum())
    mem_kinds = np.isin(kind, [EventKind.ALLOC, EventKind.FREE_REQUESTED, EventKind.FREE_COMPLETED])
    streams = sorted(int(s) for s in np.unique(trace.column("stream")[mem_kinds]))
    decisions = trace.decisions["action"].value_counts().to_dict() if len(trace.decisions) else {}
    return {
        "file": trace.meta.source,
        "format": trace.meta.format,
        "events": int(len(trace.events)),
        "allocs": int(np.count_nonzero(kind == EventKind.ALLOC)),
        # Requests that failed in the real run (a recorded OOM) are ALLOC events too: the program asked.
        "recorded_ooms": sum(len(run.get("ooms") or []) for run in trace.meta.recorded.values()),
        "frees": int(np.count_nonzero(kind == EventKind.FREE_REQUESTED)),
        "frees_completed": int(np.count_nonzero(kind == EventKind.FREE_COMPLETED)),
        "empty_cache_calls": int(np.count_nonzero(kind == EventKind.EMPTY_CACHE)),
        "markers": int(np.count_nonzero(kind == EventKind.MARKER)),
        "streams": len(streams),
        "stream_ids": streams,
        "devices": trace.devices,
        "time_synthesized": bool(trace.meta.time_synthesized),
        "time_span_ns": int(t_ns[-1] - t_ns[0]) if len(t_ns) else 0,
        "baseline_allocs": int(len(trace.initial_allocs)),
        "baseline_live_bytes": baseline_bytes,
        "peak_live_bytes": int(max(0, window.max())) if len(window) else 0,
        "peak_live_with_baseline_bytes": int(max(baseline_bytes, total.max())) if len(total) else baseline_bytes,
        "initial_segments": int(len(trace.initial_segments)),
        "initial_reserved_bytes": int(trace.initial_segments["size_bytes"].sum()),
        "recorded_decisions": {str(k): int(v) for k, v in sorted(decisions.items())},
        "allocator_settings": trace.meta.allocator_settings,
        "recorded": {device: _recorded_brief(run) for device, run in sorted(trace.meta.recorded.items())},
        "repairs": list(trace.meta.repairs),
        "notes": list(trace.meta.notes),
    }


def _recorded_brief(run: dict[str, Any]) -> dict[str, Any]:
    """The recorded facts ``info`` shows: real peak, device calls, releases, OOMs, capacity."""
    keys = ("allocator", "start_reserved_bytes", "peak_reserved_bytes", "final_reserved_bytes",
            "peak_allocated_bytes", "segment_allocs", "segment_frees", "segment_maps", "segment_unmaps",
            "empty_cache_calls", "oom_path_releases", "capacity_bytes", "capacity_source")
    out = {k: run.get(k) for k in keys if run.get(k) is not None}
    out["ooms"] = len(run.get("ooms") or [])
    return out
