"""Hold the ``pytorch`` preset against PyTorch's real CUDACachingAllocator, decision by decision.

A PyTorch memory snapshot records the program's requests *and* what the real allocator did about
them. ``check_snapshot(path)`` replays the requests through ``PyTorchPolicy`` from the exact
allocator state at the start of the recorded window and compares every decision.

What counts as a decision (each one is compared and counted once):

* every **alloc placement**: the address the real allocator returned for an ``alloc`` entry (same
  alloc id) vs ours, reported as (segment, offset within the segment);
* every **segment creation**: ``segment_alloc`` (cudaMalloc) or ``segment_map`` (expandable
  segments): same size, same address (segment identity, below), same request, same order;
* every **segment release**: ``segment_free`` / ``segment_unmap``: same segment, same size, same
  request, same order;
* every **oom** entry: our replay must fail the same request.

``decisions`` = real decisions + predicted segment decisions the real run does not have (extra
cudaMallocs or frees); ``matched`` = real decisions reproduced exactly. ``free_requested`` /
``free_completed`` are the program's requests, not allocator decisions: they drive the replay.

Start state: segments at their real addresses, sizes, streams and pools; live blocks at their
real addresses bound to the trace's allocation ids; free gaps as free blocks of their stream and
pool (``PyTorchPolicy.load_state``). The trace layer makes the block sizes exact
(``allocsim.trace.inference.start_state``); this module only uses them.

Segment identity: initial segments keep their real addresses. A segment the model creates while
serving request *i* is paired, in creation order, with the segments the real allocator created
for the same request, and the simulated device is asked to hand out the real address (a
cudaMalloc's address is the driver's choice, outside the allocator policy; giving the model the
real addresses lets PyTorch's address tie-break in the free sets see the real order). An
expandable segment's virtual range is paired the same way through its first mapping; its
addresses are compared as offsets from that range's base.

Segment releases no request explains (PyTorch only frees segments in ``empty_cache`` or when a
cudaMalloc fails) are classified by the trace layer (``allocsim.trace.inference.recorded``): the program's
``empty_cache()`` calls are EMPTY_CACHE events of the trace, a recorded OOM's failed request is an
ALLOC event, and the points where the allocator released its cache on the out-of-memory path are
``RecordedRun.release_points``. The replay here refuses the recorded request's first cudaMalloc at
an OOM-path point (``SimulatedDevice.refuse(1)``) and every device call of a recorded OOM's failed
request, so the model runs its own failure path; which segments are freed, in which order, is
then the model's decision and is compared. With ``capacity_bytes`` the replay runs on a device of
that size instead (the inferred capacity explains both kinds of point when one exists).
"""

from __future__ import annotations

import bisect
import dataclasses
import difflib
import os
from typing import Any

import numpy as np

from allocsim.device import SimulatedDevice
from allocsim.errors import AllocsimError, OutOfMemory
from allocsim.policies.freelist import ADDR_BITS, ADDR_MASK
from allocsim.settings.pytorch_sizes import K_SMALL_SIZE
from allocsim.policies.pytorch import PyTorchPolicy
from allocsim.settings.recorded import allocator_settings_to_kwargs
from allocsim.trace import read_trace
from allocsim.trace.inference.recorded import RecordedRun, recorded_run
from allocsim.trace.schema import EventKind, Trace

SEGMENT_ALLOCS = ("segment_alloc", "segment_map")
SEGMENT_FREES = ("segment_free", "segment_unmap")
SEGMENT_ACTIONS = SEGMENT_ALLOCS + SEGMENT_FREES + ("oom",)

ALLOC, FREE_REQUESTED, FREE_COMPLETED, EMPTY_CACHE = (int(EventKind.ALLOC), int(EventKind.FREE_REQUESTED),
                                                      int(EventKind.FREE_COMPLETED), int(EventKind.EMPTY_CACHE))
#: How many mismatches the report lists one by one (all are counted by cause).
MAX_EXAMPLES = 20
#: How many free blocks the first mismatch's context lists.
MAX_CONTEXT_BLOCKS = 64


