"""Replay a trace through a policy on a real device, simulate the same run, and compare the two.

``validate_policy(trace, "pytorch", backend)`` does, in order:

1. **Measure.** Build the policy with ``build_policy(name, device=<real device>, params=...)``,
   place ``trace.initial_allocs`` (alloc_id order, untimed), then issue every event in trace order
   on one host thread, timing each policy call with ``perf_counter_ns`` (the device's own
   measurement time is taken out). The device samples the memory it really holds at every device
   call (``cudaMemGetInfo`` on a GPU, kernel mapping sizes and RSS on the host).
   With ``compute=True`` the gaps between events are work: the host waits each gap (scaled by
   ``time_scale``) after the previous call returned, as the simulator does on one stream, and on
   a GPU a spin kernel as long as the gap to that stream's next event is queued on the stream
   right after each event, so ``cudaFree``'s device-wide synchronisation really waits for it.
   On CuPy each trace stream gets its own non-blocking ``cupy.cuda.Stream``; the host ignores
   streams (multi-stream traces are issued in trace order by one thread).
2. **Predict.** ``allocsim.engine.simulate`` runs the same policy, parameters and allocator
   settings on a ``SimulatedDevice`` with the real device's footprint rule and capacity, under a
   cost model (a calibration file if given; the harness adds the Python policy overheads recorded
   in it, see ``cost_model_for_policy``). With ``compute`` the simulated trace is time-scaled too.
3. **Compare.** Peak bytes, device call counts and allocation latency p50/p99, with errors in
   percent of the measured value (``(predicted - measured) / measured * 100``).

OOM: the first ``OutOfMemory`` stops the replay (as the simulator does by default); both sides
report it.
"""

from __future__ import annotations

import dataclasses
import gc
import time
from typing import Any, Callable, Mapping

import numpy as np
import pandas as pd

from allocsim.cost import CostModel
from allocsim.device import SimulatedDevice
from allocsim.engine import run_fast, select_device, simulate
from allocsim.errors import OutOfMemory
from allocsim.metrics.summary import distribution
from allocsim.policies.registry import build_policy
from allocsim.trace.schema import EventKind, Trace

from .devices import OP_FREE, OP_MALLOC, OP_MAP, OP_UNMAP, busy_wait_ns

ALLOC, FREE_REQUESTED, FREE_COMPLETED, EMPTY_CACHE, MARKER = (int(k) for k in EventKind)
_perf_ns = time.perf_counter_ns

#: Targets the GPU validation is held to.
PEAK_TARGET_PCT = 1.0
P50_TARGET_PCT = 20.0

#: Policies validated by default (``python -m validate replay --policy all``).
DEFAULT_POLICIES = ("direct", "pytorch", "cupy", "cuda-async", "paddle", "deferred-gc")


@dataclasses.dataclass
class ReplayOptions:
    """How a replay runs; the same options drive the simulated side."""

    compute: bool = False
    time_scale: float = 1.0
    capacity_bytes: int | None = None
    granularity_bytes: int | None = None
    small_granularity_bytes: int | None = None
    real_addresses: bool = False


# ====================================================================== trace helpers
def slice_trace(trace: Trace, limit_events: int | None) -> Trace:
    """The first ``limit_events`` events of ``trace`` (allocations freed later simply stay live)."""
    if limit_events is None or limit_events >= len(trace.events):
        return trace
    events = trace.events.iloc[:max(limit_events, 0)].reset_index(drop=True)
    decisions = trace.decisions.loc[trace.decisions["event_index"] < limit_events].reset_index(drop=True)
    meta = dataclasses.replace(trace.meta, notes=list(trace.meta.notes) + [f"first {limit_events} events only"])
    return dataclasses.replace(trace, events=events, decisions=decisions, meta=meta)


def scale_time(trace: Trace, time_scale: float) -> Trace:
    """``trace`` with every gap multiplied by ``time_scale`` (what a scaled compute replay waits)."""
    if time_scale == 1.0 or not len(trace.events):
        return trace
    t = trace.column("t_ns")
    scaled = t[0] + np.floor((t - t[0]) * float(time_scale)).astype(np.int64)
    events = trace.events.copy()
    events["t_ns"] = scaled.astype(np.int64)
    return dataclasses.replace(trace, events=events)


