"""What a recording proves about the real run: read it with ``recorded_run(trace, device)``.

A PyTorch snapshot records what the real caching allocator did (segment allocations and frees,
maps and unmaps, OOMs); a Kineto trace records the allocator's ``Total Allocated`` / ``Total
Reserved`` after every event. The trace layer infers from them, once, what every command needs to
start from what really happened: the real peaks and device-call counts, the program's
``empty_cache()`` calls (``EMPTY_CACHE`` events in ``Trace.events``), the segment releases that
the allocator made on its out-of-memory path and the device capacity they imply, and the OOMs the
run really hit. The facts live in ``trace.meta.recorded`` (JSON-able, kept by ``convert``).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import numpy as np

from ..schema import EventKind, Trace


@dataclasses.dataclass
class RecordedOOM:
    """One out-of-memory the real run hit: the request failed and left no allocation."""

    event_index: int            #: index in ``Trace.events`` of the failed request (an ALLOC event)
    t_ns: int
    requested_bytes: int        #: the request as the allocator rounded it
    stream: int
    device_free_bytes: int      #: what cudaMemGetInfo reported free at the failure (-1 if unknown)
    reserved_bytes: int         #: the real allocator's reserved bytes at the failure


@dataclasses.dataclass
class RecordedRun:
    """The real run of one device as the recording shows it; ``None`` fields are not recorded."""

    device: int
    allocator: str                                  #: "pytorch" (snapshots, Kineto) or "unknown"
    settings: dict[str, Any] | None = None          #: the recorded allocator settings, if any
    start_reserved_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    final_reserved_bytes: int | None = None
    peak_allocated_bytes: int | None = None         #: Kineto's Total Allocated (snapshots: None)
    segment_allocs: int | None = None               #: cudaMalloc calls (plain segments)
    segment_alloc_bytes: int | None = None
    segment_frees: int | None = None                #: cudaFree calls
    segment_free_bytes: int | None = None
    segment_maps: int | None = None                 #: expandable segments: page maps
    segment_map_bytes: int | None = None
    segment_unmaps: int | None = None
    segment_unmap_bytes: int | None = None
    empty_cache_calls: int = 0                      #: program empty_cache() calls found in the window
    oom_path_releases: int = 0                      #: release points on the allocator's OOM path
    ooms: list[RecordedOOM] = dataclasses.field(default_factory=list)
    #: Device memory the allocator could use, as the recording implies it (None: not inferable).
    capacity_bytes: int | None = None
    #: How the capacity was inferred, or why it could not be (one sentence for people).
    capacity_source: str = ""
    #: Every capacity in [lo, hi] explains the recording (hi None: no upper bound known).
    capacity_range: tuple[int, int | None] | None = None
    #: Segment releases no request explains, in order: ``event_index`` (of the EMPTY_CACHE event,
    #: the request whose cudaMalloc failed, or the failed request of a recorded OOM), ``mode``
    #: ("empty_cache" | "oom_path" | "oom"), ``releases`` (how many), ``reason``,
    #: ``reserved_before_bytes`` and, on the OOM path, ``failed_demand_bytes`` (reserved + the
    #: cudaMalloc that failed).
    release_points: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    #: What the recording shows that a replay does not model (inferred start layout, other pools):
    #: sentences for people, the reasons a replay may not reproduce it.
    unmodelled: list[str] = dataclasses.field(default_factory=list)
    #: Where the start-of-window layout (segments, blocks) comes from: "recorded" (the file lays it
    #: out, as a snapshot does) or "inferred" (rebuilt from the window's addresses, as for Kineto).
    start_layout: str = "recorded"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (inverse of ``from_dict``): ``dataclasses.asdict`` without its generic walk."""
        data = {f.name: getattr(self, f.name) for f in _RUN_FIELDS}
        data["settings"] = copy.deepcopy(self.settings)
        data["ooms"] = [dict(vars(o)) for o in self.ooms]
        data["release_points"] = copy.deepcopy(self.release_points)
        data["unmodelled"] = list(self.unmodelled)
        if self.capacity_range is not None:
            data["capacity_range"] = list(self.capacity_range)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RecordedRun":
        """Rebuild from ``to_dict`` output, ignoring keys this version does not know."""
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        kwargs["ooms"] = [RecordedOOM(**o) for o in kwargs.get("ooms") or []]
        if kwargs.get("capacity_range") is not None:
            kwargs["capacity_range"] = tuple(kwargs["capacity_range"])
        return cls(**kwargs)


