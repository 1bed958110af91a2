"""Replay a trace through a policy: ``run_fast`` for memory alone, ``run_simpy`` for memory and time.

Both paths drive the *same* policy object through the same calls (``malloc``, ``free_requested``,
``free_completed``, ``empty_cache``), so on a single-stream trace they produce identical memory
results; a policy knows nothing about SimPy.

Start state: the allocations alive when the trace starts (``trace.initial_allocs``) are allocated
first, in ``alloc_id`` order, each on its own stream, so every peak counts them (row 0 of the time
series is the state after placing them; they cost no simulated time).

Out of memory: the first ``OutOfMemory`` a policy raises (after its own retry path) is recorded with
its event index (-1 for an initial allocation), time, request, and the reserved/allocated bytes at
that moment; the run stops there, or with ``continue_on_oom=True`` every failure is recorded, the
failed allocation is skipped and its later frees are ignored.

Timing model (``run_simpy``), all times integer nanoseconds on a clock that starts at the trace's
first timestamp:

- One SimPy process per stream walks that stream's events in (t_ns, index) order. The gap between
  two consecutive events of a stream is *work* on that stream (kernels, host code), so event ``i``
  of stream ``s`` is issued at ``t_i + delay_s``, where ``delay_s`` accumulates everything the
  simulation added on that stream: the latency of its allocator calls, device-wide sync stalls and
  waits for cross-stream dependencies. (The trace's gaps already contain the real allocator's own
  latency; simulated latency comes on top, so compare policies by their *differences*.)
- Each allocator call takes ``CostModel.call_cost(before, after)`` from the counter differences and
  delays that stream's later events by that much. Its memory effect happens at its issue time.
- A call that did a cudaFree synchronises the device: for its whole duration (a *sync window*) every
  other stream is frozen. A stream that was working (waiting for its next issue time) has its
  remaining work pushed back by the window; a stream that wants to issue a call during a window
  waits until it ends. Windows never overlap because no call is issued during one. ``stall_ns`` is
  the stream-time lost to syncs: the drain (``device_sync_ns``) on the calling stream plus the time
  every other stream (started or not, but not yet finished) was frozen. In-flight GPU work is not
  in an allocation trace, so the drain is the cost model's constant, not the real queue depth.
- Streams are independent issuers (as if each had its own host thread); a free whose allocation
  was made on another stream waits until that allocation has happened (``dependency_wait_ns``).

Speed (results are the same as with one SimPy event and one policy call per trace event):

- A stream process moves the clock itself (``_Environment.advance_to``) whenever no other event is
  due before its next call, which is exactly when a timeout would have resumed it next; it yields
  to SimPy only when another stream (or a sync window, or a dependency) is due first, so a
  single-stream trace runs without any SimPy event. The counters ``call_cost`` compares are
  snapshotted once per call (the snapshot after one call is the one before the next), and not at
  all for ``Policy.free_requested``, which can make no device call.
- A policy with a batch fast path (``Policy.replay_run``: the pool policies on the compiled kernel)
  replays runs of events that need no device call itself, in both modes, reading the trace's
  columns in place; the engine takes each event it stops at through the per-event methods
  (``stepper``) and hands the rest back.

Event order: in fast mode, and in SimPy mode on a single-stream trace, the policy sees the events
in trace order. On a multi-stream trace, delays on one stream can reorder its events relative to
other streams' (legitimately: that is what the delays do), so peaks may differ from fast mode;
per-stream order, each event executed exactly once, and the final requested bytes always agree.
With a zero cost model and distinct timestamps, SimPy reproduces the trace order exactly.

Multi-device traces: one device per run (``device=N``); the default is the only device, and a trace
with several devices must name one.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator, Union

import numpy as np
import simpy

from .cost import OP_FREE_COMPLETED, OP_FREE_REQUESTED, OP_MALLOC, OP_OTHER, CostModel, snapshotter
from .device import SimulatedDevice
from .errors import AllocsimError, OutOfMemory
from .metrics.series import Samples
from .metrics.summary import RunInfo, RunOutput
from .policies.base import Policy, ReplayRun
from .policies.kernel import route_of
from .result import RunResult, build_result
from .trace.inference.recorded import start_layout_origin
from .trace.schema import EventKind, Trace

ALLOC, FREE_REQUESTED, FREE_COMPLETED, EMPTY_CACHE = (int(EventKind.ALLOC), int(EventKind.FREE_REQUESTED),
                                                      int(EventKind.FREE_COMPLETED), int(EventKind.EMPTY_CACHE))
_OPS = {ALLOC: OP_MALLOC, FREE_REQUESTED: OP_FREE_REQUESTED, FREE_COMPLETED: OP_FREE_COMPLETED}
#: Both loops convert this many events at a time to Python lists (keeps memory bounded: ~40 B per
#: event and column while a chunk is alive).
CHUNK_EVENTS = 1 << 13

PolicyLike = Union[Policy, str, Callable[[SimulatedDevice], Policy]]
#: ``observer(event_index, policy)`` runs after every event (and once with -1 after the start state).
Observer = Callable[[int, Policy], None]


def only_gpu(devices: list[int]) -> int | None:
    """The device to replay when none is given: the one GPU of a trace whose other devices are host memory.

    Kineto and Paddle traces record host memory (device -1, -2) beside the GPU; with one GPU that is the
    device a user means. None: a single device, or several GPUs (the user must choose).
    """
    gpus = [d for d in devices if d >= 0]
    return gpus[0] if len(devices) > 1 and len(gpus) == 1 else None


def picked_device_note(devices: list[int]) -> str | None:
    """The one line that says ``select_device`` picked the GPU (None when it picked nothing)."""
    gpu = only_gpu(devices)
    if gpu is None:
        return None
    host = [d for d in devices if d < 0]
    return (f"device {gpu} replayed, the trace's only GPU ({', '.join(map(str, host))} "
            f"{'is' if len(host) == 1 else 'are'} host memory: --device {host[0]} replays it)")


def select_device(trace: Trace, device: int | None = None) -> Trace:
    """Return the part of ``trace`` on ``device``; None means the only device, or the only GPU beside host memory."""
    devices = trace.devices
    if device is None:
        if len(devices) > 1:
            gpu = only_gpu(devices)
            if gpu is not None:
                return trace.for_device(gpu)
            raise AllocsimError(f"{trace.meta.source or 'trace'} has devices {devices}; choose one with --device N")
        return trace
    if device not in devices:
        raise AllocsimError(f"{trace.meta.source or 'trace'}: no device {device} (devices: {devices})")
    return trace if devices == [device] else trace.for_device(device)


def make_policy(policy: PolicyLike, *, capacity_bytes: int | None = None, params: dict | None = None,
                allocator_settings: dict | None = None) -> Policy:
    """Return a fresh policy; a registry name or ``factory(device)`` is built on ``SimulatedDevice(capacity_bytes)``."""
    if isinstance(policy, Policy):
        if capacity_bytes is not None:
            raise ValueError("capacity_bytes needs a policy name or factory; a built policy has its device already")
        if policy.n_mallocs or policy.live or policy.device.n_mallocs:
            raise ValueError("the policy has been used already; pass a fresh one")
        return policy
    device = SimulatedDevice(capacity_bytes)
    if isinstance(policy, str):
        from .policies.registry import build_policy

        return build_policy(policy, device=device, params=params, allocator_settings=allocator_settings)
    return policy(device)


class _Replay:
    """State shared by both engines: the policy, the samples, failures and the peak-time probe."""

    def __init__(self, trace: Trace, policy: Policy, *, continue_on_oom: bool, timed: bool,
                 observer: Observer | None):
        self.trace = trace
        self.policy = policy
        self.continue_on_oom = continue_on_oom
        self.observer = observer
        self.samples = Samples(len(trace.events) + 1, timed=timed)
        self.t_ns = trace.column("t_ns")
        self.t0_ns = int(self.t_ns[0]) if len(self.t_ns) else 0
        self.failed: set[int] = set()
        self.ooms: list[dict[str, Any]] = []
        self.stopped = False
        # Read reserved bytes straight from the device unless the policy redefines them.
        self.reserved_source = policy.device if type(policy).reserved_bytes is Policy.reserved_bytes else policy
        self.peak_reserved = -1
        self.lfb_at_peak = 0
        self.start_state = "allocated"
        self.start_state_note = ""
        #: Start allocations the loaded layout does not hold (placed anew after it; see ``load_recorded_state``).
        self.start_outside: set[int] = set()
        self.views = self.samples.views()   # memoryviews of (requested, active, pending, reserved)

    def output(self) -> RunOutput:
        """What this replay produced, for the summary (which knows nothing of the engine)."""
        return RunOutput(trace=self.trace, policy=self.policy, samples=self.samples, ooms=self.ooms,
                         completed=not self.stopped, continue_on_oom=self.continue_on_oom,
                         start_state=self.start_state, start_state_note=self.start_state_note,
                         t0_ns=self.t0_ns, probed_peak_reserved_bytes=self.peak_reserved,
                         largest_free_block_at_probe_bytes=self.lfb_at_peak)

    # ------------------------------------------------------------------ shared pieces
    def probe_peak(self, reserved: int) -> None:
        """Remember the largest free block whenever reserved memory reaches a new peak."""
        if reserved > self.peak_reserved:
            self.peak_reserved = reserved
            self.lfb_at_peak = self.policy.largest_free_block_bytes()

    def record_oom(self, event_index: int, alloc_id: int, size_bytes: int, stream: int,
                   exc: OutOfMemory, sim_t_ns: int | None = None) -> None:
        """Record one failed allocation; stop the run unless ``continue_on_oom``."""
        p = self.policy
        active = p.allocated_bytes
        t_ns = int(self.t_ns[event_index]) if event_index >= 0 else self.t0_ns
        self.ooms.append({
            "event_index": int(event_index), "t_ns": t_ns,
            "sim_t_ns": sim_t_ns if sim_t_ns is not None else t_ns,
            "alloc_id": int(alloc_id), "stream": int(stream), "requested_bytes": int(size_bytes),
            "reserved_bytes": int(self.reserved_source.reserved_bytes),
            "allocated_bytes": int(active - p.pending_free_bytes), "active_bytes": int(active),
            "largest_free_block_bytes": int(p.largest_free_block_bytes()),
            "capacity_bytes": p.device.capacity_bytes, "reason": str(exc),
        })
        if self.continue_on_oom:
            self.failed.add(alloc_id)
        else:
            self.stopped = True

    def load_recorded_state(self) -> bool:
        """Adopt the real allocator's start state (segments and blocks) when the policy can; say if it did.

        PyTorch snapshots record where every block lived; a policy with ``load_state`` (the pytorch
        preset) starts from exactly that layout instead of re-allocating the start state, so peaks
        and later placements are those of the real run, not of a fresh allocator.
        """
        trace, policy = self.trace, self.policy
        load_state = getattr(policy, "load_state", None)
        if load_state is None or not len(trace.initial_segments) or not len(trace.initial_blocks):
            return False
        live_in_blocks = set(trace.initial_blocks["alloc_id"].tolist()) - {-1}
        init = trace.initial_allocs
        outside = set(init["alloc_id"].tolist()) - live_in_blocks
        if live_in_blocks - set(init["alloc_id"].tolist()):
            return False  # a block names an allocation the trace does not hold
        if outside and (init["addr"].to_numpy()[init["alloc_id"].isin(list(outside)).to_numpy()] >= 0).any():
            # The reconstruction left some recorded start allocations outside the segments. (A start
            # allocation with no address, as a scaled trace has, is placed anew after the layout.)
            return False
        self.start_outside = outside
        capacity = policy.device.capacity_bytes
        start_reserved = int(trace.initial_segments["size_bytes"].sum())
        origin = start_layout_origin(trace)
        if capacity is not None and start_reserved > capacity:
            # That layout cannot exist on this device: place the live allocations anew under its limit.
            self.start_state_note = (f"{origin} start state not used: it reserves {start_reserved:,} bytes, more "
                                     f"than the capacity ({capacity:,}); the allocations alive at the start were "
                                     "placed anew")
            return False
        try:
            load_state(trace.initial_segments, trace.initial_blocks)
        except ValueError as exc:
            # e.g. expandable_segments overridden against the recorded layout: start fresh instead.
            self.start_state_note = f"{origin} start state not used: {exc}"
            return False
        follow = getattr(policy.device, "follow_addresses", None)
        if follow is not None:
            # The driver's addresses are not the policy's choice, but PyTorch breaks best-fit ties by
            # address: a replay of the recording gets the recorded ones for as long as it follows it.
            dec = trace.decisions
            plan = dec[dec["action"] == "segment_alloc"]
            follow(list(zip(plan["addr"].to_numpy().tolist(), plan["size_bytes"].to_numpy().tolist())))
        return True

    def place_initial(self) -> None:
        """Place the trace's start state (its recorded or inferred layout, else allocations in alloc_id order)."""
        loaded = self.load_recorded_state()
        self.start_state = start_layout_origin(self.trace) if loaded else "allocated"
        init = self.trace.initial_allocs.sort_values("alloc_id", kind="stable")
        if loaded:
            init = init[init["alloc_id"].isin(list(self.start_outside))]
        malloc = self.policy.malloc
        for aid, size, stream in zip(init["alloc_id"].tolist(), init["size_bytes"].tolist(),
                                     init["stream"].tolist()):
            try:
                malloc(aid, size, stream)
            except OutOfMemory as exc:
                self.record_oom(-1, aid, size, stream, exc)
                if self.stopped:
                    break
        reserved = self.reserved_source.reserved_bytes
        self.samples.write(0, self.policy, reserved)
        if self.samples.timed:
            self.samples.sim_t_ns[0] = self.t0_ns
        self.samples.rows = 1
        self.probe_peak(reserved)
        if self.observer is not None:
            self.observer(-1, self.policy)

    def apply(self, i: int, kind: int, aid: int, size: int, stream: int, sim_t_ns: int | None = None) -> int:
        """Run event ``i`` through the policy and write its row (the generic path); return the row."""
        p = self.policy
        if kind == ALLOC:
            try:
                p.malloc(aid, size, stream)
            except OutOfMemory as exc:
                self.record_oom(i, aid, size, stream, exc, sim_t_ns)
        elif kind == FREE_REQUESTED:
            if aid not in self.failed:
                p.free_requested(aid)
        elif kind == FREE_COMPLETED:
            if aid not in self.failed:
                p.free_completed(aid)
        elif kind == EMPTY_CACHE:
            p.empty_cache()
        row = self.samples.rows
        reserved = self.reserved_source.reserved_bytes
        self.samples.write(row, p, reserved)
        self.samples.rows = row + 1
        if kind == ALLOC:
            self.probe_peak(reserved)
        if self.observer is not None:
            self.observer(i, p)
        return row

    def stepper(self) -> Callable[..., int]:
        """Return ``step(i, kind, aid, size, stream, sim_t_ns) -> row``: ``apply`` for a run with no observer.

        Same calls and rows as ``apply``, but it writes only the sample columns the event can change
        (the others stay ``UNCHANGED`` and are forward-filled, as in ``run_loop``), and it is a
        closure over the run's state because the SimPy loop calls it once per event.
        """
        p, samples, failed, src = self.policy, self.samples, self.failed, self.reserved_source
        malloc, free_requested, free_completed, empty_cache = (
            p.malloc, p.free_requested, p.free_completed, p.empty_cache)
        req, act, pend, res = self.views

        def step(i: int, kind: int, aid: int, size: int, stream: int, sim_t_ns: int | None = None) -> int:
            row = samples.rows
            if kind == ALLOC:
                try:
                    malloc(aid, size, stream)
                except OutOfMemory as exc:
                    self.record_oom(i, aid, size, stream, exc, sim_t_ns)
                reserved = src.reserved_bytes
                req[row] = p.requested_bytes
                act[row] = p.allocated_bytes
                res[row] = reserved
                if reserved > self.peak_reserved:
                    self.probe_peak(reserved)
            elif kind == FREE_REQUESTED:
                if not failed or aid not in failed:
                    free_requested(aid)
                pend[row] = p.pending_free_bytes
                res[row] = src.reserved_bytes
            elif kind == FREE_COMPLETED:
                if not failed or aid not in failed:
                    free_completed(aid)
                req[row] = p.requested_bytes
                act[row] = p.allocated_bytes
                pend[row] = p.pending_free_bytes
                res[row] = src.reserved_bytes
            elif kind == EMPTY_CACHE:
                empty_cache()
                req[row] = p.requested_bytes
                act[row] = p.allocated_bytes
                res[row] = src.reserved_bytes
            samples.rows = row + 1
            return row

        return step

    # ------------------------------------------------------------------ fast path
    def run_generic(self) -> None:
        """Every event through ``apply`` (used when an observer is attached)."""
        cols = [self.trace.column(c).tolist() for c in ("kind", "alloc_id", "size_bytes", "stream")]
        for i, (kind, aid, size, stream) in enumerate(zip(*cols)):
            self.apply(i, kind, aid, size, stream)
            if self.stopped:
                return

    def run_loop(self) -> None:
        """The tight loop: same calls as ``apply``, locals only, samples written only where they change."""
        if self.policy.replay_run is not None:   # the policy replays runs of events itself
            self.run_batched()
            return
        p = self.policy
        malloc, free_requested, free_completed, empty_cache = (
            p.malloc, p.free_requested, p.free_completed, p.empty_cache)
        src = self.reserved_source
        req, act, pend, res = self.views
        failed = self.failed
        peak = self.peak_reserved
        kind_col, id_col, size_col, stream_col = (self.trace.column(c)
                                                  for c in ("kind", "alloc_id", "size_bytes", "stream"))
        n = len(kind_col)
        row = 1
        for start in range(0, n, CHUNK_EVENTS):
            stop = min(n, start + CHUNK_EVENTS)
            for kind, aid, size, stream in zip(kind_col[start:stop].tolist(), id_col[start:stop].tolist(),
                                               size_col[start:stop].tolist(), stream_col[start:stop].tolist()):
                if kind == 1:  # ALLOC
                    try:
                        malloc(aid, size, stream)
                    except OutOfMemory as exc:
                        self.record_oom(row - 1, aid, size, stream, exc)
                        if self.stopped:
                            self.samples.write(row, p, src.reserved_bytes)
                            self.samples.rows = row + 1
                            return
                    r = src.reserved_bytes
                    req[row] = p.requested_bytes
                    act[row] = p.allocated_bytes
                    res[row] = r
                    if r > peak:
                        self.probe_peak(r)
                        peak = r
                elif kind == 2:  # FREE_REQUESTED
                    if not failed or aid not in failed:
                        free_requested(aid)
                    pend[row] = p.pending_free_bytes
                    res[row] = src.reserved_bytes
                elif kind == 3:  # FREE_COMPLETED
                    if not failed or aid not in failed:
                        free_completed(aid)
                    req[row] = p.requested_bytes
                    act[row] = p.allocated_bytes
                    pend[row] = p.pending_free_bytes
                    res[row] = src.reserved_bytes
                elif kind == 4:  # EMPTY_CACHE
                    empty_cache()
                    req[row] = p.requested_bytes
                    act[row] = p.allocated_bytes
                    res[row] = src.reserved_bytes
                row += 1
        self.samples.rows = row

    def run_batched(self) -> None:
        """``run_loop`` for a policy with ``replay_run``: it runs what it can, ``step`` the events it leaves.

        The policy reads the whole trace's columns in place (integer memoryviews: no per-event
        objects, no chunk copies); the engine reads only the events it steps itself.
        """
        replay_run, samples = self.policy.replay_run, self.samples
        step = self.stepper()
        run = ReplayRun(*self.views[:3])
        kinds, ids, sizes, streams = (memoryview(np.ascontiguousarray(self.trace.column(c)))
                                      for c in ("kind", "alloc_id", "size_bytes", "stream"))
        run.kind, run.alloc_id, run.size_bytes, run.stream = kinds, ids, sizes, streams
        n = len(kinds)
        run.pos, run.row = 0, 1
        while True:
            replay_run(run)
            pos = run.pos
            if pos >= n:
                break
            samples.rows = run.row
            step(pos, kinds[pos], ids[pos], sizes[pos], streams[pos])
            if self.stopped:
                return
            run.pos = pos + 1
            run.row = samples.rows
        samples.rows = run.row