# ---------------------------------------------------------------------- the report
@dataclasses.dataclass
class _Segments:
    """Real segments (address -> size) known so far, for naming (segment, offset) of an address."""

    starts: list[int]
    sizes: dict[int, int]

    @classmethod
    def of(cls, ranges: dict[int, int]) -> "_Segments":
        return cls(sorted(ranges), dict(ranges))

    def add(self, addr: int, size: int) -> None:
        if addr not in self.sizes:
            bisect.insort(self.starts, addr)
        self.sizes[addr] = size

    def remove(self, addr: int) -> None:
        if self.sizes.pop(addr, None) is not None:
            self.starts.pop(bisect.bisect_left(self.starts, addr))

    def locate(self, addr: int) -> tuple[int, int] | None:
        k = bisect.bisect_right(self.starts, addr) - 1
        if k >= 0:
            start = self.starts[k]
            if addr < start + self.sizes[start]:
                return start, addr - start
        return None


class _DeviceCheck:
    """One device's replay and comparison."""

    def __init__(self, trace: Trace, device: int, capacity_bytes: int | None = None, *,
                 address_order: str | None = None, recorded_addresses: bool = True):
        self.trace = trace
        self.device = device
        self.capacity_bytes = capacity_bytes
        self.recorded_addresses = recorded_addresses
        kwargs = allocator_settings_to_kwargs(trace.meta.allocator_settings)
        self.sim = SimulatedDevice(capacity_bytes, address_order=address_order)
        self.policy = PyTorchPolicy(self.sim, record_decisions=True, **kwargs)
        self.expandable = bool(self.policy.expandable_segments)
        segments, blocks = trace.initial_segments, trace.initial_blocks
        if len(segments) and not len(blocks):
            raise AllocsimError("the snapshot's start state could not be reconstructed (no initial blocks): "
                                + "; ".join(trace.meta.notes[-2:]))
        self.policy.load_state(segments, blocks)
        self.start_notes = [n for n in trace.meta.notes if "start-of-window" in n or "start-state" in n]
        self.recorded = recorded_run(trace, device) or RecordedRun(device=device, allocator="unknown")
        # Event index -> how the recorded run released its cache there (see the module docstring).
        self.release_mode = {int(p["event_index"]): p["mode"] for p in self.recorded.release_points
                             if p["mode"] in ("oom_path", "oom")}
        # Real segment decisions per request index, in recorded order; real alloc addresses by id.
        dec = trace.decisions
        self.real: dict[int, list[tuple]] = {}
        self.real_alloc: dict[int, int] = {}
        for idx, action, addr, size, stream, aid, dfree in zip(
                dec["event_index"].tolist(), dec["action"].tolist(), dec["addr"].tolist(),
                dec["size_bytes"].tolist(), dec["stream"].tolist(), dec["alloc_id"].tolist(),
                dec["device_free_bytes"].tolist()):
            if action == "alloc":
                self.real_alloc[aid] = addr
            elif action in SEGMENT_ACTIONS:
                self.real.setdefault(idx, []).append((action, addr if action != "oom" else -1, size, stream, dfree))
        initial = {int(a): int(s) for a, s in zip(segments["addr"], segments["size_bytes"])}
        self.real_segments = _Segments.of(initial)
        # Our segments and their real counterparts: initial ones are the real ones; a segment the
        # model creates is paired with the real segment created at the same place (see pair_segments).
        self.sim_segments = _Segments.of(initial)
        self.seg_map: dict[int, int | None] = {a: a for a in initial}
        self.real_start_reserved = sum(initial.values())
        self.real_reserved = self.real_start_reserved   # real reserved bytes before the current request
        self.real_peak_so_far = self.real_start_reserved
        # Simulated virtual range base -> real base; ranges adopted from the start state are real.
        self.va_map: dict[int, int] = {base: base for base in self.sim._address_spaces}
        self.va_real_sizes: dict[int, int] = dict(self.sim._address_spaces)
        # results
        self.n_decisions = 0
        self.n_matched = 0
        self.causes: dict[str, int] = {}
        self.kinds: dict[str, list[int]] = {}    # decision kind -> [decisions, matched]
        self.examples: list[dict[str, Any]] = []
        self.first: dict[str, Any] | None = None
        self._context: list[dict[str, Any]] | None = None

    # ------------------------------------------------------------------ addresses
    def to_real(self, addr: int) -> int:
        """Our address in the real address space, through the segment pairing (-1: no real counterpart)."""
        if addr < 0:
            return -1
        if self.expandable:
            for base, size in self.sim._address_spaces.items():
                if base <= addr < base + size:
                    real = self.va_map.get(base)
                    return -1 if real is None else real + (addr - base)
            return -1
        found = self.sim_segments.locate(addr)
        if found is None:
            return -1
        real = self.seg_map.get(found[0])
        return -1 if real is None else real + found[1]

    def where(self, real_addr: int) -> dict[str, Any]:
        """Name a real-space address as segment and offset."""
        if real_addr < 0:
            return {"addr": real_addr, "segment": None, "offset": None}
        found = self.real_segments.locate(real_addr)
        if found is None and self.expandable:
            for base in self.va_map.values():
                if base <= real_addr < base + self.va_real_sizes.get(base, 0):
                    found = (base, real_addr - base)
        seg, off = found if found else (None, None)
        return {"addr": real_addr, "segment": seg, "offset": off}

    def free_blocks(self, size: int, stream: int) -> list[dict[str, Any]]:
        """The free blocks the model had for this stream in the request's pool (best-fit order)."""
        pool = self.policy.small if size <= K_SMALL_SIZE else self.policy.large
        out = []
        for key in pool.keys(stream):
            addr = self.to_real(key & ADDR_MASK)
            item = self.where(addr)
            item["size"] = key >> ADDR_BITS
            out.append(item)
        return out

    # ------------------------------------------------------------------ bookkeeping
    def count(self, kind: str, ok: bool, cause: str | None = None, detail: dict[str, Any] | None = None) -> None:
        self.n_decisions += 1
        tally = self.kinds.setdefault(kind, [0, 0])
        tally[0] += 1
        if ok:
            self.n_matched += 1
            tally[1] += 1
            return
        self.causes[cause] = self.causes.get(cause, 0) + 1
        detail = dict(detail or {})
        detail["cause"] = cause
        if self.first is None:
            self.first = dict(detail)
            if self._context is not None:
                self.first["free_blocks_seen"] = self._context[:MAX_CONTEXT_BLOCKS]
                self.first["free_blocks_seen_total"] = len(self._context)
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append(detail)

    def apply_real(self, items: list[tuple]) -> None:
        """Keep the real segment table up to date (for naming segments in the report)."""
        for action, addr, size, _stream, _dfree in items:
            if action == "segment_alloc":
                self.real_segments.add(addr, size)
            elif action == "segment_free":
                self.real_segments.remove(addr)
            if action in SEGMENT_ALLOCS:
                self.real_reserved += size
                self.real_peak_so_far = max(self.real_peak_so_far, self.real_reserved)
            elif action in SEGMENT_FREES:
                self.real_reserved -= size

    # ------------------------------------------------------------------ replay
    def run(self) -> dict[str, Any]:
        ev = self.trace.events
        cols = [ev[c].tolist() for c in ("kind", "alloc_id", "size_bytes", "stream")]
        n = len(cols[0])
        for i in range(n):
            self.request(i, cols[0][i], cols[1][i], cols[2][i], cols[3][i], self.real.get(i, []))
        if self.real.get(n):   # decisions after the last request (none in a well-formed recording)
            self.request(n, -1, -1, 0, 0, self.real[n])
        return self.report()

    def request(self, i: int, kind: int, aid: int, size: int, stream: int, real: list[tuple]) -> None:
        """Replay event ``i`` (refusing device calls where the recording failed them) and compare."""
        policy, sim = self.policy, self.sim
        mark = len(policy.decisions)
        va_before = set(sim._address_spaces) if self.expandable else None
        mode = self.release_mode.get(i)
        if mode is None and kind == EMPTY_CACHE:
            mode = "empty_cache"
        if self.capacity_bytes is None:
            if mode == "oom":
                sim.refuse(None)   # the recorded OOM: every device call failed
            elif mode == "oom_path":
                sim.refuse(1)      # alloc_block fails once -> release_cached_blocks -> retry
        failed = False
        if kind == ALLOC:
            if self.first is None:
                self._context = self.free_blocks(policy.rounded_size(size), stream)
            if not self.expandable and self.recorded_addresses:
                sim.hint_addresses([(a, s) for act, a, s, _st, _d in real if act == "segment_alloc"])
            try:
                policy.malloc(aid, size, stream)
            except OutOfMemory:
                failed = True
            finally:
                sim.refuse(0)
                sim.hint_addresses([])
        elif kind == FREE_REQUESTED:
            if aid in policy.live and aid not in policy.pending:
                policy.free_requested(aid)
        elif kind == FREE_COMPLETED:
            if aid in policy.live:
                policy.free_completed(aid)
        elif kind == EMPTY_CACHE:
            policy.empty_cache()
        ours = policy.decisions[mark:]
        if self.expandable:
            self.pair_ranges(va_before, ours, real)
        self.compare_segments(i, kind, size, stream, real, ours, mode)
        self.apply_real(real)
        if kind == ALLOC and aid in self.real_alloc:
            self.compare_alloc(i, aid, size, stream, failed)
        self._context = None

    def pair_ranges(self, before: set[int], ours: list[tuple], real: list[tuple]) -> None:
        """Pair a virtual range our model reserved with the real one through its first mapping."""
        for base in set(self.sim._address_spaces) - before:
            for j, (action, addr, _size, _stream) in enumerate(ours):
                if action == "segment_map" and addr == base:
                    if j < len(real) and real[j][0] == "segment_map":
                        self.va_map[base] = real[j][1]
                        self.va_real_sizes[real[j][1]] = self.sim._address_spaces[base]
                    break

    def translate(self, ours: list[tuple], real: list[tuple]) -> list[tuple]:
        """Our segment decisions of one request in real addresses, pairing the segments we create.

        The k-th cudaMalloc our model makes for a request is paired with the k-th segment_alloc the
        real allocator recorded for the same request when their sizes agree (creation order).
        """
        if self.expandable:
            return [(a, self.to_real(addr) if a != "oom" else -1, s) for a, addr, s, _st in ours]
        created = [item for item in real if item[0] == "segment_alloc"]
        k = 0
        out = []
        for action, addr, size, _stream in ours:
            if action == "segment_alloc":
                twin = created[k] if k < len(created) else None
                k += 1
                self.sim_segments.add(addr, size)
                self.seg_map[addr] = twin[1] if twin is not None and twin[2] == size else None
                out.append((action, self.to_real(addr), size))
            elif action == "segment_free":
                out.append((action, self.to_real(addr), size))
                self.sim_segments.remove(addr)
                self.seg_map.pop(addr, None)
            else:
                out.append((action, -1, size))
        return out

    def compare_segments(self, i: int, kind: int, size: int, stream: int, real: list[tuple],
                         ours: list[tuple], mode: str | None) -> None:
        r = [(a, addr, s) for a, addr, s, _st, _d in real]
        o = self.translate(ours, real)
        if r == o:
            for action, _addr, _s in r:
                self.count(_kind(action), True)
            return
        matcher = difflib.SequenceMatcher(None, r, o, autojunk=False)
        base = {"event_index": i, "request_kind": _kind_name(kind), "request_size": size, "stream": stream,
                "release_mode": mode}
        for tag, r0, r1, o0, o1 in matcher.get_opcodes():
            if tag == "equal":
                for action, _addr, _s in r[r0:r1]:
                    self.count(_kind(action), True)
                continue
            rr, oo = r[r0:r1], o[o0:o1]
            for j, item in enumerate(rr):
                other = oo[j] if j < len(oo) else None
                cause = _cause_missing(item, other, mode)
                detail = dict(base, real=self.describe(item), ours=self.describe(other) if other else None)
                self.count(_kind(item[0]), False, cause, detail)
            for item in oo[len(rr):]:
                cause = ("extra segment alloc" if item[0] in SEGMENT_ALLOCS
                         else "extra segment free" if item[0] in SEGMENT_FREES else "extra oom")
                detail = dict(base, real=None, ours=self.describe(item))
                self.count(_kind(item[0]), False, cause, detail)

    def describe(self, item: tuple) -> dict[str, Any]:
        action, addr, size = item
        out = {"action": action, "size": size}
        if action != "oom":
            out.update(self.where(addr))
        return out

    def compare_alloc(self, i: int, aid: int, size: int, stream: int, failed: bool) -> None:
        real_addr = self.real_alloc[aid]
        if failed or aid not in self.policy.live:
            self.count("alloc", False, "oom instead of alloc",
                       {"event_index": i, "request_kind": "alloc", "alloc_id": aid, "request_size": size,
                        "stream": stream, "real": self.where(real_addr), "ours": None})
            return
        ours = self.to_real(self.policy.live[aid][0])
        if ours == real_addr:
            self.count("alloc", True)
            return
        real_where, our_where = self.where(real_addr), self.where(ours)
        same = real_where["segment"] is not None and real_where["segment"] == our_where["segment"]
        self.count("alloc", False, "wrong offset" if same else "wrong segment",
                   {"event_index": i, "request_kind": "alloc", "alloc_id": aid, "request_size": size,
                    "rounded_size": self.policy.rounded_size(size), "stream": stream,
                    "pool": "small" if self.policy.rounded_size(size) <= K_SMALL_SIZE else "large",
                    "real": real_where, "ours": our_where,
                    "our_block_size": self.policy.live[aid][2]})

    # ------------------------------------------------------------------ summary
    def report(self) -> dict[str, Any]:
        dec = self.trace.decisions
        seg = dec[dec["action"].isin(SEGMENT_ALLOCS + SEGMENT_FREES)]
        signed = np.where(seg["action"].isin(SEGMENT_ALLOCS).to_numpy(), 1, -1) * seg["size_bytes"].to_numpy()
        series = self.real_start_reserved + np.concatenate([[0], np.cumsum(signed)])
        ours = self.policy.decisions
        our_allocs = [s for a, _x, s, _st in ours if a in SEGMENT_ALLOCS]
        our_frees = [s for a, _x, s, _st in ours if a in SEGMENT_FREES]
        real_allocs = seg.loc[seg["action"].isin(SEGMENT_ALLOCS), "size_bytes"].tolist()
        real_frees = seg.loc[seg["action"].isin(SEGMENT_FREES), "size_bytes"].tolist()
        modes: dict[str, int] = {}
        for point in self.recorded.release_points:
            modes[point["mode"]] = modes.get(point["mode"], 0) + 1
        peak = int(series.max())
        demands = [p["failed_demand_bytes"] for p in self.recorded.release_points if "failed_demand_bytes" in p]
        capacity = None
        if demands:
            # One fixed device capacity C explains every OOM-path point iff reserved + the failed
            # cudaMalloc > C >= every reserved level the run reached: i.e. min(demand) > peak.
            capacity = {"oom_path_points": len(demands), "lowest_failed_demand_bytes": int(min(demands)),
                        "real_peak_reserved_bytes": peak, "consistent_with_one_capacity": min(demands) > peak}
        self.policy.check_invariants()
        return {
            "device": self.device,
            "decisions": self.n_decisions,
            "matched": self.n_matched,
            "match_rate": self.n_matched / self.n_decisions if self.n_decisions else 1.0,
            "by_kind": {k: {"decisions": v[0], "matched": v[1]} for k, v in sorted(self.kinds.items())},
            "mismatch_causes": dict(sorted(self.causes.items(), key=lambda kv: -kv[1])),
            "first_mismatch": self.first,
            "mismatches": self.examples,
            "real_start_reserved_bytes": int(self.real_start_reserved),
            "real_peak_reserved_bytes": peak,
            "predicted_peak_reserved_bytes": int(self.sim.peak_reserved_bytes),
            "real_final_reserved_bytes": int(series[-1]),
            "predicted_final_reserved_bytes": int(self.sim.reserved_bytes),
            "real_segment_allocs": len(real_allocs),
            "predicted_segment_allocs": len(our_allocs),
            "real_segment_alloc_bytes": int(sum(real_allocs)),
            "predicted_segment_alloc_bytes": int(sum(our_allocs)),
            "real_segment_frees": len(real_frees),
            "predicted_segment_frees": len(our_frees),
            "real_segment_sizes": _histogram(real_allocs),
            "predicted_segment_sizes": _histogram(our_allocs),
            "expandable_segments": self.expandable,
            "streams": int(self.trace.events["stream"].nunique()),
            "inferred_releases": modes,
            "oom_path_capacity_check": capacity,
            "release_points": self.recorded.release_points,
            "inferred_capacity_bytes": self.recorded.capacity_bytes,
            "inferred_capacity_source": self.recorded.capacity_source,
            "start_state_notes": self.start_notes,
            "_address_order": self.sim.address_order,
        }


