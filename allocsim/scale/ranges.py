"""How sure a prediction is: the trace at each end of the range its inputs leave open.

Each allocation's law has a least and a most size at the target (``SizeLaw.bounds``: equal when the
inputs determine the law). A scaled trace carries, in ``meta.version_hints["scale"]["range"]``, the
allocations whose ends differ (``encode_range``); ``end_traces(trace)`` rebuilds the trace with every
size at its low end and at its high end. Live bytes are a sum of sizes, so the low trace's peak live
bytes are the least any consistent set of laws gives, and the high trace's the most; peak reserved
is replayed at both ends (``prediction_range``). ``allocsim run`` and ``--find-max`` judge both ends.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import AllocsimError
from ..trace.reading.builder import MAX_SIZE_BYTES
from ..trace.schema import EventKind, Trace
from ..units import format_bytes


class BadRange(AllocsimError):
    """A scaled trace's recorded range is malformed (the file was edited or is not what it says)."""


def encode_range(ids: np.ndarray, low: np.ndarray, high: np.ndarray) -> dict[str, list[int]]:
    """The allocations whose low and high ends differ, as JSON-ready lists."""
    differ = np.flatnonzero(low != high)
    return {"alloc_id": [int(i) for i in ids[differ]], "low": [int(x) for x in low[differ]],
            "high": [int(x) for x in high[differ]]}


def recorded_range(trace: Trace) -> dict[str, np.ndarray] | None:
    """The range a scaled trace carries (None for any other trace); ``BadRange`` when malformed."""
    hints = trace.meta.version_hints or {}
    scale = hints.get("scale")
    if not isinstance(scale, dict) or "range" not in scale:
        return None
    raw = scale["range"]
    where = f"{trace.meta.source}: version_hints.scale.range"
    if not isinstance(raw, dict) or any(not isinstance(raw.get(k), list) for k in ("alloc_id", "low", "high")):
        raise BadRange(f"{where} is not three lists alloc_id, low, high")
    if not len(raw["alloc_id"]) == len(raw["low"]) == len(raw["high"]):
        raise BadRange(f"{where}: alloc_id, low and high differ in length")
    if any(type(x) is not int for k in ("alloc_id", "low", "high") for x in raw[k]):
        raise BadRange(f"{where} holds a value that is not a whole number")
    out = {k: np.array(raw[k], dtype=object) for k in ("alloc_id", "low", "high")}
    low, high = out["low"], out["high"]
    if len(low) and (min(low) < 1 or max(high) > MAX_SIZE_BYTES or any(lo > hi for lo, hi in zip(low, high))):
        raise BadRange(f"{where} holds a size outside 1..{MAX_SIZE_BYTES:,} or a low end above its high end")
    return {k: v.astype(np.int64) for k, v in out.items()}


