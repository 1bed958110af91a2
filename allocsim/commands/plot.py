"""``allocsim plot INPUT -o DIR``: figures (PNG + SVG) and the data they were drawn from.

INPUT is one of:

* a trace: each ``--policy`` (default ``pytorch``) is simulated with an attribution observer
  (timed unless ``--fast``) and gets ``timeline``, ``attribution``, ``segments`` (the segment map at
  the reserved peak) and ``latency`` figures beside ``summary.json``, ``timeseries.parquet``,
  ``attribution.parquet`` and ``segments_at_peak.parquet``. One policy writes into DIR; several
  write DIR/<policy>/ each, plus ``comparison`` (peak reserved by cause, ``comparison.parquet``)
  and an overlaid ``latency`` in DIR. ``--set K=V`` goes to every listed policy that has K.
* a result directory (``allocsim run -o`` or an earlier ``allocsim plot``): the figures its tables
  allow, written to DIR (default: beside the tables);
* a sweep results Parquet (``allocsim sweep``): a heatmap of ``--metric`` per trace and policy and,
  when the sweep was timed, the Pareto front of peak reserved vs p99 latency with the winner.

Bad input exits 2 with one line on stderr.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from ..errors import AllocsimError
from ..units import parse_bytes

#: Tables a result directory may hold, and what they feed.
RESULT_FILES = ("summary.json", "timeseries.parquet", "ooms.parquet", "attribution.parquet",
                "segments_at_peak.parquet", "markers.parquet", "perf.json")


def register(subparsers) -> None:
    """Add the ``plot`` subcommand."""
    parser = subparsers.add_parser(
        "plot", help="draw figures of a trace's simulation, a run's results or a sweep",
        description="Draw PNG and SVG figures and write the data they were drawn from beside them. Given a "
                    "trace, simulate each --policy and draw the memory timeline, where reserved memory "
                    "goes over time (by cause), the segment map at the peak and the allocation-latency "
                    "distribution (plus a comparison when several policies). Given a result directory "
                    "(allocsim run -o) or a sweep results file, plot those.",
        epilog="examples:\n  allocsim plot traces/bert_fp32.json.gz --policy pytorch --policy cupy -o figs/\n"
               "  allocsim run T --policy paddle -o run/ && allocsim plot run/\n"
               "  allocsim plot results.parquet -o sweep-figs/ --metric peak_reserved_bytes",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("input", metavar="RESULT_OR_TRACE", help="trace file, result directory or sweep Parquet")
    parser.add_argument("--policy", action="append", default=[], metavar="NAME",
                        help="policy to simulate a trace with (repeatable; default: pytorch)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="settings",
                        help="policy parameter, given to every listed policy that has it (repeatable)")
    parser.add_argument("--capacity", metavar="SIZE", help="device memory, e.g. 16GiB (default: unlimited)")
    parser.add_argument("--device", type=int, metavar="N", help="device to replay (required if the trace has several)")
    parser.add_argument("--fast", action="store_true", help="no timing (no latency figure), faster")
    parser.add_argument("--every", type=int, default=1000, metavar="N",
                        help="attribution sample period in events, besides the peak and every 1%% move "
                             "(default 1000)")
    parser.add_argument("--metric", default="peak_reserved_bytes", metavar="METRIC",
                        help="sweep heatmap metric (default peak_reserved_bytes)")
    parser.add_argument("--lenient", action="store_true", help="repair what can be repaired in a bad trace")
    parser.add_argument("-o", "--out", metavar="DIR", dest="out_dir",
                        help="output directory (required for a trace or sweep; default for a result "
                             "directory: that directory)")
    parser.set_defaults(func=main)


# ----------------------------------------------------------------------------- saving
class Writer:
    """Saves figures (PNG + SVG) and tables into one directory and lists what it wrote."""

    def __init__(self, out: Path):
        self.out = out
        self.written: list[Path] = []
        out.mkdir(parents=True, exist_ok=True)

    def figure(self, stem: str, draw, size: tuple[float, float] = (10, 4.5), **kwargs: Any) -> None:
        """Draw with ``draw(ax=...)`` on a fresh Figure (no pyplot state) and save it twice."""
        from matplotlib.figure import Figure

        fig = Figure(figsize=size, layout="constrained")
        ax = draw(ax=fig.add_subplot(), **kwargs)
        if stem == "segments":
            fig.set_size_inches(11, 1.6 + 0.25 * max(len(ax.get_yticks()), 4))
        for ext in ("png", "svg"):
            path = self.out / f"{stem}.{ext}"
            fig.savefig(path, dpi=120 if ext == "png" else None)
            self.written.append(path)

    def table(self, name: str, df: pd.DataFrame) -> None:
        path = self.out / name
        df.to_parquet(path, index=False)
        self.written.append(path)

    def json(self, name: str, data: Any) -> None:
        path = self.out / name
        path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        self.written.append(path)


# ----------------------------------------------------------------------------- a trace
def _params_per_policy(policies: list[str], settings: list[str]) -> dict[str, dict[str, str]]:
    """``--set`` items for each policy that accepts the key; a key no policy accepts is an error."""
    from ..policies.registry import accepted_params
    from .run import policy_params

    items = policy_params(settings)
    out: dict[str, dict[str, str]] = {name: {} for name in policies}
    for key, value in items.items():
        takers = []
        for name in policies:
            names = {p.name for p in accepted_params(name, items if name == "deferred-gc" else None)}
            names |= {p.name + "_bytes" for p in accepted_params(name, items if name == "deferred-gc" else None)
                      if p.unit == "bytes"}
            if key in names:
                takers.append(name)
        if not takers:
            raise ValueError(f"--set {key}: no listed policy ({', '.join(policies)}) has a parameter {key!r}")
        for name in takers:
            out[name][key] = value
    return out


def _labels(policies: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for name in policies:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name}-{seen[name]}")
    return out


def plot_trace(args: argparse.Namespace, out: Path) -> list[Path]:
    """Simulate every policy on the trace, write data and figures; return the paths written."""
    from ..engine import select_device
    from ..metrics.attribution import attribute_run
    from ..plots import comparison_table, plot_latency, plot_policy_comparison, step_markers
    from ..trace import read_trace

    policies = list(args.policy) or ["pytorch"]
    params = _params_per_policy(policies, args.settings)
    capacity = parse_bytes(args.capacity) if args.capacity is not None else None
    trace = select_device(read_trace(args.input, lenient=args.lenient), args.device)
    labels = _labels(policies)
    written: list[Path] = []
    peaks, extra, latencies = {}, {}, {}
    for name, label in zip(policies, labels):
        result, observer, table = attribute_run(trace, name, every=args.every, fast=args.fast,
                                                capacity_bytes=capacity, params=params[name] or None)
        where = out if len(policies) == 1 else out / label
        written += write_result(where, result, table, observer.peak_segments,
                                step_markers(trace, result.timeseries, result.summary))
        peaks[label] = observer.peak or {}
        s = result.summary
        lat = s.get("alloc_latency_ns") or {}
        extra[label] = {"lower_bound_bytes": s["peak_live_lower_bound_bytes"], "oom_count": s["oom_count"],
                        "alloc_latency_p50_ns": lat.get("p50"), "alloc_latency_p99_ns": lat.get("p99")}
        latencies[label] = result.timeseries
    if len(policies) > 1:
        w = Writer(out)
        table = comparison_table(peaks, extra, order=labels)
        w.table("comparison.parquet", table)
        lower = int(table["lower_bound_bytes"].iloc[0])
        w.figure("comparison", plot_policy_comparison, size=(11, 1.4 + 0.6 * len(table)), table=table,
                 lower_bound_bytes=lower, title=f"Peak reserved memory by policy, split by cause — "
                                                f"{trace.meta.source or 'trace'}")
        if not args.fast:
            w.figure("latency", plot_latency, latencies=latencies)
        written += w.written
    return written


def write_result(out: Path, result: Any, table: pd.DataFrame | None, segments: pd.DataFrame | None,
                 markers: pd.DataFrame | None) -> list[Path]:
    """Save one run's tables (as ``allocsim run -o`` does, plus attribution) and draw its figures."""
    paths = list(result.save(out).values())
    w = Writer(out)
    if table is not None:
        w.table("attribution.parquet", table)
    if segments is not None:
        w.table("segments_at_peak.parquet", segments)
    if markers is not None and len(markers):
        w.table("markers.parquet", markers)
    draw_result(w, result.summary, result.timeseries, result.ooms, table, segments, markers)
    return paths + w.written


