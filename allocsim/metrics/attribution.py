"""Where reserved memory goes: split it EXACTLY into causes, at sampled moments and at the peak.

``attribute(policy)`` splits ``policy.reserved_bytes`` right now into the parts of ``CATEGORIES``;
they always add up to reserved, to the byte. ``AttributionObserver`` does it during a run (every
``every`` events and at each new reserved peak, so the last forced sample *is* the peak) and also
keeps the segment map at the peak; ``allocsim.runner.attribute_run`` runs a trace with one attached.

The parts, for a stack ``adaptors... -> placing policy -> SimulatedDevice``:

``live_requested``
    bytes the program asked for, of allocations alive and not freed (top of the stack).
``rounding``
    allocated - requested of those blocks: the policy's size rounding (512 B, 256 B, Paddle's
    64 B header, a whole unsplit block handed out).
``pending_free``
    whole blocks the program freed whose stream-ordered free has not completed yet.
``gc_queue``
    blocks freed and completed but held in a deferred-GC queue (``DeferredGC.queued_bytes``).
``stranded``
    free cached blocks of a stream-bound pool that belong to a stream other than the *reference
    stream*: the stream of the most recent allocation request (``last_stream``), which at the
    reserved peak is the request that made the peak. Only other streams could reuse them. Zero
    for pools any stream may use, and on single-stream traces.
``free_slivers``
    the rest of the free blocks inside partly used segments: remainders left by splits (and,
    for expandable segments, the parts of free blocks that are not whole pages).
``cached_segments``
    free memory the policy's ``empty_cache`` would give back: wholly free segments (chunks), or
    for PyTorch's expandable segments every whole mapped page inside a free block.
``device_rounding``
    what the device reserves beyond what the policy asked for: cudaMalloc's 2 MiB granularity on
    segments (pools) or on each request (``direct``, whose blocks are device allocations).

Precedence: a free block of another stream is ``stranded`` even if its segment is wholly free.
The pytorch preset is read from outside (its free lists, ``_expandable`` page state and
``last_stream``); nothing here changes a policy.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import TYPE_CHECKING, Any, Callable, Iterable

from ..policies.base import Policy
from ..policies.direct import DirectPolicy
from ..policies.freelist import ADDR_BITS, ADDR_MASK, FreeList
from ..policies.pool import PoolPolicy

if TYPE_CHECKING:
    import pandas as pd

#: The parts of reserved memory, bottom of a stacked chart first.
CATEGORIES = ("live_requested", "rounding", "pending_free", "gc_queue", "stranded",
              "free_slivers", "cached_segments", "device_rounding")

#: Legend text for each part (for readers who have not seen the code).
LABELS = {
    "live_requested": "live data (bytes requested)",
    "rounding": "rounding inside live blocks",
    "pending_free": "freed, waiting for stream-ordered free",
    "gc_queue": "freed, held in deferred-GC queue",
    "stranded": "free, but cached for another stream",
    "free_slivers": "free pieces of partly used segments",
    "cached_segments": "free, releasable by empty_cache",
    "device_rounding": "device granularity rounding (2 MiB pages)",
}

#: Segment-map block states, in drawing order.
SEGMENT_STATES = ("requested", "rounding", "pending_free", "gc_queue", "free", "stranded", "device_rounding")


class AttributionError(AssertionError):
    """The parts did not add up to reserved memory (a bug in a policy or here)."""


# ----------------------------------------------------------------------------- the stack
def stack_layers(policy: Policy) -> list[Policy]:
    """The policies of a stack, top first (adaptors, then the policy that places blocks)."""
    layers = [policy]
    while isinstance(layers[-1].upstream, Policy):
        layers.append(layers[-1].upstream)
    return layers


def reference_stream(policy: Policy) -> int:
    """The stream of the most recent allocation request (what ``stranded`` is relative to)."""
    return int(getattr(stack_layers(policy)[-1], "last_stream", 0))


def _live_split(top: Policy) -> tuple[int, int]:
    """(requested, allocated) bytes of live blocks whose free has not been requested."""
    live = top.live
    pending_requested = sum(live[aid][1] for aid in top.pending)
    requested = top.requested_bytes - pending_requested
    return requested, top.allocated_bytes - top.pending_free_bytes


def _expandable_pools(pool: PoolPolicy) -> dict[int, Any]:
    """``id(FreeList) -> ExpandableSegments`` of a PyTorch policy with expandable segments, else {}."""
    segs = getattr(pool, "_expandable", None)
    return {id(e.pool): e for e in segs.values()} if segs else {}


def _releasable_pages(addr: int, size: int, base: int, page: int) -> int:
    """Bytes of whole pages (aligned to the segment ``base``) inside the free block ``[addr, addr+size)``."""
    begin = base + -(-(addr - base) // page) * page
    end = base + (addr + size - base) // page * page
    return max(end - begin, 0)


def _free_parts(pool: PoolPolicy, stream: int) -> dict[str, int]:
    """Split the pool's free blocks into stranded / cached_segments / free_slivers."""
    stranded = cached = slivers = 0
    bound = bool(getattr(pool, "stream_bound", False))
    expandable = _expandable_pools(pool)
    for fl in pool.pools:
        exp = expandable.get(id(fl))
        starts = sorted(fl.segment_size_at) if exp is not None else None
        seg_size_at = fl.segment_size_at
        for skey, blocks in fl.by_stream.items():
            if bound and skey != stream:
                stranded += sum(key >> ADDR_BITS for key in blocks)   # only another stream may reuse them
                continue
            for key in blocks:
                size = key >> ADDR_BITS
                addr = key & ADDR_MASK
                if exp is not None:
                    base = starts[bisect_right(starts, addr) - 1]
                    pages = _releasable_pages(addr, size, base, exp.page_bytes)
                    cached += pages
                    slivers += size - pages
                elif seg_size_at.get(addr) == size:
                    cached += size
                else:
                    slivers += size
    return {"stranded": stranded, "cached_segments": cached, "free_slivers": slivers}


