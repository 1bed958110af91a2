"""Live bytes over time by code site: ``site_timeline(trace)``, the data of ``plots.plot_site_timeline``.

The program's live requested bytes (an allocation counts from its ALLOC event until its free
completes, as the lower bound counts it) split into the ``top`` sites holding the most at the
trace's peak of live bytes, ``other sites`` and ``unattributed``. A tidy table, one row per
(sample, site): ``sample``, ``event_index`` (-1: the start state), ``t_ns``, ``site``,
``live_bytes``; at every sample the sites add up to the live bytes exactly. Long traces are
thinned by the per-pixel rule of ``metrics.decimate``: ``max_points`` equal buckets of events, each
sampled at its largest total (``event_index``, ``t_ns``) and drawn from the bucket's first event
(``from_event_index``, ``from_t_ns``) as one step, so the drawn stack reaches the peak it names.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ...trace.schema import EventKind, Trace
from .rule import SiteFilter, SiteIndex
from .rows import DEFAULT_TOP, OTHER, UNATTRIBUTED, allocation_stacks, group_sums, live_at_peak, rows_by_site

#: Samples kept at most (one per pixel column of a wide figure).
MAX_POINTS = 2000


def _groups(index: SiteIndex, trace: Trace, top: int) -> list[str]:
    """The groups in drawing order: the top sites at the trace's peak, then other sites, then unattributed."""
    peak = live_at_peak(trace)
    rows = rows_by_site(index, allocation_stacks(trace, peak.alloc_ids), peak.size_bytes, top=top)
    return [r["site"] for r in rows[:-2] if r["bytes"] > 0] + [OTHER, UNATTRIBUTED]


def _sample(total: np.ndarray, max_points: int) -> tuple[np.ndarray, np.ndarray]:
    """(first event of each bucket, the event of its largest total): the per-pixel rule of ``decimate``."""
    from ..decimate import bucket_starts, max_rows

    starts = bucket_starts(np.arange(len(total)), max_points)
    return starts, max_rows(total, starts)


def site_timeline(trace: Trace, *, top: int = DEFAULT_TOP, site_filter: SiteFilter | None = None,
                  max_points: int = MAX_POINTS) -> pd.DataFrame:
    """The table described in the module doc."""
    index = SiteIndex(trace, site_filter or SiteFilter())
    names = _groups(index, trace, top)
    number = {name: k for k, name in enumerate(names)}
    other, unattributed = number[OTHER], number[UNATTRIBUTED]
    site_group = np.array([number.get(name, other) for name in index.names] + [unattributed], dtype=np.int64)

    kind = trace.column("kind")
    ids = trace.column("alloc_id")
    sizes = trace.column("size_bytes").astype(np.int64)
    init = trace.initial_allocs
    alloc = kind == EventKind.ALLOC
    all_ids = np.concatenate([init["alloc_id"].to_numpy(), ids[alloc]]).astype(np.int64)
    all_stacks = np.concatenate([init["stack_id"].to_numpy(), trace.column("stack_id")[alloc]])
    group_of = site_group[index.site_of(all_stacks)]        # site -1 indexes the last entry: unattributed
    order = np.argsort(all_ids, kind="stable")
    sorted_ids = all_ids[order]

    done = kind == EventKind.FREE_COMPLETED
    event_group = np.full(len(kind), -1, dtype=np.int64)
    event_group[alloc] = group_of[len(init):]
    if len(sorted_ids) and done.any():
        pos = np.minimum(np.searchsorted(sorted_ids, ids[done]), len(sorted_ids) - 1)
        known = sorted_ids[pos] == ids[done]
        freed = np.flatnonzero(done)
        event_group[freed[known]] = group_of[order[pos[known]]]
    delta = np.where(alloc, sizes, 0) - np.where(done & (event_group >= 0), sizes, 0)
    baseline = group_sums(group_of[:len(init)], init["size_bytes"].to_numpy(), len(names))

    total = np.cumsum(np.where(event_group >= 0, delta, 0)) + sum(baseline)
    starts, picks = _sample(total, max_points) if len(total) else (np.empty(0, np.int64), np.empty(0, np.int64))
    t_ns = trace.column("t_ns")
    t0 = int(t_ns[0]) if len(t_ns) else 0
    events = np.concatenate([[-1], picks]).astype(np.int64)
    times = np.concatenate([[t0], t_ns[picks]]).astype(np.int64)
    from_events = np.concatenate([[-1], starts]).astype(np.int64)
    from_times = np.concatenate([[t0], t_ns[starts]]).astype(np.int64)
    frames = []
    for k, name in enumerate(names):
        live = np.cumsum(np.where(event_group == k, delta, 0))[picks] + baseline[k]
        frames.append(pd.DataFrame({"sample": np.arange(len(events)), "event_index": events, "t_ns": times,
                                    "from_event_index": from_events, "from_t_ns": from_times,
                                    "site": name, "live_bytes": np.concatenate([[baseline[k]], live])}))
    table = pd.concat(frames, ignore_index=True)
    return table.sort_values(["sample", "site"], key=lambda c: c.map(number) if c.name == "site" else c,
                             kind="stable").reset_index(drop=True)
