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
from ..metrics.sites.rule import MAX_FRAME_PART_CHARS, frame_text
from ..trace.schema import EventKind, Trace

#: Buckets shipped per timeline: the page re-buckets them per pixel, so zooming in keeps every peak.
TIMELINE_COLUMNS = 8192
#: Pieces shipped per segment map at most (the rest counted as "not shown").
MAX_PIECES = 60000
#: Pieces shipped over all the page's segment maps at most: with the frame caps below, this bounds
#: the page's size whatever the trace and the number of policies.
MAX_PAGE_PIECES = 240_000
#: Frames shipped per stack at most.
MAX_FRAMES = 60
#: Characters of frame text one page holds at most (each frame is cut by ``frame_text`` too).
MAX_PAGE_FRAME_CHARS = 4 << 20
#: Frames over all the page's stacks at most (a stack is a list of frame numbers).
MAX_PAGE_STACK_FRAMES = 1_000_000

SEGMENT_STATES = ("requested", "rounding", "pending_free", "gc_queue", "free", "stranded", "device_rounding")


@dataclass
class PolicyRun:
    """One replay for the page: its label, result, code sites, and segment maps with their owners."""

    label: str
    result: Any
    verdict_line: str
    maps: dict[str, tuple[int, Any, dict[int, int]]] = field(default_factory=dict)  # name -> (event, table, addr->aid)


class StackTable:
    """Interns the stacks the page shows: frame texts once, each stack a list of frame numbers.

    The frame columns are read once (never per stack: a trace where every allocation has its own
    stack made that quadratic), each frame's text is cut by ``frame_text``, and the page holds at
    most ``MAX_PAGE_FRAME_CHARS`` characters of frame text and ``MAX_PAGE_STACK_FRAMES`` frames over
    all its stacks: a stack met after that shows one line saying so, counted in ``cut_stacks``.
    """

    def __init__(self, trace: Trace, program: np.ndarray):
        self.trace = trace
        self.program = program
        self.frames: list[str] = []
        self._frame_no: dict[int, int] = {}
        self.stacks: list[list[int]] = []
        self._stack_no: dict[int, int] = {}
        self._columns: tuple[list, list, list] | None = None
        self.text_chars = 0
        self.frame_refs = 0
        self.cut_stacks = 0
        self.clipped_frames = 0
        self._cut_frame: int | None = None

    def _frame_columns(self) -> tuple[list, list, list]:
        if self._columns is None:
            fr = self.trace.table("frames")
            self._columns = (fr["filename"].tolist(), fr["line"].tolist(), fr["name"].tolist())
        return self._columns

    def _number(self, row: int, user: bool) -> int:
        n = self._frame_no.get(row)
        if n is None:
            files, lines, names = self._frame_columns()
            file, name = str(files[row]), str(names[row])
            if len(file) > MAX_FRAME_PART_CHARS or len(name) > MAX_FRAME_PART_CHARS:
                self.clipped_frames += 1
            text = frame_text(file, int(lines[row]), name)
            text = "* " + text if user else text
            n = self._frame_no[row] = len(self.frames)
            self.frames.append(text)
            self.text_chars += len(text)
        return n

    def _cut(self) -> list[int]:
        self.cut_stacks += 1
        if self._cut_frame is None:
            self._cut_frame = len(self.frames)
            self.frames.append(f"(frames not shown: the page holds at most {MAX_PAGE_FRAME_CHARS:,} characters "
                               f"of frame text and {MAX_PAGE_STACK_FRAMES:,} frames over all its stacks)")
        return [self._cut_frame]

    def add(self, stack_id: int) -> int:
        """The page's number of ``stack_id`` (-1: no frames): program frames first, then the rest."""
        if stack_id < 0:
            return -1
        known = self._stack_no.get(stack_id)
        if known is not None:
            return known
        starts, rows = self.trace._stack_index()
        frame_rows = rows[starts[stack_id]:starts[stack_id + 1]]
        user = frame_rows[self.program[frame_rows]].tolist()
        other = frame_rows[~self.program[frame_rows]].tolist()
        shown = ([(r, True) for r in user] + [(r, False) for r in other])[:MAX_FRAMES]
        if self.text_chars > MAX_PAGE_FRAME_CHARS or self.frame_refs + len(shown) > MAX_PAGE_STACK_FRAMES:
            numbers = self._cut()
        else:
            numbers = [self._number(r, is_user) for r, is_user in shown]
            self.frame_refs += len(numbers)
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


def segment_map(table: Any, owners: dict[int, int], allocs: AllocTable, max_pieces: int = MAX_PIECES) -> dict[str, Any]:
    """A segment map as flat arrays: per segment its address, size, pool; per piece its segment, offset,
    size, state and (live pieces) the page's allocation row; at most ``max_pieces`` pieces (``truncated``: the rest)."""
    if table is None or not len(table):
        return {"segments": [], "pieces": [], "truncated": 0}
    segs = table.drop_duplicates("segment")
    segments = [[int(r.segment_addr), int(r.segment_bytes), str(r.pool), int(r.stream)]
                for r in segs.itertuples(index=False)]
    seg_no = {int(s): k for k, s in enumerate(segs["segment"].tolist())}
    pieces: list[list[int]] = []
    truncated = 0
    for r in table.itertuples(index=False):
        if len(pieces) >= max_pieces:
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
    pieces_left = MAX_PAGE_PIECES
    cut_pieces = 0
    for run in runs:
        s = run.result.summary
        sites = s.get("sites") or {}
        maps = {}
        for name, (ev, table, owners) in run.maps.items():
            maps[name] = {"event_index": int(ev), **segment_map(table, owners, allocs, min(MAX_PIECES, pieces_left))}
            pieces_left -= len(maps[name]["pieces"])
            cut_pieces += maps[name]["truncated"]
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
        "advice": advice, "advice_text": advice_text, "cuts": page_cuts(stacks, cut_pieces),
    }


def page_cuts(stacks: StackTable, cut_pieces: int) -> list[str]:
    """What the page leaves out to stay small, one sentence each (the page shows them under its title)."""
    cuts = []
    if stacks.clipped_frames:
        cuts.append(f"{stacks.clipped_frames:,} frames have a file or function name longer than "
                    f"{MAX_FRAME_PART_CHARS} characters: their middle is cut, marked [N characters cut]")
    if stacks.cut_stacks:
        cuts.append(f"{stacks.cut_stacks:,} stacks are shown without their frames: the page holds at most "
                    f"{MAX_PAGE_FRAME_CHARS:,} characters of frame text and {MAX_PAGE_STACK_FRAMES:,} frames "
                    "over all its stacks")
    if cut_pieces:
        cuts.append(f"{cut_pieces:,} pieces of the segment maps are not drawn: a map shows at most {MAX_PIECES:,} "
                    f"and the page {MAX_PAGE_PIECES:,} (each map says how many it leaves out)")
    return cuts