def draw_result(w: Writer, summary: dict, timeseries: pd.DataFrame, ooms: pd.DataFrame | None,
                table: pd.DataFrame | None, segments: pd.DataFrame | None, markers: pd.DataFrame | None) -> None:
    """The figures one run's tables allow."""
    from ..plots import plot_attribution, plot_latency, plot_segment_map, plot_timeline
    from ..units import format_bytes

    w.figure("timeline", plot_timeline, result=timeseries, summary=summary, ooms=ooms, markers=markers)
    if table is not None and len(table):
        w.figure("attribution", plot_attribution, table=table, summary=summary)
    if segments is not None and len(segments):
        peak = summary.get("at_peak_reserved", {})
        w.figure("segments", plot_segment_map, segments=segments,
                 title=f"Segments at the reserved peak ({format_bytes(int(summary['peak_reserved_bytes']))}, "
                       f"event {peak.get('event_index')}) — {summary.get('policy')}")
    if "latency_ns" in timeseries.columns:
        w.figure("latency", plot_latency, latencies={str(summary.get("policy")): timeseries})


# ----------------------------------------------------------------------------- a result directory
def _read_result_dir(src: Path) -> dict[str, Any]:
    data: dict[str, Any] = {"summary": json.loads((src / "summary.json").read_text(encoding="utf-8")),
                            "timeseries": pd.read_parquet(src / "timeseries.parquet")}
    for key, name in (("ooms", "ooms.parquet"), ("table", "attribution.parquet"),
                      ("segments", "segments_at_peak.parquet"), ("markers", "markers.parquet")):
        data[key] = pd.read_parquet(src / name) if (src / name).is_file() else None
    return data


