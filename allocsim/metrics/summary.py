"""The summary of one run: peaks beside the lower bound, fragmentation, device calls, latency, stalls.

Names follow PyTorch (``torch.cuda.memory_stats``) and ``papers.md`` §7, with ``L`` = requested,
``A`` = active, ``R`` = reserved:

- ``requested``: bytes the program asked for, of allocations alive or pending free (held until the
  free completes, like the lower bound);
- ``allocated``: bytes of handed-out blocks after rounding, minus blocks whose free the program
  requested but that are not reusable yet; ``active`` includes those (``pending_free``);
- ``reserved``: bytes held from the device; ``inactive`` = reserved - active (cached free memory,
  i.e. external fragmentation); internal fragmentation = active - requested (rounding);
- ``peak_live_lower_bound_bytes``: peak live bytes of the trace including its start state (LOAD):
  no non-moving allocator can reserve less;
- ``fragmentation.ratio`` = 1 - max A / max R (GMLake/STAlloc); ``fragmentation.over_live`` =
  max R / max L - 1 (Johnstone & Wilson #4); ``fragmentation.external_at_peak`` =
  1 - largest free block / free bytes at peak reserved (Umpire).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ..cost import CostModel, stack_counter
from ..trace.schema import EventKind
from ..trace.inference.stats import live_bytes_series
from .verdict import summary_verdict

if TYPE_CHECKING:
    from ..policies.base import Policy
    from ..trace.schema import Trace
    from .series import Samples

SCHEMA = "allocsim-run/1"
_KIND_NAMES = {int(EventKind.ALLOC): "alloc", int(EventKind.FREE_REQUESTED): "free_requested",
               int(EventKind.FREE_COMPLETED): "free_completed", int(EventKind.EMPTY_CACHE): "empty_cache"}
OOM_COLUMNS = ("event_index", "t_ns", "sim_t_ns", "alloc_id", "stream", "requested_bytes", "reserved_bytes",
               "allocated_bytes", "active_bytes", "largest_free_block_bytes", "capacity_bytes", "reason")


@dataclasses.dataclass
class RunOutput:
    """What one replay produced, whichever engine ran it: the input of ``summarize`` and ``result.build_result``."""

    trace: "Trace"
    policy: "Policy"
    samples: "Samples"
    #: One dict per failed allocation (``OOM_COLUMNS``), in the order they happened.
    ooms: list[dict[str, Any]]
    completed: bool                      #: False when the run stopped at an OOM
    continue_on_oom: bool
    #: "recorded" (the real allocator's layout, from the file), "inferred" (rebuilt from the window's
    #: addresses: Kineto) or "allocated" (the live allocations placed anew)
    start_state: str
    start_state_note: str                #: why the recorded or inferred layout was not used, if it was not
    t0_ns: int                           #: the trace's first timestamp (the run's time origin)
    #: Reserved bytes when the largest free block was last probed, and that block's size.
    probed_peak_reserved_bytes: int = -1
    largest_free_block_at_probe_bytes: int = 0


@dataclasses.dataclass
class RunInfo:
    """What the engine knows about a run beyond the policy state: mode, wall time and timing totals."""

    mode: str
    wall_s: float
    cost_model: CostModel | None = None
    sync_count: int = 0
    sync_ns: int = 0
    stall_ns: int = 0
    dependency_wait_ns: int = 0
    makespan_ns: int = 0


def lower_bound_bytes(trace, *, granted_only: bool = False) -> int:
    """Peak live bytes of ``trace`` including the allocations alive at its start (and the requests of
    recorded OOMs, which the program needed, unless ``granted_only``: then what the real run held)."""
    baseline = int(trace.initial_allocs["size_bytes"].sum())
    if not len(trace.events):
        return baseline
    _, total = live_bytes_series(trace, granted_only=granted_only)
    return int(max(baseline, int(total.max())))


def distribution(values: np.ndarray) -> dict[str, Any] | None:
    """p50/p99/max/mean/count of integer samples (percentiles are actual samples), None when empty."""
    if len(values) == 0:
        return None
    p50, p99 = np.percentile(values, [50, 99], method="inverted_cdf")
    return {"p50": int(p50), "p99": int(p99), "max": int(values.max()),
            "mean": round(float(values.mean()), 3), "count": int(len(values)), "total": int(values.sum())}


def jsonable(value: Any) -> Any:
    """Turn numpy scalars, tuples and other odd values into plain JSON types (recursively)."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value) if isinstance(value, (set, frozenset)) else value
        return [jsonable(v) for v in items]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return round(value, 9) if np.isfinite(value) else None
    if value is None or isinstance(value, str):
        return value
    return str(value)


