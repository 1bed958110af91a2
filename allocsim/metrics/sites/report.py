"""The code sites of one run, for ``allocsim run``: ``run_sites(trace, result, waste_at, ...)`` and ``format_sites``.

Three tables of rows (``sites.rows_by_site``), each adding up exactly to what it splits:

- ``at_peak``: the allocations live at the run's peak of requested memory; the rows add up to
  ``peak_requested_bytes``;
- ``at_oom``: the allocations live when the first request failed (the verdict's live bytes), and
  ``moments.at_oom.failed_request``: the site of the request that failed;
- ``waste``: reserved minus live requested bytes at the peak of reserved memory, charged to the
  sites that cause it under the run's policy (``waste``), each row with its ``causes``.
"""

from __future__ import annotations

import re
from typing import Any, Callable

import numpy as np

from ...trace.schema import Trace
from ...units import format_bytes
from ..attribution import LABELS
from ..categories import LABELS as CATEGORY_LABELS
from .rule import SiteFilter, SiteIndex
from .waste import WASTE_CAUSES, WasteCharges, stacks_and_causes, waste_total_check
from .rows import (DEFAULT_TOP, OTHER, UNATTRIBUTED, SiteAccountingError, failed_request, live_at_row,
                    note_for, oom_row, peak_row, rows_by_site, skipped_for)

_SITE = re.compile(r"^(.*):(\d+) in (.*)$")


def waste_rows(index: SiteIndex, stacks: np.ndarray, causes: list[str], sizes: np.ndarray, pieces: np.ndarray,
               *, top: int = DEFAULT_TOP) -> list[dict[str, Any]]:
    """Rows of waste charges (stack, cause, bytes, pieces): bytes and pieces per site, split by cause."""
    rows = rows_by_site(index, stacks, sizes, top=top)
    site = index.site_of(stacks)
    shown = {r["site"]: r for r in rows[:-2]}
    by_cause: dict[str, dict[str, int]] = {r["site"]: {} for r in rows}
    count: dict[str, int] = {r["site"]: 0 for r in rows}
    for s, cause, size, n in zip(site.tolist(), causes, sizes.tolist(), pieces.tolist()):
        name = UNATTRIBUTED if s < 0 else index.names[s]
        name = name if name in shown or name == UNATTRIBUTED else OTHER
        by_cause[name][cause] = by_cause[name].get(cause, 0) + size
        count[name] += n
    for r in rows:
        r["count"] = count[r["site"]]
        r["causes"] = {c: by_cause[r["site"]][c] for c in WASTE_CAUSES if by_cause[r["site"]].get(c)}
    return rows


def run_sites(trace: Trace, result: Any, waste_at: Callable[[int], WasteCharges], *,
              site_filter: SiteFilter | None = None, top: int = DEFAULT_TOP, continue_on_oom: bool = False,
              categories: Any = None) -> dict[str, Any]:
    """The ``sites`` object of a run of ``trace`` (``result``); ``waste_at(event_index)`` charges the waste there.

    ``waste_at`` replays the run's policy afresh up to that event (``allocsim.runner.waste_by_site``).
    With ``categories`` (``categories.categorize``'s result) the live rows carry their ``category``.
    """
    from ..categories import label_site_rows

    index = SiteIndex(trace, site_filter or SiteFilter())
    ts, ooms, summary = result.timeseries, result.ooms, result.summary
    peak = live_at_row(trace, ts, ooms, peak_row(ts), continue_on_oom=continue_on_oom)
    if peak.live_bytes != summary["peak_requested_bytes"]:
        raise SiteAccountingError(f"sites at the peak hold {peak.live_bytes} bytes, the run's peak requested "
                                  f"is {summary['peak_requested_bytes']}")
    out: dict[str, Any] = {
        "rule": index.site_filter.rule(), "skipped_paths": list(index.site_filter.skip),
        "skipped": skipped_for(trace, index), "note": note_for(trace, index) or None,
        "at_peak": rows_by_site(index, peak.stack_ids, peak.size_bytes, top=top),
        "at_oom": [], "waste": [],
        "moments": {"at_peak": {"event_index": peak.event_index, "bytes": peak.live_bytes},
                    "at_oom": None, "waste": None},
    }
    if categories is not None:
        label_site_rows(out["at_peak"], index, peak.alloc_ids, peak.stack_ids, peak.size_bytes, categories)
    oom = summary.get("oom")
    if oom is not None:
        live = live_at_row(trace, ts, ooms, oom_row(ts, int(oom["event_index"])), continue_on_oom=continue_on_oom)
        out["at_oom"] = rows_by_site(index, live.stack_ids, live.size_bytes, top=top)
        if categories is not None:
            label_site_rows(out["at_oom"], index, live.alloc_ids, live.stack_ids, live.size_bytes, categories)
        out["moments"]["at_oom"] = {"event_index": int(oom["event_index"]), "bytes": live.live_bytes,
                                    "failed_request": failed_request(trace, index, oom)}
    target = int(summary["at_peak_reserved"]["event_index"])
    charges = waste_at(target)
    if charges.reserved_bytes != summary["peak_reserved_bytes"]:
        raise SiteAccountingError(f"the replay to event {target} reserves {charges.reserved_bytes} bytes, the run's "
                                  f"peak is {summary['peak_reserved_bytes']}")
    waste_total_check(charges)
    stacks, causes, sizes, pieces = stacks_and_causes(charges)
    totals = {c: 0 for c in WASTE_CAUSES}
    for cause, size in zip(causes, sizes.tolist()):
        totals[cause] += size
    out["waste"] = waste_rows(index, stacks, causes, sizes, pieces, top=top)
    out["moments"]["waste"] = {"event_index": target, "bytes": charges.waste_bytes,
                               "reserved_bytes": charges.reserved_bytes,
                               "live_requested_bytes": charges.live_requested_bytes,
                               "causes": {c: v for c, v in totals.items() if v}}
    return out


