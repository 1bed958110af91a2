"""Check a timeline's events against the allocator's own running total: call ``settle_running_total`` before feeding.

Kineto's ``Total Allocated`` and Paddle's ``current_allocated`` are what the allocator held after
each ``[memory]`` event. Three things follow from them, per device, on every reader route (the
compiled scanners only decode; this runs on the columns both routes build):

* **Order.** Where two neighbouring events (two threads' events whose timestamps came out swapped)
  chain only in the other order -- each total equals the one before plus the event's bytes once
  the two are exchanged, and not before -- they are fed in the order the totals prove, where that
  leaves the device's totals without a contradiction; the time column keeps its order (each event
  takes the other's timestamp, frames stay with their events). Nothing else is reordered.
* **Start bytes.** What the allocator held before the window is the largest value every event
  allows, ``max(0, min_i(total_i - window_i))`` where ``window_i`` is what the window's own events
  hold after event ``i`` (their bytes summed so far, frees negative): a total above that is bytes
  the events do not explain (another allocator's, or a wrong total) and never raises the start.
* **Contradictions.** Where a total is below what the window's own events hold after it, no start
  explains the file: it is refused naming that event (``--lenient``: a repair note, start 0).
"""

from __future__ import annotations

import numpy as np

from .builder import TraceBuilder
from .timeline import MEM, RecColumns

_INT64_LIMIT = 1 << 63
#: Columns an exchanged pair swaps: everything but the time (which keeps its order).
_SWAPPED_COLUMNS = ("pos", "kind", "device", "addr", "nbytes", "total", "reserved", "thread", "label")


def settle_running_total(builder: TraceBuilder, cols: RecColumns, stack_ids: list[int] | None, where: str,
                         total_name: str) -> tuple[RecColumns, list[int] | None, dict[int, dict[str, int]]]:
    """(columns in the order the totals prove, their stack ids, the per-device check); refuses a contradiction.

    ``cols`` are in feed order; ``total_name`` is the file's name for the total, for messages.
    The check per device: ``checked`` consecutive totals, ``mismatched`` of them that did not change
    by the event's bytes, ``baseline_bytes`` the start bytes, and where they differ from the first
    event's own figure ``first_event_baseline_bytes``; ``swapped`` pairs fed in the totals' order.
    """
    perm = np.arange(len(cols))
    check = {}
    for device, rows in _device_rows(cols).items():
        order = _proven_order(cols, rows)
        stats, short = _device_check(cols, order)
        swapped = int(np.count_nonzero(order != rows)) // 2
        if swapped and short is None:
            stats["swapped"] = swapped
            perm[rows] = order
        elif swapped:             # the exchanges do not settle the totals: feed the file's order
            stats, short = _device_check(cols, rows)
        check[device] = stats
        if short is not None:
            row, window, total = short
            builder.problem(
                where.format(int(cols.pos[row])),
                f"device {device}: {total_name} is {total:,} bytes after this event, but the window's own events "
                f"hold {window:,} bytes by then: no start explains the totals (events out of order beyond two "
                f"neighbours swapped, or frees missing)",
                "replayed in timestamp order from a start of 0 bytes")
    if (perm != np.arange(len(cols))).any():
        cols = _exchange(cols, perm)
        if stack_ids is not None:
            stack_ids = np.asarray(stack_ids, dtype=np.int64)[perm].tolist()
    return cols, stack_ids, check


def _device_rows(cols: RecColumns) -> dict[int, np.ndarray]:
    """The [memory] rows of each device, in feed order."""
    rows = np.flatnonzero(cols.kind == MEM)
    device = cols.device[rows]
    order = np.argsort(device, kind="stable")
    rows, device = rows[order], device[order]
    if not len(rows):
        return {}
    starts = np.flatnonzero(np.diff(device, prepend=device[0] - 1))
    ends = [*starts[1:].tolist(), len(rows)]
    return {int(device[a]): rows[a:b] for a, b in zip(starts.tolist(), ends)}


