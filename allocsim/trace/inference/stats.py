"""What a user checks first about a trace: counts, span and live-byte peaks (``allocsim info``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..schema import EventKind, Trace
from .recorded import failed_request_events


def live_bytes_series(trace: Trace, *, granted_only: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Return (window_live_bytes, total_live_bytes) after each event, memory held until free completes.

    ``window_live_bytes`` counts only allocations made inside the trace; ``total_live_bytes`` adds the
    allocations alive when the trace began (the baseline), minus those freed so far. A recorded OOM's
    request is an ALLOC event that is never freed: it counts (what the program asked for) unless
    ``granted_only``, which counts only what the real run held. On the compiled route one pass in C
    (``live_bytes``) fills both without temporaries; sums that could pass int64 take the reference
    below (Python integers).
    """
    from ..reading import compiled

    size = trace.column("size_bytes")
    failed = failed_request_events(trace) if granted_only else ()
    if len(failed):
        size = size.copy()
        size[failed] = 0
    if compiled.active() and len(trace):
        baseline_total = _exact_sum(trace.table("initial_allocs")["size_bytes"])
        if baseline_total < _INT64_LIMIT:
            c = np.ascontiguousarray
            got = compiled.ext.live_bytes(
                c(trace.column("kind"), np.uint8), c(size, np.int64),
                c(trace.column("alloc_id"), np.int64), c(trace.table("initial_allocs")["alloc_id"], np.int64),
                baseline_total)
            if got is not None:
                return np.frombuffer(got[0], np.int64), np.frombuffer(got[1], np.int64)
    return live_bytes_series_reference(trace, size)


