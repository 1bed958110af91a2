"""Who holds the memory: ``site_rows(trace, alloc_ids, sizes)`` groups live bytes by code site.

A *site* is the innermost stack frame that belongs to the user's program. Attributing bytes to
sites needs the stack frames PyTorch snapshots record for every allocation, and the trace model
does not carry them yet: until it does, ``site_rows`` returns no rows and a one-line note saying
so. Everything around it is exact already: ``live_at_peak`` finds the allocations alive at the
trace's peak of live bytes (their sizes add up to the lower bound every run reports), and the
history-less state report passes the blocks live in the recorded state. Frames plug in here
alone, without changing a caller.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..trace.schema import EventKind, Trace

#: What the site rows say while the trace model has no stack frames.
NEEDS_FRAMES = ("code sites need the stack frames the snapshot records for each allocation, which this "
                "version does not read yet")
#: ... and for a trace format that records no frames at all.
NO_FRAMES = "this trace format records no stack frames per allocation, so no code sites"


@dataclass
class SiteRows:
    """Top sites by bytes: rows of ``{"site", "bytes", "count", "frames"}`` and a note on what is missing."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"rows": list(self.rows), "note": self.note or None}


def site_rows(trace: Trace, alloc_ids: np.ndarray, size_bytes: np.ndarray, *, top: int = 10) -> SiteRows:
    """The ``top`` code sites holding the bytes of ``alloc_ids`` (``size_bytes`` each), largest first.

    Today: no rows and ``NEEDS_FRAMES`` (the trace model has no frames to attribute with), or
    ``NO_FRAMES`` for a format without frames.
    """
    del alloc_ids, size_bytes, top   # the frames table is what is missing
    return SiteRows(rows=[], note=NEEDS_FRAMES if trace.meta.format == "pytorch-snapshot" else NO_FRAMES)


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


def live_at_peak(trace: Trace) -> LiveAtPeak:
    """The allocations alive at the first moment live bytes peak (start state included), exactly.

    Same rule as the lower bound (``trace.stats.live_bytes_series``): an allocation holds its
    requested bytes from its ALLOC event until its free completes.
    """
    from ..trace.stats import live_bytes_series

    init_ids = trace.initial_allocs["alloc_id"].to_numpy()
    init_sizes = trace.initial_allocs["size_bytes"].to_numpy()
    baseline = int(init_sizes.sum())
    kind = trace.column("kind")
    peak_index = -1
    if len(kind):
        _, total = live_bytes_series(trace)
        if int(total.max()) > baseline:
            peak_index = int(total.argmax())
    ids = trace.column("alloc_id")[: peak_index + 1]
    kinds = kind[: peak_index + 1]
    done = ids[kinds == EventKind.FREE_COMPLETED]
    allocated = np.flatnonzero(kinds == EventKind.ALLOC)
    all_ids = np.concatenate([init_ids, ids[allocated]]).astype(np.int64)
    all_sizes = np.concatenate([init_sizes, trace.column("size_bytes")[allocated]]).astype(np.int64)
    events = np.concatenate([np.full(len(init_ids), -1), allocated]).astype(np.int64)
    streams = np.concatenate([trace.initial_allocs["stream"].to_numpy(),
                              trace.column("stream")[allocated]]).astype(np.int64)
    alive = ~np.isin(all_ids, done)
    return LiveAtPeak(peak_index, int(all_sizes[alive].sum()), all_ids[alive], all_sizes[alive], events[alive],
                      streams[alive])
