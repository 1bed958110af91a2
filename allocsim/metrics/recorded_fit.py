"""Never let a replay's OUT OF MEMORY contradict a recording silently: ``recording_fit(...)`` says so.

A recording that ran in a capacity without an OOM proves the program fits there (with the
recorded allocator, settings and start state). When a replay in that capacity runs out of memory,
the verdict keeps its answer for the replay but adds that the recording fit, by how much the
replay's demand exceeds the recorded peak, and why the two differ.
"""

from __future__ import annotations

from typing import Any

from ..units import format_bytes


def recording_fit(summary: dict[str, Any], recorded: Any, what_if: list[str]) -> dict[str, Any] | None:
    """What the recording proves against a replay that ran out of memory, or None (no contradiction).

    ``recorded`` is the device's ``RecordedRun``; ``what_if`` the reasons the run is not the
    recorded one (empty: a replay of the recording that diverged from it).
    """
    capacity, oom = summary.get("capacity_bytes"), summary.get("oom")
    peak = getattr(recorded, "peak_reserved_bytes", None)
    if capacity is None or oom is None or peak is None or recorded.ooms or peak > capacity:
        return None
    demand = int(oom["reserved_bytes"]) + int(oom["requested_bytes"])
    why = list(what_if) or list(getattr(recorded, "unmodelled", None) or []) or [
        "the replay of the recorded allocator and settings diverges from the recording (where the trace does "
        "not record the start layout or pools, it is inferred: see the trace's notes)"]
    line = (f"the recording FIT in {format_bytes(capacity)}: its peak reserved was {format_bytes(peak)} "
            f"(headroom {format_bytes(capacity - peak)}), while this replay asked for {format_bytes(demand)} "
            f"({format_bytes(demand - peak)} more) because " + "; ".join(why))
    return {"recorded_peak_reserved_bytes": int(peak), "recorded_headroom_bytes": int(capacity - peak),
            "replay_demand_bytes": demand, "replay_over_recorded_bytes": demand - int(peak),
            "why": why, "line": line}


def unproven_fit(summary: dict[str, Any], recorded: Any, what_if: list[str],
                 capacity_reason: str) -> dict[str, Any] | None:
    """What the recording says against a replay that FITS below the recorded peak reserved, or None.

    With the recorded allocator, settings and start state, a replay that fits in a capacity below
    the recorded peak reserved without ever failing a device allocation ran as it would with no
    limit: its peak is then below the recording's because the replay misses some of what the real
    allocator reserved (``recorded.unmodelled``), not because the capacity made it give memory back.
    The fit rests on that gap, so the verdict says it is not proven. ``capacity_reason`` is the
    ``what_if`` entry that names the capacity (the only difference allowed).
    """
    capacity, peak = summary.get("capacity_bytes"), getattr(recorded, "peak_reserved_bytes", None)
    if capacity is None or summary.get("oom") is not None or peak is None or recorded.ooms or peak <= capacity:
        return None
    if [w for w in what_if if w != capacity_reason] or summary.get("start_state") == "allocated":
        return None
    if summary.get("device_failed_mallocs"):
        return None     # the capacity bound the replay: its lower peak may be the allocator adapting
    gap = int(peak) - int(summary["peak_reserved_bytes"])
    why = list(getattr(recorded, "unmodelled", None) or []) or [
        "the replay of the recorded allocator and settings diverges from the recording"]
    line = (f"not proven: the recording reserved {format_bytes(peak)}, more than {format_bytes(capacity)}, "
            f"and this replay never reached the capacity ({format_bytes(gap)} under the recorded peak) because "
            + "; ".join(why))
    return {"recorded_peak_reserved_bytes": int(peak), "replay_under_recorded_bytes": gap, "why": why,
            "line": line}
