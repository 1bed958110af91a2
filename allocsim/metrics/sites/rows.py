"""Who holds the memory: ``site_rows(trace, alloc_ids, sizes)`` groups bytes by code site, exactly.

A *site* is the innermost stack frame that belongs to the user's program (the rule, its fallbacks
and ``--site-filter`` are in ``rule``). Every table here has the same rows: the ``top`` sites
by bytes (ties: more allocations, then name), then ``other sites`` (the rest, together) and
``unattributed`` (allocations without recorded frames), each ``{"site", "bytes", "count",
"frames"}``; the rows always add up to the bytes given, to the byte. ``frames`` are the program
frames (site first, then its callers) of the stack that holds the most bytes of the row.

- ``live_at_peak(trace)``: the allocations alive at the trace's peak of live bytes (what the lower
  bound counts), for ``advise`` when nothing can fit;
- ``live_at_row(trace, timeseries, ooms, row)``: the allocations a run held at one row of its time
  series (their requested bytes equal that row's ``requested_bytes``, checked); ``report.run_sites``
  uses it at the peak of requested memory and at the first OOM;
- ``allocation_sites(trace)``: every allocation of the trace by site, by count and by bytes (``info``);
- the waste by site under a policy is ``waste``'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...trace.schema import EventKind, Trace
from .rule import KINETO_NOTE, NO_FRAMES, PADDLE_NOTE, SiteFilter, SiteIndex, source_format

OTHER, UNATTRIBUTED = "other sites", "unattributed"
#: Rows listed before "other sites" unless a caller says otherwise.
DEFAULT_TOP = 10
_LOW_BITS = 25
_LOW_MASK = (1 << _LOW_BITS) - 1


class SiteAccountingError(AssertionError):
    """Site rows did not add up to the bytes they split (a bug here or in the run's bookkeeping)."""


@dataclass
class SiteRows:
    """Top sites by bytes: rows of ``{"site", "bytes", "count", "frames"}`` and a note on what is missing."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"rows": list(self.rows), "note": self.note or None}

    @property
    def total_bytes(self) -> int:
        """What the rows add up to."""
        return sum(r["bytes"] for r in self.rows)


# ----------------------------------------------------------------------------- exact sums
def group_sums(groups: np.ndarray, values: np.ndarray, n_groups: int) -> list[int]:
    """Sum of ``values`` per group (0..n_groups-1) as Python ints: no int64 wrap whatever the file holds."""
    groups = np.asarray(groups, dtype=np.int64)
    values = np.asarray(values, dtype=np.int64)
    high = np.zeros(n_groups, dtype=np.int64)
    low = np.zeros(n_groups, dtype=np.int64)
    # Readers cap a size at 2**50, so each high part is below 2**25 and each low part below 2**25:
    # 2**38 values per group cannot wrap.
    np.add.at(high, groups, values >> _LOW_BITS)
    np.add.at(low, groups, values & _LOW_MASK)
    return [(int(h) << _LOW_BITS) + int(l) for h, l in zip(high.tolist(), low.tolist())]


# ----------------------------------------------------------------------------- rows
def skipped_for(trace: Trace, index: SiteIndex) -> str:
    """What the site rule skips on ``trace``, for the sites header: the filter's paths, where paths apply."""
    if source_format(trace) == "paddle":
        # Paddle's pseudo-frames are operators, layers and API calls with no file: no path can match one.
        return "no path skipped: Paddle records operators, layers and API calls, not source files"
    return f"skipped: {index.site_filter.describe()}; change with --site-filter"


def note_for(trace: Trace, index: SiteIndex) -> str:
    """What the reader should know about the frames behind the rows of ``trace``."""
    if not index.has_frames:
        return NO_FRAMES
    if source_format(trace) == "kineto":
        return KINETO_NOTE
    if source_format(trace) == "paddle":
        return PADDLE_NOTE
    return ""


def rows_by_site(index: SiteIndex, stack_ids: np.ndarray, size_bytes: np.ndarray, *, top: int = DEFAULT_TOP,
                 by: str = "bytes") -> list[dict[str, Any]]:
    """The ``top`` sites of the allocations (``stack_ids``, ``size_bytes``), then other sites and unattributed.

    ``by="count"`` ranks by number of allocations instead (ties: bytes). Rows add up exactly.
    """
    stacks = np.asarray(stack_ids, dtype=np.int64)
    sizes = np.asarray(size_bytes, dtype=np.int64)
    distinct, slot = np.unique(np.maximum(stacks, -1), return_inverse=True)
    per_stack = group_sums(slot, sizes, len(distinct))
    counts = np.bincount(slot, minlength=len(distinct)).tolist()
    sites = index.site_of(distinct).tolist()
    acc: dict[int, list] = {}    # site -> [bytes, count, best stack, its bytes]
    for stack, site, b, c in zip(distinct.tolist(), sites, per_stack, counts):
        entry = acc.setdefault(site, [0, 0, -1, -1])
        entry[0] += b
        entry[1] += c
        if b > entry[3]:
            entry[2], entry[3] = stack, b
    unattributed = acc.pop(-1, [0, 0, -1, -1])
    key = (lambda kv: (-kv[1][0], -kv[1][1], index.names[kv[0]])) if by == "bytes" else (
        lambda kv: (-kv[1][1], -kv[1][0], index.names[kv[0]]))
    ranked = sorted(acc.items(), key=key)
    rows = [{"site": index.names[site], "bytes": b, "count": c, "frames": index.frames_of(stack)}
            for site, (b, c, stack, _) in ranked[:max(top, 0)]]
    rest = ranked[max(top, 0):]
    rows.append({"site": OTHER, "bytes": sum(v[0] for _, v in rest), "count": sum(v[1] for _, v in rest),
                 "frames": [], "sites": len(rest)})
    rows.append({"site": UNATTRIBUTED, "bytes": unattributed[0], "count": unattributed[1], "frames": []})
    return rows


def allocation_stacks(trace: Trace, alloc_ids: np.ndarray) -> np.ndarray:
    """The stack id each allocation was made with (initial allocations: their block's; -1: none or unknown)."""
    kind = trace.column("kind")
    alloc = kind == EventKind.ALLOC
    ids = np.concatenate([trace.table("initial_allocs")["alloc_id"], trace.column("alloc_id")[alloc]])
    stacks = np.concatenate([trace.table("initial_allocs")["stack_id"], trace.column("stack_id")[alloc]])
    order = np.argsort(ids, kind="stable")
    ids, stacks = ids[order], stacks[order].astype(np.int64)
    want = np.asarray(alloc_ids, dtype=np.int64)
    if not len(ids):
        return np.full(len(want), -1, dtype=np.int64)
    pos = np.minimum(np.searchsorted(ids, want), len(ids) - 1)
    return np.where(ids[pos] == want, stacks[pos], -1)


def site_rows(trace: Trace, alloc_ids: np.ndarray, size_bytes: np.ndarray, *, top: int = DEFAULT_TOP,
              site_filter: SiteFilter | None = None, index: SiteIndex | None = None) -> SiteRows:
    """The ``top`` code sites holding the bytes of ``alloc_ids`` (``size_bytes`` each), largest first."""
    index = index or SiteIndex(trace, site_filter or SiteFilter())
    rows = rows_by_site(index, allocation_stacks(trace, alloc_ids), size_bytes, top=top)
    return SiteRows(rows=rows, note=note_for(trace, index))


# ----------------------------------------------------------------------------- the trace's peak
@dataclass
class LiveAtPeak:
    """The allocations alive at the trace's peak of live bytes (requested bytes, held until free completes)."""

    event_index: int          #: index in ``Trace.events`` after which the peak holds; -1: the start state
    live_bytes: int           #: equals the runs' ``peak_live_lower_bound_bytes``
    alloc_ids: np.ndarray
    size_bytes: np.ndarray
    alloc_events: np.ndarray  #: index of each allocation's ALLOC event; -1: alive when the trace began
    streams: np.ndarray

    def largest(self, n: int = 5) -> list[dict[str, int]]:
        """The ``n`` largest live allocations, largest first: ``alloc_id``, ``size_bytes``, ``event_index``, ``stream``."""
        order = np.lexsort((self.alloc_ids, -self.size_bytes))[:n]
        return [{"alloc_id": int(self.alloc_ids[i]), "size_bytes": int(self.size_bytes[i]),
                 "event_index": int(self.alloc_events[i]), "stream": int(self.streams[i])} for i in order]


def live_at_peak(trace: Trace, *, granted_only: bool = False) -> LiveAtPeak:
    """The allocations alive at the first moment live bytes peak (start state included), exactly.

    Same rule as the lower bound (``trace.inference.stats.live_bytes_series``): an allocation holds its
    requested bytes from its ALLOC event until its free completes. ``granted_only`` leaves out the
    requests of recorded OOMs (they never got memory): the peak of what the real run held.
    """
    from ...trace.inference.recorded import failed_request_events
    from ...trace.inference.stats import live_bytes_series

    init_ids = trace.table("initial_allocs")["alloc_id"]
    init_sizes = trace.table("initial_allocs")["size_bytes"]
    baseline = int(init_sizes.sum())
    kind = trace.column("kind")
    peak_index = -1
    if len(kind):
        _, total = live_bytes_series(trace, granted_only=granted_only)
        if int(total.max()) > baseline:
            peak_index = int(total.argmax())
    ids = trace.column("alloc_id")[: peak_index + 1]
    kinds = kind[: peak_index + 1]
    done = ids[kinds == EventKind.FREE_COMPLETED]
    allocated = np.flatnonzero(kinds == EventKind.ALLOC)
    if granted_only:
        allocated = np.setdiff1d(allocated, failed_request_events(trace), assume_unique=True)
    all_ids = np.concatenate([init_ids, ids[allocated]]).astype(np.int64)
    all_sizes = np.concatenate([init_sizes, trace.column("size_bytes")[allocated]]).astype(np.int64)
    events = np.concatenate([np.full(len(init_ids), -1), allocated]).astype(np.int64)
    streams = np.concatenate([trace.table("initial_allocs")["stream"],
                              trace.column("stream")[allocated]]).astype(np.int64)
    alive = ~np.isin(all_ids, done)
    return LiveAtPeak(peak_index, int(all_sizes[alive].sum()), all_ids[alive], all_sizes[alive], events[alive],
                      streams[alive])


# ----------------------------------------------------------------------------- a run's moments
@dataclass
class LiveSet:
    """The allocations a run held at one row of its time series."""

    row: int
    event_index: int
    alloc_ids: np.ndarray
    size_bytes: np.ndarray
    stack_ids: np.ndarray

    @property
    def live_bytes(self) -> int:
        return group_sums(np.zeros(len(self.size_bytes), dtype=np.int64), self.size_bytes, 1)[0]


def live_at_row(trace: Trace, timeseries: Any, ooms: Any, row: int, *, continue_on_oom: bool = False) -> LiveSet:
    """What a run of ``trace`` held after row ``row`` of its ``timeseries`` (``ooms``: its failed allocations).

    The rows executed so far are ``timeseries.event_index[1:row+1]`` (their order need not be the
    trace's); an allocation is held from its ALLOC event to its FREE_COMPLETED event, unless it
    failed. The start state is placed in ``alloc_id`` order, and a run that does not continue after
    an out-of-memory stops there, so the start allocations after a failed one were never placed.
    The result's bytes equal ``timeseries.requested_bytes[row]``, checked.
    """
    ev = timeseries["event_index"].to_numpy()
    executed = np.zeros(len(trace), dtype=bool)
    done_rows = ev[1:row + 1]
    executed[done_rows[done_rows >= 0]] = True
    kind = trace.column("kind")
    ids = trace.column("alloc_id")
    failed = np.asarray(ooms["alloc_id"].to_numpy() if len(ooms) else [], dtype=np.int64)
    alloc = executed & (kind == EventKind.ALLOC)
    freed = ids[executed & (kind == EventKind.FREE_COMPLETED)]
    init = trace.table("initial_allocs")
    init_ids, init_sizes, init_stacks = init["alloc_id"], init["size_bytes"], init["stack_id"]
    if not continue_on_oom and len(ooms) and int(ooms["event_index"].iat[0]) < 0:
        placed = init_ids <= int(ooms["alloc_id"].iat[0])
        init_ids, init_sizes, init_stacks = init_ids[placed], init_sizes[placed], init_stacks[placed]
    all_ids = np.concatenate([init_ids, ids[alloc]]).astype(np.int64)
    sizes = np.concatenate([init_sizes, trace.column("size_bytes")[alloc]]).astype(np.int64)
    stacks = np.concatenate([init_stacks, trace.column("stack_id")[alloc]]).astype(np.int64)
    alive = ~np.isin(all_ids, freed) & ~np.isin(all_ids, failed)
    live = LiveSet(row, int(ev[row]), all_ids[alive], sizes[alive], stacks[alive])
    expected = int(timeseries["requested_bytes"].to_numpy()[row])
    if live.live_bytes != expected:
        raise SiteAccountingError(f"live allocations at row {row} (event {live.event_index}) hold {live.live_bytes} "
                                  f"bytes, the run's requested bytes there are {expected}")
    return live


def peak_row(timeseries: Any) -> int:
    """The first row of the run's peak of requested bytes."""
    return int(np.argmax(timeseries["requested_bytes"].to_numpy()))


def oom_row(timeseries: Any, event_index: int) -> int:
    """The row of the first out-of-memory (``event_index`` -1: the start state, row 0)."""
    if event_index < 0:
        return 0
    rows = np.flatnonzero(timeseries["event_index"].to_numpy() == event_index)
    return int(rows[0]) if len(rows) else 0


def failed_request(trace: Trace, index: SiteIndex, oom: dict[str, Any]) -> dict[str, Any]:
    """The site of the request that failed first: ``{"site", "bytes", "event_index", "frames"}``."""
    stack = int(allocation_stacks(trace, np.array([oom["alloc_id"]]))[0])
    site = int(index.site_of(np.array([stack]))[0])
    return {"site": index.names[site] if site >= 0 else UNATTRIBUTED, "bytes": int(oom["requested_bytes"]),
            "event_index": int(oom["event_index"]), "frames": index.frames_of(stack)}


# ----------------------------------------------------------------------------- the whole trace
def allocation_sites(trace: Trace, *, top: int = DEFAULT_TOP, site_filter: SiteFilter | None = None
                     ) -> dict[str, Any]:
    """Every allocation of ``trace`` (start state included) by site: ``by_bytes`` and ``by_count`` rows."""
    index = SiteIndex(trace, site_filter or SiteFilter())
    alloc = trace.column("kind") == EventKind.ALLOC
    init = trace.table("initial_allocs")
    stacks = np.concatenate([init["stack_id"], trace.column("stack_id")[alloc]])
    sizes = np.concatenate([init["size_bytes"], trace.column("size_bytes")[alloc]])
    return {"rule": index.site_filter.rule(), "skipped_paths": list(index.site_filter.skip),
            "skipped": skipped_for(trace, index),
            "allocations": int(len(sizes)), "note": note_for(trace, index) or None,
            "by_bytes": rows_by_site(index, stacks, sizes, top=top),
            "by_count": rows_by_site(index, stacks, sizes, top=top, by="count")}
