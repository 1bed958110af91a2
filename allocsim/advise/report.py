"""``Advice`` for people and for programs: ``format_advice(advice)`` and ``advice_to_dict(advice)``.

JSON keys: ``capacity_bytes``, ``capacity_source``, ``grid``, ``recommendations`` (each with
``alloc_conf``, ``flags`` (Paddle: ``FLAGS_name=value`` strings; else None), ``settings``,
``peak_reserved_bytes``, ``headroom_bytes``, ``min_capacity_bytes``, ``alloc_latency_ns``, ``command``),
``no_effect``, ``lower_bound_bytes``, ``fits_any``, ``errors`` (each distinct error of a failed run, with
the runs it hit); and beside
them the trace, the recorded settings' run, the "why", the closest misses or what is live at the
peak, and what the search ran.
"""

from __future__ import annotations

from typing import Any

from ..metrics.reproduction import start_state_dropped
from ..metrics.sites.report import format_rows
from ..metrics.sites.rule import SiteFilter
from ..metrics.verdict import format_duration_ns, incomplete_line, peak_words
from ..sweep.failures import format_error_groups
from ..units import format_bytes
from .advice import MIN_CAPACITY_RULE, Advice, Recommendation
from .rank import Outcome, fits


def _latency(row: dict[str, Any]) -> dict[str, Any] | None:
    keys = [k for k in row if k.startswith("alloc_latency_ns.")]
    if not keys or row.get(keys[0]) is None:
        return None
    return {k.partition(".")[2]: row[k] for k in keys}


def verdict_text(row: dict[str, Any], capacity_bytes: int) -> str:
    """The run's verdict line (a start state bigger than the device is placed anew by the engine)."""
    return row.get("verdict.line") or ""


def _grid_dict(advice: Advice) -> dict[str, Any]:
    knobs = advice.preset.knobs() if advice.grid is None else advice.grid.knobs
    effective = {k.name for k in advice.grid.effective} if advice.grid is not None else set()
    return {"searched": advice.grid is not None,
            "knobs": {k.name: [c.text for c in k.choices] for k in knobs},
            "recorded": {k.name: k.recorded.text for k in knobs},
            "combined": [k.name for k in knobs if k.name in effective],
            "notes": {k.name: k.note for k in knobs if k.note},
            "configurations": advice.grid.configurations if advice.grid is not None else 0,
            "rule": ("the recorded settings and each knob's other values alone; knobs that changed nothing alone "
                     "stay at their recorded value (no_effect); every combination of the other knobs' values"),
            "timed": not advice.fast}


def _recommendation_dict(advice: Advice, rec: Recommendation) -> dict[str, Any]:
    o = rec.outcome
    return {"alloc_conf": rec.alloc_conf, "flags": advice.preset.flags(o.params), "settings": dict(o.changes),
            "params": o.params, "line": rec.line,
            "recorded_settings": o.recorded,
            "peak_reserved_bytes": o.peak_reserved_bytes,
            "headroom_bytes": advice.capacity_bytes - o.peak_reserved_bytes,
            "min_capacity_bytes": rec.min_capacity_bytes,
            "min_capacity_probes": rec.search.probed if rec.search is not None else 0,
            "min_capacity_contradictions": [list(c) for c in rec.search.contradictions] if rec.search else [],
            "alloc_latency_ns": _latency(o.row), "command": rec.command}


def _baseline_dict(advice: Advice) -> dict[str, Any] | None:
    if advice.grid is None:
        return None
    row = advice.grid.baseline.row
    return {"fits": fits(row, advice.capacity_bytes), "peak_reserved_bytes": row.get("peak_reserved_bytes"),
            "verdict": verdict_text(row, advice.capacity_bytes), "alloc_latency_ns": _latency(row),
            "line": advice.preset.paste_line({}), "flags": advice.preset.flags({}),
            "replay_under_recorded_bytes": replay_under_recorded(row),
            "start_state_dropped": start_state_dropped(row.get("reproduction.line"))}


def replay_under_recorded(row: dict[str, Any]) -> int | None:
    """How far the recorded settings' replay, fitting below the recorded peak, falls short of it (None: not so)."""
    under = row.get("verdict.recording_exceeds.replay_under_recorded_bytes")
    return None if under is None or under != under else int(under)   # a journal row holds NaN for none