def plot_result_dir(src: Path, out: Path) -> list[Path]:
    """Re-draw a result directory (or one holding a result per policy and a comparison)."""
    from ..plots import plot_latency, plot_policy_comparison

    if (src / "summary.json").is_file():
        if out.resolve() != src.resolve():
            out.mkdir(parents=True, exist_ok=True)
            for name in RESULT_FILES:
                if (src / name).is_file():
                    shutil.copy2(src / name, out / name)
        w = Writer(out)
        d = _read_result_dir(src)
        draw_result(w, d["summary"], d["timeseries"], d["ooms"], d["table"], d["segments"], d["markers"])
        return w.written
    subdirs = sorted(p for p in src.iterdir() if (p / "summary.json").is_file())
    if not subdirs:
        raise ValueError(f"{src}: no summary.json here or in a subdirectory (not a result directory)")
    written: list[Path] = []
    for sub in subdirs:
        written += plot_result_dir(sub, out / sub.name)
    if (src / "comparison.parquet").is_file():
        w = Writer(out)
        table = pd.read_parquet(src / "comparison.parquet")
        if out.resolve() != src.resolve():
            w.table("comparison.parquet", table)
        w.figure("comparison", plot_policy_comparison, size=(11, 1.4 + 0.6 * len(table)), table=table,
                 lower_bound_bytes=int(table["lower_bound_bytes"].iloc[0]))
        lat = {sub.name: pd.read_parquet(sub / "timeseries.parquet") for sub in subdirs}
        if any("latency_ns" in ts.columns for ts in lat.values()):
            w.figure("latency", plot_latency, latencies=lat)
        written += w.written
    return written


