"""The data of one report page: ``report_data(trace, runs, ...)`` decimates and indexes in Python.

The page gets compact, already-thinned data, never one entry per event: timelines as per-pixel
maxima (``metrics.decimate``) over ``TIMELINE_COLUMNS`` buckets, segment maps as flat arrays, and
only the allocations and stacks those maps and tables show (interned once). Every number is an
integer byte count as the run computed it; the page only draws and formats.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..metrics.categories import CATEGORIES, Categories, category_timeline
from ..metrics.decimate import bucket_max, bucket_starts
from ..trace.schema import EventKind, Trace

#: Buckets shipped per timeline: the page re-buckets them per pixel, so zooming in keeps every peak.
TIMELINE_COLUMNS = 8192
#: Pieces shipped per segment map at most (the rest summed per segment into one "not shown" piece).
MAX_PIECES = 60000
#: Frames shipped per stack at most.
MAX_FRAMES = 60

SEGMENT_STATES = ("requested", "rounding", "pending_free", "gc_queue", "free", "stranded", "device_rounding")


@dataclass
class PolicyRun:
    """One replay for the page: its label, result, code sites, and segment maps with their owners."""

    label: str
    result: Any
    verdict_line: str
    maps: dict[str, tuple[int, Any, dict[int, int]]] = field(default_factory=dict)  # name -> (event, table, addr->aid)


class StackTable:
    """Interns the stacks the page shows: frame texts once, each stack a list of frame numbers."""

    def __init__(self, trace: Trace, program: np.ndarray):
        self.trace = trace
        self.program = program
        self.frames: list[str] = []
        self._frame_no: dict[str, int] = {}
        self.stacks: list[list[int]] = []
        self._stack_no: dict[int, int] = {}

    def add(self, stack_id: int) -> int:
        """The page's number of ``stack_id`` (-1: no frames): program frames first, then the rest."""
        if stack_id < 0:
            return -1
        known = self._stack_no.get(stack_id)
        if known is not None:
            return known
        starts, rows = self.trace._stack_index()
        frame_rows = rows[starts[stack_id]:starts[stack_id + 1]]
        fr = self.trace.frames
        files, lines, names = fr["filename"].to_numpy(), fr["line"].to_numpy(), fr["name"].to_numpy()
        user = [r for r in frame_rows.tolist() if self.program[r]]
        other = [r for r in frame_rows.tolist() if not self.program[r]]
        numbers = []
        for r in (user + other)[:MAX_FRAMES]:
            text = f"{files[r]}:{lines[r]} in {names[r]}" if files[r] else str(names[r])
            if r in user:
                text = "* " + text
            n = self._frame_no.get(text)
            if n is None:
                n = self._frame_no[text] = len(self.frames)
                self.frames.append(text)
            numbers.append(n)
        self._stack_no[stack_id] = len(self.stacks)
        self.stacks.append(numbers)
        return self._stack_no[stack_id]


