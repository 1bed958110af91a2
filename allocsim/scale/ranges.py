"""How sure a prediction is: the trace at each end of the range its inputs leave open.

Each allocation's law has a least and a most size at the target (``SizeLaw.bounds``: equal when the
inputs determine the law). A scaled trace carries, in ``meta.version_hints["scale"]["range"]``, the
allocations whose ends differ (``encode_range``); ``end_traces(trace)`` rebuilds the trace with every
size at its low end and at its high end. Live bytes are a sum of sizes, so the low trace's peak live
bytes are the least any consistent set of laws gives, and the high trace's the most; peak reserved
is replayed at both ends (``prediction_range``). ``allocsim run`` and ``--find-max`` judge both ends.
"""

from __future__ import annotations

from fractions import Fraction
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
    resized = Trace(events=events, meta=trace.meta, labels=list(trace.labels), initial_allocs=initial,
                    frames=trace.frames, stacks=trace.stacks)
    if not len(trace.initial_segments):
        return resized
    # The start layout was laid out for the old sizes: lay it out again for these (``start_layout``).
    from .start_layout import as_predicted

    cached = ((trace.meta.version_hints or {}).get("scale") or {}).get("start_layout") == "cached"
    return as_predicted(resized, trace, cached)[0]


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


def layout_miss_bytes(trace: Trace, policy: str = "pytorch") -> tuple[int, int] | None:
    """``(laid out as predicted - recorded, recorded)`` peak reserved of one input (None: no layout recorded).

    A prediction lays its start-of-window state out by a rule (``start_layout.as_predicted``); laid
    out by the same rule, each input shows how far that rule is from the layout its run really had
    (segments cached by earlier work in the same process show here).
    """
    from .evaluate import peaks
    from .start_layout import as_predicted

    if not len(trace.initial_segments) or not len(trace.initial_allocs):
        return None
    recorded = peaks(trace, policy)["peak_reserved_bytes"]
    return peaks(as_predicted(trace)[0], policy)["peak_reserved_bytes"] - recorded, recorded


def widen_by_layout(rng: dict[str, Any], misses: dict[str, tuple[int, int]]) -> None:
    """Widen ``rng["peak_reserved_bytes"]`` by the inputs' layout misses, as ratios of their recorded peak.

    An input whose rule-laid-out peak is ``m`` and recorded peak ``r`` says the truth can be ``r/m``
    times the rule's: the low end is divided by the largest such excess, the high end by the
    largest shortfall. With no miss in any input the range is unchanged. ``determined`` keeps saying
    whether the inputs determine every size law.
    """
    ratios = [Fraction(r, r + miss) for miss, r in misses.values() if r + miss > 0]
    if not ratios:
        return
    reserved = rng["peak_reserved_bytes"]
    reserved["low"] = min(reserved["low"], int(reserved["low"] * min(ratios)))
    high = reserved["high"] * max(ratios)
    reserved["high"] = max(reserved["high"], int(high) + (high.denominator != 1))