_RUN_FIELDS = dataclasses.fields(RecordedRun)


def recorded_run(trace: Trace, device: int) -> RecordedRun | None:
    """The recorded facts of ``device`` in ``trace``, or None when the source records none."""
    data = trace.meta.recorded.get(str(device))
    return None if data is None else RecordedRun.from_dict(data)


def failed_request_events(trace: Trace) -> np.ndarray:
    """Indices of the ALLOC events that are recorded OOMs: requests the real run made that never got memory."""
    found = np.array(sorted({int(o["event_index"]) for run in trace.meta.recorded.values()
                             for o in run.get("ooms") or []}), dtype=np.int64)
    # A prefix of the trace (a partial replay) keeps the whole recording: only its own events count.
    found = found[(found >= 0) & (found < len(trace))]
    return found[trace.column("kind")[found] == EventKind.ALLOC]


def set_recorded_run(trace: Trace, run: RecordedRun) -> None:
    """Store ``run`` in ``trace.meta.recorded`` (readers call this once per device)."""
    trace.meta.recorded[str(run.device)] = run.to_dict()


def start_layout_origin(trace: Trace) -> str:
    """Say "inferred" when the trace's start-of-window layout was rebuilt rather than recorded, else "recorded".

    Kineto files record no segment: their start layout is inferred from the window's addresses
    (``kineto_layout``), and wording about it must not call it recorded.
    """
    inferred = any(run.get("start_layout") == "inferred" for run in trace.meta.recorded.values())
    return "inferred" if inferred else "recorded"


# ---------------------------------------------------------------------- inference (PyTorch snapshots)
SEGMENT_ALLOCS = ("segment_alloc", "segment_map")
SEGMENT_FREES = ("segment_free", "segment_unmap")
_DEVICE_ACTIONS = frozenset(SEGMENT_ALLOCS + SEGMENT_FREES + ("oom",))
_ALLOC = int(EventKind.ALLOC)
_KIND_NAMES = {int(k): k.name.lower() for k in EventKind}


@dataclasses.dataclass(eq=False)
class _Insert:
    """An event the recording implies but the trace entries do not hold, and its decisions."""

    position: int            #: index in ``Trace.events`` of the event it goes before
    kind: int
    t_ns: int
    alloc_id: int
    size_bytes: int
    stream: int
    device: int
    decision_rows: list[int]
    stack_id: int = -1       #: the frames of the request (an OOM's failed request: the ``oom`` entry's)


def infer_recorded(trace: Trace) -> None:
    """Infer, once, what a PyTorch snapshot proves about the real run; change ``trace`` in place.

    Segment releases that no request explains are classified (``_DeviceRecording.classify``): the
    program's ``empty_cache()`` calls become EMPTY_CACHE events right before the request they
    preceded, and every recorded OOM becomes the ALLOC event of the request that failed (it left no
    ``alloc`` entry); the decisions of those events point at them. Per device, a ``RecordedRun``
    with the real peaks, device calls, OOMs and the inferred capacity goes to ``trace.meta.recorded``.
    Traces of other formats are left alone.
    """
    if trace.meta.format != "pytorch-snapshot":
        return
    recordings = [_DeviceRecording(trace, device) for device in trace.devices]
    ids = [int(t["alloc_id"].max()) for t in (trace.events, trace.initial_allocs) if len(t)]
    next_id = max(ids, default=-1) + 1
    for recording in recordings:
        next_id = recording.classify(next_id)
    inserts = [ins for rec in recordings for ins in rec.inserts]
    new_index = _insert_events(trace, inserts)
    for rec in recordings:
        rec.finish(new_index)
        set_recorded_run(trace, rec.run)
        trace.meta.notes.extend(rec.notes)


