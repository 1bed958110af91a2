"""Which code sites cause the waste at the reserved peak: a ``WasteTracker`` observes a replay and charges it.

Waste is reserved memory that holds no requested byte: ``reserved - live requested`` at the run's
peak of reserved memory, split by cause exactly as ``attribution.attribute`` splits it, and here
charged to code sites (stacks; ``sites`` turns them into rows):

- ``rounding`` (and ``device_rounding`` of a ``direct`` policy's blocks), ``pending_free``,
  ``gc_queue``: the site of the block's allocation;
- ``free_slivers``: the site of the allocation that last occupied those bytes, i.e. whose free left
  the sliver behind; bytes no allocation has occupied yet (the remainder of a segment's first
  split) go to the site that allocated the segment;
- ``cached_segments`` and ``stranded``: the site that allocated the segment (for expandable
  segments: the site whose request mapped the page, i.e. whose block covered it);
- ``device_rounding`` of a pool: the site that allocated the segment.

Segments present when the recording began, and allocations without frames, have no site: their
bytes are ``unattributed``. Anything the walk could not place (a policy this module does not know)
is unattributed too and counted in ``unexplained``; the charges always add up to the waste.

How: the run's own policy, built fresh, replays the trace up to the peak with this engine observer
(``allocsim.runner.waste_by_site`` runs ``engine.run_fast(..., observer=WasteTracker(...))``) that logs every block freed (the last freed over a byte is its
last occupant, looked up at the peak only where a sliver lies: ``ranges.LastOwners``) and the
segment (or pages) each request made the allocator take. Nothing in the engine or the policies changes.
"""

from __future__ import annotations

import dataclasses
from array import array
from bisect import bisect_right
from typing import Any

import numpy as np

from ...policies.base import Policy
from ...policies.direct import DirectPolicy
from ...policies.freelist import ADDR_BITS, ADDR_MASK
from ...policies.pool import PoolPolicy
from ...trace.schema import EventKind, Trace
from ..attribution import _expandable_pools, _releasable_pages, attribute, reference_stream, stack_layers
from ..ranges import LastOwners, RangeOwners
from .rows import SiteAccountingError

#: The causes of waste, as ``attribution.CATEGORIES`` names them (live requested bytes are not waste).
WASTE_CAUSES = ("rounding", "pending_free", "gc_queue", "stranded", "free_slivers", "cached_segments",
                "device_rounding")
NO_STACK = -1
_ALLOC, _FREE_COMPLETED = int(EventKind.ALLOC), int(EventKind.FREE_COMPLETED)


@dataclasses.dataclass
class WasteCharges:
    """Waste at one moment, charged to stacks: ``charges[(stack_id, cause)] = [bytes, pieces]``."""

    event_index: int
    reserved_bytes: int
    live_requested_bytes: int
    charges: dict[tuple[int, str], list[int]]
    unexplained: dict[str, int]   #: bytes of a cause the walk could not place (charged to no stack)

    @property
    def waste_bytes(self) -> int:
        return self.reserved_bytes - self.live_requested_bytes