def attribute(policy: Policy, stream: int | None = None) -> dict[str, int]:
    """Split ``policy.reserved_bytes`` now into ``CATEGORIES`` (ints that add up to it exactly).

    ``stream`` is the reference stream for ``stranded`` (default: the last request's stream).
    Raises ``AttributionError`` if the parts do not add up (which would be a bookkeeping bug).
    """
    layers = stack_layers(policy)
    top, bottom = layers[0], layers[-1]
    parts = dict.fromkeys(CATEGORIES, 0)
    requested, allocated = _live_split(top)
    parts["live_requested"] = requested
    parts["rounding"] = allocated - requested
    parts["pending_free"] = top.pending_free_bytes
    parts["gc_queue"] = sum(int(getattr(layer, "queued_bytes", 0)) for layer in layers[:-1])
    reserved = policy.reserved_bytes
    if isinstance(bottom, PoolPolicy):
        ref = reference_stream(policy) if stream is None else stream
        parts.update(_free_parts(bottom, ref))
        parts["device_rounding"] = bottom.device.reserved_bytes - bottom.segment_bytes()
    elif isinstance(bottom, DirectPolicy):
        # Each block is a cudaMalloc of exactly the request: its rounding is the device's.
        parts["device_rounding"] = parts["rounding"]
        parts["rounding"] = 0
        parts["cached_segments"] = reserved - bottom.allocated_bytes
    else:
        # A policy this module does not know: what it holds beyond its blocks counts as cache.
        parts["cached_segments"] = reserved - bottom.allocated_bytes
    total = sum(parts.values())
    if total != reserved or min(parts.values()) < 0:
        raise AttributionError(f"{policy.name}: parts {parts} add up to {total}, reserved is {reserved}")
    return parts


# ----------------------------------------------------------------------------- segment map
def _segments_of(bottom: PoolPolicy) -> list[tuple[int, int, int, str, FreeList]]:
    """(addr, size, stream, pool name, free list) of every segment; expandable ones as mapped runs."""
    names = {id(bottom.small): "small", id(bottom.large): "large"} if len(bottom.pools) > 1 else {}
    expandable = _expandable_pools(bottom)
    out = []
    for fl in bottom.pools:
        name = names.get(id(fl), "pool")
        exp = expandable.get(id(fl))
        for addr, size in fl.segment_size_at.items():
            stream = fl.segment_stream(addr)
            if exp is None:
                out.append((addr, size, stream, name, fl))
                continue
            cursor, end = addr, addr + size
            holes = sorted((a, s) for a, s in exp.unmapped.size_at.items() if addr <= a < end)
            for hole, length in holes + [(end, 0)]:
                if hole > cursor:
                    out.append((cursor, hole - cursor, stream, name, fl))
                cursor = hole + length
    huge = getattr(bottom, "huge_chunks", None)   # paddle-naive's direct cudaMallocs
    for addr, size in (huge() if huge is not None else {}).items():
        out.append((addr, size, -1, "huge", bottom.large))
    return sorted(out)