def advice_to_dict(advice: Advice) -> dict[str, Any]:
    """The JSON object of ``allocsim advise --json``."""
    out: dict[str, Any] = {
        "trace": advice.trace, "device": advice.device, "device_note": advice.device_note, "policy": advice.policy,
        "capacity_bytes": advice.capacity_bytes, "capacity_source": advice.capacity_source,
        "capacity_note": advice.capacity_note or None,
        "capacity_range": list(advice.capacity_range) if advice.capacity_range is not None else None,
        "capacity_assumed": advice.assumption,
        "lower_bound_bytes": advice.lower_bound_bytes, "peak_live_granted_bytes": advice.granted_bytes,
        "fits_any": advice.fits_any,
        "recorded": _baseline_dict(advice),
        "grid": _grid_dict(advice),
        "no_effect": [k.name for k in advice.grid.no_effect] if advice.grid is not None else [],
        "recommendations": [_recommendation_dict(advice, r) for r in advice.recommendations],
        "min_capacity_rule": MIN_CAPACITY_RULE.format(step=format_bytes(advice.step_bytes)),
        "why": advice.why,
        "closest": None, "live_at_peak": None, "sites": None,
    }
    if advice.incomplete:
        out["incomplete"], out["incomplete_reason"] = True, advice.incomplete
    if advice.misses:
        m = advice.misses[0]
        out["closest"] = {"settings": dict(m.outcome.changes), "line": advice.preset.paste_line(m.outcome.params),
                          "flags": advice.preset.flags(m.outcome.params),
                          "min_capacity_bytes": m.min_capacity_bytes,
                          "missing_bytes": None if m.min_capacity_bytes is None
                          else m.min_capacity_bytes - advice.capacity_bytes,
                          "verdict": verdict_text(m.outcome.row, advice.capacity_bytes), "note": m.note or None,
                          "candidates": len(advice.misses)}
    if advice.peak is not None:
        out["live_at_peak"] = {"event_index": advice.peak.event_index, "live_bytes": advice.peak.live_bytes,
                               "allocations": int(len(advice.peak.alloc_ids)),
                               "largest": advice.peak.largest()}
        if advice.sites is not None:
            out["sites"] = {**advice.sites.to_dict(), "rule": (advice.site_filter or SiteFilter()).rule()}
    out["errors"] = [g.to_dict() for g in advice.error_groups()]
    if advice.runs is not None:
        out["runs"] = {"distinct": len(advice.runs.rows), "computed": advice.runs.computed,
                       "reused": advice.runs.reused, "executor": advice.runs.executor.name,
                       "output": advice.runs.output}
    out["wall_seconds"] = round(advice.wall_seconds, 3)
    return out


# ----------------------------------------------------------------------------- text
def _head(advice: Advice) -> list[str]:
    where = advice.source + (f", device {advice.device}" if advice.device is not None else "")
    capacity = f"capacity {format_bytes(advice.capacity_bytes)} ({advice.capacity_bytes:,} bytes, {advice.capacity_source}"
    capacity += f": {advice.capacity_note})" if advice.capacity_note else ")"
    lines = [f"allocsim advise: {where}, policy {advice.policy}", capacity]
    if advice.device_note:
        lines.insert(1, advice.device_note)
    if advice.assumption:
        lines.append(advice.assumption)
    words, held = peak_words(advice.lower_bound_bytes, advice.granted_bytes)
    return lines + [f"{words}: no setting can reserve less{held}"]


def _grid_lines(advice: Advice) -> list[str]:
    grid = advice.grid
    mode = "no timing: ranked by peak reserved" if advice.fast else "timed replays"
    if len(grid.effective) > 1:
        sizes = " x ".join(str(len(k.choices)) for k in grid.effective)
        head = f"grid: {sizes} = {grid.configurations} settings, every combination ({mode})"
    elif grid.effective:
        head = f"grid: {grid.configurations} settings of {grid.effective[0].name} ({mode})"
    else:
        head = f"grid: the recorded settings only, as no knob changed anything alone ({mode})"
    lines = [head]
    for knob in grid.knobs:
        values = ", ".join(f"{c.text} (recorded)" if c.recorded else c.text for c in knob.choices)
        mark = "" if knob in grid.effective else "   [no effect alone: left at the recorded value]"
        lines.append(f"  {knob.name:<36} {values}{mark}")
        if knob.note:
            lines.append(f"  {'':<36} ({knob.note})")
    if grid.no_effect:
        lines.append("no effect on this trace (each value tried alone changed nothing): "
                     + ", ".join(k.name for k in grid.no_effect))
    runs = advice.runs
    lines.append(f"{len(runs.rows):,} distinct runs ({runs.computed:,} simulated now, {runs.reused:,} from the "
                 f"journal) in {advice.wall_seconds:.1f} s on {runs.executor.name}; rows in {runs.output}")
    lines += format_error_groups(advice.error_groups(), "runs")
    return lines


def _outcome_figures(advice: Advice, o: Outcome) -> str:
    p99 = o.p99_ns
    latency = "" if p99 is None else f", p99 allocation latency {format_duration_ns(p99)}"
    return (f"peak reserved {format_bytes(o.peak_reserved_bytes)}, "
            f"headroom {format_bytes(advice.capacity_bytes - o.peak_reserved_bytes)}{latency}")