def _proven_order(cols: RecColumns, rows: np.ndarray) -> np.ndarray:
    """One device's rows with each neighbouring pair the totals prove swapped exchanged.

    Events ``k`` and ``k+1`` are exchanged when, with the events before and after them, the totals
    chain in the exchanged order (each total is the one before plus the event's bytes) and not in
    the file's, every total involved is recorded, and the two are at different addresses. Pairs
    are taken left to right, each clear of the last one's neighbours.
    """
    m = len(rows)
    if m < 2:
        return rows
    total, nbytes, addr = cols.total[rows], cols.nbytes[rows], cols.addr[rows]
    if int(total.max()) + int(np.abs(nbytes).max()) >= _INT64_LIMIT:
        total, nbytes = total.astype(object), nbytes.astype(object)     # sums past int64: exact ints
    k = np.arange(m - 1)
    has_prev, has_next = k >= 1, k + 2 < m
    prev, nxt = np.maximum(k - 1, 0), np.minimum(k + 2, m - 1)
    known = ((total[k] >= 0) & (total[k + 1] >= 0) & (~has_prev | (total[prev] >= 0))
             & (~has_next | (total[nxt] >= 0)))

    def chain(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Whether event ``b`` may come right after event ``a``: its total is ``a``'s plus its bytes."""
        return np.asarray(total[a] + nbytes[b] == total[b], dtype=bool)

    exchanged = chain(k + 1, k) & (~has_prev | chain(prev, k + 1)) & (~has_next | chain(k, nxt))
    in_file = chain(k, k + 1) & (~has_prev | chain(prev, k)) & (~has_next | chain(k + 1, nxt))
    candidates = np.flatnonzero(np.asarray(known, dtype=bool) & exchanged & ~in_file
                                & (addr[k] != addr[k + 1])).tolist()
    order, last = rows.copy(), -3
    for j in candidates:
        if j < last + 3:
            continue          # would chain against a neighbour the last exchange moved
        order[j], order[j + 1] = rows[j + 1], rows[j]
        last = j
    return order


def _exchange(cols: RecColumns, perm: np.ndarray) -> RecColumns:
    """The columns with rows permuted by ``perm``, times kept in place (they stay in order)."""
    fields = {name: getattr(cols, name)[perm] for name in _SWAPPED_COLUMNS}
    return RecColumns(t_ns=cols.t_ns, labels=cols.labels, **fields)


def _device_check(cols: RecColumns, rows: np.ndarray) -> tuple[dict[str, int], tuple[int, int, int] | None]:
    """One device's check over ``rows`` (in the order fed) and, when a total is below what the window
    holds, (row, window bytes, total)."""
    total, nbytes = cols.total[rows], cols.nbytes[rows]
    has = np.flatnonzero(total >= 0)
    stats = {"checked": max(len(has) - 1, 0), "mismatched": 0, "baseline_bytes": 0}
    if not len(has):
        return stats, None
    t = total[has]
    # Totals are within [0, 2**63): their differences fit in int64.
    stats["mismatched"] = int(np.count_nonzero(t[1:] - t[:-1] != nbytes[has[1:]]))
    slack = t - _window_bytes(nbytes, int(t.max()))[has]
    lowest = int(np.argmin(slack))
    first = int(slack[0])
    stats["baseline_bytes"] = max(int(slack[lowest]), 0)
    if first != stats["baseline_bytes"]:
        stats["first_event_baseline_bytes"] = first
    if slack[lowest] < 0:
        below = int(np.flatnonzero(np.asarray(slack < 0, dtype=bool))[0])
        return stats, (int(rows[has[below]]), int(t[below]) - int(slack[below]), int(t[below]))
    return stats, None


def _window_bytes(nbytes: np.ndarray, largest_total: int) -> np.ndarray:
    """What the window's own events hold after each one (bytes summed so far): int64 where no sum and no
    total less such a sum can wrap, else exact Python integers."""
    largest = int(np.abs(nbytes).max()) if len(nbytes) else 0
    if len(nbytes) * largest + largest_total < _INT64_LIMIT:
        return np.cumsum(nbytes, dtype=np.int64)
    return np.cumsum(nbytes.astype(object))


def running_total_notes(check: dict[int, dict[str, int]], total_name: str) -> list[str]:
    """The notes a user needs where the totals changed the order or the start bytes."""
    notes = []
    for device, stats in sorted(check.items()):
        if stats.get("swapped"):
            notes.append(f"device {device}: {stats['swapped']} pairs of neighbouring events fed in the order "
                         f"{total_name} proves (their timestamps came out swapped, as two threads' events can)")
        if "first_event_baseline_bytes" in stats:
            notes.append(f"device {device}: the first event's {total_name} implies "
                         f"{stats['first_event_baseline_bytes']:,} bytes held before the window, later events "
                         f"allow at most {stats['baseline_bytes']:,}: the start is {stats['baseline_bytes']:,} bytes "
                         f"(the largest every event allows)")
    return notes