def _ratio(num: float, den: float) -> float | None:
    return round(num / den, 6) if den else None


def _peaks(ts: pd.DataFrame) -> dict[str, tuple[int, int]]:
    """Column -> (peak value, row of its first occurrence)."""
    out = {}
    for name in ("requested", "allocated", "active", "reserved", "inactive"):
        values = ts[f"{name}_bytes"].to_numpy() if name != "inactive" else (
            ts["reserved_bytes"].to_numpy() - ts["active_bytes"].to_numpy())
        row = int(np.argmax(values))
        out[name] = (int(values[row]), row)
    return out


def summarize(run: RunOutput, info: RunInfo, timeseries: pd.DataFrame) -> dict[str, Any]:
    """Return the JSON-ready summary of a finished run (deterministic: no wall-clock values)."""
    trace, policy = run.trace, run.policy
    dev = policy.device
    ts = timeseries
    lower_bound = lower_bound_bytes(trace)
    peaks = _peaks(ts)
    peak_row = peaks["reserved"][1]
    at_peak = ts.iloc[peak_row]
    final = ts.iloc[-1]
    free_at_peak = int(at_peak["reserved_bytes"] - at_peak["active_bytes"])
    lfb_at_peak = (run.largest_free_block_at_probe_bytes
                   if run.probed_peak_reserved_bytes == peaks["reserved"][0] else None)
    event_index = ts["event_index"].to_numpy()
    t_ns = trace.column("t_ns")
    span_ns = int(t_ns[-1] - t_ns[0]) if len(t_ns) else 0
    summary: dict[str, Any] = {
        "schema": SCHEMA,
        "policy": policy.name,
        "params": jsonable(policy.params()),
        "mode": info.mode,
        "trace": {"source": trace.meta.source, "format": trace.meta.format,
                  "devices": [int(d) for d in trace.devices],
                  "time_synthesized": bool(trace.meta.time_synthesized)},
        # The device replayed: GPU N, -1 for host memory; None when a trace of several was replayed whole.
        "device": int(trace.devices[0]) if len(trace.devices) == 1 else None,
        "capacity_bytes": dev.capacity_bytes,
        "continue_on_oom": run.continue_on_oom,
        "events": int(len(trace.events)),
        "events_replayed": int(len(ts) - 1),
        "completed": run.completed,
        "initial_allocs": int(len(trace.initial_allocs)),
        "initial_alloc_bytes": int(trace.initial_allocs["size_bytes"].sum()),
        # "recorded": the real allocator's start layout was adopted; "allocated": re-allocated in order.
        "start_state": run.start_state,
        "start_state_note": run.start_state_note or None,
    }
    for name, (value, _) in peaks.items():
        summary[f"peak_{name}_bytes"] = value
    summary["peak_live_lower_bound_bytes"] = lower_bound
    # Below the lower bound only where a recorded OOM's request, which never got memory, is in it.
    summary["peak_live_granted_bytes"] = lower_bound_bytes(trace, granted_only=True)
    summary["peak_event_index"] = {name: int(event_index[row]) for name, (_, row) in peaks.items()}
    summary["peak_over_lower_bound"] = {name: _ratio(peaks[name][0], lower_bound)
                                        for name in ("requested", "allocated", "active", "reserved")}
    for name in ("requested", "allocated", "active", "reserved"):
        summary[f"final_{name}_bytes"] = int(final[f"{name}_bytes"])
    summary["final_inactive_bytes"] = int(final["reserved_bytes"] - final["active_bytes"])
    summary["at_peak_reserved"] = {
        "event_index": int(event_index[peak_row]),
        "requested_bytes": int(at_peak["requested_bytes"]),
        "allocated_bytes": int(at_peak["allocated_bytes"]),
        "active_bytes": int(at_peak["active_bytes"]),
        # A trace of block sizes (Kineto's Bytes) records no request size: the rounding inside blocks is
        # unknown, and active - requested would only be the replay rounding the blocks once more.
        "internal_fragmentation_bytes": (None if trace.meta.version_hints.get("size_bytes") == "block"
                                         else int(at_peak["active_bytes"] - at_peak["requested_bytes"])),
        "external_fragmentation_bytes": free_at_peak,
        "largest_free_block_bytes": lfb_at_peak,
    }
    summary["largest_free_block_at_peak_bytes"] = lfb_at_peak
    summary["largest_free_block_final_bytes"] = int(policy.largest_free_block_bytes())
    summary["fragmentation"] = {
        "ratio": _ratio(peaks["reserved"][0] - peaks["active"][0], peaks["reserved"][0]),
        "over_live": _ratio(peaks["reserved"][0] - peaks["requested"][0], peaks["requested"][0]),
        "reserved_over_lower_bound": _ratio(peaks["reserved"][0], lower_bound),
        "external_at_peak": (_ratio(free_at_peak - lfb_at_peak, free_at_peak)
                             if lfb_at_peak is not None else None),
    }
    summary.update({
        "device_mallocs": int(dev.n_mallocs), "device_malloc_bytes": int(dev.malloc_bytes),
        "device_frees": int(dev.n_frees), "device_free_bytes": int(dev.freed_bytes),
        "device_maps": int(getattr(dev, "n_maps", 0)), "device_map_bytes": int(getattr(dev, "map_bytes", 0)),
        "device_unmaps": int(getattr(dev, "n_unmaps", 0)),
        "device_unmap_bytes": int(getattr(dev, "unmapped_bytes", 0)),
        "device_failed_mallocs": int(getattr(dev, "n_failed_mallocs", 0)),
        "device_peak_reserved_bytes": int(dev.peak_reserved_bytes),
        "policy_mallocs": int(policy.n_mallocs),
        "pool_hits": stack_counter(policy, "n_pool_hits"),
        "splits": stack_counter(policy, "n_splits"),
        "merges": stack_counter(policy, "n_merges"),
        "gc_batches": stack_counter(policy, "n_gc_batches"),
        "oom_count": len(run.ooms),
        "oom": jsonable(run.ooms[0]) if run.ooms else None,
    })
    summary.update(_timing(info, ts, span_ns))
    summary["repairs"] = len(trace.meta.repairs)
    summary["verdict"] = summary_verdict(summary, ts, run.t0_ns)
    return summary