class _DeviceRecording:
    """One device of a snapshot: the real reserved series, release points, OOMs, capacity."""

    def __init__(self, trace: Trace, device: int):
        self.trace = trace
        self.device = device
        ev = trace.events
        self.n_events = len(ev)
        kinds = ev["kind"].to_numpy()
        # The requests of this device as a per-device replay sees them (markers belong to every device).
        self.kept = np.flatnonzero((ev["device"].to_numpy() == device) | (kinds == int(EventKind.MARKER)))
        self.kinds = kinds
        self.t_col = ev["t_ns"].to_numpy()
        self.inserts: list[_Insert] = []
        self.notes: list[str] = []
        self._points: list[tuple[dict[str, Any], Any]] = []    # (point, _Insert or old event index)
        self._oom_inserts: list[_Insert] = []
        dec = trace.decisions
        rows = np.flatnonzero((dec["device"].to_numpy() == device) & dec["action"].isin(_DEVICE_ACTIONS).to_numpy())
        self.rows = rows
        self.action = dec["action"].iloc[rows].tolist()    # (text columns: take the few rows, then convert)
        self.addr = dec["addr"].to_numpy()[rows].tolist()
        self.size = dec["size_bytes"].to_numpy()[rows].tolist()
        self.stream = dec["stream"].to_numpy()[rows].tolist()
        self.t_ns = dec["t_ns"].to_numpy()[rows].tolist()
        self.device_free = dec["device_free_bytes"].to_numpy()[rows].tolist()
        self.stack = dec["stack_id"].to_numpy()[rows].tolist()
        self.sub_index = np.searchsorted(self.kept, dec["event_index"].to_numpy()[rows]).tolist()
        segs = trace.initial_segments
        start = int(segs.loc[segs["device"] == device, "size_bytes"].sum())
        delta = [s if a in SEGMENT_ALLOCS else -s if a in SEGMENT_FREES else 0
                 for a, s in zip(self.action, self.size)]
        # Python ints: a hostile file's sizes must not wrap a fixed-width sum.
        after, level = [], start
        for d in delta:
            level += d
            after.append(level)
        self.reserved_after = after
        self.reserved_before = [a - d for a, d in zip(after, delta)]
        # No entry at all for this device (a snapshot dumped without history): its segments prove what
        # was reserved when it was taken, nothing about the start of the run or its peak.
        history = bool(len(rows)) or bool(np.any((ev["device"].to_numpy() == device)
                                                 & (kinds != int(EventKind.MARKER))))
        self.run = RecordedRun(
            device=device, allocator="pytorch", settings=trace.meta.allocator_settings,
            start_reserved_bytes=start if history else None,
            peak_reserved_bytes=max([start] + after) if history else None,
            final_reserved_bytes=after[-1] if after else start)
        for name, action in (("segment_allocs", "segment_alloc"), ("segment_frees", "segment_free"),
                             ("segment_maps", "segment_map"), ("segment_unmaps", "segment_unmap")):
            sizes = [s for a, s in zip(self.action, self.size) if a == action]
            setattr(self.run, name, len(sizes))
            setattr(self.run, name[:-1] + "_bytes", sum(sizes))

    # ------------------------------------------------------------------ positions
    def position(self, k: int) -> int:
        """Global event index of this device's k-th request (its end: after its last event)."""
        if k < len(self.kept):
            return int(self.kept[k])
        return int(self.kept[-1]) + 1 if len(self.kept) else self.n_events

    def insert(self, k: int, kind: int, row_slice: list[int], alloc_id: int = -1, size_bytes: int = 0,
               stream: int = 0) -> _Insert:
        pos = self.position(k)
        t = self.t_ns[row_slice[0]] if row_slice else 0
        t_col = self.t_col
        if pos > 0:
            t = max(t, int(t_col[pos - 1]))
        if pos < self.n_events:
            t = min(t, int(t_col[pos]))
        ins = _Insert(pos, kind, t, alloc_id, size_bytes, stream, self.device,
                      [int(self.rows[j]) for j in row_slice])
        self.inserts.append(ins)
        return ins

    # ------------------------------------------------------------------ classification
    def classify(self, next_id: int) -> int:
        """Sort every unexplained release into empty_cache / OOM path / OOM; return the next free id."""
        groups: dict[int, list[int]] = {}
        for j, k in enumerate(self.sub_index):
            groups.setdefault(k, []).append(j)
        peak = self.run.peak_reserved_bytes
        candidates = [k for k, items in groups.items() if self._needs_cache_check(k, items, peak)]
        model = _ModelReplay.build(self.trace, self.device, self.kept) if candidates else None
        if candidates and model is None:
            self.notes.append(f"device {self.device}: the start state could not be replayed, so "
                              f"{len(candidates)} segment releases before a cudaMalloc were taken for "
                              "the out-of-memory path without checking the cache")
        for k in sorted(groups):
            if model is not None:
                model.advance(k)
            failed, items = self._split_at_ooms(groups[k])
            for run in failed:
                next_id = self._recorded_oom(k, run, next_id, model)
            self._release(k, items, peak, model)
        self._infer_capacity()
        return next_id

    def _lead(self, items: list[int]) -> int:
        lead = 0
        while lead < len(items) and self.action[items[lead]] in SEGMENT_FREES:
            lead += 1
        return lead

    def _split_at_ooms(self, items: list[int]) -> tuple[list[list[int]], list[int]]:
        """``items`` cut after each ``oom`` entry: (the runs that end in one, the rest), in one pass
        (a file may record any number of OOMs before one request)."""
        runs, start = [], 0
        for n, j in enumerate(items):
            if self.action[j] == "oom":
                runs.append(items[start:n + 1])
                start = n + 1
        return runs, items[start:]

    def _needs_cache_check(self, k: int, items: list[int], peak: int) -> bool:
        """True when only the allocator's cache at request k can tell empty_cache from the OOM path."""
        items = self._split_at_ooms(items)[1]
        lead = self._lead(items)
        if not lead or lead == len(items) or k >= len(self.kept):
            return False
        nxt = items[lead]
        return (int(self.kinds[self.kept[k]]) == _ALLOC and self.action[nxt] in SEGMENT_ALLOCS
                and self.reserved_before[items[0]] + self.size[nxt] > peak)

    def _recorded_oom(self, k: int, items: list[int], next_id: int, model: "_ModelReplay | None") -> int:
        """The failed request of an ``oom`` entry becomes an ALLOC event (with its release path)."""
        j = items[-1]
        ins = self.insert(k, _ALLOC, items, alloc_id=next_id, size_bytes=self.size[j], stream=self.stream[j])
        ins.stack_id = int(self.stack[j])
        self._oom_inserts.append(ins)
        self.run.ooms.append(RecordedOOM(event_index=-1, t_ns=ins.t_ns, requested_bytes=self.size[j],
                                         stream=self.stream[j], device_free_bytes=int(self.device_free[j]),
                                         reserved_bytes=self.reserved_after[j]))
        point = {"mode": "oom", "releases": len(items) - 1, "reason": "the request failed and left no alloc entry",
                 "reserved_before_bytes": self.reserved_before[items[0]]}
        self._points.append((point, ins))
        if model is not None:
            model.fail(next_id, self.size[j], self.stream[j])
        return next_id + 1

    def _release(self, k: int, items: list[int], peak: int, model: "_ModelReplay | None") -> None:
        lead = self._lead(items)
        if not lead:
            return
        nxt = items[lead] if lead < len(items) else None
        kind = int(self.kinds[self.kept[k]]) if k < len(self.kept) else None
        before = self.reserved_before[items[0]]
        demand = None
        if kind is None:
            mode, reason = "empty_cache", "released at the end of the recording"
        elif kind != _ALLOC:
            mode, reason = "empty_cache", f"released before a {_KIND_NAMES.get(kind, 'request')}"
        elif nxt is None or self.action[nxt] not in SEGMENT_ALLOCS:
            mode, reason = "empty_cache", "the next request made no new segment"
        elif before + self.size[nxt] <= peak:
            # A device that held the run's peak would not refuse this cudaMalloc. (Were memory outside
            # the allocator to change, it still replays identically: releasing the cache right before
            # a request that then needs a new segment is what both the OOM path and empty_cache do.)
            mode, reason = "empty_cache", ("the next cudaMalloc fits under the run's own peak reserved: "
                                           "a device that held the peak would not refuse it")
        elif model is not None and model.would_reuse(k):
            mode, reason = "empty_cache", "a cached block fitted the request: no cudaMalloc was tried"
        else:
            mode, reason = "oom_path", "no cached block fitted and the request's new segment follows the release"
            demand = before + self.size[nxt]
        point = {"mode": mode, "releases": lead, "reason": reason, "reserved_before_bytes": before}
        if demand is not None:
            point["failed_demand_bytes"] = demand
        if mode == "empty_cache":
            ins = self.insert(k, int(EventKind.EMPTY_CACHE), items[:lead], stream=self.stream[items[0]])
            self._points.append((point, ins))
            self.run.empty_cache_calls += 1
            if model is not None:
                model.empty_cache()
        else:
            self._points.append((point, self.position(k)))
            self.run.oom_path_releases += 1
            if model is not None:
                model.refuse_next()

    # ------------------------------------------------------------------ capacity
    def _infer_capacity(self) -> None:
        run = self.run
        peak = run.peak_reserved_bytes
        demands = [p["failed_demand_bytes"] for p, _ in self._points if "failed_demand_bytes" in p]
        lowest_demand = min(demands) if demands else None
        from_ooms = sorted({o.reserved_bytes + o.device_free_bytes for o in run.ooms if o.device_free_bytes >= 0})
        if from_ooms:
            fitting = [c for c in from_ooms if c >= peak and (lowest_demand is None or c < lowest_demand)]
            if fitting:
                run.capacity_bytes = fitting[0]
                run.capacity_source = (
                    f"the real allocator's reserved bytes at its recorded OOM plus the "
                    f"{fitting[0] - run.ooms[0].reserved_bytes:,} bytes the driver then reported free"
                    if len(from_ooms) == 1 else
                    f"the smallest of {len(from_ooms)} recorded OOMs' reserved-plus-free bytes that explains the "
                    "whole run")
                run.capacity_range = (run.capacity_bytes, run.capacity_bytes)
                return
            run.capacity_source = ("not inferred: the free bytes the driver reported at the recorded OOM imply "
                                   "a device smaller than the run's own peak reserved (memory outside the "
                                   "allocator changed)")
            return
        if lowest_demand is not None:
            # Every OOM-path demand exceeds the peak (``_release``), so one capacity explains them all.
            run.capacity_bytes = peak
            run.capacity_range = (peak, lowest_demand - 1)
            run.capacity_source = (f"the real peak reserved, the smallest capacity under which the {len(demands)} "
                                   "segment releases on the allocator's out-of-memory path happen (any capacity "
                                   f"up to {lowest_demand - 1:,} bytes explains them)")
            return
        run.capacity_source = ("not inferred: no OOM and no release on the out-of-memory path in the "
                               "recording, and a snapshot does not record the device's size")

    # ------------------------------------------------------------------ after insertion
    def finish(self, new_index: "_NewIndex") -> None:
        """Point release points and OOMs at the final event indices; write the notes."""
        for oom, ins in zip(self.run.ooms, self._oom_inserts):
            oom.event_index = new_index.of_insert(ins)
        points = []
        for point, where in self._points:
            index = new_index.of_insert(where) if isinstance(where, _Insert) else new_index.of_event(where)
            points.append(dict(point, event_index=index))
        self.run.release_points = points
        run = self.run
        if run.empty_cache_calls:
            self.notes.append(f"device {self.device}: {run.empty_cache_calls} segment releases no request explains "
                              "are program empty_cache() calls; they are EMPTY_CACHE events")
        if run.oom_path_releases:
            self.notes.append(f"device {self.device}: {run.oom_path_releases} segment releases are the "
                              "allocator's out-of-memory path (a cudaMalloc failed, the cache was released, "
                              "the retry succeeded)")
        if run.ooms:
            self.notes.append(f"device {self.device}: {len(run.ooms)} recorded OOMs; each failed request is an "
                              "ALLOC event that never got memory")