def run_fast(trace: Trace, policy: PolicyLike, *, capacity_bytes: int | None = None, device: int | None = None,
             continue_on_oom: bool = False, observer: Observer | None = None, params: dict | None = None,
             allocator_settings: dict | None = None) -> RunResult:
    """Replay ``trace`` through ``policy`` with no notion of time: exact memory results, as fast as possible."""
    trace = select_device(trace, device)
    policy = make_policy(policy, capacity_bytes=capacity_bytes, params=params,
                         allocator_settings=allocator_settings if allocator_settings is not None
                         else trace.meta.allocator_settings)
    replay = _Replay(trace, policy, continue_on_oom=continue_on_oom, timed=False, observer=observer)
    started = time.perf_counter()
    replay.place_initial()
    if not replay.stopped:
        if observer is None:
            replay.run_loop()
        else:
            replay.run_generic()
    wall_s = time.perf_counter() - started
    return _with_route(build_result(replay.output(), RunInfo(mode="fast", wall_s=wall_s)), policy)


class _Environment(simpy.Environment):
    """A SimPy environment whose running process may move the clock itself when nothing is due first."""

    def advance_to(self, t_ns: int) -> bool:
        """Set the clock to ``t_ns`` and return True if no scheduled event is due at or before it.

        Then ``yield env.timeout(t_ns - env.now)`` would make that timeout the very next event
        processed (an event already queued for the same time goes first, hence ``<=``), and
        processing it would only resume the caller: skipping the round trip through the queue
        changes nothing but the cost. A stream with no other stream due before its next event
        runs on without yielding; a single-stream trace never yields at all.
        """
        queue = self._queue
        if queue and queue[0][0] <= t_ns:
            return False
        self._now = t_ns
        return True