def segment_table(policy: Policy) -> pd.DataFrame:
    """One row per piece of every segment now: the data of a segment map.

    Columns: ``segment`` (0.. in address order), ``segment_addr``, ``segment_bytes``, ``stream``,
    ``pool``, ``offset_bytes`` (from the segment start), ``size_bytes``, ``state`` (one of
    ``SEGMENT_STATES``; ``stranded`` is a free block cached for a stream other than the last
    request's, as in ``attribute``). A live block is two pieces: its requested bytes and its rounding. For
    ``direct`` every allocation is its own segment; expandable segments appear as mapped runs.
    """
    layers = stack_layers(policy)
    top, bottom = layers[0], layers[-1]
    state_at: dict[int, tuple[str, int, int]] = {}
    for aid, (addr, req, alloc, _stream) in top.live.items():
        if alloc:
            state_at[addr] = ("pending_free" if aid in top.pending else "live", req, alloc)
    rows: list[tuple] = []
    device = bottom.device
    if isinstance(bottom, PoolPolicy):
        segments = _segments_of(bottom)
        expandable = bool(_expandable_pools(bottom))
        starts = [s[0] for s in segments]
        pieces: list[list[tuple[int, int, str]]] = [[] for _ in segments]

        def place(addr: int, size: int, state: str) -> None:
            pieces[bisect_right(starts, addr) - 1].append((addr, size, state))

        bound = bool(getattr(bottom, "stream_bound", False))
        ref = reference_stream(policy)
        for fl in bottom.pools:
            for addr, size, skey in fl.blocks():
                place(addr, size, "stranded" if bound and skey != ref else "free")
        for addr, _req, alloc, _stream in bottom.live.values():
            if alloc:
                _add_block(place, addr, alloc, state_at.get(addr))
        for k, (seg_addr, seg_size, stream, pool, _fl) in enumerate(segments):
            for addr, size, state in sorted(pieces[k]):
                rows.append((k, seg_addr, seg_size, stream, pool, addr - seg_addr, size, state))
            extra = device.footprint(seg_size) - seg_size
            if extra > 0 and not expandable:
                rows.append((k, seg_addr, seg_size, stream, pool, seg_size, extra, "device_rounding"))
    else:
        # No pool: each live block is its own device allocation (``direct``). For a policy this module
        # does not know, its cache is not drawn and its rounding stays the policy's own.
        waste = "device_rounding" if isinstance(bottom, DirectPolicy) else "rounding"
        for k, (addr, req, alloc, stream) in enumerate(sorted(bottom.live.values())):
            if not alloc:
                continue
            top_state = state_at.get(addr)
            if top_state is None or top_state[0] != "live":
                state = "gc_queue" if top_state is None else top_state[0]
                rows.append((k, addr, alloc, stream, bottom.name, 0, alloc, state))
                continue
            rows.append((k, addr, alloc, stream, bottom.name, 0, req, "requested"))
            if alloc > req:
                rows.append((k, addr, alloc, stream, bottom.name, req, alloc - req, waste))
    import pandas as pd

    return pd.DataFrame(rows, columns=["segment", "segment_addr", "segment_bytes", "stream", "pool",
                                       "offset_bytes", "size_bytes", "state"]).astype(
        {"segment": "int64", "segment_addr": "int64", "segment_bytes": "int64", "stream": "int64",
         "offset_bytes": "int64", "size_bytes": "int64"})


def _add_block(place: Callable[[int, int, str], None], addr: int, alloc: int,
               top_state: tuple[str, int, int] | None) -> None:
    """Place one live block of the placing policy: queued, pending, or requested + rounding."""
    if top_state is None:
        place(addr, alloc, "gc_queue")
        return
    state, req, _alloc = top_state
    if state == "pending_free":
        place(addr, alloc, "pending_free")
        return
    if req:
        place(addr, min(req, alloc), "requested")
    if alloc > req:
        place(addr + req, alloc - req, "rounding")