class _NewIndex:
    """Old event index -> index after the inserts, and each insert's own index."""

    def __init__(self, positions: np.ndarray, insert_index: dict[int, int]):
        self.positions = positions
        self.insert_index = insert_index

    def of_event(self, old: int) -> int:
        return int(old + np.searchsorted(self.positions, old, side="right"))

    def of_insert(self, ins: _Insert) -> int:
        return self.insert_index[id(ins)]


#: Values of the event columns an inserted event does not set.
_DEFAULTS = {"stack_id": -1}


def _insert_events(trace: Trace, inserts: list[_Insert]) -> _NewIndex:
    """Insert the events into ``trace.events`` (stable order) and re-point every decision."""
    order = sorted(range(len(inserts)), key=lambda j: inserts[j].position)   # stable: recorded order kept
    positions = np.array([inserts[j].position for j in order], dtype=np.int64)
    insert_index = {id(inserts[j]): int(positions[r]) + r for r, j in enumerate(order)}
    new_index = _NewIndex(positions, insert_index)
    if not inserts:
        return new_index
    events = trace.events
    columns = {}
    for name in events.columns:
        values = [getattr(inserts[j], name, _DEFAULTS.get(name, -1)) for j in order]
        old = events[name].to_numpy()
        columns[name] = np.insert(old, positions, np.asarray(values, dtype=old.dtype))
    trace.events = type(events)(columns)
    dec = trace.decisions
    idx = dec["event_index"].to_numpy()
    idx = idx + np.searchsorted(positions, idx, side="right")
    for ins in inserts:
        idx[ins.decision_rows] = insert_index[id(ins)]
    dec["event_index"] = idx.astype(np.int64)
    return new_index