def _recommendation_lines(advice: Advice) -> list[str]:
    order = "peak reserved" if advice.fast else "peak reserved, then p99 allocation latency"
    lines = ["", f"Settings that fit, best first ({order}; ties: the recorded settings, then fewest changes):"]
    for i, rec in enumerate(advice.recommendations, 1):
        o = rec.outcome
        title = "your recorded settings: no change needed" if o.recorded else o.label()
        lines += [f"{i:>2}. {title}",
                  f"      {rec.line}",
                  f"      {_outcome_figures(advice, o)}",
                  f"      still fits down to {format_bytes(rec.min_capacity_bytes)} ({rec.min_capacity_bytes:,} bytes)",
                  f"      {rec.command}"]
        if rec.search is not None and rec.search.contradictions:
            fit_at, fail_at = rec.search.contradictions[0]
            lines.append(f"      note: fails at {fail_at:,} bytes although it fits at {fit_at:,}: fitting is not "
                         "monotone in capacity here")
    return lines


def format_advice(advice: Advice) -> str:
    """The report of ``allocsim advise`` as text; the last line says what to do (and, on a trace that stops
    early, that it is judged on the part recorded)."""
    text = _format_advice(advice)
    if not advice.incomplete:
        return text
    head, sep, last = text.rpartition("\n")
    return head + sep + incomplete_line(advice.incomplete, last)


def _format_advice(advice: Advice) -> str:
    lines = _head(advice)
    if not advice.lower_bound_fits:
        peak = advice.peak
        where = "at the start state" if peak.event_index < 0 else f"after event {peak.event_index:,}"
        words, held = peak_words(advice.lower_bound_bytes, advice.granted_bytes)
        lines += [f"no allocator setting can fit: {words} > {format_bytes(advice.capacity_bytes)}{held}; the "
                  "program must hold less at its peak",
                  (f"what holds the memory at the peak ({where}): {len(peak.alloc_ids):,} live allocations, "
                   f"{format_bytes(peak.live_bytes)}; the largest:" if not held else
                   f"what the program asks to hold at its peak of demand ({where}): {len(peak.alloc_ids):,} "
                   f"allocations, {format_bytes(peak.live_bytes)}, a request the recording shows failing among "
                   "them; the largest:")]
        for item in peak.largest():
            born = ("alive when the trace began" if item["event_index"] < 0
                    else f"allocated at event {item['event_index']:,}")
            lines.append(f"    {format_bytes(item['size_bytes']):>12}  allocation {item['alloc_id']}, {born}, "
                         f"stream {item['stream']}")
        sites = advice.sites
        if sites is not None:
            skipped = ", ".join((advice.site_filter or SiteFilter()).skip) or "nothing"
            lines.append(f"by code site: the innermost frame of the program (skipped: {skipped}; change with --site-filter)")
            if sites.note:
                lines.append(f"  note: {sites.note}")
            lines += format_rows(sites.rows)
        lines.append(f"NO SETTING FITS in {format_bytes(advice.capacity_bytes)}: nothing was searched")
        return "\n".join(lines)
    base = advice.grid.baseline
    lines.append(f"recorded settings ({advice.preset.describe({})}): {verdict_text(base.row, advice.capacity_bytes)}")
    dropped = start_state_dropped(base.row.get("reproduction.line"))
    if dropped:        # run's own line: why this replay is not the recorded run (the same for every setting)
        lines.append(f"   {dropped}")
    lines += _grid_lines(advice)
    if advice.recommendations:
        lines += _recommendation_lines(advice)
        lines.append(MIN_CAPACITY_RULE.format(step=format_bytes(advice.step_bytes)))
        if advice.why is not None:
            lines.append(f"why {advice.recommendations[0].outcome.label()}: {advice.why['line']}")
            if advice.why["others"]:
                lines.append("   other causes there: " + "; ".join(advice.why["others"]))
        best = advice.recommendations[0]
        under = replay_under_recorded(base.row)
        # Every setting is replayed as the recorded ones are: a replay short of the recording is short for all.
        caveat = ("" if under is None else f"; but not proven: the recorded settings' replay falls "
                  f"{format_bytes(under)} short of the recorded peak reserved (see their line above), and every "
                  "setting here is replayed the same way")
        lines.append(f"FITS in {format_bytes(advice.capacity_bytes)}: " +
                     ("keep your settings" if best.outcome.recorded else best.line) + caveat)
        return "\n".join(lines)
    lines.append("")
    closest = advice.misses[0] if advice.misses else None
    if closest is not None and closest.min_capacity_bytes is not None:
        missing = closest.min_capacity_bytes - advice.capacity_bytes
        lines += [f"closest: {closest.outcome.label()} ({advice.preset.paste_line(closest.outcome.params)})",
                  f"   {verdict_text(closest.outcome.row, advice.capacity_bytes)}",
                  f"   it fits from {format_bytes(closest.min_capacity_bytes)} ({closest.min_capacity_bytes:,} bytes): "
                  f"{format_bytes(missing)} ({missing:,} bytes) short (the closest of the {len(advice.misses)} settings "
                  "whose first out-of-memory fell shortest of fitting)",
                  MIN_CAPACITY_RULE.format(step=format_bytes(advice.step_bytes))]
    elif closest is not None:
        lines.append(f"closest: {closest.outcome.label()}: {closest.note}")
    lines.append(f"NO SETTING FITS in {format_bytes(advice.capacity_bytes)} among the {advice.grid.configurations} "
                 "settings searched")
    return "\n".join(lines)