def name_failed_request(summary: dict[str, Any], sites: dict[str, Any]) -> None:
    """Put the failed request's site into the verdict's ``first_oom`` (JSON) of ``summary``."""
    moment = sites["moments"].get("at_oom")
    first = (summary.get("verdict") or {}).get("first_oom")
    if moment is not None and first is not None:
        first["site"] = moment["failed_request"]["site"]


# ----------------------------------------------------------------------------- text
def short_site(site: str, parts: int = 3) -> str:
    """``.../train/models.py:174 in update_nodes``: the last ``parts`` path components of a site."""
    m = _SITE.match(site)
    if not m:
        return site
    path, line, name = m.groups()
    pieces = re.split(r"[/\\]", path)
    shown = "/".join(pieces[-parts:])
    return f"{'.../' if len(pieces) > parts else ''}{shown}:{line} in {name}"


def format_rows(rows: list[dict[str, Any]], indent: str = "    ", causes: bool = False) -> list[str]:
    """Table lines of site rows (rows of 0 bytes and no allocation left out)."""
    lines = []
    for r in rows:
        if r["site"] in (OTHER, UNATTRIBUTED) and not r["bytes"] and not r["count"]:
            continue
        name = short_site(r["site"])
        if r["site"] == OTHER:
            name = f"other sites ({r.get('sites', 0):,})"
        elif r["site"] == UNATTRIBUTED:
            name = "unattributed (no frames recorded)"
        line = f"{indent}{format_bytes(r['bytes']):>12} {r['count']:>7,}  {name}"
        if r.get("category") and r["bytes"]:
            line += f"  ({CATEGORY_LABELS[r['category']]})"
        if causes and r.get("causes"):
            line += "  [" + ", ".join(f"{LABELS[c]} {format_bytes(v)}" for c, v in r["causes"].items()) + "]"
        lines.append(line)
    return lines


def skipped_words(sites: dict[str, Any]) -> str:
    """The sites header's words on what the rule skips (a ``sites`` dict written before it had ``skipped``: its paths)."""
    return sites.get("skipped") or f"skipped: {', '.join(sites['skipped_paths']) or 'nothing'}; change with --site-filter"


def format_sites(sites: dict[str, Any]) -> list[str]:
    """The ``sites`` of a run as text lines (before the verdict)."""
    m = sites["moments"]
    lines = [f"Code sites: the innermost frame of the program ({skipped_words(sites)})"]
    if sites.get("note"):
        lines.append(f"  note: {sites['note']}")
    peak = m["at_peak"]
    lines.append(f"  live at the peak of requested memory ({_where(peak['event_index'])}): "
                 f"{format_bytes(peak['bytes'])} ({peak['bytes']:,} bytes)")
    lines += format_rows(sites["at_peak"])
    oom = m.get("at_oom")
    if oom is not None:
        failed = oom["failed_request"]
        lines.append(f"  live at the first out-of-memory ({_where(oom['event_index'])}): {format_bytes(oom['bytes'])}; "
                     f"the failed {format_bytes(failed['bytes'])} request "
                     + ("has no recorded frames" if failed["site"] == UNATTRIBUTED
                        else f"came from {short_site(failed['site'])}"))
        lines += format_rows(sites["at_oom"])
    waste = m.get("waste")
    if waste is not None:
        lines.append(f"  waste at the peak of reserved memory ({_where(waste['event_index'])}): "
                     f"{format_bytes(waste['bytes'])} = reserved {format_bytes(waste['reserved_bytes'])} - live "
                     f"requested {format_bytes(waste['live_requested_bytes'])}")
        lines += format_rows(sites["waste"], causes=True)
    return lines


def _where(event_index: int) -> str:
    return "the start state" if event_index < 0 else f"after event {event_index:,}"


__all__ = ["format_rows", "format_sites", "name_failed_request", "run_sites", "short_site", "waste_rows"]