class _ModelReplay:
    """The pytorch preset replaying one device's recording, to ask what the real cache held.

    Used only where the recorded entries cannot tell the program's ``empty_cache()`` from the
    allocator's out-of-memory path: both release the cache before a cudaMalloc, but the OOM path
    runs only when no cached block fits the request. The preset reproduces the recorded decisions
    exactly (``python -m validate snapshot``), so its cache is the real one.
    """

    def __init__(self, policy: Any, kept: np.ndarray, events: Any):
        self.policy = policy
        self.device = policy.device
        columns = [np.ascontiguousarray(events[name].to_numpy()[kept], dtype=np.int64)
                   for name in ("kind", "alloc_id", "size_bytes", "stream")]
        self.kind, self.alloc_id, self.size, self.stream = (c.tolist() for c in columns)
        self.pos = 0
        self.refuse_pending = False
        self.run = None
        if policy.replay_run is not None:
            # The compiled kernel replays runs of pool hits and frees in one call (Policy.replay_run),
            # with exactly the per-event methods' state changes; the loop below takes the rest.
            from ...policies.base import ReplayRun

            rows = np.zeros(len(self.kind) + 1, dtype=np.int64)
            self.run = ReplayRun(memoryview(rows), memoryview(rows.copy()), memoryview(rows.copy()))
            self.columns = [memoryview(c) for c in columns]

    @classmethod
    def build(cls, trace: Trace, device: int, kept: np.ndarray) -> "_ModelReplay | None":
        """A replay from the recorded start state, or None when that state cannot be loaded."""
        from ...device import SimulatedDevice
        from ...policies.pytorch import PyTorchPolicy
        from ...settings.recorded import allocator_settings_to_kwargs

        segs = trace.initial_segments[trace.initial_segments["device"] == device]
        blocks = trace.initial_blocks[trace.initial_blocks["device"] == device]
        if len(segs) and not len(blocks):
            return None
        try:
            policy = PyTorchPolicy(SimulatedDevice(), **allocator_settings_to_kwargs(trace.meta.allocator_settings))
            policy.load_state(segs, blocks)
        except (ValueError, TypeError):
            return None
        dec = trace.decisions
        plan = dec[(dec["device"] == device) & (dec["action"] == "segment_alloc")]
        policy.device.follow_addresses(list(zip(plan["addr"].to_numpy().tolist(),
                                                plan["size_bytes"].to_numpy().tolist())))
        return cls(policy, kept, trace.events)

    def advance(self, k: int) -> None:
        """Replay the recorded requests up to (not including) the k-th."""
        end = min(k, len(self.kind))
        if self.run is None:
            self._step_until(end)
            return
        run = self.run
        run.kind, run.alloc_id, run.size_bytes, run.stream = (c[:end] for c in self.columns)
        while self.pos < end:
            if self.refuse_pending:         # the next ALLOC meets the refusal: one event at a time
                self._step_until(self.pos + 1)
                continue
            run.pos, run.row = self.pos, 0
            self.policy.replay_run(run)
            self.pos = run.pos
            self._step_until(min(run.pos + 1, end))

    def _step_until(self, end: int) -> None:
        """Replay requests ``pos .. end - 1`` one at a time through the policy's methods."""
        from ...errors import OutOfMemory

        p = self.policy
        for i in range(self.pos, end):
            kind, aid = self.kind[i], self.alloc_id[i]
            if kind == _ALLOC:
                try:
                    p.malloc(aid, self.size[i], self.stream[i])
                except OutOfMemory:
                    pass
                finally:
                    if self.refuse_pending:
                        self.device.refuse(0)
                        self.refuse_pending = False
            elif kind == int(EventKind.FREE_REQUESTED):
                if aid in p.live and aid not in p.pending:
                    p.free_requested(aid)
            elif kind == int(EventKind.FREE_COMPLETED):
                if aid in p.live:
                    p.free_completed(aid)
            elif kind == int(EventKind.EMPTY_CACHE):
                p.empty_cache()
        self.pos = max(self.pos, end)

    def would_reuse(self, k: int) -> bool:
        return bool(self.policy.would_reuse(self.size[k], self.stream[k]))

    def empty_cache(self) -> None:
        self.policy.empty_cache()

    def refuse_next(self) -> None:
        """The next cudaMalloc fails once (the recorded request's failed first attempt)."""
        self.device.refuse(1)
        self.refuse_pending = True

    def fail(self, alloc_id: int, size_bytes: int, stream: int) -> None:
        """Run a recorded OOM: the device refuses every call during the request."""
        from ...errors import OutOfMemory

        self.device.refuse(None)
        try:
            self.policy.malloc(alloc_id, size_bytes, stream)
        except OutOfMemory:
            pass
        finally:
            self.device.refuse(0)


def infer_from_snapshot(trace: Trace) -> None:
    """What the snapshot reader calls on the built ``Trace``: exact start state, then the recorded run."""
    from .start_state import repair_start_state

    repair_start_state(trace)
    infer_recorded(trace)