def next_gap_same_stream(t_ns: np.ndarray, streams: np.ndarray) -> np.ndarray:
    """For each event, the time until the next event of the same stream (0 for a stream's last)."""
    gaps = np.zeros(len(t_ns), dtype=np.int64)
    frame = pd.DataFrame({"t": t_ns, "s": streams, "i": np.arange(len(t_ns))})
    for _stream, part in frame.groupby("s", sort=False):
        idx = part["i"].to_numpy()
        tt = part["t"].to_numpy()
        if len(idx) > 1:
            gaps[idx[:-1]] = np.diff(tt)
    return gaps


# ====================================================================== the measuring loop
@dataclasses.dataclass
class Drive:
    """What one real replay measured at the call level (memory is the target's business)."""

    latency_ns: np.ndarray          # per event; -1 for events not executed (markers, after an OOM)
    kinds: np.ndarray
    total_ns: int
    events_replayed: int
    oom: dict[str, Any] | None
    start_state: str = "allocated"   # "recorded" when a snapshot's layout was loaded (as the simulator does)


def drive(trace: Trace, target: Any, backend: Any, *, compute: bool = False, time_scale: float = 1.0,
          overhead_ns: Callable[[], int] | None = None,
          after_call: Callable[[int, int], None] | None = None) -> Drive:
    """Issue ``trace``'s start state and events to ``target`` (a policy, or a real-allocator adaptor).

    ``target`` has ``malloc(alloc_id, size, stream)``, ``free_requested(id)``, ``free_completed(id)``
    and ``empty_cache()``. ``overhead_ns()`` is a running total of measurement time to take out of
    each call's latency; ``after_call(kind, stream)`` runs untimed after each call.
    """
    kinds = trace.column("kind")
    t_ns = trace.column("t_ns")
    stream_col = trace.column("stream")
    kind_l, id_l, size_l, stream_l = (kinds.tolist(), trace.column("alloc_id").tolist(),
                                      trace.column("size_bytes").tolist(), stream_col.tolist())
    n = len(kind_l)
    init = trace.initial_allocs.sort_values("alloc_id", kind="stable")
    backend.prepare_streams(sorted(set(stream_l) | set(init["stream"].tolist())))
    next_gap = (np.floor(next_gap_same_stream(t_ns, stream_col) * time_scale).astype(np.int64).tolist()
                if compute else None)
    scaled_t = (np.floor((t_ns - (t_ns[0] if n else 0)) * time_scale).astype(np.int64).tolist()
                if compute else None)
    latency = np.full(n, -1, dtype=np.int64)
    oom: dict[str, Any] | None = None
    start_state = "allocated"
    if load_recorded_state(trace, target):
        start_state = "recorded"
        init = init.iloc[:0]
    for aid, size, stream in zip(init["alloc_id"].tolist(), init["size_bytes"].tolist(), init["stream"].tolist()):
        backend.use_stream(stream)
        try:
            target.malloc(aid, size, stream)
        except OutOfMemory as exc:
            oom = {"event_index": -1, "alloc_id": aid, "requested_bytes": size, "reason": str(exc)}
            break
    ov = overhead_ns or (lambda: 0)
    launch, use_stream = backend.launch_work, backend.use_stream
    gc_was_enabled = gc.isenabled()
    gc.disable()
    start = _perf_ns()
    last_end = start
    replayed = 0
    try:
        if oom is None:
            for i in range(n):
                kind = kind_l[i]
                if kind == MARKER:
                    continue
                stream = stream_l[i]
                if compute and i:
                    gap = scaled_t[i] - scaled_t[i - 1]
                    if gap > 0:
                        busy_wait_ns(last_end + gap - _perf_ns())
                use_stream(stream)
                o0 = ov()
                c0 = _perf_ns()
                if kind == ALLOC:
                    try:
                        target.malloc(id_l[i], size_l[i], stream)
                    except OutOfMemory as exc:
                        oom = {"event_index": i, "alloc_id": id_l[i], "requested_bytes": size_l[i],
                               "reason": str(exc)}
                        break
                elif kind == FREE_REQUESTED:
                    target.free_requested(id_l[i])
                elif kind == FREE_COMPLETED:
                    target.free_completed(id_l[i])
                elif kind == EMPTY_CACHE:
                    target.empty_cache()
                c1 = _perf_ns()
                latency[i] = c1 - c0 - (ov() - o0)
                replayed += 1
                if after_call is not None:
                    after_call(kind, stream)
                if compute and next_gap[i] > 0:
                    launch(stream, next_gap[i])
                last_end = c1
        backend.synchronize()
        end = _perf_ns()
    finally:
        if gc_was_enabled:
            gc.enable()
    return Drive(latency_ns=latency, kinds=kinds, total_ns=end - start, events_replayed=replayed, oom=oom,
                 start_state=start_state)