class _Clock:
    """The SimPy side of a run: stream processes, sync windows and the stall accounting."""

    def __init__(self, replay: _Replay, cost_model: CostModel):
        self.replay = replay
        self.cost_model = cost_model
        self.env = _Environment(initial_time=replay.t0_ns)
        self.pause_total = 0      # sum of all sync windows so far (they never overlap)
        self.sync_end = replay.t0_ns
        self.sync_count = 0
        self.sync_ns = 0
        self.stall_ns = 0
        self.dependency_wait_ns = 0
        self.done: dict[int, simpy.Event] = {}
        self.special: frozenset[int] = frozenset()
        self.snapshot = snapshotter(replay.policy)
        # The counters after the last call, whichever stream made it: the policy changes only in
        # calls, so they are also the counters before the next call (one snapshot per event).
        self.counters: tuple[int, ...] = ()

    def start(self) -> None:
        """Create one process per stream, in stream-id order (deterministic tie-breaking)."""
        trace = self.replay.trace
        streams = trace.column("stream")
        deps = _cross_stream_dependencies(trace)
        self.done = {prev: self.env.event() for prev in sorted(set(deps.values()))}
        self.special = frozenset(deps) | frozenset(self.done)   # events with a cross-stream dependency
        self.counters = self.snapshot()
        cols = [trace.column(c) for c in ("t_ns", "kind", "alloc_id", "size_bytes", "stream")]
        # A compiled replay_run reads integer buffers directly; the Python loop indexes lists faster.
        buffers = self.replay.observer is None and self.replay.policy.replay_run is not None
        for stream in np.unique(streams).tolist():
            index = np.flatnonzero(streams == stream)
            self.env.process(self.stream_process(_chunks(index, cols, buffers), deps))

    def stream_process(self, chunks: Iterator[list[Any]], deps: dict[int, int]):
        """Walk one stream's events: wait for the work before each, issue the call, pay its latency.

        ``now`` mirrors ``env.now``: it is re-read after every yield and set wherever this process
        moves the clock itself (``advance_to``). Whenever nothing is pending before the next event
        (no pause to absorb, no sync window, no dependency, nothing else due first) the policy's
        ``replay_run`` may take a run of events; the loop body below handles the one it stops at.
        """
        env, replay, cost_model = self.env, self.replay, self.cost_model
        event_index, sim_t_ns, latency_ns = replay.samples.timed_views()
        observing = replay.observer is not None
        step = replay.apply if observing else replay.stepper()
        snapshot, call_cost, done = self.snapshot, cost_model.call_cost, self.done
        advance_to = env.advance_to
        sync_drain_ns = round(cost_model.device_sync_ns)
        # What call_cost gives a call that changed no counter, indexed by event kind (a uint8).
        unchanged = self.counters
        quiet_ns = [call_cost(unchanged, unchanged, _OPS.get(kind, OP_OTHER))[0] for kind in range(256)]
        # Policy.free_requested only marks the block pending (no device call, no GC): skip its snapshot.
        policy = replay.policy
        quiet_free_requests = (type(policy).free_requested is Policy.free_requested
                               and not policy._hooks_free_requested)
        # The policy's batch fast path takes the runs of events that need nothing from this loop.
        replay_run = None if observing else policy.replay_run
        samples = replay.samples
        run = ReplayRun(*replay.views[:3])
        special = self.special
        run.timed, run.quiet_ns, run.special = True, quiet_ns, special
        run.event_index, run.sim_t_ns, run.latency_ns = event_index, sim_t_ns, latency_ns
        delay = 0
        seen = self.pause_total
        now = env.now
        for chunk in chunks:
            index_c, t_c, kind_c, id_c, size_c, stream_c = chunk
            run.index, run.t_ns, run.kind, run.alloc_id, run.size_bytes, run.stream = chunk
            chunk_events = len(index_c)
            pos = 0   # position in the chunk of the event being handled
            while pos < chunk_events:
                i, t = index_c[pos], t_c[pos]
                if (replay_run is not None and self.pause_total == seen and self.sync_end <= now
                        and i not in special and not replay.stopped
                        and (t + delay <= now or t + delay < env.peek())):
                    # Nothing to wait for before this event: let the policy run events until one needs
                    # this loop (a device call, a dependency, another stream's event due first).
                    run.pos, run.row, run.delay_ns, run.now_ns, run.due_ns = pos, samples.rows, delay, now, env.peek()
                    replay_run(run)
                    ran = run.pos - pos
                    if ran:
                        samples.rows, delay = run.row, run.delay_ns
                        if run.now_ns > now:
                            now = run.now_ns
                            moved = advance_to(now)   # before due_ns, so nothing is skipped
                            assert moved, "replay_run ran past an event due first"
                        if run.pos == chunk_events:
                            break
                        pos = run.pos   # skip what the policy ran; handle the event it stopped at
                        i, t = index_c[pos], t_c[pos]
                kind, aid, size, stream = kind_c[pos], id_c[pos], size_c[pos], stream_c[pos]
                pos += 1
                target = t + delay
                while True:  # work until the issue time; sync windows freeze it
                    if target > now:
                        if not advance_to(target):
                            yield env.timeout(target - now)
                        now = target
                    extra = self.pause_total - seen
                    if not extra:
                        break
                    seen += extra
                    target += extra
                    self.stall_ns += extra
                if deps:
                    prev = deps.get(i)
                    if prev is not None and not done[prev].triggered:
                        yield done[prev]
                        self.dependency_wait_ns += env.now - now
                        now = env.now
                        seen = self.pause_total   # a blocked stream loses nothing to windows that ended meanwhile
                while self.sync_end > now:  # no call is issued inside a sync window
                    sync_end = self.sync_end
                    self.stall_ns += sync_end - now
                    if not advance_to(sync_end):
                        yield env.timeout(sync_end - now)
                    now = sync_end
                    seen = self.pause_total
                if replay.stopped:   # another stream's allocation failed while this one waited
                    return
                if observing:
                    self.counters = snapshot()   # an observer runs between calls: trust no cached counters
                row = step(i, kind, aid, size, stream, now)
                if kind == FREE_REQUESTED and quiet_free_requests:
                    latency, syncs = quiet_ns[kind], False
                else:
                    after = snapshot()
                    if after == self.counters:
                        latency, syncs = quiet_ns[kind], False
                    else:
                        latency, syncs = call_cost(self.counters, after, _OPS.get(kind, OP_OTHER))
                        self.counters = after
                event_index[row] = i
                sim_t_ns[row] = now
                latency_ns[row] = latency
                if syncs:
                    self.sync_count += 1
                    self.sync_ns += latency
                    self.pause_total += latency
                    self.sync_end = now + latency
                    self.stall_ns += sync_drain_ns
                    seen = self.pause_total
                delay = now + latency - t
                if done and i in done:
                    done[i].succeed()
                if replay.stopped:
                    return

    def end_ns(self) -> int:
        """When the last call ended: the latest ``sim_t_ns + latency_ns`` of any row (row 0: the start)."""
        samples = self.replay.samples
        rows = samples.rows
        return int((samples.sim_t_ns[:rows] + samples.latency_ns[:rows]).max())