# ----------------------------------------------------------------------------- a sweep
def is_sweep_file(path: Path) -> bool:
    """A Parquet file with sweep rows (``policy`` and ``params_json`` columns)."""
    if path.suffix != ".parquet" or not path.is_file():
        return False
    import pyarrow.parquet as pq

    names = set(pq.read_schema(path).names)
    return {"policy", "params_json"} <= names


def plot_sweep(src: Path, out: Path, metric: str, capacity: int | None) -> list[Path]:
    """Heatmap per (trace, policy) and the Pareto front of a sweep's rows."""
    from ..plots import plot_pareto, plot_sweep_heatmap, varying_params
    from ..plots.sweep import DEFAULT_OBJECTIVES, metric_label

    rows = pd.read_parquet(src)
    if metric not in rows.columns:
        raise ValueError(f"no metric {metric!r} in {src}")
    w = Writer(out)
    w.table("sweep_rows.parquet", rows)
    groups = list(rows.groupby(["trace", "policy"], sort=False)) if "trace" in rows.columns else [(("", ""), rows)]
    for k, ((trace, policy), part) in enumerate(groups):
        if not varying_params(part):
            continue
        stem = "heatmap" if len(groups) == 1 else f"heatmap_{k}_{policy}"
        n_x = max(part[c].astype(str).nunique() for c in varying_params(part))
        w.figure(stem, plot_sweep_heatmap, size=(5.5 + 1.2 * n_x, 2.0 + 0.45 * len(part) / max(n_x, 1)),
                 rows=part, metric=metric, title=f"{metric_label(metric)}: {policy}\non {Path(str(trace)).name}")
    latency = DEFAULT_OBJECTIVES[1]
    if latency in rows.columns and rows[latency].notna().any():
        winner = None
        try:
            from ..sweep.pareto import select

            cap = capacity if capacity is not None else _sweep_capacity(rows)
            winner = select(rows, list(DEFAULT_OBJECTIVES), cap).winner
        except ImportError:
            pass
        traces = ", ".join(sorted({Path(str(t)).name for t in rows.get("trace", pd.Series(dtype=str))}))
        w.figure("pareto", plot_pareto, size=(10, 6), rows=rows, winner=winner,
                 winner_label="winner: lowest peak that fits, then lowest p99",
                 title=f"Memory vs latency trade-off{' — ' + traces if traces else ''}")
    return w.written


def _sweep_capacity(rows: pd.DataFrame) -> int | None:
    if "capacity_bytes" not in rows.columns or rows["capacity_bytes"].isna().all():
        return None
    return int(rows["capacity_bytes"].dropna().iloc[0])


# ----------------------------------------------------------------------------- entry point
def run(args: argparse.Namespace) -> list[Path]:
    """Dispatch on what INPUT is; return the paths written."""
    src = Path(args.input)
    if src.is_dir():
        return plot_result_dir(src, Path(args.out_dir) if args.out_dir else src)
    if not src.exists():
        raise ValueError(f"{src}: no such file or directory")
    if not args.out_dir:
        raise ValueError("-o DIR is required when plotting a trace or a sweep")
    out = Path(args.out_dir)
    if is_sweep_file(src):
        capacity = parse_bytes(args.capacity) if args.capacity is not None else None
        return plot_sweep(src, out, args.metric, capacity)
    return plot_trace(args, out)


def main(args: argparse.Namespace) -> int:
    """Draw; print the files written; 2 with one line on stderr on bad input."""
    try:
        written = run(args)
    except (AllocsimError, ValueError, OSError, KeyError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"allocsim plot: error: {message}", file=sys.stderr)
        return 2
    figures = sorted({p.stem for p in written if p.suffix == ".png"})
    print(f"wrote {len(written)} files to {args.out_dir or args.input} (figures: {', '.join(figures) or 'none'})")
    for path in written:
        print(f"  {path}")
    return 0
