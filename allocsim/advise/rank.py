"""Which runs are the same, which fit, which come first: ``signature``, ``fits``, ``recommend``.

Two settings *make no difference* to each other when their runs have the same ``signature``: every
memory and timing figure of the run summary (peaks, device calls, splits, OOMs, latencies, the
verdict) but not the names of the settings. ``recommend`` keeps, of each group of fitting settings
with one signature, the one with the fewest changes from the recorded settings: as the search
covers every combination of its knobs, a kept setting has no change whose undoing leaves the run
unchanged. It then orders them by peak reserved, p99 allocation latency, the recorded settings
first, fewest changes, grid order.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

#: Row columns that name the run or its settings rather than measure it.
_NAMING_PREFIXES = ("params.", "param.", "reproduction.", "recorded.", "cost_model.", "trace", "verdict.capacity")
_NAMING_KEYS = frozenset({"policy", "params_json", "row_key", "capacity_bytes", "device", "fast", "schema",
                          "sim_seconds", "events_per_second", "wall_seconds", "mode", "error"})


@dataclass
class Outcome:
    """One setting's run: its changes from the recorded settings and the sweep row it produced."""

    changes: tuple[tuple[str, str], ...]       #: (knob, value text) of every knob not at its recorded value
    params: dict[str, Any]                     #: allocsim parameters of those changes
    row: dict[str, Any] = field(repr=False)
    order: int = 0                             #: position in the grid

    @property
    def recorded(self) -> bool:
        """True for the recorded settings themselves (no change)."""
        return not self.changes

    @property
    def peak_reserved_bytes(self) -> int | None:
        value = self.row.get("peak_reserved_bytes")
        return None if value is None else int(value)

    @property
    def p99_ns(self) -> int | None:
        value = self.row.get("alloc_latency_ns.p99")
        return None if value is None else int(value)

    def label(self) -> str:
        """The changes in the knobs' words (``expandable_segments:True``), or ``recorded settings``."""
        return ",".join(f"{knob}:{text}" for knob, text in self.changes) or "recorded settings"


def signature(row: dict[str, Any]) -> str:
    """Everything a run measured, as one comparable text (equal texts: the settings made no difference)."""
    kept = {k: v for k, v in row.items()
            if k not in _NAMING_KEYS and not k.startswith(_NAMING_PREFIXES)}
    return json.dumps(kept, sort_keys=True, default=str)


def fits(row: dict[str, Any], capacity_bytes: int | None = None) -> bool:
    """True when the run finished without an out-of-memory and its peak reserved is within its capacity
    (``capacity_bytes``, else the row's own; a run on an unlimited device fits when it finished)."""
    if row.get("error") is not None or row.get("oom_count") != 0 or row.get("completed") is not True:
        return False
    capacity = row.get("capacity_bytes") if capacity_bytes is None else capacity_bytes
    if capacity is None:
        return True
    peak = row.get("peak_reserved_bytes")
    return row.get("verdict.fits") is True and peak is not None and int(peak) <= int(capacity)


def rank_key(outcome: Outcome) -> tuple:
    """Peak reserved, p99 allocation latency, the recorded settings first, fewest changes, grid order."""
    p99 = outcome.p99_ns
    return (outcome.peak_reserved_bytes, p99 if p99 is not None else 0, not outcome.recorded,
            len(outcome.changes), outcome.order)


def distinct(outcomes: list[Outcome]) -> list[Outcome]:
    """Of each group with one ``signature``, the outcome with the fewest changes (then grid order)."""
    best: dict[str, Outcome] = {}
    for outcome in outcomes:
        key = signature(outcome.row)
        kept = best.get(key)
        if kept is None or (len(outcome.changes), outcome.order) < (len(kept.changes), kept.order):
            best[key] = outcome
    return list(best.values())


def recommend(outcomes: list[Outcome], capacity_bytes: int) -> list[Outcome]:
    """The fitting settings, one per distinct run, best first (see the module doc)."""
    fitting = [o for o in outcomes if fits(o.row, capacity_bytes)]
    return sorted(distinct(fitting), key=rank_key)


def shortfall_bytes(row: dict[str, Any], capacity_bytes: int) -> int | None:
    """How far past what it may reserve a failed run's first OOM asked to go: reserved + request - the
    capacity (or the memory fraction of it, which caps the allocator)."""
    reserved, requested = row.get("oom.reserved_bytes"), row.get("oom.requested_bytes")
    if reserved is None or requested is None:
        return None
    fraction = row.get("params.memory_fraction")
    allowed = int(float(fraction) * capacity_bytes) if fraction is not None else capacity_bytes
    return int(reserved) + int(requested) - allowed


def nearest_misses(outcomes: list[Outcome], capacity_bytes: int, n: int = 3) -> list[Outcome]:
    """The ``n`` failing settings (one per distinct run) whose first OOM fell shortest of fitting."""
    failing = [o for o in distinct(outcomes) if not fits(o.row, capacity_bytes) and o.row.get("error") is None]

    def key(o: Outcome) -> tuple:
        short = shortfall_bytes(o.row, capacity_bytes)
        return (short is None, short if short is not None else 0, not o.recorded, len(o.changes), o.order)
    return sorted(failing, key=key)[:n]