def _kind(action: str) -> str:
    return "segment_alloc" if action in SEGMENT_ALLOCS else "segment_free" if action in SEGMENT_FREES else action


def _kind_name(kind: int) -> str:
    return {ALLOC: "alloc", FREE_REQUESTED: "free_requested", FREE_COMPLETED: "free_completed",
            EMPTY_CACHE: "empty_cache", int(EventKind.MARKER): "marker"}.get(kind, "end of trace")


def _cause_missing(item: tuple, other: tuple | None, mode: str | None) -> str:
    action = item[0]
    same = other is not None and _kind(other[0]) == _kind(action)
    if action in SEGMENT_ALLOCS:
        if same:
            return "wrong segment size" if other[2] != item[2] else "wrong segment address"
        return "missing segment alloc"
    if action in SEGMENT_FREES:
        if same:
            return "wrong segment freed"
        return "unexplained segment free" if mode is None else "missing segment free"
    return "missing oom"


def _histogram(sizes: list[int]) -> dict[str, int]:
    out: dict[int, int] = {}
    for s in sizes:
        out[s] = out.get(s, 0) + 1
    return {str(k): v for k, v in sorted(out.items())}


# ---------------------------------------------------------------------- entry points
def check_trace(trace: Trace, device: int | None = None, *, capacity_bytes: int | None = None,
                address_order: str | None = None, recorded_addresses: bool = True) -> dict[str, Any]:
    """Compare one device (or every device) of a snapshot trace; return the report dict.

    With ``device`` the result is that device's report; without, ``{"file", "devices": {...}}``.
    ``capacity_bytes`` replays on a device of that size instead of forcing the inferred OOM paths
    and the recorded OOMs (the real capacity is rarely known; see the module docstring).
    ``recorded_addresses=False`` lets the simulated device place the segments the replay makes
    (in ``address_order``, default the preset's: the driver's) instead of handing it the recorded
    addresses: how well the address rule predicts the recorded tie-breaks.
    """
    devices = trace.devices
    options = {"capacity_bytes": capacity_bytes, "address_order": address_order,
               "recorded_addresses": recorded_addresses}
    if device is not None:
        if device not in devices:
            raise AllocsimError(f"{trace.meta.source or 'trace'}: no device {device} (devices: {devices})")
        return check_device(trace, device, **options)
    return {"file": trace.meta.source,
            "devices": {str(d): check_device(trace, d, **options) for d in devices}}


