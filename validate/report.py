"""Reports of a validation: the machine, then predicted against measured per policy, as Markdown and JSON.

``write_report(results, out_dir)`` writes ``results.json`` (everything) and ``report.md`` (the
tables, the targets and why each missed one was missed). ``python -m validate.report merge DIR...
-o OUT`` joins several result folders into one report (the GPU script uses it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping

from allocsim.metrics.summary import jsonable
from allocsim.units import format_bytes

from .replay import P50_TARGET_PCT, PEAK_TARGET_PCT

SCHEMA = "allocsim-validate/1"


# ====================================================================== machine
def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _mem_total() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _version(module: str) -> str | None:
    try:
        mod = __import__(module)
    except Exception:
        return None
    return str(getattr(mod, "__version__", "?"))


def describe_machine(backend: str = "host", *, device_id: int = 0) -> dict[str, Any]:
    """CPU, memory, OS and library versions; on ``cupy`` also the GPU model, memory, driver and runtime."""
    import mmap

    out: dict[str, Any] = {
        "cpu_model": _cpu_model(), "cpu_count": os.cpu_count(), "memory_bytes": _mem_total(),
        "platform": platform.platform(), "python": sys.version.split()[0], "page_bytes": mmap.PAGESIZE,
        "numpy": _version("numpy"), "pandas": _version("pandas"), "simpy": _version("simpy"),
    }
    if backend == "cupy":
        try:
            from .devices import import_cupy

            cp = import_cupy()
            rt = cp.cuda.runtime
            props = rt.getDeviceProperties(device_id)
            name = props.get("name", b"")
            driver = rt.driverGetVersion()
            runtime = rt.runtimeGetVersion()
            out["gpu"] = {
                "name": name.decode(errors="replace") if isinstance(name, bytes) else str(name),
                "device_id": device_id,
                "total_memory_bytes": int(props.get("totalGlobalMem", 0)),
                "compute_capability": f"{props.get('major')}.{props.get('minor')}",
                "multiprocessors": props.get("multiProcessorCount"),
                "cuda_driver_version": f"{driver // 1000}.{driver % 1000 // 10}",
                "cuda_runtime_version": f"{runtime // 1000}.{runtime % 1000 // 10}",
                "cupy": cp.__version__,
                "torch": _version("torch"),
            }
            try:
                import subprocess

                smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                     capture_output=True, text=True, timeout=10)
                if smi.returncode == 0:
                    out["gpu"]["nvidia_driver"] = smi.stdout.strip().splitlines()[0]
            except (OSError, subprocess.SubprocessError, IndexError):
                pass
        except Exception as exc:  # the report must not fail for want of a detail
            out["gpu"] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def machine_line(machine: Mapping[str, Any]) -> str:
    """One line naming the machine."""
    parts = [f"CPU {machine.get('cpu_model')} ({machine.get('cpu_count')} cores)"]
    if machine.get("memory_bytes"):
        parts.append(f"{format_bytes(machine['memory_bytes'])} RAM")
    gpu = machine.get("gpu")
    if gpu and "name" in gpu:
        parts.append(f"GPU {gpu['name']} ({format_bytes(gpu['total_memory_bytes'])}, CC {gpu['compute_capability']}, "
                     f"CUDA driver {gpu['cuda_driver_version']}"
                     + (f" / {gpu['nvidia_driver']}" if gpu.get("nvidia_driver") else "")
                     + f", runtime {gpu['cuda_runtime_version']}, CuPy {gpu['cupy']}"
                     + (f", torch {gpu['torch']}" if gpu.get("torch") else "") + ")")
    parts.append(f"Python {machine.get('python')}, {machine.get('platform')}")
    return "; ".join(parts)


# ====================================================================== markdown
def _b(value: Any) -> str:
    return "—" if value is None else f"{int(value):,}"


def _pct(value: Any) -> str:
    return "—" if value is None else f"{value:+.2f} %"


def _ns(value: Any) -> str:
    return "—" if value is None else f"{int(value):,}"


def _mark(ok: bool | None) -> str:
    return "—" if ok is None else ("yes" if ok else "**no**")


def policy_table(rows: Iterable[Mapping[str, Any]], *, label: str = "policy") -> list[str]:
    """Markdown table: predicted against measured per policy (or per real allocator)."""
    lines = [f"| {label} | predicted peak B | measured peak B | peak err | device mallocs pred / meas | "
             "device frees pred / meas | p50 ns pred / meas | p50 err | p99 ns pred / meas | p99 err | "
             f"peak ≤{PEAK_TARGET_PCT:g}% | p50 ≤{P50_TARGET_PCT:g}% |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|:-:|:-:|"]
    for r in rows:
        if r.get("skipped"):
            lines.append(f"| {r.get('name', r.get('policy'))} | skipped: {r['skipped']} |" + " |" * 10)
            continue
        if r.get("error"):
            lines.append(f"| {r.get('name', r.get('policy'))} | error: {r['error']} |" + " |" * 10)
            continue
        t = r.get("targets") or {}
        name = r.get("name") or r.get("policy")
        if r.get("preset"):
            name = f"{name} (vs `{r['preset']}`)"
        lines.append(
            f"| {name} | {_b(r.get('predicted_peak_bytes'))} | {_b(r.get('measured_peak_bytes'))} | "
            f"{_pct(r.get('peak_error_pct'))} | {_b(r.get('predicted_device_mallocs'))} / "
            f"{_b(r.get('measured_device_mallocs'))} | {_b(r.get('predicted_device_frees'))} / "
            f"{_b(r.get('measured_device_frees'))} | {_ns(r.get('predicted_p50_ns'))} / "
            f"{_ns(r.get('measured_p50_ns'))} | {_pct(r.get('latency_error_pct'))} | "
            f"{_ns(r.get('predicted_p99_ns'))} / {_ns(r.get('measured_p99_ns'))} | {_pct(r.get('p99_error_pct'))} | "
            f"{_mark(t.get('peak_within_1pct'))} | {_mark(t.get('p50_within_20pct'))} |")
    return lines


def render_run(run: Mapping[str, Any], *, level: str = "##") -> list[str]:
    """The Markdown section of one validation run (one trace, one backend)."""
    opts = run.get("options") or {}
    trace = run.get("trace") or {}
    lines = [f"{level} {trace.get('source', 'trace')} on `{run.get('backend')}`", ""]
    lines.append(f"- trace: {trace.get('source')} ({trace.get('format')}), {trace.get('events'):,} events, "
                 f"{trace.get('allocs'):,} allocations, {trace.get('streams')} stream(s), peak live "
                 f"{format_bytes(trace.get('peak_live_bytes') or 0)}")
    cm = run.get("cost_model") or {}
    lines.append(f"- cost model: {cm.get('source') or 'allocsim defaults (placeholders, not calibrated)'}")
    lines.append(f"- footprint rule: granularity {_b(run.get('granularity_bytes'))} B, small "
                 f"{_b(run.get('small_granularity_bytes'))} B; options: "
                 + ", ".join(f"{k}={v}" for k, v in opts.items()))
    lines.append(f"- wall time: {run.get('seconds')} s")
    lines.append("")
    if run.get("policies"):
        lines += policy_table(run["policies"])
        lines.append("")
        extra = [r for r in run["policies"] if r.get("measured_rss_peak_bytes") is not None]
        if extra:
            lines.append("Independent host measurement (pages populated): resident-set growth at the peak, "
                         "against the predicted peak:")
            lines.append("")
            lines.append("| policy | predicted peak B | RSS growth B | error |")
            lines.append("|---|---:|---:|---:|")
            for r in extra:
                lines.append(f"| {r['policy']} | {_b(r['predicted_peak_bytes'])} | "
                             f"{_b(r['measured_rss_peak_bytes'])} | {_pct(r.get('rss_peak_error_pct'))} |")
            lines.append("")
    if opts.get("compute"):
        timed = [r for r in list(run.get("policies") or []) + list(run.get("real_allocators") or [])
                 if r.get("measured_total_ns") is not None]
        if timed:
            lines.append(f"With compute (gaps scaled by {opts.get('time_scale')}): simulated makespan against the "
                         "measured wall time of the whole replay:")
            lines.append("")
            lines.append("| run | predicted makespan ns | measured total ns | error |")
            lines.append("|---|---:|---:|---:|")
            for r in timed:
                lines.append(f"| {r.get('name') or r.get('policy')} | {_ns(r.get('predicted_makespan_ns'))} | "
                             f"{_ns(r.get('measured_total_ns'))} | {_pct(r.get('makespan_error_pct'))} |")
            lines.append("")
    if run.get("real_allocators"):
        lines.append(f"{level}# Real allocators")
        lines.append("")
        lines += policy_table(run["real_allocators"], label="allocator")
        lines.append("")
        pools = [r for r in run["real_allocators"] if r.get("measured_pool_peak_bytes") is not None]
        if pools:
            lines.append("The allocators' own accounting (bytes they asked of the driver) against the preset's:")
            lines.append("")
            lines.append("| allocator | predicted pool peak B | measured pool peak B | error |")
            lines.append("|---|---:|---:|---:|")
            for r in pools:
                lines.append(f"| {r['name']} | {_b(r.get('predicted_pool_peak_bytes'))} | "
                             f"{_b(r.get('measured_pool_peak_bytes'))} | {_pct(r.get('pool_peak_error_pct'))} |")
            lines.append("")
    notes = [(r.get("name") or r.get("policy"), n) for r in list(run.get("policies") or [])
             + list(run.get("real_allocators") or []) for n in (r.get("notes") or [])]
    if notes:
        lines.append("Why targets were missed:")
        lines.append("")
        lines += [f"- `{name}`: {note}" for name, note in notes]
        lines.append("")
    for note in run.get("notes") or []:
        lines.append(f"- {note}")
    if run.get("notes"):
        lines.append("")
    return lines


def render_markdown(doc: Mapping[str, Any]) -> str:
    """The whole ``report.md``."""
    lines = [f"# allocsim validation: {doc.get('title', 'predicted vs measured')}", ""]
    machine = doc.get("machine") or {}
    lines.append(f"Machine: {machine_line(machine)}.")
    lines.append("")
    for para in doc.get("preamble") or []:
        lines.append(para)
        lines.append("")
    lines.append(f"Targets: predicted peak within {PEAK_TARGET_PCT:g} % of measured for every policy; allocation "
                 f"latency p50 within {P50_TARGET_PCT:g} % after calibration. Errors are (predicted − measured) "
                 "/ measured.")
    lines.append("")
    cal = doc.get("calibration")
    if cal:
        lines += render_calibration(cal)
    for run in doc.get("runs") or []:
        lines += render_run(run)
    for section in doc.get("extra_sections") or []:
        lines += section.splitlines()
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def render_calibration(cal: Mapping[str, Any]) -> list[str]:
    """The calibration section: fitted constants, granularity table, device-call table."""
    lines = ["## Calibration", ""]
    consts = cal.get("constants") or {}
    if consts:
        lines.append("| constant | value |")
        lines.append("|---|---:|")
        lines += [f"| `{k}` | {v} |" for k, v in consts.items()]
        lines.append("")
    prov = cal.get("provenance") or {}
    meas = prov.get("_measurements") or {}
    gran = meas.get("granularity") or {}
    if gran:
        lines.append(f"Footprint rule: granularity {_b(gran.get('granularity_bytes'))} B, small granularity "
                     f"{_b(gran.get('small_granularity_bytes'))} B ({gran.get('rule', '')}).")
        lines.append("")
        table = gran.get("table") or []
        if table:
            keys = [k for k in table[0] if k != "size_bytes"]
            lines.append("| size B | " + " | ".join(keys) + " |")
            lines.append("|---:|" + "---:|" * len(keys))
            for row in table:
                lines.append(f"| {row['size_bytes']:,} | " + " | ".join(
                    "—" if row.get(k) is None else (f"{row[k]:,.0f}" if isinstance(row[k], (int, float)) else str(row[k]))
                    for k in keys) + " |")
            lines.append("")
    calls = meas.get("device_calls") or []
    if calls:
        lines.append("| size B | malloc median ns | free median ns |")
        lines.append("|---:|---:|---:|")
        lines += [f"| {r['size_bytes']:,} | {r['malloc_median_ns']:,.0f} | {r['free_median_ns']:,.0f} |" for r in calls]
        lines.append("")
    return lines


# ====================================================================== files
#: What ``write_report`` writes in its folder (checked before any work by ``check_report_folder``).
REPORT_FILES = ("results.json", "report.md")
#: Whole-file caps on what ``merge`` reads (results of a validation are kilobytes to a few MiB).
MAX_RESULTS_BYTES = 256 << 20


def check_report_folder(out_dir: str | os.PathLike, option: str = "-o") -> None:
    """Refuse, before any work, a report folder ``write_report`` must not write (``output_file``'s rules:
    its parent exists, and ``results.json`` / ``report.md`` there are absent or files allocsim wrote)."""
    from allocsim.output_file import check_output_folder

    check_output_folder(os.fspath(out_dir), option, files=REPORT_FILES)


def write_report(doc: Mapping[str, Any], out_dir: str | os.PathLike) -> dict[str, Path]:
    """Write ``results.json`` and ``report.md`` into ``out_dir`` (created if its parent exists) through
    ``output_write.open_output``: a file there is replaced only if allocsim wrote it, no link is followed."""
    from allocsim.output_file import make_output_folder, open_output
    from allocsim.output_marks import write_json, written_by_allocsim

    out = Path(out_dir)
    make_output_folder(os.fspath(out))    # its parent must exist: a mistyped path is an error, not a new tree
    data = {"schema": SCHEMA, **{k: v for k, v in dict(jsonable(dict(doc))).items() if k != "schema"}}
    paths = {"json": out / "results.json", "markdown": out / "report.md"}
    write_json(data, paths["json"], SCHEMA, within=out, allow_nan=False)
    with open_output(paths["markdown"], ours=written_by_allocsim, what="a report allocsim wrote", within=out,
                     text=True) as fh:
        fh.write(render_markdown(data))
    return paths


def _read_json(path: Path, what: str) -> Any:
    """``path`` parsed, or ValueError naming it and why (too large, unreadable, not JSON)."""
    from allocsim.jsonfile import parse_json

    try:
        with open(path, "rb") as fh:
            text = fh.read(MAX_RESULTS_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"{path}: cannot read {what} ({exc.strerror or type(exc).__name__})") from None
    if len(text) > MAX_RESULTS_BYTES:
        raise ValueError(f"{path}: larger than {MAX_RESULTS_BYTES >> 20} MiB; not {what}")
    return parse_json(text, f"{path}: {what}")


def _check_run(run: Any, where: str) -> None:
    """Refuse (ValueError naming ``where``, the file and record) a run ``render_run`` cannot show."""
    if not isinstance(run, dict):
        raise ValueError(f"{where}: not an object but {type(run).__name__}")
    for key in ("trace", "options", "cost_model"):
        if run.get(key) is not None and not isinstance(run[key], dict):
            raise ValueError(f"{where}: {key!r} is {type(run[key]).__name__}, not an object")
    for key in ("policies", "real_allocators", "notes"):
        if run.get(key) is not None and not isinstance(run[key], list):
            raise ValueError(f"{where}: {key!r} is {type(run[key]).__name__}, not a list")
    for key in ("policies", "real_allocators"):
        for i, row in enumerate(run.get(key) or []):
            if not isinstance(row, dict):
                raise ValueError(f"{where}: {key}[{i}] is {type(row).__name__}, not an object")
    try:
        render_run(run)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"{where}: cannot be shown ({type(exc).__name__}: {exc})") from None


def merge(dirs: Iterable[str | os.PathLike], *, title: str | None = None,
          calibration: str | os.PathLike | None = None, preamble: list[str] | None = None,
          extra_sections: list[str] | None = None) -> dict[str, Any]:
    """Join the ``results.json`` of several folders (each one or more runs) into one document.

    A folder without ``results.json`` (a step that did not run) is skipped with a note on stderr; a
    path that is not a folder, a file that is not JSON, a ``runs`` that is not a list of runs, or a
    calibration that is not a JSON object is a ValueError naming the file and the record.
    """
    runs: list[Any] = []
    machine = None
    for d in dirs:
        folder = Path(d)
        if folder.exists() and not folder.is_dir():
            raise ValueError(f"{folder}: is a file, not a result folder (give the folder that holds results.json)")
        path = folder / "results.json"
        if not path.exists():
            print(f"validate.report: note: {folder}: no results.json, skipped", file=sys.stderr)
            continue
        doc = _read_json(path, "a results file")
        if not isinstance(doc, dict):
            raise ValueError(f"{path}: not a results file (a JSON {type(doc).__name__}, not an object)")
        found = doc.get("runs") or []
        if not isinstance(found, list):
            raise ValueError(f"{path}: 'runs' is {type(found).__name__}, not a list of runs")
        for i, run in enumerate(found):
            _check_run(run, f"{path}: runs[{i}]")
        if doc.get("machine") is not None and not isinstance(doc["machine"], dict):
            raise ValueError(f"{path}: 'machine' is {type(doc['machine']).__name__}, not an object")
        machine = machine or doc.get("machine")
        runs += found
    out: dict[str, Any] = {"schema": SCHEMA, "title": title or "predicted vs measured", "machine": machine or {},
                           "runs": runs, "preamble": preamble or [], "extra_sections": extra_sections or []}
    if calibration and Path(calibration).exists():
        data = _read_json(Path(calibration), "a calibration file")
        if not isinstance(data, dict):
            raise ValueError(f"{calibration}: not a calibration file (a JSON {type(data).__name__}, not an object)")
        out["calibration"] = {"constants": {k: v for k, v in data.items() if not k.startswith("_")},
                              "provenance": {k: v for k, v in data.items() if k.startswith("_")}}
        device = data.get("_device")
        out["machine"] = out["machine"] or (device if isinstance(device, dict) else {})
        try:
            render_calibration(out["calibration"])
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"{calibration}: cannot be shown ({type(exc).__name__}: {exc})") from None
    return out


def _read_section(path: str) -> str | None:
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_RESULTS_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ValueError(f"--section-file {path}: cannot read it ({exc.strerror or type(exc).__name__})") from None
    if len(data) > MAX_RESULTS_BYTES:
        raise ValueError(f"--section-file {path}: larger than {MAX_RESULTS_BYTES >> 20} MiB")
    return data.decode("utf-8", errors="replace")


def main(argv: list[str] | None = None) -> int:
    """``python -m validate.report merge DIR... -o OUT [--calibration FILE] [--title T] [--note TEXT]``.

    Exit status 0 written, 2 bad input (one line naming the file and why; nothing written).
    """
    from allocsim.terminal import escaped_output

    parser = argparse.ArgumentParser(prog="python -m validate.report")
    sub = parser.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("merge", help="join result folders into one report.md + results.json")
    m.add_argument("dirs", nargs="+")
    m.add_argument("-o", "--out", required=True,
                   help="folder for report.md and results.json (created if its parent exists; a file there "
                        "is replaced only if allocsim wrote it)")
    m.add_argument("--calibration")
    m.add_argument("--title")
    m.add_argument("--note", action="append", default=[], help="a paragraph for the top of the report")
    m.add_argument("--section-file", action="append", default=[], help="a Markdown file appended as a section")
    args = parser.parse_args(argv)
    with escaped_output():
        try:
            check_report_folder(args.out)                     # before reading anything
            sections = [text for text in map(_read_section, args.section_file) if text is not None]
            doc = merge(args.dirs, title=args.title, calibration=args.calibration, preamble=args.note,
                        extra_sections=sections)
            paths = write_report(doc, args.out)
        except (ValueError, OSError) as exc:
            print(f"validate.report: error: {exc}", file=sys.stderr)
            return 2
        print(f"wrote {paths['markdown']} and {paths['json']} ({len(doc['runs'])} runs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