# ----------------------------------------------------------------------------- observer
class AttributionObserver:
    """Engine observer: ``attribute`` every ``every`` events, whenever memory moved, and at each new peak.

    Pass it as ``simulate(..., observer=obs)``. A sample is taken at each new reserved peak, every
    ``every`` events, and whenever allocated or reserved bytes moved by ``resolution`` x the peak so
    far since the last sample (so a plot of the samples follows the memory curve at any trace
    length; ``resolution=None`` turns that off, ``every=None`` the periodic samples).

    After the run: ``table()`` is the time series (one row per sample: ``row`` of the run's time
    series, ``event_index``, ``reserved_bytes``, the parts, ``at_peak``), ``peak`` the parts at the
    (first) reserved peak, ``peak_segments`` the segment map there, ``segments_at`` the maps at
    the events in ``snapshot_events``. Every sample is checked to add up to reserved.
    """

    def __init__(self, every: int | None = 1000, *, resolution: float | None = 0.01,
                 segments_at_peak: bool = True, snapshot_events: Iterable[int] = ()):
        if every is not None and every < 1:
            raise ValueError(f"every must be >= 1 or None, got {every}")
        self.every = every
        self.resolution = resolution
        self.segments_at_peak = segments_at_peak
        self.snapshot_events = set(int(e) for e in snapshot_events)
        self.segments_at: dict[int, pd.DataFrame] = {}
        self.calls = 0
        self.peak_reserved = -1
        self.peak: dict[str, int] | None = None
        self.peak_event_index: int | None = None
        self.peak_row: int | None = None
        self.peak_segments: pd.DataFrame | None = None
        self.policy: Policy | None = None
        self._rows: list[tuple] = []
        self._last_row = -1
        self._last_event = -1
        self._last_reserved = 0
        self._last_allocated = 0

    def __call__(self, event_index: int, policy: Policy) -> None:
        row = self.calls
        self.calls += 1
        self.policy = policy
        self._last_event = event_index
        reserved = policy.reserved_bytes
        new_peak = reserved > self.peak_reserved
        if new_peak:
            self.peak_reserved = reserved
        if event_index in self.snapshot_events:
            self.segments_at[event_index] = segment_table(policy)
        due = new_peak or (self.every is not None and row % self.every == 0)
        if not due and self.resolution is not None:
            moved = abs(reserved - self._last_reserved) + abs(policy.allocated_bytes - self._last_allocated)
            due = moved > self.resolution * self.peak_reserved
        if due:
            parts = self._sample(row, event_index, policy)
            if new_peak:
                self.peak, self.peak_event_index, self.peak_row = parts, event_index, row
                if self.segments_at_peak:
                    self.peak_segments = segment_table(policy)

    def _sample(self, row: int, event_index: int, policy: Policy) -> dict[str, int]:
        parts = attribute(policy)
        self._last_reserved = policy.reserved_bytes
        self._last_allocated = policy.allocated_bytes
        self._rows.append((row, event_index, policy.reserved_bytes, *parts.values()))
        self._last_row = row
        return parts

    def finish(self) -> None:
        """Sample the final state too (``attribute_run`` calls it after the run)."""
        if self.policy is not None and self._last_row != self.calls - 1:
            self._sample(self.calls - 1, self._last_event, self.policy)

    def table(self) -> pd.DataFrame:
        """The samples in run order; ``at_peak`` marks the reserved peak's row."""
        import pandas as pd

        columns = ["row", "event_index", "reserved_bytes", *CATEGORIES]
        df = pd.DataFrame(self._rows, columns=columns).astype("int64")
        df["at_peak"] = df["row"] == (self.peak_row if self.peak_row is not None else -1)
        return df


def with_time(table: pd.DataFrame, timeseries: pd.DataFrame) -> pd.DataFrame:
    """Add the run's time columns (``t_ns``, and ``sim_t_ns`` in SimPy mode) and true event index by ``row``."""
    out = table.copy()
    rows = out["row"].to_numpy()
    for col in ("event_index", "t_ns", "sim_t_ns"):
        if col in timeseries.columns:
            out[col] = timeseries[col].to_numpy()[rows]
    return out


def peak_summary(observer: AttributionObserver) -> dict[str, Any]:
    """JSON-ready parts at the peak: ``{"event_index", "reserved_bytes", "parts": {...}}``."""
    return {"event_index": observer.peak_event_index, "reserved_bytes": observer.peak_reserved,
            "parts": dict(observer.peak or {})}