def _timing(info: RunInfo, ts: pd.DataFrame, span_ns: int) -> dict[str, Any]:
    """Latency, stall and makespan fields (None in fast mode, which has no clock)."""
    timed = info.mode == "simpy"
    out: dict[str, Any] = {"alloc_latency_ns": None, "call_latency_ns": None, "stall_ns": None,
                           "sync_count": None, "sync_ns": None, "dependency_wait_ns": None,
                           "makespan_ns": None, "trace_span_ns": span_ns, "makespan_over_span": None,
                           "cost_model": None}
    if not timed:
        return out
    rows = ts.iloc[1:]
    kind = rows["kind"].to_numpy()
    latency = rows["latency_ns"].to_numpy()
    out["alloc_latency_ns"] = distribution(latency[kind == EventKind.ALLOC])
    out["call_latency_ns"] = {name: distribution(latency[kind == k]) for k, name in _KIND_NAMES.items()}
    out.update(stall_ns=int(info.stall_ns), sync_count=int(info.sync_count), sync_ns=int(info.sync_ns),
               dependency_wait_ns=int(info.dependency_wait_ns), makespan_ns=int(info.makespan_ns),
               makespan_over_span=_ratio(info.makespan_ns, span_ns),
               cost_model=info.cost_model.to_dict() if info.cost_model else None)
    return out