def check_device(trace: Trace, device: int, *, capacity_bytes: int | None = None, address_order: str | None = None,
                 recorded_addresses: bool = True) -> dict[str, Any]:
    """Replay one device of ``trace`` through the pytorch preset and compare every decision."""
    if trace.meta.format != "pytorch-snapshot":
        raise AllocsimError(f"{trace.meta.source or 'trace'} is a {trace.meta.format} trace: only PyTorch "
                            "snapshots record the allocator's decisions")
    sub = trace if trace.devices == [device] else trace.for_device(device)
    report = _DeviceCheck(sub, device, capacity_bytes, address_order=address_order,
                          recorded_addresses=recorded_addresses).run()
    report["capacity_bytes"] = capacity_bytes
    report["file"] = trace.meta.source
    report["recorded_addresses"] = recorded_addresses
    report["address_order"] = report.pop("_address_order")
    return report


def check_snapshot(path: str | os.PathLike, device: int | None = None, *, capacity_bytes: int | None = None,
                   address_order: str | None = None, recorded_addresses: bool = True) -> dict[str, Any]:
    """Read a PyTorch memory snapshot and compare the preset's decisions with the recorded ones."""
    trace = read_trace(path)
    return check_trace(trace, device, capacity_bytes=capacity_bytes, address_order=address_order,
                       recorded_addresses=recorded_addresses)