def live_bytes_series_reference(trace: Trace, size_bytes: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``live_bytes_series`` in numpy: the reference the compiled pass is held to (``size_bytes``: per event)."""
    kind = trace.column("kind")
    size = trace.column("size_bytes") if size_bytes is None else size_bytes
    ids = trace.column("alloc_id")
    baseline_ids = trace.table("initial_allocs")["alloc_id"]
    is_alloc = kind == EventKind.ALLOC
    is_done = kind == EventKind.FREE_COMPLETED
    is_baseline = np.isin(ids, baseline_ids) & is_done
    window_delta = np.where(is_alloc, size, 0) - np.where(is_done & ~is_baseline, size, 0)
    baseline_delta = -np.where(is_baseline, size, 0)
    baseline_total = _exact_sum(trace.table("initial_allocs")["size_bytes"])
    n_allocs = int(np.count_nonzero(is_alloc))
    largest = max(int(size.max()) if len(size) else 0, 0)
    if (n_allocs * largest + baseline_total >= _INT64_LIMIT
            and _exact_sum(np.where(is_alloc, size, 0)) + baseline_total >= _INT64_LIMIT):
        # Live bytes could pass 2**63 (only crafted traces): sum in Python integers, never wrap.
        window = np.cumsum(window_delta.astype(object))
        total = window + baseline_total + np.cumsum(baseline_delta.astype(object))
        return window, total
    window = np.cumsum(window_delta, dtype=np.int64)
    total = window + baseline_total + np.cumsum(baseline_delta, dtype=np.int64)
    return window, total


_INT64_LIMIT = 1 << 63


def _exact_sum(values: np.ndarray) -> int:
    """Sum of non-negative int64 values as a Python int (no wrap-around)."""
    if not len(values):
        return 0
    if int(values.max()) > 1 << 50 or int(values.min()) < 0:
        return sum(values.tolist())
    # Chunks of 2**12 values of at most 2**50 bytes each (the readers' size cap) cannot wrap.
    return sum(int(chunk.sum()) for chunk in np.array_split(values, max(1, len(values) // 4096)))


def summarize(trace: Trace) -> dict[str, Any]:
    """Return the ``allocsim info`` fields for ``trace`` as a JSON-ready dict.

    Byte figures count one memory: on a trace of several GPUs they are None (each device's are in
    ``summarize(trace.for_device(d))``), and host memory is never added to a GPU's.
    """
    kind = trace.column("kind")
    t_ns = trace.column("t_ns")
    # The devices that hold memory (markers carry a device too, but no bytes).
    held = set(np.unique(trace.column("device")[kind != EventKind.MARKER]).tolist())
    held |= set(np.unique(trace.table("initial_allocs")["device"]).tolist())
    gpus = sorted(int(d) for d in held if d >= 0)
    others = sorted(int(d) for d in held if d < 0)
    # Host and GPU bytes are different memories: on a mixed trace the byte figures count the GPUs only.
    bytes_of = _gpu_part(trace) if gpus and others else trace
    # Peaks of what the real run held; a recorded OOM's request, which never got memory, only in the demand.
    window, total = live_bytes_series(bytes_of, granted_only=True)
    demand = int(live_bytes_series(bytes_of)[1].max()) if len(failed_request_events(bytes_of)) else None
    baseline_bytes = _exact_sum(bytes_of.table("initial_allocs")["size_bytes"])
    mem_kinds = np.isin(kind, [EventKind.ALLOC, EventKind.FREE_REQUESTED, EventKind.FREE_COMPLETED])
    streams = sorted(int(s) for s in np.unique(trace.column("stream")[mem_kinds]))
    decisions = _value_counts(trace.table("decisions")["action"])
    out = {
        "file": trace.meta.source,
        "format": trace.meta.format,
        # a capture that stops before its script's end (every verdict on it says so)
        **({"incomplete": trace.meta.incomplete} if trace.meta.incomplete else {}),
        "events": int(len(trace)),
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
        "time_span_ns": int(t_ns[-1]) - int(t_ns[0]) if len(t_ns) else 0,
        "baseline_allocs": int(len(trace.table("initial_allocs"))),
        "baseline_live_bytes": baseline_bytes,
        "peak_live_bytes": int(max(0, int(window.max()))) if len(window) else 0,
        "peak_live_with_baseline_bytes": int(max(baseline_bytes, int(total.max()))) if len(total) else baseline_bytes,
        **({} if demand is None else {"peak_demand_bytes": max(demand, baseline_bytes)}),
        "initial_segments": int(len(trace.table("initial_segments"))),
        "initial_reserved_bytes": _exact_sum(bytes_of.table("initial_segments")["size_bytes"]),
        "recorded_decisions": {str(k): int(v) for k, v in sorted(decisions.items())},
        "allocator_settings": trace.meta.allocator_settings,
        "recorded": {device: _recorded_brief(run) for device, run in sorted(trace.meta.recorded.items())},
        "repairs": list(trace.meta.repairs),
        "notes": list(trace.meta.notes),
    }
    said = None
    if len(gpus) > 1 or (not gpus and len(others) > 1):
        # Each GPU (or host memory and pinned memory) is its own memory: a sum would fit none of them.
        for key in _BYTE_KEYS:
            if key in out:
                out[key] = None
        what = f"GPUs {gpus}" if gpus else f"devices {others}"
        said = (f"per device only: {what} are separate memories and their bytes are not added together"
                + (f", nor host memory (device(s) {others})" if gpus and others else "")
                + "; each device's own figures are in its section (or pass --device N)")
    elif bytes_of is not trace:
        said = (f"GPU device(s) {gpus} only: host memory (device(s) {others}) is another memory and is not "
                "added to it; each device's own figures are in its section")
    if said is not None:
        # Right after the byte figures it qualifies.
        items = list(out.items())
        at = [k for k, _ in items].index("initial_reserved_bytes") + 1
        out = dict(items[:at] + [("bytes_counted", said)] + items[at:])
    return out


def _value_counts(values: np.ndarray) -> dict[str, int]:
    """How many times each value occurs, missing values left out (the decisions' actions: a few strings)."""
    counts: dict[str, int] = {}
    for value in values.tolist():
        if value is None or value != value:      # None or NaN: not counted, as pandas' value_counts
            continue
        counts[value] = counts.get(value, 0) + 1
    return counts


#: The figures that count bytes of one memory (None on a trace of several GPUs: see ``bytes_counted``).
_BYTE_KEYS = ("baseline_live_bytes", "peak_live_bytes", "peak_live_with_baseline_bytes", "peak_demand_bytes",
              "initial_reserved_bytes")


def counted_part(trace: Trace) -> Trace:
    """The part of ``trace`` whose bytes ``info`` counts: the GPUs where host memory sits beside them."""
    kind = trace.column("kind")
    held = set(np.unique(trace.column("device")[kind != EventKind.MARKER]).tolist())
    held |= set(np.unique(trace.table("initial_allocs")["device"]).tolist())
    mixed = any(d >= 0 for d in held) and any(d < 0 for d in held)
    return _gpu_part(trace) if mixed else trace


def _gpu_part(trace: Trace) -> Trace:
    """The GPU devices' events and start state of a trace that also holds host memory."""
    ev = trace.events
    keep = (ev["device"].to_numpy() >= 0) | (ev["kind"].to_numpy() == EventKind.MARKER)
    gpu = lambda frame: frame.loc[frame["device"].to_numpy() >= 0].reset_index(drop=True)
    return trace.replace(events=ev.loc[keep].reset_index(drop=True),
                               initial_allocs=gpu(trace.initial_allocs), initial_segments=gpu(trace.initial_segments),
                               initial_blocks=gpu(trace.initial_blocks))


def _recorded_brief(run: dict[str, Any]) -> dict[str, Any]:
    """The recorded facts ``info`` shows: real peak, device calls, releases, OOMs, capacity."""
    keys = ("allocator", "start_reserved_bytes", "peak_reserved_bytes", "final_reserved_bytes",
            "peak_allocated_bytes", "segment_allocs", "segment_frees", "segment_maps", "segment_unmaps",
            "empty_cache_calls", "oom_path_releases", "capacity_bytes", "capacity_source", "capacity_range")
    out = {k: run.get(k) for k in keys if run.get(k) is not None}
    out["ooms"] = len(run.get("ooms") or [])
    return out