def load_recorded_state(trace: Trace, target: Any) -> bool:
    """Start a policy from a snapshot's recorded layout exactly when the simulator does (same rule, same code).

    ``allocsim.engine`` lets a policy with ``load_state`` (the pytorch preset) adopt a PyTorch
    snapshot's segments and blocks instead of re-allocating the start state; the real device then
    really allocates every adopted segment (untimed). Returns True when the state was loaded.
    """
    policy = getattr(target, "policy", None)
    if policy is None or getattr(policy, "load_state", None) is None:
        return False
    from allocsim.engine import _Replay

    probe = _Replay(trace, policy, continue_on_oom=False, timed=False, observer=None)
    return bool(probe.load_recorded_state())


def latency_stats(run: Drive) -> dict[str, Any]:
    """p50/p99/max/mean of measured call latencies, by kind of call (like the simulator's summary)."""
    lat, kinds = run.latency_ns, run.kinds
    done = lat >= 0
    return {
        "alloc_latency_ns": distribution(lat[done & (kinds == ALLOC)]),
        "call_latency_ns": {name: distribution(lat[done & (kinds == k)]) for k, name in (
            (ALLOC, "alloc"), (FREE_REQUESTED, "free_requested"), (FREE_COMPLETED, "free_completed"),
            (EMPTY_CACHE, "empty_cache"))},
    }


def device_call_stats(device: Any) -> dict[str, Any]:
    """Latency distributions of the device's own calls (cudaMalloc/cudaFree/map/unmap or mmap/munmap)."""
    ops = np.asarray(device.call_ops, dtype=np.int64)
    ns = np.asarray(device.call_ns, dtype=np.int64)
    return {name: distribution(ns[ops == op]) for op, name in (
        (OP_MALLOC, "malloc"), (OP_FREE, "free"), (OP_MAP, "map"), (OP_UNMAP, "unmap"))}


# ====================================================================== cost models
def cost_model_for_policy(cost_model: CostModel, policy: str, *, inner: str | None = None,
                          real_allocator: str | None = None) -> CostModel:
    """The cost model to predict one replay with: the file's device constants plus the harness's overheads.

    A calibration file written by ``python -m validate calibrate`` keeps, under the provenance key
    ``_harness``, what the Python policies cost on top of the device (``python_policy``:
    ``malloc_overhead_ns``/``free_overhead_ns`` added to a miss, ``pool_hit_ns``/``free_request_ns``
    per policy) and what real allocators' hits cost (``real_allocators``). Without it the model is
    used as it is.
    """
    harness = cost_model.provenance.get("_harness")
    if not isinstance(harness, Mapping):
        return cost_model
    overrides: dict[str, float] = {}
    if real_allocator is not None:
        real = (harness.get("real_allocators") or {}).get(real_allocator) or {}
        for key in ("pool_hit_ns", "free_request_ns"):
            if isinstance(real.get(key), (int, float)):
                overrides[key] = float(real[key])
        return CostModel.from_overrides(overrides, base=cost_model) if overrides else cost_model
    py = harness.get("python_policy") or {}
    for key in ("pool_hit_ns", "free_request_ns"):
        table = py.get(key) or {}
        value = table.get(policy, table.get(inner or "", table.get("default")))
        if isinstance(value, (int, float)):
            overrides[key] = float(value)
    for key, field in (("malloc_overhead_ns", "malloc_base_ns"), ("free_overhead_ns", "free_base_ns"),
                       ("map_overhead_ns", "map_base_ns"), ("unmap_overhead_ns", "unmap_base_ns")):
        extra = py.get(key)
        if isinstance(extra, (int, float)):
            overrides[field] = float(getattr(cost_model, field)) + float(extra)
    return CostModel.from_overrides(overrides, base=cost_model) if overrides else cost_model