class WasteTracker:
    """Engine observer: logs blocks freed and segments grown until the ``target`` event, then charges."""

    def __init__(self, trace: Trace, target: int):
        self.target = target
        self.kinds = trace.column("kind").tolist()
        self.ids = trace.column("alloc_id").tolist()
        self.stacks = trace.column("stack_id").tolist()
        init = trace.initial_allocs
        self.initial_stack = dict(zip(init["alloc_id"].tolist(), init["stack_id"].tolist()))
        #: allocation the placing policy holds -> (block start, block end, stack)
        self.held: dict[int, tuple[int, int, int]] = {}
        #: (start, end, stack) of every block freed, in order: the last one over a byte occupied it last
        self.freed = array("q")
        self.owner = RangeOwners()      # bytes -> stack whose request made the allocator take them
        self.grown = 0
        self.bottom: Policy | None = None
        self.result: WasteCharges | None = None

    def __call__(self, event_index: int, policy: Policy) -> None:
        bottom = self.bottom
        if bottom is None:
            bottom = self.bottom = stack_layers(policy)[-1]
        if event_index < 0:
            for aid, (addr, _req, alloc, _stream) in bottom.live.items():
                self.held[aid] = (addr, addr + alloc, int(self.initial_stack.get(aid, NO_STACK)))
            self.grown = _device_growth(bottom)
        else:
            kind = self.kinds[event_index]
            if kind == _ALLOC:
                aid = self.ids[event_index]
                block = bottom.live.get(aid)
                if block is not None:
                    stack = self.stacks[event_index]
                    self.held[aid] = (block[0], block[0] + block[2], stack)
                    grown = _device_growth(bottom)
                    if grown != self.grown:
                        self.grown = grown
                        self._owns_new_memory(bottom, block[0], block[2], stack)
            elif kind == _FREE_COMPLETED:
                aid = self.ids[event_index]
                if aid not in bottom.live:
                    span = self.held.pop(aid, None)
                    if span is not None and span[1] > span[0]:
                        self.freed.extend(span)
                if len(self.held) > 2 * len(bottom.live) + 1024:
                    # An adaptor (deferred GC) freed queued blocks below it: log them as freed.
                    for gone in [a for a in self.held if a not in bottom.live]:
                        self.freed.extend(self.held.pop(gone))
        if event_index == self.target:
            stack_of = {aid: span[2] for aid, span in self.held.items()}
            occupant = LastOwners(np.frombuffer(self.freed, dtype=np.int64).reshape(-1, 3))
            self.result = charge(policy, stack_of, occupant, self.owner, event_index)

    def _owns_new_memory(self, bottom: Policy, addr: int, size: int, stack: int) -> None:
        """The request at ``addr`` made the allocator grow: its segment (or the pages its block covers) is its own."""
        if not isinstance(bottom, PoolPolicy):
            return
        found = _segment_holding(bottom.pools, addr)
        if found is None:
            return
        fl, base, seg_size = found
        exp = _expandable_pools(bottom).get(id(fl))
        if exp is None:
            self.owner.assign(base, base + seg_size, stack)
        else:
            page = exp.page_bytes
            begin = base + (addr - base) // page * page
            end = base + -(-(addr + max(size, 1) - base) // page) * page
            self.owner.assign(begin, end, stack)


def _device_growth(bottom: Policy) -> int:
    """Device allocations and page maps so far (a change: the last request made the allocator grow)."""
    dev = bottom.device
    return int(dev.n_mallocs) + int(getattr(dev, "n_maps", 0))


def _segment_holding(pools: list, addr: int) -> tuple[Any, int, int] | None:
    """(pool, start, size) of the segment holding ``addr``, or None.

    A block placed in a new segment starts it, so one lookup per pool finds it; only a block inside
    an expandable segment's range (few segments per pool) needs the scan of ``segment_of``. Reading
    the pools' whole segment tables here instead would cost O(segments) per growth.
    """
    for fl in pools:
        size = fl.segment_size(addr)
        if size is not None:
            return fl, addr, size
    for fl in pools:
        try:
            start = fl.segment_of(addr)
        except KeyError:
            continue
        return fl, start, fl.segment_size(start)
    return None


# ----------------------------------------------------------------------------- charging
def charge(policy: Policy, stack_of: dict[int, int], occupant: "LastOwners | RangeOwners", owner: RangeOwners,
           event_index: int) -> WasteCharges:
    """Charge ``policy``'s waste now to stacks (see the module doc); checked against ``attribute``."""
    layers = stack_layers(policy)
    top, bottom = layers[0], layers[-1]
    charges: dict[tuple[int, str], list[int]] = {}

    def add(stack: Any, cause: str, size: int) -> None:
        if size <= 0:
            return
        key = (NO_STACK if stack is None else int(stack), cause)
        entry = charges.setdefault(key, [0, 0])
        entry[0] += size
        entry[1] += 1

    def by_map(first: RangeOwners, cause: str, start: int, end: int, fallback: RangeOwners | None = None) -> None:
        for size, who in first.pieces(start, end):
            if who is None and fallback is not None:
                for sub, w in fallback.pieces(start, start + size):
                    add(w, cause, sub)
            else:
                add(who, cause, size)
            start += size

    direct = isinstance(bottom, DirectPolicy)
    for aid, (_addr, req, alloc, _stream) in top.live.items():
        stack = stack_of.get(aid, NO_STACK)
        if aid in top.pending:
            add(stack, "pending_free", alloc)
        else:
            add(stack, "device_rounding" if direct else "rounding", alloc - req)
    # The bottom's ids are its own (a deferred-GC layer hands it fresh ones): queued blocks are the
    # ones each layer holds in its queue, charged to the site of the allocation they had.
    for layer in layers[:-1]:
        for upstream_id, aid in getattr(layer, "queued_alloc_id", {}).items():
            entry = bottom.live.get(upstream_id) if layer is layers[-2] else None
            if entry is not None:
                add(stack_of.get(aid, NO_STACK), "gc_queue", entry[2])
    if isinstance(bottom, PoolPolicy):
        requests = _free_block_requests(bottom, reference_stream(policy))
        if isinstance(occupant, LastOwners):
            occupant.resolve([(start, end) for which, _c, start, end in requests if which == "occupant"])
        for which, cause, start, end in requests:
            if which == "owner":
                by_map(owner, cause, start, end)
            else:
                by_map(occupant, cause, start, end, owner)
        expandable = _expandable_pools(bottom)
        footprint = bottom.device.footprint
        for fl in bottom.pools:
            if id(fl) in expandable:
                continue
            for addr, size in fl.segment_size_at.items():
                extra = footprint(size) - size
                if extra > 0:
                    add(owner.pieces(addr, addr + 1)[0][1], "device_rounding", extra)
    parts = attribute(policy)
    mine = dict.fromkeys(parts, 0)
    for (_stack, cause), (size, _n) in charges.items():
        mine[cause] += size
    unexplained = {}
    for cause in WASTE_CAUSES:
        extra = parts[cause] - mine[cause]
        if extra < 0:
            raise SiteAccountingError(f"{policy.name}: {cause} charged to sites {mine[cause]} bytes, "
                                      f"the attribution has {parts[cause]}")
        if extra:
            unexplained[cause] = extra
            add(None, cause, extra)
    return WasteCharges(event_index, policy.reserved_bytes, parts["live_requested"], charges, unexplained)


def _free_block_requests(bottom: PoolPolicy, stream: int) -> list[tuple[str, str, int, int]]:
    """Free blocks as ``(map, cause, start, end)``: stranded and cached bytes go by the segment's allocator
    (``owner``), slivers by their last occupant (``occupant``, else the segment's allocator)."""
    out: list[tuple[str, str, int, int]] = []
    bound = bool(getattr(bottom, "stream_bound", False))
    expandable = _expandable_pools(bottom)
    for fl in bottom.pools:
        exp = expandable.get(id(fl))
        seg_size_at = fl.segment_size_at   # once per pool: on the compiled route each read is a copy
        starts = sorted(seg_size_at) if exp is not None else None
        for skey, blocks in fl.by_stream.items():
            for key in blocks:
                size = key >> ADDR_BITS
                addr = key & ADDR_MASK
                if bound and skey != stream:
                    out.append(("owner", "stranded", addr, addr + size))
                elif exp is not None:
                    base = starts[bisect_right(starts, addr) - 1]
                    page = exp.page_bytes
                    begin = base + -(-(addr - base) // page) * page
                    pages = _releasable_pages(addr, size, base, page)
                    if pages:
                        out += [("occupant", "free_slivers", addr, begin),
                                ("owner", "cached_segments", begin, begin + pages),
                                ("occupant", "free_slivers", begin + pages, addr + size)]
                    else:
                        out.append(("occupant", "free_slivers", addr, addr + size))
                elif seg_size_at.get(addr) == size:
                    out.append(("owner", "cached_segments", addr, addr + size))
                else:
                    out.append(("occupant", "free_slivers", addr, addr + size))
    return [r for r in out if r[3] > r[2]]


def waste_total_check(charges: WasteCharges) -> int:
    """The charged bytes (always ``waste_bytes``)."""
    total = sum(size for size, _n in charges.charges.values())
    if total != charges.waste_bytes:
        raise SiteAccountingError(f"waste charged {total} bytes, reserved - live requested is {charges.waste_bytes}")
    return total


def stacks_and_causes(charges: WasteCharges) -> tuple[np.ndarray, list[str], np.ndarray, np.ndarray]:
    """The charges as arrays: stack ids, causes, bytes, pieces."""
    keys = list(charges.charges)
    stacks = np.array([k[0] for k in keys], dtype=np.int64)
    sizes = np.array([charges.charges[k][0] for k in keys], dtype=np.int64)
    pieces = np.array([charges.charges[k][1] for k in keys], dtype=np.int64)
    return stacks, [k[1] for k in keys], sizes, pieces
