"""Run a trace the way every command does: ``simulate_trace(trace, "pytorch", params, capacity=...)``.

What the commands (``run``, ``sweep``, ...) share beyond the engine:

- the device: ``device_for(capacity_bytes, cost_model)`` builds the simulated device with the
  footprint rule a calibration measured (``_granularity_bytes`` in a cost-model file), if any;
- the capacity: ``resolve_capacity`` takes the given one, else the capacity the recording implies
  (``RecordedRun.capacity_bytes``), and says which; ``check_capacity`` refuses a given capacity
  below the largest single request, which nothing could fit;
- the memory answer follows the recorded interleaving of streams. A timed run lets simulated delays
  reorder streams, which can change peaks and where an OOM happens; so on a multi-stream trace the
  memory figures and the OOM come from a replay in trace order, and the timed replay's memory
  figures are kept beside them (``timed_memory``), flagged when they differ. ``--fast`` and the
  default mode therefore give the same memory answer, always;
- the recorded column: the recording's real figures (``recorded``) and whether this run reproduces
  them or is a what-if, and why (``reproduction``); the verdict states where its capacity came from.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from .cost import CostModel
from .device import SimulatedDevice
from .engine import run_fast, run_simpy, select_device
from .metrics.recorded_fit import recording_fit, unproven_fit
from .metrics.reproduction import START_NOT_LOADED, capacity_matches, recorded_figures, reproduction
from .metrics.verdict import GIVEN, INFERRED, summary_verdict
from .result import RunResult
from .trace.inference.recorded import RecordedRun, recorded_run, start_layout_origin
from .trace.schema import EventKind, Trace
from .units import format_bytes

#: Summary keys that describe time (taken from the timed replay); every other key describes memory.
TIMING_KEYS = ("alloc_latency_ns", "call_latency_ns", "stall_ns", "sync_count", "sync_ns", "dependency_wait_ns",
               "makespan_ns", "trace_span_ns", "makespan_over_span", "cost_model")
#: Memory figures compared between the trace-order and the timed replay.
TIMED_MEMORY_KEYS = ("peak_requested_bytes", "peak_allocated_bytes", "peak_active_bytes", "peak_reserved_bytes",
                     "device_mallocs", "device_frees", "device_maps", "device_unmaps", "oom_count", "completed",
                     "events_replayed")


@dataclasses.dataclass(frozen=True)
class Capacity:
    """The device capacity of a run and where it came from (``given``, ``inferred`` or None: unlimited)."""

    bytes: int | None = None
    source: str | None = None
    note: str = ""          #: for an inferred capacity: how the recording implies it
    #: for an inferred capacity: (least, most) the recording proves the device had (most None: no bound)
    range: tuple[int, int | None] | None = None


def device_for(capacity_bytes: int | None, cost_model: CostModel | None = None) -> SimulatedDevice:
    """A simulated device with the footprint rule a calibration measured (``_granularity_bytes`` keys), if any."""
    footprint = {}
    provenance = cost_model.provenance if cost_model is not None else {}
    for key in ("granularity_bytes", "small_granularity_bytes"):
        value = provenance.get(f"_{key}")
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"cost model _{key}: not a positive integer: {value!r}")
            footprint[key] = value
    return SimulatedDevice(capacity_bytes, **footprint)


def only_device(trace: Trace) -> int | None:
    """The one device a (device-selected) trace is about, None if it has none."""
    devices = trace.devices
    return devices[0] if len(devices) == 1 else None


def recording(trace: Trace) -> RecordedRun | None:
    """What the trace records about the real run of its device (None: nothing recorded)."""
    device = only_device(trace)
    return None if device is None else recorded_run(trace, device)


def resolve_capacity(trace: Trace, given_bytes: int | None) -> Capacity:
    """The given capacity, else the one the recording implies, else unlimited."""
    if given_bytes is not None:
        return Capacity(given_bytes, GIVEN)
    recorded = recording(trace)
    if recorded is not None and recorded.capacity_bytes is not None:
        return Capacity(recorded.capacity_bytes, INFERRED, recorded.capacity_source, recorded.capacity_range)
    return Capacity()


def largest_request(trace: Trace) -> tuple[int, int]:
    """(size, event index) of the largest request the program made; index -1 for the start state.

    Requests the recording shows failing (a real OOM's request) are left out: a device smaller than
    them is exactly what the recording says the job ran on.
    """
    kind = trace.column("kind")
    sizes = np.where(kind == int(EventKind.ALLOC), trace.column("size_bytes"), -1)
    recorded = recording(trace)
    if recorded is not None:
        failed = [o.event_index for o in recorded.ooms if 0 <= o.event_index < len(sizes)]
        sizes[failed] = -1
    best, index = (int(sizes.max()), int(sizes.argmax())) if len(sizes) else (-1, -1)
    initial = trace.initial_allocs["size_bytes"]
    if len(initial) and int(initial.max()) > best:
        best, index = int(initial.max()), -1
    return max(best, 0), index


def check_capacity(trace: Trace, capacity: Capacity) -> None:
    """Refuse a given capacity below the largest single request (``ValueError``, one line)."""
    if capacity.source != GIVEN or capacity.bytes is None:
        return
    size, index = largest_request(trace)
    if size > capacity.bytes:
        where = "in the start state" if index < 0 else f"at event {index:,}"
        raise ValueError(f"capacity {format_bytes(capacity.bytes)} is below the largest single request of this "
                         f"trace ({format_bytes(size)}, {size:,} bytes {where}): nothing could fit; "
                         f"give at least {format_bytes(size)}")


def _builder(trace: Trace, policy: str, params: Mapping[str, Any] | None, capacity_bytes: int | None,
             cost_model: CostModel | None):
    from .policies.registry import build_policy

    def build():
        try:
            return build_policy(policy, device=device_for(capacity_bytes, cost_model), params=dict(params or {}),
                                allocator_settings=trace.meta.allocator_settings)
        except (KeyError, TypeError) as exc:
            raise ValueError(f"policy {policy}: {exc}") from None
    return build


def stream_count(trace: Trace) -> int:
    """How many streams the trace's events use (more than one: timed and trace order may differ)."""
    return len(np.unique(trace.column("stream")))


def simulate_trace(trace: Trace, policy: str, params: Mapping[str, Any] | None = None, *,
                   capacity: Capacity = Capacity(), cost_model: CostModel | None = None, fast: bool = False,
                   continue_on_oom: bool = False) -> RunResult:
    """Replay ``trace`` (one device) through the registry policy ``policy`` with ``params``; see the module doc."""
    trace = select_device(trace, None)
    build = _builder(trace, policy, params, capacity.bytes, cost_model)
    if fast:
        result = run_fast(trace, build(), continue_on_oom=continue_on_oom)
    elif stream_count(trace) > 1:
        memory = run_fast(trace, build(), continue_on_oom=continue_on_oom)
        timed = run_simpy(trace, build(), cost_model or CostModel(), continue_on_oom=continue_on_oom)
        result = merge_timed(memory, timed, stream_count(trace))
    else:   # one stream: the timed replay sees the events in trace order already
        result = run_simpy(trace, build(), cost_model or CostModel(), continue_on_oom=continue_on_oom)
    add_recording(result, trace, policy, params, capacity, cost_model)
    return result


def merge_timed(memory: RunResult, timed: RunResult, streams: int) -> RunResult:
    """Memory figures and OOMs of the trace-order replay, timing of the timed one, timed memory beside."""
    summary = dict(memory.summary)
    for key in TIMING_KEYS:
        summary[key] = timed.summary[key]
    summary["mode"] = timed.summary["mode"]
    figures = {key: timed.summary[key] for key in TIMED_MEMORY_KEYS}
    oom = timed.summary["oom"]
    figures["oom_event_index"] = None if oom is None else oom["event_index"]
    memory_oom = memory.summary["oom"]
    differs = any(figures[k] != memory.summary[k] for k in TIMED_MEMORY_KEYS) or (
        figures["oom_event_index"] != (None if memory_oom is None else memory_oom["event_index"]))
    summary["timed_memory"] = {"streams": streams, "differs": differs, **figures}
    perf_s = memory.perf.get("sim_seconds", 0) + timed.perf.get("sim_seconds", 0)
    events = summary["events_replayed"]
    perf = {"sim_seconds": round(perf_s, 6), "events_per_second": round(events / perf_s, 1) if perf_s > 0 else None}
    return RunResult(summary=summary, timeseries=memory.timeseries, ooms=memory.ooms, perf=perf,
                     timed_timeseries=timed.timeseries)


def _settings_changes(trace: Trace, policy: str, built: Any) -> list[str]:
    """How the run's settings differ from the recorded ones (PyTorch's words where it has them)."""
    from .settings.alloc_conf import changed_settings
    from .policies.registry import build_policy

    reference = build_policy(policy, device=SimulatedDevice(built.device.capacity_bytes),
                             allocator_settings=trace.meta.allocator_settings).params()
    return [f"{ours} (recorded: {theirs or 'default'})"
            for ours, theirs in changed_settings(policy, built.params(), reference)]


def add_recording(result: RunResult, trace: Trace, policy: str, params: Mapping[str, Any] | None,
                  capacity: Capacity, cost_model: CostModel | None = None) -> None:
    """Add ``recorded`` and ``reproduction`` to the summary of a run of ``trace`` through ``policy`` with
    ``params``, and the capacity's source to its verdict."""
    summary = result.summary
    build = _builder(trace, policy, params, capacity.bytes, cost_model)
    t_ns = trace.column("t_ns")
    summary["verdict"] = summary_verdict(summary, result.timeseries, int(t_ns[0]) if len(t_ns) else 0,
                                         capacity_source=capacity.source, capacity_note=capacity.note,
                                         capacity_range=capacity.range)
    summary.setdefault("timed_memory", None)
    recorded = recording(trace)
    if recorded is None:
        summary["recorded"] = summary["reproduction"] = summary["verdict"]["recording_fit"] = None
        summary["verdict"]["recording_exceeds"] = None
        return
    figures = recorded_figures(recorded)
    what_if = []
    if recorded.allocator != policy:
        what_if.append(f"policy {policy} is not the recorded allocator ({recorded.allocator})")
    else:
        what_if += [f"settings changed: {change}" for change in _settings_changes(trace, policy, build())]
    if len(trace.initial_segments) and summary["start_state"] == "allocated":
        note = summary.get("start_state_note")
        what_if.append(f"the {start_layout_origin(trace)} {START_NOT_LOADED}" + (f" ({note})" if note else ""))
    elif not len(trace.initial_segments) and recorded.start_reserved_bytes:
        what_if.append(f"the recording began with {format_bytes(recorded.start_reserved_bytes)} reserved that the "
                       "trace does not lay out")
    mismatch = capacity_matches(recorded, capacity.bytes)
    if mismatch:
        what_if.append(mismatch)
    summary["recorded"] = figures
    summary["reproduction"] = reproduction(summary, figures, what_if)
    fit = recording_fit(summary, recorded, what_if)
    summary["verdict"]["recording_fit"] = fit
    if fit is not None:
        # An OOM the recording disproves must say so in the verdict itself, not only beside it.
        summary["verdict"]["line"] += "; but " + fit["line"]
    unproven = unproven_fit(summary, recorded, what_if, mismatch)
    summary["verdict"]["recording_exceeds"] = unproven
    if unproven is not None:
        # A fit below the recorded peak that rests on what the replay misses is said to be unproven.
        summary["verdict"]["line"] += "; but " + unproven["line"]


# ----------------------------------------------------------------------------- replays with an observer
def attribute_run(trace: Trace, policy: str, *, every: int | None = 1000, resolution: float | None = 0.01,
                  fast: bool = False, segments_at_peak: bool = True, snapshot_events: Iterable[int] = (),
                  **kwargs: Any):
    """Simulate ``trace`` with an ``AttributionObserver``; return ``(result, observer, table)``.

    ``table`` is ``observer.table()`` with the run's time columns; ``kwargs`` go to ``engine.simulate``.
    """
    from .engine import simulate
    from .metrics.attribution import AttributionObserver, with_time

    observer = AttributionObserver(every, resolution=resolution, segments_at_peak=segments_at_peak,
                                   snapshot_events=snapshot_events)
    result = simulate(trace, policy, fast=fast, observer=observer, **kwargs)
    observer.finish()
    return result, observer, with_time(observer.table(), result.timeseries)


def waste_by_site(trace: Trace, build_policy: Callable[[], Any], event_index: int, *,
                  continue_on_oom: bool = False) -> Any:
    """Replay ``trace`` up to ``event_index`` (-1: the start state) with a fresh policy and charge its waste there.

    Returns the ``metrics.sites.waste.WasteCharges`` of that moment.
    """
    from .metrics.sites.rows import SiteAccountingError
    from .metrics.sites.waste import WasteTracker

    prefix = trace if event_index + 1 >= len(trace) else trace.replace(
        events=trace.events.iloc[:event_index + 1].reset_index(drop=True))
    tracker = WasteTracker(trace, event_index)
    run_fast(prefix, build_policy(), continue_on_oom=continue_on_oom, observer=tracker)
    if tracker.result is None:
        raise SiteAccountingError(f"the replay never reached event {event_index}")
    return tracker.result