def footprint_rule(cost_model: CostModel | None, backend: Any, options: ReplayOptions) -> tuple[int, int]:
    """(granularity, small granularity): explicit options, else the calibration file's, else the backend's."""
    g, sg = backend.default_granularity()
    if cost_model is not None:
        prov = cost_model.provenance
        g = int(prov.get("_granularity_bytes") or g)
        sg = int(prov.get("_small_granularity_bytes") or sg)
    return options.granularity_bytes or g, options.small_granularity_bytes or sg


# ====================================================================== predicting
def pool_bytes(policy: Any) -> int | None:
    """Bytes the policy itself holds from the device (its own accounting, before any device rounding)."""
    layer = policy
    while layer is not None:
        if hasattr(layer, "total_allocated_memory"):
            return int(layer.total_allocated_memory)
        if hasattr(layer, "segment_bytes"):
            return int(layer.segment_bytes())
        nxt = getattr(layer, "upstream", None)
        if nxt is None or nxt is getattr(layer, "device", None):
            return None
        layer = nxt
    return None


def predict(trace: Trace, policy: str, *, params: Mapping[str, Any] | None, cost_model: CostModel,
            capacity_bytes: int | None, granularity_bytes: int, small_granularity_bytes: int,
            with_pool_peak: bool = False) -> dict[str, Any]:
    """Simulate ``policy`` on a device with the given footprint rule; return the summary (+ ``pool_peak_bytes``)."""
    def fresh():
        dev = SimulatedDevice(capacity_bytes, granularity_bytes=granularity_bytes,
                              small_granularity_bytes=small_granularity_bytes)
        return build_policy(policy, device=dev, params=dict(params or {}),
                            allocator_settings=trace.meta.allocator_settings)

    summary = dict(simulate(trace, fresh(), cost_model=cost_model).summary)
    if with_pool_peak:
        peak = [0]

        def observe(_i: int, pol: Any) -> None:
            value = pool_bytes(pol)
            if value is not None and value > peak[0]:
                peak[0] = value

        run_fast(trace, fresh(), observer=observe)
        summary["pool_peak_bytes"] = peak[0]
    return summary


# ====================================================================== comparing
def error_pct(predicted: float | None, measured: float | None) -> float | None:
    """``(predicted - measured) / measured * 100`` rounded to 3 decimals; None when undefined."""
    if predicted is None or measured is None:
        return None
    if measured == 0:
        return 0.0 if predicted == 0 else None
    return round((predicted - measured) / measured * 100.0, 3)


def _p(dist: Mapping[str, Any] | None, key: str) -> int | None:
    return None if not dist else dist.get(key)


def compare(predicted: Mapping[str, Any], measured: Mapping[str, Any]) -> dict[str, Any]:
    """The comparison fields of one run (both sides' figures side by side, with errors)."""
    pred_peak = predicted.get("device_peak_reserved_bytes", predicted.get("peak_reserved_bytes"))
    meas_peak = measured.get("measured_peak_bytes")
    pred_lat, meas_lat = predicted.get("alloc_latency_ns"), measured.get("alloc_latency_ns")
    out = {
        "predicted_peak_bytes": pred_peak,
        "measured_peak_bytes": meas_peak,
        "peak_error_pct": error_pct(pred_peak, meas_peak),
        "predicted_p50_ns": _p(pred_lat, "p50"),
        "measured_p50_ns": _p(meas_lat, "p50"),
        "latency_error_pct": error_pct(_p(pred_lat, "p50"), _p(meas_lat, "p50")),
        "predicted_p99_ns": _p(pred_lat, "p99"),
        "measured_p99_ns": _p(meas_lat, "p99"),
        "p99_error_pct": error_pct(_p(pred_lat, "p99"), _p(meas_lat, "p99")),
        "predicted_mean_ns": _p(pred_lat, "mean"),
        "measured_mean_ns": _p(meas_lat, "mean"),
    }
    for name in ("mallocs", "frees", "maps", "unmaps"):
        out[f"predicted_device_{name}"] = predicted.get(f"device_{name}")
        out[f"measured_device_{name}"] = measured.get(f"device_{name}")
    out["device_calls_match"] = all(out[f"predicted_device_{n}"] == out[f"measured_device_{n}"]
                                    for n in ("mallocs", "frees", "maps", "unmaps")
                                    if out[f"measured_device_{n}"] is not None)
    out["predicted_makespan_ns"] = predicted.get("makespan_ns")
    out["measured_total_ns"] = measured.get("total_ns")
    out["makespan_error_pct"] = (error_pct(predicted.get("makespan_ns"), measured.get("total_ns"))
                                 if measured.get("compute") else None)
    peak_ok = out["peak_error_pct"] is not None and abs(out["peak_error_pct"]) <= PEAK_TARGET_PCT
    p50_ok = out["latency_error_pct"] is not None and abs(out["latency_error_pct"]) <= P50_TARGET_PCT
    out["targets"] = {"peak_within_1pct": peak_ok, "p50_within_20pct": p50_ok}
    return out


