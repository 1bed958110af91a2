"""Simulated beside recorded: ``recorded_figures`` and ``reproduction`` say whether a run is the real one.

A recording (``allocsim.trace.inference.recorded.RecordedRun``) holds what the real allocator did: peak
reserved (and, from Kineto, peak allocated), device calls, OOMs. ``recorded_figures`` puts those
figures under the names a run summary uses, so the two can stand side by side.

``reproduction`` then says which of three cases a run is:

- a *replay* of the recording (the recorded allocator and settings, its start state loaded, the
  recorded capacity) whose figures all equal the recorded ones: ``reproduces`` True;
- a replay whose figures differ: ``reproduces`` False, with every ``mismatch`` (the simulation is
  wrong until proven otherwise);
- a *what-if*: ``reproduces`` None, and ``what_if`` lists why it cannot be the recorded run
  (another policy, changed settings, start state not loaded, another capacity).
"""

from __future__ import annotations

from typing import Any

from ..units import format_bytes

#: Summary key -> RecordedRun field (the figures a recording may hold).
FIGURES = {
    "peak_reserved_bytes": "peak_reserved_bytes",
    "peak_allocated_bytes": "peak_allocated_bytes",
    "device_mallocs": "segment_allocs",
    "device_frees": "segment_frees",
    "device_maps": "segment_maps",
    "device_unmaps": "segment_unmaps",
}
#: The what-if of a run whose trace's start layout was not loaded (``runner.add_recording`` writes it).
START_NOT_LOADED = "start state was not loaded"


def start_state_dropped(line: Any) -> str | None:
    """``line`` (a run's ``reproduction.line``) when the run did not load the trace's start layout, else None."""
    return line if isinstance(line, str) and START_NOT_LOADED in line else None


#: How each figure is named for people.
LABELS = {"peak_reserved_bytes": "peak reserved", "peak_allocated_bytes": "peak allocated",
          "device_mallocs": "cudaMalloc calls", "device_frees": "cudaFree calls", "device_maps": "page maps",
          "device_unmaps": "page unmaps", "oom_count": "OOMs"}


def recorded_figures(recorded: Any) -> dict[str, Any]:
    """The recording's figures under summary names (None where it records nothing), plus its context."""
    out: dict[str, Any] = {key: getattr(recorded, field) for key, field in FIGURES.items()}
    out["oom_count"] = len(recorded.ooms)
    out["first_oom_event_index"] = recorded.ooms[0].event_index if recorded.ooms else None
    out.update(allocator=recorded.allocator, settings=recorded.settings,
               start_reserved_bytes=recorded.start_reserved_bytes,
               empty_cache_calls=recorded.empty_cache_calls,
               capacity_bytes=recorded.capacity_bytes, capacity_source=recorded.capacity_source or None,
               capacity_range=list(recorded.capacity_range) if recorded.capacity_range else None)
    if getattr(recorded, "unmodelled", None):
        out["unmodelled"] = list(recorded.unmodelled)
    return out


def capacity_matches(recorded: Any, capacity_bytes: int | None) -> str:
    """"" when ``capacity_bytes`` is consistent with the recorded run, else why not (one clause)."""
    if recorded.capacity_bytes is not None:
        low, high = recorded.capacity_range or (recorded.capacity_bytes, recorded.capacity_bytes)
        if capacity_bytes is not None and low <= capacity_bytes and (high is None or capacity_bytes <= high):
            return ""
        shown = "no capacity" if capacity_bytes is None else f"capacity {format_bytes(capacity_bytes)}"
        return f"{shown} is not the recorded device's ({format_bytes(recorded.capacity_bytes)}, inferred)"
    if recorded.ooms and capacity_bytes is None:
        return "the recording ran out of memory, but no capacity is known (give --capacity)"
    peak = recorded.peak_reserved_bytes
    if capacity_bytes is not None and peak is not None and capacity_bytes < peak:
        return (f"capacity {format_bytes(capacity_bytes)} is below the recorded peak reserved "
                f"({format_bytes(peak)})")
    return ""


def reproduction(summary: dict[str, Any], recorded: dict[str, Any], what_if: list[str]) -> dict[str, Any]:
    """Compare a run with the recorded figures; ``what_if`` holds why the run is not the recorded one."""
    if what_if:
        return {"reproduces": None, "what_if": list(what_if), "mismatches": [],
                "line": "what-if, not the recorded run: " + "; ".join(what_if)}
    mismatches = []
    for key in (*FIGURES, "oom_count"):
        real = recorded.get(key)
        if real is not None and summary.get(key) != real:
            mismatches.append({"metric": key, "simulated": summary.get(key), "recorded": real})
    compared = [LABELS[k] for k in (*FIGURES, "oom_count") if recorded.get(k) is not None]
    if not mismatches:
        line = f"reproduces the recording: {', '.join(compared)} equal the real run's"
        return {"reproduces": True, "what_if": [], "mismatches": [], "line": line}
    shown = "; ".join(f"{LABELS[m['metric']]} {_value(m['metric'], m['simulated'])} "
                      f"vs {_value(m['metric'], m['recorded'])} recorded{_gap(m)}" for m in mismatches)
    line = ("does NOT reproduce the recording although allocator, settings, start state and capacity are the "
            f"recorded ones: {shown}")
    out = {"reproduces": False, "what_if": [], "mismatches": mismatches, "line": line}
    if recorded.get("unmodelled"):
        # What the recording shows and the replay does not model: the likely reasons, said with the gap.
        out["why"] = list(recorded["unmodelled"])
        out["line"] += "; why: " + "; ".join(out["why"])
    return out


def _value(key: str, value: Any) -> str:
    if value is None:
        return "-"
    return format_bytes(int(value)) if key.endswith("_bytes") else f"{int(value):,}"


def _gap(mismatch: dict[str, Any]) -> str:
    """`` (+190.50 KiB, +195,072 bytes)`` where two differing byte figures round to the same text, else ""."""
    sim, real = mismatch["simulated"], mismatch["recorded"]
    if not mismatch["metric"].endswith("_bytes") or sim is None or format_bytes(int(sim)) != format_bytes(int(real)):
        return ""
    delta = int(sim) - int(real)
    return f" ({'+' if delta > 0 else '-'}{format_bytes(abs(delta))}, {delta:+,} bytes)"