def new_sizes(events_alloc_id: np.ndarray, kind: np.ndarray, old_sizes: np.ndarray,
              ids: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Event sizes with every event of allocation ``ids[i]`` resized to ``sizes[i]``."""
    out = old_sizes.copy()
    if not len(ids):
        return out
    order = np.argsort(ids, kind="stable")
    sorted_ids, sorted_sizes = ids[order], sizes[order]
    carries = (kind == EventKind.ALLOC) | (kind == EventKind.FREE_REQUESTED) | (kind == EventKind.FREE_COMPLETED)
    pos = np.searchsorted(sorted_ids, events_alloc_id)
    pos_clipped = np.minimum(pos, len(sorted_ids) - 1)
    hit = carries & (pos < len(sorted_ids)) & (sorted_ids[pos_clipped] == events_alloc_id)
    out[hit] = sorted_sizes[pos_clipped[hit]]
    return out


def with_sizes(trace: Trace, ids: np.ndarray, sizes: np.ndarray) -> Trace:
    """A copy of ``trace`` with allocation ``ids[i]`` (its events and start-of-window row) resized to ``sizes[i]``."""
    events = trace.events.copy()
    events["size_bytes"] = new_sizes(events["alloc_id"].to_numpy(), events["kind"].to_numpy(),
                                     events["size_bytes"].to_numpy(), ids, sizes)
    initial = trace.initial_allocs.copy()
    if len(initial) and len(ids):
        lookup = dict(zip(ids.tolist(), sizes.tolist()))
        initial["size_bytes"] = [lookup.get(int(i), int(s)) for i, s in
                                 zip(initial["alloc_id"].tolist(), initial["size_bytes"].tolist())]
    return Trace(events=events, meta=trace.meta, labels=list(trace.labels), initial_allocs=initial,
                 frames=trace.frames, stacks=trace.stacks)


def end_traces(trace: Trace) -> tuple[Trace, Trace] | None:
    """(low end, high end) of a scaled trace, or None when it carries no range or its range is a point."""
    rng = recorded_range(trace)
    if rng is None or not len(rng["alloc_id"]):
        return None
    known = set(trace.initial_allocs["alloc_id"].tolist()) | set(
        trace.events["alloc_id"].to_numpy()[trace.events["kind"].to_numpy() == EventKind.ALLOC].tolist())
    missing = next((int(i) for i in rng["alloc_id"] if int(i) not in known), None)
    if missing is not None:
        raise BadRange(f"{trace.meta.source}: version_hints.scale.range names allocation {missing}, "
                       "which the trace does not hold")
    return with_sizes(trace, rng["alloc_id"], rng["low"]), with_sizes(trace, rng["alloc_id"], rng["high"])


def prediction_range(trace: Trace, policy: str = "pytorch") -> dict[str, Any]:
    """Peak live and peak reserved at the point and at both ends (``low <= high``; equal when determined)."""
    from .evaluate import peaks

    point = peaks(trace, policy)
    ends = end_traces(trace)
    low, high = (point, point) if ends is None else (peaks(ends[0], policy), peaks(ends[1], policy))
    out: dict[str, Any] = {"policy": policy, "determined": ends is None,
                           "allocations_undetermined": len(recorded_range(trace)["alloc_id"])
                           if recorded_range(trace) is not None else 0}
    for key in ("peak_live_bytes", "peak_reserved_bytes"):
        values = (low[key], point[key], high[key])
        # Reserved bytes need not be monotone in the sizes: the range spans all three replays.
        out[key] = {"low": min(values), "point": point[key], "high": max(values)}
    return out


def judge_ends(run_end: Any, trace: Trace) -> dict[str, Any] | None:
    """The verdicts of a scaled trace's two ends: ``run_end(end_trace)`` gives each end's run summary.

    None when the trace carries no open range. ``fits`` is True only when both ends fit (False when
    either does not, None without a capacity); ``line`` says which end fits.
    """
    ends = end_traces(trace)
    if ends is None:
        return None
    out: dict[str, Any] = {}
    for name, end in zip(("low", "high"), ends):
        summary = run_end(end)
        verdict = summary.get("verdict") or {}
        out[name] = {"fits": verdict.get("fits"), "line": verdict.get("line", ""),
                     "peak_live_bytes": int(summary.get("peak_live_lower_bound_bytes", 0)),
                     "peak_reserved_bytes": int(summary.get("peak_reserved_bytes", 0))}
    low, high = out["low"]["fits"], out["high"]["fits"]
    if low is None or high is None:
        out["fits"], out["line"] = None, "prediction range: no capacity to judge its ends"
    else:
        out["fits"] = bool(low and high)
        both = {(True, True): "fits at both ends", (True, False): "fits at the low end, not at the high end",
                (False, False): "fits at neither end", (False, True): "fits at the high end, not at the low end"}
        def end_text(name: str) -> str:
            end = out[name]
            return (f"{name} end peak reserved {format_bytes(end['peak_reserved_bytes'])}" if end["fits"] else
                    f"{name} end out of memory")
        out["line"] = f"prediction range: {both[(bool(low), bool(high))]} ({end_text('low')}, {end_text('high')})"
    return out


def fresh_start(trace: Trace) -> Trace:
    """``trace`` with its start-of-window allocations to be placed anew (its recorded layout dropped), as a prediction is."""
    initial = trace.initial_allocs.copy()
    initial["addr"] = -1
    initial["block_size_bytes"] = -1
    return Trace(events=trace.events, meta=trace.meta, labels=list(trace.labels), initial_allocs=initial,
                 frames=trace.frames, stacks=trace.stacks)


def layout_effect_bytes(trace: Trace, policy: str = "pytorch") -> int | None:
    """Peak reserved with the recorded start-of-window layout minus placed anew (None: no layout recorded).

    A prediction places its start-of-window state anew (the layout at the target is unknown); what the
    recorded layout changes in each input says how much that can move peak reserved.
    """
    from .evaluate import peaks

    if not len(trace.initial_segments) or not len(trace.initial_allocs):
        return None
    return peaks(trace, policy)["peak_reserved_bytes"] - peaks(fresh_start(trace), policy)["peak_reserved_bytes"]