def _chunks(index: np.ndarray, cols: list[np.ndarray], buffers: bool = False) -> Iterator[list[Any]]:
    """Yield [index, t_ns, kind, alloc_id, size_bytes, stream] of ``index``, a chunk at a time.

    As lists, or with ``buffers`` as integer memoryviews (for a compiled ``replay_run``).
    """
    for start in range(0, len(index), CHUNK_EVENTS):
        part = index[start:start + CHUNK_EVENTS]
        if buffers:
            yield [memoryview(part)] + [memoryview(c[part]) for c in cols]
        else:
            yield [part.tolist()] + [c[part].tolist() for c in cols]


def _cross_stream_dependencies(trace: Trace) -> dict[int, int]:
    """Map event index -> index of the previous event of the same allocation when that was on another stream."""
    streams = trace.column("stream")
    if not len(streams) or streams.min() == streams.max():
        return {}   # one stream: nothing to wait for (and no per-event scratch arrays to build)
    kind = trace.column("kind")
    mem = np.flatnonzero((kind == ALLOC) | (kind == FREE_REQUESTED) | (kind == FREE_COMPLETED))
    if len(mem) < 2:
        return {}
    ids = trace.column("alloc_id")[mem]
    by_id = np.lexsort((mem, ids))
    order, sorted_ids = mem[by_id], ids[by_id]
    same = sorted_ids[1:] == sorted_ids[:-1]
    prev, cur = order[:-1][same], order[1:][same]
    cross = streams[prev] != streams[cur]
    return dict(zip(cur[cross].tolist(), prev[cross].tolist()))