class AllocTable:
    """The allocations the page shows: size, category, lifetime (events) and stack, each once."""

    def __init__(self, trace: Trace, categories: Categories, stacks: StackTable):
        self.stacks = stacks
        self.categories = categories
        ev = trace.events
        kind = ev["kind"].to_numpy()
        ids = ev["alloc_id"].to_numpy()
        init = trace.initial_allocs
        alloc = kind == EventKind.ALLOC
        self._ids = np.concatenate([init["alloc_id"].to_numpy(), ids[alloc]]).astype(np.int64)
        self._size = np.concatenate([init["size_bytes"].to_numpy(), ev["size_bytes"].to_numpy()[alloc]])
        self._stack = np.concatenate([init["stack_id"].to_numpy(), ev["stack_id"].to_numpy()[alloc]])
        self._born = np.concatenate([np.full(len(init), -1), np.flatnonzero(alloc)])
        order = np.argsort(self._ids, kind="stable")
        self._ids, self._size, self._stack, self._born = (a[order] for a in (self._ids, self._size, self._stack,
                                                                               self._born))
        self._died = np.full(len(self._ids), -1, dtype=np.int64)
        done = np.flatnonzero(kind == EventKind.FREE_COMPLETED)
        if len(done) and len(self._ids):
            pos = np.minimum(np.searchsorted(self._ids, ids[done]), len(self._ids) - 1)
            ok = self._ids[pos] == ids[done]
            self._died[pos[ok]] = done[ok]
        self.rows: list[list[int]] = []      # [alloc_id, size_bytes, category, born, died, stack]
        self._row_of: dict[int, int] = {}

    def add(self, alloc_id: int) -> int:
        """The page's row number of ``alloc_id`` (-1 when the trace does not know it)."""
        known = self._row_of.get(alloc_id)
        if known is not None:
            return known
        pos = int(np.searchsorted(self._ids, alloc_id))
        if pos >= len(self._ids) or self._ids[pos] != alloc_id:
            return -1
        code = int(self.categories.of(np.array([alloc_id]))[0])
        self._row_of[alloc_id] = len(self.rows)
        self.rows.append([int(alloc_id), int(self._size[pos]), code, int(self._born[pos]), int(self._died[pos]),
                          self.stacks.add(int(self._stack[pos]))])
        return self._row_of[alloc_id]


def _series(event_index: np.ndarray, values: np.ndarray, starts: np.ndarray, n_events: int) -> list[int]:
    """Per-bucket maxima of ``values`` (given after ``event_index``), carried forward over empty buckets."""
    if not len(values):
        return []
    pos = np.searchsorted(event_index, starts, side="right") - 1          # the value in force at each bucket start
    bucket_of = np.searchsorted(starts, np.clip(event_index, 0, None), side="right") - 1
    carried = np.where(pos >= 0, values[np.maximum(pos, 0)], values[0]).astype(np.int64)
    peak = carried.copy()
    inside = bucket_of >= 0
    np.maximum.at(peak, bucket_of[inside], values[inside].astype(np.int64))
    return peak.tolist()


def timelines(trace: Trace, runs: list[PolicyRun]) -> dict[str, Any]:
    """Live, simulated allocated / reserved per policy and recorded reserved (when the trace has it), per bucket."""
    from ..trace.inference.stats import live_bytes_series

    n = len(trace.events)
    starts = bucket_starts(np.arange(n), TIMELINE_COLUMNS)
    _, total = live_bytes_series(trace)
    out: dict[str, Any] = {"x": starts.tolist(), "events": n, "live": bucket_max(total, starts).tolist(),
                           "runs": [], "recorded": {}}
    for run in runs:
        ts = run.result.timeseries
        ev = ts["event_index"].to_numpy()
        keep = ev >= 0
        order = np.argsort(ev[keep], kind="stable")
        e = ev[keep][order]
        out["runs"].append({col: _series(e, ts[col].to_numpy()[keep][order], starts, n)
                            for col in ("allocated_bytes", "reserved_bytes")})
    rec = recorded_reserved(trace)
    if rec is not None:
        out["recorded"]["reserved_bytes"] = _series(rec[0], rec[1], starts, n)
    series = trace.recorded_series
    if len(series) and (series["allocated_bytes"] >= 0).any():
        ok = (series["event_index"] >= 0) & (series["allocated_bytes"] >= 0)
        out["recorded"]["allocated_bytes"] = _series(series["event_index"].to_numpy()[ok],
                                                     series["allocated_bytes"].to_numpy()[ok], starts, n)
    return out


def recorded_reserved(trace: Trace) -> tuple[np.ndarray, np.ndarray] | None:
    """The real allocator's reserved bytes after each recorded decision (snapshots) or total (Kineto)."""
    series = trace.recorded_series
    if len(series) and (series["reserved_bytes"] >= 0).any():
        ok = (series["event_index"] >= 0) & (series["reserved_bytes"] >= 0)
        return series["event_index"].to_numpy()[ok], series["reserved_bytes"].to_numpy()[ok]
    d = trace.decisions
    grow = d["action"].isin(["segment_alloc", "segment_map"]).to_numpy()
    shrink = d["action"].isin(["segment_free", "segment_unmap"]).to_numpy()
    if not len(trace.initial_segments) and not grow.any():
        return None
    delta = np.where(grow, d["size_bytes"].to_numpy(), 0) - np.where(shrink, d["size_bytes"].to_numpy(), 0)
    base = int(trace.initial_segments["size_bytes"].sum())
    keep = grow | shrink
    idx = np.concatenate([[0], d["event_index"].to_numpy()[keep]])
    values = np.concatenate([[base], base + np.cumsum(delta[keep])])
    return idx.astype(np.int64), values.astype(np.int64)