# ---------------------------------------------------------------------- text
def _b(n: int | None) -> str:
    return "-" if n is None else f"{n:,}"


def _where(w: dict[str, Any] | None) -> str:
    if not w:
        return "nothing"
    seg = w.get("segment")
    text = f"{w.get('action', 'block')}"
    if "size" in w:
        text += f" {_b(w['size'])} B"
    if w.get("addr", -1) is not None and w.get("addr", -1) >= 0:
        text += f" at {w['addr']:#x}"
    if seg is not None:
        text += f" (segment {seg:#x} + {w['offset']:,})"
    return text


def format_device(rep: dict[str, Any]) -> str:
    """A readable report for one device."""
    lines = [f"device {rep['device']}: {rep['matched']:,} of {rep['decisions']:,} decisions matched "
             f"({100 * rep['match_rate']:.2f} %)"
             + ("  [expandable segments]" if rep["expandable_segments"] else "")
             + f"  streams: {rep['streams']}"
             + ("" if rep.get("recorded_addresses", True)
                else f"  [segments placed by the device, {rep.get('address_order')} order]")]
    for kind, v in rep["by_kind"].items():
        lines.append(f"  {kind:<14} {v['matched']:>7,} / {v['decisions']:<7,}")
    lines.append(f"  peak reserved   real {_b(rep['real_peak_reserved_bytes'])} B   predicted "
                 f"{_b(rep['predicted_peak_reserved_bytes'])} B   (error "
                 f"{_b(rep['predicted_peak_reserved_bytes'] - rep['real_peak_reserved_bytes'])} B)")
    lines.append(f"  final reserved  real {_b(rep['real_final_reserved_bytes'])} B   predicted "
                 f"{_b(rep['predicted_final_reserved_bytes'])} B   (start {_b(rep['real_start_reserved_bytes'])} B)")
    lines.append(f"  segment allocs  real {rep['real_segment_allocs']} ({_b(rep['real_segment_alloc_bytes'])} B)"
                 f"   predicted {rep['predicted_segment_allocs']} ({_b(rep['predicted_segment_alloc_bytes'])} B)")
    lines.append(f"  segment frees   real {rep['real_segment_frees']}   predicted {rep['predicted_segment_frees']}")
    if rep["real_segment_sizes"] != rep["predicted_segment_sizes"]:
        lines.append(f"  segment sizes   real {rep['real_segment_sizes']}")
        lines.append(f"                  predicted {rep['predicted_segment_sizes']}")
    if rep["inferred_releases"]:
        lines.append("  releases inferred from the trace: "
                     + ", ".join(f"{k} x{v}" for k, v in rep["inferred_releases"].items()))
    cap = rep.get("oom_path_capacity_check")
    if cap:
        lines.append(f"  OOM-path points: reserved + failed cudaMalloc >= {_b(cap['lowest_failed_demand_bytes'])} B"
                     f" vs real peak {_b(cap['real_peak_reserved_bytes'])} B: "
                     + ("consistent with one device capacity" if cap["consistent_with_one_capacity"]
                        else "NOT explained by one fixed capacity (memory used outside the allocator varied, "
                             "or these were empty_cache calls)"))
    for note in rep["start_state_notes"]:
        lines.append(f"  start state: {note}")
    if rep["mismatch_causes"]:
        lines.append("  mismatches by cause: " + ", ".join(f"{k}: {v}" for k, v in rep["mismatch_causes"].items()))
        first = rep["first_mismatch"]
        lines.append(f"  first mismatch at event {first['event_index']} ({first['request_kind']} of "
                     f"{_b(first.get('request_size'))} B on stream {first.get('stream')}): {first['cause']}")
        lines.append(f"    real:  {_where(first.get('real'))}")
        lines.append(f"    ours:  {_where(first.get('ours'))}")
        if first.get("release_mode"):
            lines.append(f"    release inferred: {first['release_mode']}")
        if "free_blocks_seen" in first:
            lines.append(f"    free blocks of that stream and pool before the request "
                         f"({first['free_blocks_seen_total']}):")
            for blk in first["free_blocks_seen"][:16]:
                lines.append(f"      {_where(blk)}")
    return "\n".join(lines)


def format_report(report: dict[str, Any]) -> str:
    """A readable report: one device's dict or the ``{"file", "devices"}`` dict."""
    if "devices" in report:
        parts = [f"{report['file']}"] + [format_device(rep) for rep in report["devices"].values()]
        return "\n".join(parts)
    return f"{report['file']}\n" + format_device(report)
