"""``allocsim plot INPUT -o DIR``: figures (PNG + SVG) and the data they were drawn from.

INPUT is one of:

* a trace: each ``--policy`` (default ``pytorch``; specs such as ``pytorch:expandable_segments:True``
  compare settings side by side) is simulated with an attribution observer (timed unless
  ``--fast``) and gets ``timeline``, ``attribution``, ``segments`` (the segment map at the reserved
  peak) and ``latency`` figures beside ``summary.json``, ``timeseries.parquet``,
  ``attribution.parquet`` and ``segments_at_peak.parquet``. One policy writes into DIR; several
  write DIR/<spec>/ each, plus ``comparison`` (peak reserved by cause, ``comparison.parquet``)
  and an overlaid ``latency`` in DIR. ``--set K=V`` goes to every listed policy that has K.
  The trace's live memory stacked by code site (``sites``, ``sites_timeline.parquet``: the top
  ``--sites N`` sites at the peak of live bytes, the rest grouped; ``--site-filter`` as in ``run``)
  goes to DIR once, whatever the policies: live bytes are the program's, not the allocator's.
  Titles name the non-default settings. As in ``allocsim run``, memory follows the trace's
  recorded stream order (the timed replay only adds latency), and the capacity defaults to the
  one the recording implies.
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
from typing import TYPE_CHECKING, Any

from ..errors import AllocsimError
from ..output_file import check_output_file, check_output_folder, make_output_folder, open_output
from ..output_marks import FIGURE_METADATA, write_table, written_by_allocsim
from ..units import parse_bytes
from .common import add_read_args, note_picked_device, trace_limits
from .info import add_site_args, site_options

if TYPE_CHECKING:
    import pandas as pd

#: Tables a result directory may hold, and what they feed.
RESULT_FILES = ("summary.json", "timeseries.parquet", "ooms.parquet", "attribution.parquet",
                "segments_at_peak.parquet", "markers.parquet", "perf.json", "timeseries_timed.parquet")


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
    parser.add_argument("--policy", action="append", default=[], metavar="NAME[:SETTINGS]",
                        help="policy to simulate a trace with (repeatable; default: pytorch); pytorch:SETTINGS takes "
                             "PYTORCH_CUDA_ALLOC_CONF syntax, e.g. --policy pytorch --policy "
                             "pytorch:expandable_segments:True")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="settings",
                        help="policy parameter, given to every listed policy that has it (repeatable)")
    parser.add_argument("--capacity", metavar="SIZE",
                        help="device memory, e.g. 16GiB (default: what the recording implies, else unlimited)")
    parser.add_argument("--device", type=int, metavar="N", help="device to replay (required if the trace has several)")
    parser.add_argument("--fast", action="store_true", help="no timing (no latency figure), faster")
    parser.add_argument("--every", type=int, default=1000, metavar="N",
                        help="attribution sample period in events, besides the peak and every 1%% move "
                             "(default 1000)")
    parser.add_argument("--metric", default="peak_reserved_bytes", metavar="METRIC",
                        help="sweep heatmap metric (default peak_reserved_bytes)")
    add_read_args(parser)
    add_site_args(parser, "draw")
    parser.add_argument("-o", "--out", metavar="DIR", dest="out_dir",
                        help="output directory (required for a trace or sweep; default for a result "
                             "directory: that directory)")
    parser.set_defaults(func=main)


# ----------------------------------------------------------------------------- saving
#: Figures ``plot`` may draw, each as PNG and SVG (``heatmap_K_POLICY`` too, one per sweep group).
FIGURE_STEMS = ("timeline", "attribution", "segments", "latency", "comparison", "sites", "heatmap", "pareto")
#: Tables ``plot`` may write beside them.
PLOT_TABLES = ("comparison.parquet", "sites_timeline.parquet", "sweep_rows.parquet")


def output_names(copies: bool = True) -> tuple[str, ...]:
    """Every fixed file name ``plot`` may write in one folder (checked before any work); without
    ``copies`` (re-drawing a result directory in place) the figures only."""
    figures = tuple(f"{stem}.{ext}" for stem in FIGURE_STEMS for ext in ("png", "svg"))
    return (*figures, *((*RESULT_FILES, *PLOT_TABLES) if copies else ()))


class Writer:
    """Saves figures (PNG + SVG) and tables into one directory, each with allocsim's mark, and lists
    what it wrote; a path that is not ours to write (a FIFO, a user's file) is refused before it is touched."""

    def __init__(self, out: Path, root: Path | None = None):
        self.out = out
        #: The ``-o`` folder: no link below it is followed (``output_write.open_output``).
        self.root = root if root is not None else out
        self.written: list[Path] = []
        make_output_folder(str(out), within=str(self.root))

    def _path(self, name: str) -> Path:
        path = self.out / name
        check_output_file(str(path), "-o", ours=written_by_allocsim, what="a file allocsim wrote")
        return path

    def _open(self, path: Path):
        return open_output(path, ours=written_by_allocsim, what="a file allocsim wrote", within=str(self.root))

    def figure(self, stem: str, draw, size: tuple[float, float] = (10, 4.5), **kwargs: Any) -> None:
        """Draw with ``draw(ax=...)`` on a fresh Figure (no pyplot state) and save it twice."""
        from matplotlib.figure import Figure

        paths = {ext: self._path(f"{stem}.{ext}") for ext in ("png", "svg")}
        fig = Figure(figsize=size, layout="constrained")
        ax = draw(ax=fig.add_subplot(), **kwargs)
        if stem == "segments":
            fig.set_size_inches(11, 1.6 + 0.25 * max(len(ax.get_yticks()), 4))
        for ext, path in paths.items():
            with self._open(path) as fh:
                # "tight": legends placed beside or below the axes and long titles are never cut off.
                fig.savefig(fh, format=ext, dpi=120 if ext == "png" else None, bbox_inches="tight",
                            pad_inches=0.15, metadata=FIGURE_METADATA[ext])
            self.written.append(path)

    def table(self, name: str, df: pd.DataFrame) -> None:
        path = self._path(name)
        write_table(df, path, within=self.root)
        self.written.append(path)

    def copy(self, src: Path, name: str) -> None:
        """Copy a file of a result folder (``RESULT_FILES``) in, as written (a run's tables and JSON)."""
        path = self._path(name)
        with open(src, "rb") as source, self._open(path) as fh:
            shutil.copyfileobj(source, fh)
        self.written.append(path)


# ----------------------------------------------------------------------------- a trace
def _params_per_spec(specs: list[Any], settings: list[str]) -> list[dict[str, Any]]:
    """Each spec's own settings plus the ``--set`` items its policy accepts; a key no policy accepts is an error."""
    from ..policies.registry import accepted_params
    from .run import merge_settings, policy_params

    items = policy_params(settings)
    out = [dict(spec.params) for spec in specs]
    for key, value in items.items():
        takers = []
        for i, spec in enumerate(specs):
            context = {**spec.params, **items} if spec.name == "deferred-gc" else None
            accepted = accepted_params(spec.name, context)
            names = {p.name for p in accepted} | {p.name + "_bytes" for p in accepted if p.unit == "bytes"}
            if key in names:
                takers.append(i)
        if not takers:
            names = ", ".join(spec.text for spec in specs)
            raise ValueError(f"--set {key}: no listed policy ({names}) has a parameter {key!r}")
        for i in takers:
            out[i] = merge_settings((f"--policy {specs[i].text}", out[i]), ("--set", {key: value}))
    return out


def _labels(specs: list[Any]) -> list[str]:
    """One label per spec (its text; a repeated one gets -2, -3 ...)."""
    seen: dict[str, int] = {}
    out = []
    for spec in specs:
        seen[spec.text] = seen.get(spec.text, 0) + 1
        out.append(spec.text if seen[spec.text] == 1 else f"{spec.text}-{seen[spec.text]}")
    return out


def _folder(label: str) -> str:
    """A portable folder name for a label (``pytorch:expandable_segments:True`` -> ``pytorch_expandable_...``)."""
    return "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in label)


def _simulate(trace: Any, spec: Any, params: dict[str, Any], capacity: Any, args: argparse.Namespace):
    """One spec's run with attribution: memory in the trace's order, timing (unless --fast) beside it."""
    from ..cost import CostModel
    from ..engine import run_simpy
    from ..runner import attribute_run
    from ..runner import add_recording, merge_timed, stream_count

    streams = stream_count(trace)
    order_matters = not args.fast and streams > 1
    result, observer, table = attribute_run(trace, spec.name, every=args.every, fast=args.fast or order_matters,
                                            capacity_bytes=capacity.bytes, params=params or None)
    if order_matters:
        timed = run_simpy(trace, spec.name, CostModel(), capacity_bytes=capacity.bytes, params=params or None)
        result = merge_timed(result, timed, streams)
    add_recording(result, trace, spec.name, params, capacity)
    return result, observer, table


def plot_trace(args: argparse.Namespace, out: Path) -> list[Path]:
    """Simulate every policy spec on the trace, write data and figures; return the paths written."""
    from ..settings.alloc_conf import parse_policy_spec
    from ..engine import select_device
    from ..plots import comparison_table, plot_latency, plot_policy_comparison, step_markers
    from ..runner import check_capacity, resolve_capacity
    from ..trace import read_trace
    from .run import find_spec

    specs = [parse_policy_spec(text) for text in (args.policy or ["pytorch"])]
    for spec in specs:
        find_spec(spec.name)
    site_filter, top = site_options(args)
    params = _params_per_spec(specs, args.settings)
    given = parse_bytes(args.capacity, round_down=True) if args.capacity is not None else None
    trace = read_trace(args.input, lenient=args.lenient, limits=trace_limits(args))
    note_picked_device("plot", trace, args.device)
    trace = select_device(trace, args.device)
    capacity = resolve_capacity(trace, given)
    check_capacity(trace, capacity)
    labels = _labels(specs)
    written: list[Path] = []
    peaks, extra, latencies = {}, {}, {}
    for spec, label, own in zip(specs, labels, params):
        result, observer, table = _simulate(trace, spec, own, capacity, args)
        where = out if len(specs) == 1 else out / _folder(label)
        written += write_result(where, result, table, observer.peak_segments,
                                step_markers(trace, result.timeseries, result.summary), root=out)
        peaks[label] = observer.peak or {}
        s = result.summary
        lat = s.get("alloc_latency_ns") or {}
        extra[label] = {"lower_bound_bytes": s["peak_live_lower_bound_bytes"], "oom_count": s["oom_count"],
                        "alloc_latency_p50_ns": lat.get("p50"), "alloc_latency_p99_ns": lat.get("p99")}
        latencies[label] = result.timed_timeseries if result.timed_timeseries is not None else result.timeseries
    if len(specs) > 1:
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
    if top > 0:
        written += write_site_timeline(Writer(out), trace, top, site_filter)
    return written


def _peak_text(table: pd.DataFrame) -> str:
    from ..units import format_bytes

    return format_bytes(int(table.groupby("sample")["live_bytes"].sum().max()))


def write_site_timeline(w: Writer, trace: Any, top: int, site_filter: Any) -> list[Path]:
    """The trace's live bytes stacked by code site: ``sites_timeline.parquet`` and the ``sites`` figure."""
    from ..metrics.sites.timeline import site_timeline
    from ..plots import plot_site_timeline

    # One step per 1.5 pixel columns of the 12-inch, 120-dpi figure's axes (about 900 px wide): every
    # step, the peak's included, is at least a pixel wide.
    table = site_timeline(trace, top=top, site_filter=site_filter, max_points=600)
    w.table("sites_timeline.parquet", table)
    w.figure("sites", plot_site_timeline, size=(12, 5), table=table, time_synthesized=trace.meta.time_synthesized,
             title=None if not len(table) else
             f"Live memory by code site, peak {_peak_text(table)} — {trace.meta.source or 'trace'}")
    return w.written


def write_result(out: Path, result: Any, table: pd.DataFrame | None, segments: pd.DataFrame | None,
                 markers: pd.DataFrame | None, root: Path | None = None) -> list[Path]:
    """Save one run's tables (as ``allocsim run -o`` does, plus attribution) and draw its figures
    (``root``: the ``-o`` folder ``out`` lies in, default ``out``)."""
    paths = list(result.save(out, within=root).values())
    w = Writer(out, root)
    if table is not None:
        w.table("attribution.parquet", table)
    if segments is not None:
        w.table("segments_at_peak.parquet", segments)
    if markers is not None and len(markers):
        w.table("markers.parquet", markers)
    draw_result(w, result.summary, result.timeseries, result.ooms, table, segments, markers,
                result.timed_timeseries)
    return paths + w.written


def draw_result(w: Writer, summary: dict, timeseries: pd.DataFrame, ooms: pd.DataFrame | None,
                table: pd.DataFrame | None, segments: pd.DataFrame | None, markers: pd.DataFrame | None,
                timed_timeseries: pd.DataFrame | None = None) -> None:
    """The figures one run's tables allow (latency from the timed replay's series when it is kept apart)."""
    from ..plots import plot_attribution, plot_latency, plot_segment_map, plot_timeline
    from ..plots._common import policy_label
    from ..units import format_bytes

    w.figure("timeline", plot_timeline, result=timeseries, summary=summary, ooms=ooms, markers=markers)
    if table is not None and len(table):
        w.figure("attribution", plot_attribution, table=table, summary=summary)
    if segments is not None and len(segments):
        peak = summary.get("at_peak_reserved", {})
        w.figure("segments", plot_segment_map, segments=segments,
                 title=f"Segments at the reserved peak ({format_bytes(int(summary['peak_reserved_bytes']))}, "
                       f"event {peak.get('event_index')}) — {policy_label(summary)}")
    timed = timed_timeseries if timed_timeseries is not None else timeseries
    if "latency_ns" in timed.columns:
        w.figure("latency", plot_latency, latencies={policy_label(summary): timed})


# ----------------------------------------------------------------------------- a result directory
def _read_result_dir(src: Path) -> dict[str, Any]:
    import pandas as pd

    data: dict[str, Any] = {"summary": json.loads((src / "summary.json").read_text(encoding="utf-8")),
                            "timeseries": pd.read_parquet(src / "timeseries.parquet")}
    for key, name in (("ooms", "ooms.parquet"), ("table", "attribution.parquet"),
                      ("segments", "segments_at_peak.parquet"), ("markers", "markers.parquet"),
                      ("timed", "timeseries_timed.parquet")):
        data[key] = pd.read_parquet(src / name) if (src / name).is_file() else None
    return data


def plot_result_dir(src: Path, out: Path, root: Path | None = None) -> list[Path]:
    """Re-draw a result directory (or one holding a result per policy and a comparison); ``root``: the
    ``-o`` folder ``out`` lies in (default ``out``)."""
    import pandas as pd

    from ..plots import plot_latency, plot_policy_comparison

    root = root if root is not None else out
    if (src / "summary.json").is_file():
        w = Writer(out, root)
        if out.resolve() != src.resolve():
            for name in RESULT_FILES:
                if (src / name).is_file():
                    w.copy(src / name, name)
            w.written.clear()           # copies are not listed as drawn
        d = _read_result_dir(src)
        draw_result(w, d["summary"], d["timeseries"], d["ooms"], d["table"], d["segments"], d["markers"],
                    d["timed"])
        return w.written
    subdirs = sorted(p for p in src.iterdir() if (p / "summary.json").is_file())
    if not subdirs:
        raise ValueError(f"{src}: no summary.json here or in a subdirectory (not a result directory)")
    written: list[Path] = []
    for sub in subdirs:
        written += plot_result_dir(sub, out / sub.name, root)
    if (src / "comparison.parquet").is_file():
        w = Writer(out, root)
        table = pd.read_parquet(src / "comparison.parquet")
        if out.resolve() != src.resolve():
            w.table("comparison.parquet", table)
        w.figure("comparison", plot_policy_comparison, size=(11, 1.4 + 0.6 * len(table)), table=table,
                 lower_bound_bytes=int(table["lower_bound_bytes"].iloc[0]))
        lat = {sub.name: pd.read_parquet(sub / "timeseries_timed.parquet" if (sub / "timeseries_timed.parquet").is_file()
                                         else sub / "timeseries.parquet") for sub in subdirs}
        if any("latency_ns" in ts.columns for ts in lat.values()):
            w.figure("latency", plot_latency, latencies=lat)
        written += w.written
    return written


# ----------------------------------------------------------------------------- a sweep
def is_sweep_file(path: Path) -> bool:
    """A Parquet file with sweep rows (``policy`` and ``params_json`` columns)."""
    if path.suffix != ".parquet" or not path.is_file():
        return False
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        names = set(pq.read_schema(path).names)
    except (pa.ArrowException, OSError, ValueError):
        return False        # not readable as Parquet: read as a trace, whose reader names the file
    return {"policy", "params_json"} <= names


def plot_sweep(src: Path, out: Path, metric: str, capacity: int | None) -> list[Path]:
    """Heatmap per (trace, policy) and the Pareto front of a sweep's rows."""
    import pandas as pd

    from ..plots import plot_pareto, plot_sweep_heatmap, varying_params
    from ..plots.sweep import DEFAULT_OBJECTIVES, metric_label

    import pyarrow as pa

    from ..errors import quote

    try:
        rows = pd.read_parquet(src)
    except (pa.ArrowException, OSError, ValueError) as exc:     # a damaged file past its footer
        raise ValueError(f"{src}: not a readable sweep results file: {type(exc).__name__}: {quote(str(exc))}") from None
    if metric not in rows.columns:
        raise ValueError(f"no metric {metric!r} in {src}")
    w = Writer(out)
    w.table("sweep_rows.parquet", rows)
    groups = list(rows.groupby(["trace", "policy"], sort=False)) if "trace" in rows.columns else [(("", ""), rows)]
    for k, ((trace, policy), part) in enumerate(groups):
        if not varying_params(part):
            continue
        stem = "heatmap" if len(groups) == 1 else f"heatmap_{k}_{_folder(str(policy))}"   # (a file's text: no "/")
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
def check_output(out: Path, subfolders: list[str], copies: bool = True) -> None:
    """Refuse, before any work, an output folder in which a file ``plot`` may write (in it or in
    ``subfolders``) is a FIFO, a device or a file allocsim did not write (see ``output_file``)."""
    names = output_names(copies)
    check_output_folder(str(out), "-o", files=[*names, *(f"{sub}/" for sub in subfolders),
                                              *(f"{sub}/{name}" for sub in subfolders for name in names)])


def run(args: argparse.Namespace) -> list[Path]:
    """Dispatch on what INPUT is; return the paths written."""
    src = Path(args.input)
    if src.is_dir():
        out = Path(args.out_dir) if args.out_dir else src
        check_output(out, [] if (src / "summary.json").is_file()
                     else [p.name for p in src.iterdir() if (p / "summary.json").is_file()],
                     copies=out.resolve() != src.resolve())
        return plot_result_dir(src, out)
    if not src.exists():
        raise ValueError(f"{src}: no such file or directory")
    if not args.out_dir:
        raise ValueError("-o DIR is required when plotting a trace or a sweep")
    out = Path(args.out_dir)
    if is_sweep_file(src):
        check_output(out, [])
        capacity = parse_bytes(args.capacity, round_down=True) if args.capacity is not None else None
        return plot_sweep(src, out, args.metric, capacity)
    from ..settings.alloc_conf import parse_policy_spec

    labels = _labels([parse_policy_spec(text) for text in (args.policy or ["pytorch"])])
    check_output(out, [_folder(label) for label in labels] if len(labels) > 1 else [])
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
