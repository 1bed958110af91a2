"""Why a setting fits: ``waste_removed`` compares where reserved memory goes under two settings, at one moment.

The moment is where the recorded settings fail: just before the request of their first
out-of-memory (or, when they fit, right after the event of their reserved peak). Both settings are
replayed to that moment (trace order, no timing) and their reserved bytes split exactly into causes
(``metrics.attribution.attribute``). The program holds the same live bytes under both at that
moment, so every byte of difference in reserved memory is waste one setting has and the other not;
the cause with the largest drop is what the setting removed.
"""

from __future__ import annotations

from typing import Any, Mapping

from ..metrics.attribution import CATEGORIES, LABELS, attribute
from ..engine import run_fast
from ..policies.registry import build_policy
from ..runner import device_for
from ..trace.schema import Trace
from ..units import format_bytes

#: The parts of reserved memory that are waste (not the program's own bytes).
WASTE = tuple(c for c in CATEGORIES if c != "live_requested")


class _PartsAt:
    """Engine observer: the attribution parts right after event ``event_index`` (-1: the start state)."""

    def __init__(self, event_index: int):
        self.event_index = event_index
        self.parts: dict[str, int] | None = None

    def __call__(self, event_index: int, policy: Any) -> None:
        if event_index == self.event_index:
            self.parts = attribute(policy)


def parts_after(trace: Trace, policy: str, params: Mapping[str, Any], capacity_bytes: int, event_index: int,
                cost_model: Any = None) -> dict[str, int] | None:
    """Reserved bytes right after ``event_index`` split by cause; None if the run never got there."""
    built = build_policy(policy, device=device_for(capacity_bytes, cost_model), params=dict(params),
                         allocator_settings=trace.meta.allocator_settings)
    observer = _PartsAt(event_index)
    run_fast(trace, built, observer=observer)
    return observer.parts


def moment(recorded_row: Mapping[str, Any]) -> tuple[int, str]:
    """(event index, what it is) of the moment to compare: before the recorded settings' first OOM, else their peak."""
    oom = recorded_row.get("oom.event_index")
    if oom is not None:
        return int(oom) - 1, f"just before event {int(oom):,}, where the recorded settings run out of memory"
    peak = recorded_row.get("peak_event_index.reserved")
    peak = -1 if peak is None else int(peak)
    if peak < 0:
        return -1, "at the start state, the recorded settings' reserved peak"
    return peak, f"at the recorded settings' reserved peak (event {peak:,})"


def waste_removed(trace: Trace, policy: str, recorded_row: Mapping[str, Any], chosen: Mapping[str, Any],
                  capacity_bytes: int, cost_model: Any = None) -> dict[str, Any] | None:
    """Waste by cause under the recorded settings and under ``chosen`` at one moment, and which fell most."""
    event_index, where = moment(recorded_row)
    before = parts_after(trace, policy, {}, capacity_bytes, event_index, cost_model)
    after = parts_after(trace, policy, chosen, capacity_bytes, event_index, cost_model)
    if before is None or after is None:
        return None
    drops = {c: before[c] - after[c] for c in WASTE}
    cause = max(WASTE, key=lambda c: (drops[c], -WASTE.index(c)))
    reserved_before, reserved_after = sum(before.values()), sum(after.values())
    out: dict[str, Any] = {"event_index": event_index, "moment": where,
                           "recorded_bytes": before, "chosen_bytes": after,
                           "removed_cause": cause if drops[cause] > 0 else None,
                           "removed_bytes": max(drops[cause], 0)}
    head = (f"{where}, the recorded settings reserve {format_bytes(reserved_before)} and this one "
            f"{format_bytes(reserved_after)} for the same {format_bytes(before['live_requested'])} live")
    if drops[cause] > 0:
        out["line"] = (f"{head}: it removes {format_bytes(drops[cause])} ({drops[cause]:,} bytes) of "
                       f"{LABELS[cause]} ({format_bytes(before[cause])} -> {format_bytes(after[cause])})")
    else:
        out["line"] = f"{head}: it removes no cause of waste there"
    out["others"] = [f"{LABELS[c]} {'-' if drops[c] > 0 else '+'}{format_bytes(abs(drops[c]))}"
                     for c in WASTE if c != cause and drops[c] != 0]
    return out
