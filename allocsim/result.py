"""What a run returns: ``RunResult.summary`` (JSON-ready), ``.timeseries`` (one row per event), ``.save()``.

``summary`` and the files ``save`` writes are deterministic: the same trace, policy, parameters and
cost model give byte-identical ``summary.json``. Wall-clock figures (``sim_seconds``,
``events_per_second``) live apart in ``perf`` (and ``perf.json``).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pandas as pd

from .metrics.series import build_timeseries, with_derived
from .metrics.summary import OOM_COLUMNS, RunInfo, RunOutput, summarize
from .metrics.verdict import format_duration_ns
from .output_file import make_output_folder, open_output
from .output_marks import is_json_output, write_json, write_table
from .units import format_bytes


#: The files ``RunResult.save`` may write in its folder.
RESULT_FILES = ("summary.json", "timeseries.parquet", "perf.json", "ooms.parquet", "timeseries_timed.parquet")
#: ``perf.json``'s first key.
PERF_SCHEMA = "allocsim-perf/1"


@dataclasses.dataclass
class RunResult:
    """Summary, per-event time series, OOM table and wall-clock performance of one simulated run."""

    summary: dict[str, Any]
    #: event_index, t_ns, kind, [sim_t_ns, latency_ns,] requested/allocated/active/reserved_bytes;
    #: row 0 (event_index -1) is the state after the initial allocations; rows in execution order.
    timeseries: pd.DataFrame
    #: One row per failed allocation (the first only, unless continue_on_oom).
    ooms: pd.DataFrame
    #: Wall-clock figures: sim_seconds, events_per_second (not deterministic).
    perf: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: The timed replay's time series when the memory figures come from a trace-order replay
    #: (multi-stream traces in timed mode; see ``allocsim.runner``), else None.
    timed_timeseries: pd.DataFrame | None = None

    def to_dict(self, *, include_perf: bool = False) -> dict[str, Any]:
        """The summary, plus the wall-clock figures when ``include_perf``."""
        data = dict(self.summary)
        if include_perf:
            data.update(self.perf)
        return data

    def to_json(self, *, include_perf: bool = False, indent: int | None = 2) -> str:
        """The summary as JSON text (deterministic unless ``include_perf``)."""
        return json.dumps(self.to_dict(include_perf=include_perf), indent=indent, allow_nan=False)

    def save(self, out_dir: str | os.PathLike, within: str | os.PathLike | None = None) -> dict[str, Path]:
        """Write summary.json, timeseries.parquet (with derived columns), perf.json, ooms.parquet after an OOM,
        and timeseries_timed.parquet when the timed replay is kept beside the trace-order one (``RESULT_FILES``),
        each with allocsim's mark (``output_marks``), through ``output_write.open_output`` (no link followed).

        ``out_dir`` is created if its parent exists; ``within``: the ``-o`` folder it lies in (default itself).
        """
        out = Path(out_dir)
        root = os.fspath(within if within is not None else out)
        make_output_folder(os.fspath(out), within=root)
        paths = {"summary": out / "summary.json", "timeseries": out / "timeseries.parquet",
                 "perf": out / "perf.json"}
        with open_output(paths["summary"], ours=is_json_output, what="a JSON file allocsim wrote", within=root,
                         text=True) as fh:
            fh.write(self.to_json() + "\n")   # (its first key: "schema")
        write_table(with_derived(self.timeseries), paths["timeseries"], within=root)
        write_json(self.perf, paths["perf"], PERF_SCHEMA, within=root)
        if len(self.ooms):
            paths["ooms"] = out / "ooms.parquet"
            write_table(self.ooms, paths["ooms"], within=root)
        if self.timed_timeseries is not None:
            paths["timeseries_timed"] = out / "timeseries_timed.parquet"
            write_table(with_derived(self.timed_timeseries), paths["timeseries_timed"], within=root)
        return paths

    def format_text(self) -> str:
        """A human-readable report in the spirit of ``torch.cuda.memory_summary()``."""
        return format_summary(self.summary, self.perf)


_WIDTH = 79


def _rule(char: str = "-") -> str:
    return "|" + char * (_WIDTH - 2) + "|"


def _row(*cells: str, widths: tuple[int, ...] = (31, 15, 15, 13)) -> str:
    parts = [f" {cells[0]:<{widths[0] - 1}}"]
    parts += [f"{cell:>{width - 1}} " for cell, width in zip(cells[1:], widths[1:])]
    return "|" + "|".join(parts) + "|"


def _title(text: str) -> str:
    if len(text) > _WIDTH - 4:
        text = text[:_WIDTH - 7] + "..."
    return "|" + text.center(_WIDTH - 2) + "|"


def _b(value: int | None) -> str:
    return "-" if value is None else format_bytes(int(value))


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _ns(value: int | float | None) -> str:
    return "-" if value is None else format_duration_ns(value)


def _count(value: int | None) -> str:
    return "-" if value is None else f"{int(value):,}"


def _recorded_rows(s: dict[str, Any]) -> list[str]:
    """The simulated figures beside the recorded ones, for every figure the recording holds."""
    rec = s.get("recorded")
    if not rec:
        return []
    rows = []
    for label, key, show in (("  peak reserved", "peak_reserved_bytes", _b),
                             ("  peak allocated", "peak_allocated_bytes", _b),
                             ("  cudaMalloc", "device_mallocs", _count), ("  cudaFree", "device_frees", _count),
                             ("  page maps", "device_maps", _count), ("  page unmaps", "device_unmaps", _count),
                             ("  OOMs", "oom_count", _count)):
        if rec.get(key) is not None:
            rows.append(_row(label, show(s.get(key)), show(rec[key]), _difference(s.get(key), rec[key], show)))
    if not rows:
        return []
    return [_rule(), _row("Simulated vs recorded", "Simulated", "Recorded", ""), *rows]


def _difference(simulated: int | None, recorded: int, show: Any) -> str:
    """``equal``, or simulated minus recorded with its sign (so a difference that rounds away still shows)."""
    if simulated == recorded:
        return "equal"
    if simulated is None:
        return "differs"
    delta = int(simulated) - int(recorded)
    return ("+" if delta > 0 else "-") + show(abs(delta))


def _timed_rows(s: dict[str, Any]) -> list[str]:
    """Memory figures of the timed replay beside the trace-order ones, when they differ."""
    timed = s.get("timed_memory")
    if not timed or not timed.get("differs"):
        return []
    oom = s.get("oom")
    rows = [_rule(), _row("Memory by replay order", "Trace order", "Timed", "")]
    for label, key in (("  peak requested", "peak_requested_bytes"), ("  peak allocated", "peak_allocated_bytes"),
                       ("  peak reserved", "peak_reserved_bytes")):
        rows.append(_row(label, _b(s[key]), _b(timed[key]), ""))
    rows.append(_row("  cudaMalloc / cudaFree", f"{s['device_mallocs']:,} / {s['device_frees']:,}",
                     f"{timed['device_mallocs']:,} / {timed['device_frees']:,}", ""))
    rows.append(_row("  first OOM at event", _count(None if oom is None else oom["event_index"]),
                     _count(timed.get("oom_event_index")), ""))
    return rows


def _notes(s: dict[str, Any]) -> list[str]:
    """Lines under the table: replay order, reproduction, where the capacity came from, OOM details."""
    lines = []
    timed = s.get("timed_memory")
    if timed and timed.get("differs"):
        lines.append(f"memory figures and OOMs follow the recorded order of the {timed['streams']} streams; the "
                     "Timed column is the timed replay, where simulated delays reorder streams (--fast gives the "
                     "trace-order figures alone)")
    repro = s.get("reproduction")
    if repro:
        lines.append(repro["line"])
    verdict = s.get("verdict") or {}
    if verdict.get("capacity_source") == "inferred":
        least = "at least " if verdict.get("capacity_is_lower_bound") else ""
        lines.append(f"capacity {least}{_b(verdict['capacity_bytes'])} inferred from the recording"
                     + (f": {verdict['capacity_note']}" if verdict.get("capacity_note") else "")
                     + " (--capacity SIZE overrides it)")
    oom = s.get("oom")
    if oom and not (verdict.get("line") or "").startswith("OUT OF MEMORY"):
        # A negative index is the start state (placing what was live before the trace), as the verdict says.
        where = "at the start state" if oom["event_index"] < 0 else f"at event {oom['event_index']:,}"
        lines.append(f"first OOM {where}: {_b(oom['requested_bytes'])} requested with "
                     f"{_b(oom['reserved_bytes'])} reserved, {_b(oom['allocated_bytes'])} allocated"
                     + ("" if s["completed"] else "; the run stopped there"))
    return lines


def format_summary(s: dict[str, Any], perf: dict[str, Any] | None = None) -> str:
    """Render a run summary as a table (metric, current, peak, peak / lower bound), the recorded figures
    beside the simulated ones, notes, and last the verdict line."""
    trace = s.get("trace", {})
    lines = [_rule("="),
             _title(f"allocsim run: policy {s['policy']} ({s['mode']})"),
             _title(f"{trace.get('source') or 'trace'}, device(s) {trace.get('devices')}, "
                    f"{s['events_replayed']:,} of {s['events']:,} events"),
             _rule(), _row("Metric", "Current", "Peak", "Peak / LB"), _rule()]
    vs = s.get("peak_over_lower_bound", {})
    for label, key in (("Requested memory", "requested"), ("Allocated memory", "allocated"),
                       ("Active memory (incl. pending)", "active"), ("Reserved memory", "reserved")):
        lines.append(_row(label, _b(s[f"final_{key}_bytes"]), _b(s[f"peak_{key}_bytes"]), _ratio(vs.get(key))))
    lines.append(_row("Inactive (cached free)", _b(s["final_inactive_bytes"]), _b(s["peak_inactive_bytes"]), ""))
    granted = s.get("peak_live_granted_bytes")
    demand = granted is not None and granted < s["peak_live_lower_bound_bytes"]   # a recorded OOM's request in it
    lines.append(_row(f"Lower bound (peak {'demand' if demand else 'live'})", "",
                      _b(s["peak_live_lower_bound_bytes"]), "1.000"))
    if demand:
        lines.append(_row("  held by the real run", "", _b(granted), ""))
    at_peak = s["at_peak_reserved"]
    lines += [_rule(), _row("At peak reserved", "", "", ""),
              _row("  internal fragmentation", "", "unknown" if at_peak["internal_fragmentation_bytes"] is None
                   else _b(at_peak["internal_fragmentation_bytes"]), ""),
              _row("  external fragmentation", "", _b(at_peak["external_fragmentation_bytes"]), ""),
              _row("  largest free block", _b(s["largest_free_block_final_bytes"]),
                   _b(s["largest_free_block_at_peak_bytes"]), ""),
              _row("Fragmentation 1 - A/R", "", _ratio(s["fragmentation"]["ratio"]), ""),
              _rule(), _row("Device and pool calls", "Count", "Bytes", ""),
              _row("  cudaMalloc", f"{s['device_mallocs']:,}", _b(s["device_malloc_bytes"]), ""),
              _row("  cudaFree", f"{s['device_frees']:,}", _b(s["device_free_bytes"]), "")]
    if s.get("device_maps") or s.get("device_unmaps"):
        lines += [_row("  page maps", f"{s['device_maps']:,}", _b(s["device_map_bytes"]), ""),
                  _row("  page unmaps", f"{s['device_unmaps']:,}", _b(s["device_unmap_bytes"]), "")]
    lines += [_row("  pool hits", f"{s['pool_hits']:,}", "", ""),
              _row("  splits / merges", f"{s['splits']:,} / {s['merges']:,}", "", ""),
              _row("  GC batches", f"{s['gc_batches']:,}", "", ""),
              _row("  OOMs", f"{s['oom_count']:,}", "", "")]
    lat = s.get("alloc_latency_ns")
    if lat:
        lines += [_rule(), _row("Time (simulated)", "p50", "p99", "max"),
                  _row("  allocation latency", _ns(lat["p50"]), _ns(lat["p99"]), _ns(lat["max"])),
                  _row("  device syncs / stall", f"{s['sync_count']:,}", _ns(s["stall_ns"]), ""),
                  _row("  makespan / trace span", _ns(s["makespan_ns"]), _ns(s["trace_span_ns"]),
                       _ratio(s["makespan_over_span"]))]
    lines += _recorded_rows(s)
    lines += _timed_rows(s)
    lines.append(_rule("="))
    lines += _notes(s)
    if perf and perf.get("sim_seconds") is not None:
        eps = perf.get("events_per_second")
        lines.append(f"simulated in {perf['sim_seconds']:.3f} s"
                     + (f" ({eps:,.0f} events/s)" if eps else "")
                     + (f", policy kernel: {perf['policy_kernel']}" if perf.get("policy_kernel") else ""))
    verdict = s.get("verdict")
    if verdict:
        lines.append(verdict["line"])
    return "\n".join(lines)


def build_result(run: RunOutput, info: RunInfo) -> RunResult:
    """Turn a finished replay into a ``RunResult`` (time series, summary, OOM table, wall-clock perf)."""
    timeseries = build_timeseries(run.samples, run.trace.column("t_ns"), run.trace.column("kind"), run.t0_ns)
    summary = summarize(run, info, timeseries)
    ooms = pd.DataFrame(run.ooms, columns=list(OOM_COLUMNS))
    events = summary["events_replayed"]
    perf = {"sim_seconds": round(info.wall_s, 6),
            "events_per_second": round(events / info.wall_s, 1) if info.wall_s > 0 else None}
    return RunResult(summary=summary, timeseries=timeseries, ooms=ooms, perf=perf)