def segment_map(table: Any, owners: dict[int, int], allocs: AllocTable) -> dict[str, Any]:
    """A segment map as flat arrays: per segment its address, size, pool; per piece its segment, offset,
    size, state and (live pieces) the page's allocation row."""
    if table is None or not len(table):
        return {"segments": [], "pieces": [], "truncated": 0}
    segs = table.drop_duplicates("segment")
    segments = [[int(r.segment_addr), int(r.segment_bytes), str(r.pool), int(r.stream)]
                for r in segs.itertuples(index=False)]
    seg_no = {int(s): k for k, s in enumerate(segs["segment"].tolist())}
    pieces: list[list[int]] = []
    truncated = 0
    for r in table.itertuples(index=False):
        if len(pieces) >= MAX_PIECES:
            truncated += 1
            continue
        owner = -1
        if r.state in ("requested", "pending_free"):
            aid = owners.get(int(r.segment_addr) + int(r.offset_bytes))
            owner = allocs.add(aid) if aid is not None else -1
        pieces.append([seg_no[int(r.segment)], int(r.offset_bytes), int(r.size_bytes),
                       SEGMENT_STATES.index(r.state) if r.state in SEGMENT_STATES else 0, owner])
    return {"segments": segments, "pieces": pieces, "truncated": truncated}


def site_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Site rows as the page shows them (frames kept: the whole program stack of the row's largest stack)."""
    return [{"site": r["site"], "bytes": int(r["bytes"]), "count": int(r["count"]),
             "category": r.get("category"), "frames": r.get("frames", []), "causes": r.get("causes")}
            for r in rows if r["bytes"] or r["count"]]


def report_data(trace: Trace, runs: list[PolicyRun], categories: Categories, program: np.ndarray,
                advice: dict[str, Any] | None = None, advice_text: str | None = None) -> dict[str, Any]:
    """Everything the page draws, JSON-ready."""
    stacks = StackTable(trace, program)
    allocs = AllocTable(trace, categories, stacks)
    out_runs = []
    for run in runs:
        s = run.result.summary
        sites = s.get("sites") or {}
        maps = {name: {"event_index": int(ev), **segment_map(table, owners, allocs)}
                for name, (ev, table, owners) in run.maps.items()}
        out_runs.append({
            "label": run.label, "verdict": run.verdict_line, "fits": (s.get("verdict") or {}).get("fits"),
            "peak_requested_bytes": s.get("peak_requested_bytes"), "peak_allocated_bytes": s.get("peak_allocated_bytes"),
            "peak_reserved_bytes": s.get("peak_reserved_bytes"), "lower_bound_bytes": s.get("peak_live_lower_bound_bytes"),
            "capacity_bytes": s.get("capacity_bytes"), "oom_count": s.get("oom_count"),
            "categories": s.get("categories"),
            "sites": {k: site_rows(sites.get(k) or []) for k in ("at_peak", "at_oom", "waste")},
            "moments": sites.get("moments"), "maps": maps,
        })
    return {
        "trace": trace.meta.source, "format": trace.meta.format, "events": len(trace.events),
        "time_synthesized": bool(trace.meta.time_synthesized),
        "categories": list(CATEGORIES), "states": list(SEGMENT_STATES),
        "timelines": timelines(trace, runs), "runs": out_runs,
        "category_timeline": category_timeline(trace, categories, TIMELINE_COLUMNS),
        "allocs": allocs.rows, "stacks": stacks.stacks, "frames": stacks.frames,
        "advice": advice, "advice_text": advice_text,
    }