def explain(row: Mapping[str, Any], *, backend: str, calibrated: bool) -> list[str]:
    """Reasons for each missed target, from what the row itself shows."""
    notes: list[str] = []
    if row.get("oom_measured") or row.get("oom_predicted"):
        notes.append(f"out of memory (measured: {bool(row.get('oom_measured'))}, predicted: "
                     f"{bool(row.get('oom_predicted'))}); figures cover the events before it")
    targets = row.get("targets") or {}
    if not targets.get("peak_within_1pct"):
        if not row.get("device_calls_match"):
            notes.append("device call counts differ: the policy made different decisions on the real device "
                         "(an OOM, or real addresses changing best-fit tie-breaks)")
        elif backend == "cupy":
            notes.append("same device calls, different bytes: the driver reserves memory differently from the "
                         f"footprint rule (granularity {row.get('granularity_bytes')} B, small "
                         f"{row.get('small_granularity_bytes')} B) for this size mix; calibrate, or see the "
                         "calibration's granularity table")
        elif row.get("measured_peak_bytes") is not None:
            notes.append("same device calls, different bytes: the footprint rule is not the host's page rounding")
    if not targets.get("p50_within_20pct") and row.get("measured_p50_ns") is not None:
        if not calibrated:
            notes.append("latency predicted with the cost model's placeholder constants (no calibration file)")
        pred, meas = row.get("predicted_p50_ns"), row.get("measured_p50_ns")
        hits = row.get("pool_hits") or 0
        allocs = row.get("allocs") or 0
        if allocs and hits * 2 > allocs:
            notes.append(f"p50 is a pool hit ({hits}/{allocs} allocations hit): measured {meas} ns of Python "
                         f"policy work against {pred} ns predicted; hits are sub-10 us and jitter with the "
                         "interpreter and CPU frequency")
        else:
            notes.append(f"p50 is a device call: measured {meas} ns against {pred} ns predicted; the cost model "
                         "is linear in size (base + per MiB) while the real call cost is not")
    return notes


# ====================================================================== one policy, end to end
class _PolicyTarget:
    """A policy as a replay target (its own methods already have the right names)."""

    def __init__(self, policy: Any):
        self.policy = policy
        self.malloc = policy.malloc
        self.free_requested = policy.free_requested
        self.free_completed = policy.free_completed
        self.empty_cache = policy.empty_cache