def run_simpy(trace: Trace, policy: PolicyLike, cost_model: CostModel | None = None, *,
              capacity_bytes: int | None = None, device: int | None = None, continue_on_oom: bool = False,
              observer: Observer | None = None, params: dict | None = None,
              allocator_settings: dict | None = None) -> RunResult:
    """Replay ``trace`` in simulated time: memory as ``run_fast`` plus latency, sync stalls and makespan."""
    trace = select_device(trace, device)
    cost_model = cost_model or CostModel()
    policy = make_policy(policy, capacity_bytes=capacity_bytes, params=params,
                         allocator_settings=allocator_settings if allocator_settings is not None
                         else trace.meta.allocator_settings)
    replay = _Replay(trace, policy, continue_on_oom=continue_on_oom, timed=True, observer=observer)
    clock = _Clock(replay, cost_model)
    started = time.perf_counter()
    replay.place_initial()
    if not replay.stopped:
        clock.start()
        clock.env.run()
    wall_s = time.perf_counter() - started
    return _with_route(build_result(replay.output(), RunInfo(
        mode="simpy", wall_s=wall_s, cost_model=cost_model, sync_count=clock.sync_count,
        sync_ns=clock.sync_ns, stall_ns=clock.stall_ns, dependency_wait_ns=clock.dependency_wait_ns,
        makespan_ns=clock.end_ns() - replay.t0_ns)), policy)


def _with_route(result: RunResult, policy: Policy) -> RunResult:
    """Name in ``result.perf`` the route the policy's hot path took (``compiled`` or ``reference``)."""
    result.perf["policy_kernel"] = route_of(policy)
    return result


def simulate(trace: Trace, policy: PolicyLike, *, fast: bool = False, cost_model: CostModel | None = None,
             **kwargs: Any) -> RunResult:
    """``run_fast`` when ``fast`` else ``run_simpy``; keyword arguments pass through."""
    if fast:
        return run_fast(trace, policy, **kwargs)
    return run_simpy(trace, policy, cost_model, **kwargs)
