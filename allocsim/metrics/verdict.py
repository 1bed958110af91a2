"""Does it fit? ``verdict(...)`` turns a run into one answer and one line a person can act on.

- ``FITS in 16.00 GiB: peak reserved 6.74 GiB, headroom 9.26 GiB``
- ``OUT OF MEMORY in 16.00 GiB at event 1,289 (+3.21 s): 64.00 MiB requested, 15.90 GiB reserved,
  11.20 GiB live`` (time relative to the trace's first event; left out when the trace has no times)
- ``no allocator setting can fit: peak live 19.37 GiB > 16.00 GiB`` when the program's live bytes
  alone exceed the capacity (no policy or setting can help; the program must hold less);
- without a capacity, the peak the run needs and the lower bound no allocator can beat;
- ``INCOMPLETE TRACE (the script raised ValueError: ...; 1 optimizer step recorded); judged on the part
  recorded: FITS in ...`` before any of these when the trace stops early (``mark_incomplete``).

``fits`` is None without a capacity; ``capacity_source`` says where the capacity came from
(``given``, or ``inferred`` from the recording, with the reader's sentence in ``capacity_note``).
"""

from __future__ import annotations

from typing import Any

from ..units import format_bytes

#: Where a capacity came from.
GIVEN, INFERRED = "given", "inferred"

#: Exit status of ``run``, ``scale``, ``advise``, ``report`` and ``fit`` on a trace that stops before its
#: program's end (``trace.meta.incomplete``) unless ``--allow-incomplete`` is given.
EXIT_INCOMPLETE = 4
#: The option that accepts such a trace as it is (the verdict still says it is incomplete).
ALLOW_INCOMPLETE = "--allow-incomplete"


def incomplete_line(reason: str, line: str) -> str:
    """``line`` said of a trace that stops early: ``INCOMPLETE TRACE (why); judged on the part recorded: line``."""
    return f"INCOMPLETE TRACE ({reason}); judged on the part recorded: {line}"


def mark_incomplete(verdict: dict[str, Any], reason: str) -> None:
    """Say in ``verdict`` (its ``line``, ``incomplete``, ``incomplete_reason``) that its trace stops early."""
    if not reason or verdict.get("incomplete"):
        return
    verdict["line"] = incomplete_line(reason, str(verdict.get("line", "")))
    verdict["incomplete"] = True
    verdict["incomplete_reason"] = reason


def format_duration_ns(value_ns: int | float) -> str:
    """``3.21 s``, ``1.40 ms``, ``12.00 us``, ``800 ns``."""
    value = float(value_ns)
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.2f} {unit}"
    return f"{value:.0f} ns"


def first_oom(oom: dict[str, Any] | None, *, t0_ns: int, live_bytes: int | None,
              time_synthesized: bool) -> dict[str, Any] | None:
    """The first failed allocation as the verdict reports it (``t_rel_ns`` None when times are made up)."""
    if oom is None:
        return None
    return {"event_index": int(oom["event_index"]),
            "t_rel_ns": None if time_synthesized else int(oom["t_ns"]) - int(t0_ns),
            "requested_bytes": int(oom["requested_bytes"]), "reserved_bytes": int(oom["reserved_bytes"]),
            "allocated_bytes": int(oom["allocated_bytes"]),
            "live_bytes": None if live_bytes is None else int(live_bytes)}


def is_lower_bound(capacity_source: str | None, capacity_range: Any) -> bool:
    """Whether an inferred capacity is only the least the recording proves (not one exact size)."""
    if capacity_source != INFERRED:
        return False
    return capacity_range is None or capacity_range[1] is None or capacity_range[1] != capacity_range[0]


def proven_range_text(capacity_range: Any) -> str:
    """What the recording proves of the device: ``20.97 GiB to 21.01 GiB``, or ``20.97 GiB or more``."""
    if capacity_range is None:
        return "no upper bound"
    low = format_bytes(capacity_range[0])
    return f"{low} or more" if capacity_range[1] is None else f"{low} to {format_bytes(capacity_range[1])}"