def measure_policy(trace: Trace, policy: str, backend: Any, *, params: Mapping[str, Any] | None = None,
                   options: ReplayOptions | None = None, granularity_bytes: int, small_granularity_bytes: int
                   ) -> dict[str, Any]:
    """Run ``policy`` on a real device of ``backend`` over ``trace``; return what was measured."""
    options = options or ReplayOptions()
    # Streams and the spin kernel first: loading a kernel module takes device memory, which must
    # not land in the measurement (the device takes its baseline when it is made).
    backend.prepare_streams(sorted(set(trace.column("stream").tolist()) | set(trace.initial_allocs["stream"].tolist())))
    device = backend.make_device(options.capacity_bytes, granularity_bytes=granularity_bytes,
                                 small_granularity_bytes=small_granularity_bytes,
                                 real_addresses=options.real_addresses)
    try:
        pol = build_policy(policy, device=device, params=dict(params or {}),
                           allocator_settings=trace.meta.allocator_settings)
        run = drive(trace, _PolicyTarget(pol), backend, compute=options.compute, time_scale=options.time_scale,
                    overhead_ns=lambda: device.overhead_ns)
        from allocsim.cost import stack_counter

        measured: dict[str, Any] = {
            "measured_peak_bytes": int(device.peak_measured_bytes),
            "device_counter_peak_bytes": int(device.peak_reserved_bytes),
            "device_mallocs": device.n_mallocs, "device_frees": device.n_frees,
            "device_maps": device.n_maps, "device_unmaps": device.n_unmaps,
            "device_failed_mallocs": device.n_failed_mallocs,
            "pool_hits": stack_counter(pol, "n_pool_hits"),
            "allocs": int(np.count_nonzero((run.kinds == ALLOC) & (run.latency_ns >= 0))),
            "total_ns": run.total_ns, "compute": options.compute,
            "device_call_ns_total": int(device.device_call_ns()),
            "measurement_overhead_ns": int(device.overhead_ns), "samples": device.n_samples,
            "events_replayed": run.events_replayed, "oom": run.oom, "start_state": run.start_state,
            "adopted_bytes": int(device.adopted_bytes),
            "device_call_latency_ns": device_call_stats(device),
            "device": device.describe(),
        }
        if getattr(device, "peak_rss_bytes", 0):
            measured["measured_rss_peak_bytes"] = int(device.peak_rss_bytes)
        measured.update(latency_stats(run))
        return measured
    finally:
        device.close()
        backend.close()


def validate_policy(trace: Trace, policy: str, backend: Any, *, params: Mapping[str, Any] | None = None,
                    cost_model: CostModel | None = None, options: ReplayOptions | None = None) -> dict[str, Any]:
    """Measure ``policy`` on the real device, predict it with the simulator, and compare (one JSON-ready row)."""
    options = options or ReplayOptions()
    base_model = cost_model or CostModel()
    g, sg = footprint_rule(cost_model, backend, options)
    measured = measure_policy(trace, policy, backend, params=params, options=options,
                              granularity_bytes=g, small_granularity_bytes=sg)
    model = cost_model_for_policy(base_model, policy, inner=str((params or {}).get("inner", "paddle"))
                                  if policy == "deferred-gc" else None)
    sim_trace = scale_time(trace, options.time_scale) if options.compute else trace
    predicted = predict(sim_trace, policy, params=params, cost_model=model, capacity_bytes=options.capacity_bytes,
                        granularity_bytes=g, small_granularity_bytes=sg)
    row: dict[str, Any] = {"policy": policy, "params": dict(params or {}), "backend": backend.name,
                           "granularity_bytes": g, "small_granularity_bytes": sg}
    row.update(compare(predicted, measured))
    row["device_counter_peak_bytes"] = measured["device_counter_peak_bytes"]
    row["counter_peak_error_pct"] = error_pct(predicted.get("device_peak_reserved_bytes"),
                                              measured["device_counter_peak_bytes"])
    if "measured_rss_peak_bytes" in measured:
        row["measured_rss_peak_bytes"] = measured["measured_rss_peak_bytes"]
        row["rss_peak_error_pct"] = error_pct(row["predicted_peak_bytes"], measured["measured_rss_peak_bytes"])
    row["pool_hits"] = measured["pool_hits"]
    row["allocs"] = measured["allocs"]
    row["start_state_measured"] = measured["start_state"]
    row["start_state_predicted"] = predicted.get("start_state")
    row["oom_measured"] = measured["oom"]
    row["oom_predicted"] = predicted.get("oom")
    row["predicted"] = {k: predicted.get(k) for k in (
        "peak_reserved_bytes", "device_peak_reserved_bytes", "peak_live_lower_bound_bytes", "alloc_latency_ns",
        "call_latency_ns", "sync_count", "stall_ns", "makespan_ns", "pool_hits", "params")}
    row["measured"] = measured
    row["cost_model_used"] = model.to_dict()
    row["notes"] = explain(row, backend=backend.name, calibrated=is_calibrated(cost_model))
    return row


def is_calibrated(cost_model: CostModel | None) -> bool:
    """True for a cost model that came from a calibration file."""
    return cost_model is not None and bool(cost_model.provenance.get("_source") or cost_model.provenance.get("_harness"))


def load_for_replay(trace: Trace, *, device: int | None = None, limit_events: int | None = None) -> Trace:
    """The part of ``trace`` a replay uses: one device (as the simulator picks it) and maybe a prefix."""
    return slice_trace(select_device(trace, device), limit_events)