def verdict(*, capacity_bytes: int | None, peak_reserved_bytes: int, lower_bound_bytes: int,
            oom: dict[str, Any] | None, capacity_source: str | None = None,
            capacity_note: str = "", capacity_range: Any = None,
            granted_bytes: int | None = None, peak_is_start_state: bool = False) -> dict[str, Any]:
    """The answer of one run: ``fits``, ``headroom_bytes``, ``first_oom``, ``lower_bound_fits`` and ``line``.

    An inferred capacity that is only a lower bound (``capacity_range`` wider than one size) is said
    as such: "FITS in at least ...", and an out-of-memory there names the range the recording proves.
    """
    if capacity_bytes is None:
        # A peak that is the loaded start layout is memory cached before the trace began, not a need:
        # on a smaller device the allocator gives cached blocks back first.
        needs = (f"the replay reserves {format_bytes(peak_reserved_bytes)} at its peak, the start layout it "
                 "loaded (cached before the trace began: a smaller device may do with less)"
                 if peak_is_start_state else
                 f"the run needs {format_bytes(peak_reserved_bytes)} reserved at its peak")
        words, held = peak_words(lower_bound_bytes, granted_bytes)
        label = words.rsplit(" ", 2)[0]     # "peak live" / "peak demand", without the figure
        line = (f"no capacity to check against: {needs}; no allocator can do with less than "
                f"{format_bytes(lower_bound_bytes)} ({label}){held}; give --capacity SIZE for a verdict")
        return {"fits": None, "capacity_bytes": None, "capacity_source": None, "capacity_note": None,
                "headroom_bytes": None, "first_oom": None, "lower_bound_bytes": int(lower_bound_bytes),
                "lower_bound_fits": None, "line": line}
    capacity = format_bytes(capacity_bytes)
    lower_bound_fits = lower_bound_bytes <= capacity_bytes
    fits = oom is None
    at_least = is_lower_bound(capacity_source, capacity_range)
    # A lower-bound capacity proves a fit (the device had at least that much), never a failure.
    proven = f"the recording proves {proven_range_text(capacity_range)}"
    caveat = f" (inferred lower bound; {proven}: give --capacity SIZE)" if at_least else ""
    if not lower_bound_fits:
        words, held = peak_words(lower_bound_bytes, granted_bytes)
        line = f"no allocator setting can fit: {words} > {capacity}{held}{caveat}"
    elif fits:
        headroom = format_bytes(capacity_bytes - peak_reserved_bytes)
        line = (f"FITS in at least {capacity} (inferred; {proven}): peak reserved "
                f"{format_bytes(peak_reserved_bytes)}, headroom at least {headroom}" if at_least else
                f"FITS in {capacity}: peak reserved {format_bytes(peak_reserved_bytes)}, headroom {headroom}")
    else:
        when = "" if oom["t_rel_ns"] is None else f" (+{format_duration_ns(oom['t_rel_ns'])})"
        where = "at the start state" if oom["event_index"] < 0 else f"at event {oom['event_index']:,}"
        live = "" if oom["live_bytes"] is None else f", {format_bytes(oom['live_bytes'])} live"
        line = (f"OUT OF MEMORY in {capacity}{caveat} {where}{when}: {format_bytes(oom['requested_bytes'])} "
                f"requested, {format_bytes(oom['reserved_bytes'])} reserved{live}")
    return {"fits": fits, "capacity_bytes": int(capacity_bytes), "capacity_source": capacity_source or GIVEN,
            "capacity_note": capacity_note or None,
            "capacity_range": list(capacity_range) if capacity_range is not None else None,
            "capacity_is_lower_bound": at_least,
            "headroom_bytes": int(capacity_bytes - peak_reserved_bytes) if fits else None,
            "first_oom": oom, "lower_bound_bytes": int(lower_bound_bytes),
            "lower_bound_fits": lower_bound_fits, "line": line}


def peak_words(lower_bound_bytes: int, granted_bytes: int | None) -> tuple[str, str]:
    """(``peak live 19.37 GiB``, ""); ``peak demand ...`` and what the real run held where a recorded
    OOM's request, which never got memory, is in the lower bound."""
    if granted_bytes is None or granted_bytes >= lower_bound_bytes:
        return f"peak live {format_bytes(lower_bound_bytes)}", ""
    return (f"peak demand {format_bytes(lower_bound_bytes)}",
            f" (live bytes and a request the recording shows failing; the real run held at most "
            f"{format_bytes(granted_bytes)})")


def summary_verdict(summary: dict[str, Any], timeseries: Any, t0_ns: int, *,
                    capacity_source: str | None = None, capacity_note: str = "",
                    capacity_range: Any = None) -> dict[str, Any]:
    """``verdict`` of a run summary; the live bytes at the first OOM come from its time-series row."""
    oom = summary.get("oom")
    live = None
    if oom is not None:
        rows = timeseries.index[timeseries["event_index"].to_numpy() == oom["event_index"]]
        if len(rows):
            live = int(timeseries.at[rows[0], "requested_bytes"])
    return verdict(capacity_bytes=summary.get("capacity_bytes"), peak_reserved_bytes=summary["peak_reserved_bytes"],
                   lower_bound_bytes=summary["peak_live_lower_bound_bytes"],
                   oom=first_oom(oom, t0_ns=t0_ns, live_bytes=live,
                                 time_synthesized=bool(summary.get("trace", {}).get("time_synthesized"))),
                   capacity_source=capacity_source, capacity_note=capacity_note, capacity_range=capacity_range,
                   granted_bytes=summary.get("peak_live_granted_bytes"),
                   peak_is_start_state=(summary.get("peak_event_index") or {}).get("reserved", 0) < 0
                   and summary.get("start_state") in ("recorded", "inferred"))
