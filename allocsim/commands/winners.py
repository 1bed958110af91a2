"""``allocsim winners RESULTS.parquet``: the Pareto front over memory and latency, and what fits a capacity.

Objectives: ``--minimise METRIC [--then METRIC ...]`` in order (default ``peak_reserved_bytes`` then
``alloc_latency_ns.p99``; the latency one is dropped, with a note, for a ``--fast`` sweep). Rows with
an error or an OOM-stopped run are left out. ``--capacity`` defaults to the sweep's capacity. Each
row comes with the ``allocsim run`` command that reproduces it. Exit 0 with a winner, 1 when nothing
fits, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING, Any

from ..errors import AllocsimError, quote
from ..units import GiB, parse_bytes

if TYPE_CHECKING:
    import pandas as pd


def register(subparsers) -> None:
    """Add the ``winners`` subcommand."""
    parser = subparsers.add_parser(
        "winners", help="Pareto front and best fitting configurations of a sweep",
        description="Read `allocsim sweep` results, keep configurations that ran to completion, and report the "
                    "Pareto front over the objectives, those that fit a capacity (peak reserved <= capacity, "
                    "no OOM) sorted lexicographically by the objectives, and the winner, each with the "
                    "`allocsim run` command that reproduces it.")
    parser.add_argument("results", metavar="RESULTS.parquet", help="results file written by `allocsim sweep`")
    parser.add_argument("--minimise", "--minimize", metavar="METRIC", dest="minimise",
                        help="first objective (default: peak_reserved_bytes, then alloc_latency_ns.p99)")
    parser.add_argument("--then", action="append", default=[], metavar="METRIC",
                        help="next objective, breaking ties of the ones before (repeatable)")
    parser.add_argument("--capacity", metavar="SIZE", help="device memory to fit (default: the sweep's --capacity)")
    parser.add_argument("--trace", metavar="PATH", help="results of this trace only (needed when there are several)")
    parser.add_argument("--top", type=int, metavar="N", help="list at most N fitting rows (default: 10 in text, all in JSON)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=main)


# ----------------------------------------------------------------------------- choosing inputs
def objectives_from_args(df: pd.DataFrame, minimise: str | None, then: list[str],
                         note=lambda msg: None) -> list[str]:
    """The objectives asked for; the default latency objective is dropped when no row has it."""
    from ..sweep.pareto import DEFAULT_OBJECTIVES

    if minimise is None:
        if then:
            raise ValueError("--then needs --minimise METRIC first")
        objectives = list(DEFAULT_OBJECTIVES)
        latency = objectives[1]
        if latency not in df.columns or df[latency].isna().all():
            note(f"no {latency} in these results (a --fast sweep?): minimising {objectives[0]} only")
            objectives = objectives[:1]
        return objectives
    objectives = [minimise, *then]
    if len(set(objectives)) != len(objectives):
        raise ValueError(f"an objective is given twice: {objectives}")
    return objectives


def only_trace(df: pd.DataFrame, trace: str | None) -> pd.DataFrame:
    """The rows of one trace: ``trace`` matches the path, its file name or a sha256 prefix."""
    traces = list(dict.fromkeys(df["trace"].tolist())) if len(df) else []
    if trace is None:
        if len(traces) > 1:
            raise ValueError(f"the results hold {len(traces)} traces; choose one with --trace "
                             f"({', '.join(traces)})")
        return df
    names = df["trace"].astype(str)
    mask = (names == trace) | (names.str.rsplit("/", n=1).str[-1] == trace) | df["trace_sha256"].str.startswith(trace)
    if not mask.any():
        raise ValueError(f"--trace {trace}: not in the results ({', '.join(traces)})")
    return df[mask]


def check_rows(df: pd.DataFrame, path: str) -> None:
    """Refuse a results file whose rows name an unknown policy or parameters it cannot take.

    Each row's ``allocsim run`` command is rebuilt from its policy and ``params_json``; a hand-edited
    or foreign file must fail here, in one line naming the row, not while printing the table.
    """
    from ..jsonfile import parse_json
    from ..policies.registry import policy_specs
    from ..sweep.grid import accepted_keys, set_args

    known = {spec.name for spec in policy_specs()}
    for i, (policy, params_json) in enumerate(zip(df["policy"].tolist(), df["params_json"].tolist())):
        where = f"{path}: row {i}"
        if policy not in known:
            raise ValueError(f"{where}: unknown policy {quote(policy)} (known: {', '.join(sorted(known))})")
        params = parse_json(params_json, f"{where}: params_json") if isinstance(params_json, str) else None
        if not isinstance(params, dict):
            raise ValueError(f"{where}: params_json is not a JSON object of parameters")
        try:
            table = accepted_keys(policy, [params.get("inner", "")] if isinstance(params.get("inner"), str) else [])
            unknown = [key for key in params if key not in table]
            if unknown:
                raise ValueError(f"no parameter {quote(unknown[0])}")
            set_args(policy, params)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{where}: policy {policy} cannot take params_json {quote(params_json)} "
                             f"({type(exc).__name__}: {quote(str(exc))})") from None


def default_capacity(df: pd.DataFrame) -> int | None:
    """The sweep's capacity when all rows share one, else None."""
    if "capacity_bytes" not in df.columns:
        return None
    values = df["capacity_bytes"].dropna().unique()
    return int(values[0]) if len(values) == 1 else None


# ----------------------------------------------------------------------------- text output
def format_metric(metric: str, value: Any) -> str:
    """Bytes metrics in GiB, nanosecond metrics in ms, others as numbers."""
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    if metric.endswith("_bytes") or "_bytes." in metric:
        return f"{value / GiB:.3f} GiB"
    if metric.endswith("_ns") or "_ns." in metric:
        return f"{value / 1e6:.3f} ms"
    if isinstance(value, float):
        return f"{value:.6g}"
    return f"{value:,}"


def _params_text(row: dict[str, Any]) -> str:
    from ..sweep.grid import set_args

    args = set_args(row["policy"], row["params"])
    return " ".join(args[1::2]) or "(defaults)"


def format_table(records: list[dict[str, Any]], objectives: list[str]) -> list[str]:
    """An aligned table: rank, policy, params, objectives."""
    header = ["#", "policy", "params", *objectives]
    body = [[str(i + 1), r["policy"], _params_text(r), *(format_metric(m, r[m]) for m in objectives)]
            for i, r in enumerate(records)]
    widths = [max(len(line[c]) for line in [header, *body]) for c in range(len(header))]
    right = {0, *range(3, len(header))}

    def fmt(cells: list[str]) -> str:
        return "  ".join(cell.rjust(w) if c in right else cell.ljust(w)
                         for c, (cell, w) in enumerate(zip(cells, widths))).rstrip()

    return [fmt(header), fmt(["-" * w for w in widths]), *(fmt(line) for line in body)]


def format_text(result: dict[str, Any], total: int, dropped: int, top: int) -> str:
    """The report: Pareto front, fitting rows (top N), winner and its command."""
    objectives = result["objectives"]
    cap = result["capacity_bytes"]
    lines = [f"{total} configurations, {dropped} left out (error, OOM-stopped or missing objective); "
             f"objectives: {', '.join(objectives)}", "",
             f"Pareto front ({len(result['pareto'])}):", *format_table(result["pareto"], objectives), ""]
    fits = result["fits"]
    where = f"fit in {format_metric('capacity_bytes', cap)}" if cap is not None else "ran without OOM"
    lines += [f"Configurations that {where} ({len(fits)}{f', best {top}' if len(fits) > top else ''}):",
              *format_table(fits[:top], objectives), ""]
    winner = result["winner"]
    if winner is None:
        lines.append("No configuration fits.")
    else:
        values = ", ".join(f"{m} {format_metric(m, winner[m])}" for m in objectives)
        lines += [f"Winner: {winner['policy']} {_params_text(winner)} ({values})", f"  {winner['command']}"]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- command
def main(args: argparse.Namespace) -> int:
    """Read, select, print; 1 when nothing fits, 2 on bad input."""
    from ..sweep.pareto import record, select
    from ..sweep.results import read_metadata, read_results

    def note(message: str) -> None:
        print(f"allocsim winners: {message}", file=sys.stderr)

    try:
        if args.top is not None and args.top < 1:
            raise ValueError(f"--top must be >= 1, got {args.top}")
        if not os.path.exists(args.results):
            raise ValueError(f"{args.results}: no such file (write one with `allocsim sweep ... -o {args.results}`)")
        if os.path.isdir(args.results):
            raise ValueError(f"{args.results}: is a directory, not a results file")
        try:
            df = read_results(args.results)
        except Exception as exc:  # noqa: BLE001 - pyarrow raises its own types for a damaged file
            if isinstance(exc, OSError) and exc.errno is not None:
                raise
            raise ValueError(f"{args.results}: not a Parquet results file ({type(exc).__name__}: "
                             f"{str(exc).splitlines()[0] if str(exc) else 'unreadable'})") from None
        meta = read_metadata(args.results)
        if meta and not meta.get("complete", True):
            note(f"warning: incomplete sweep ({meta.get('rows')} of {meta.get('expected_rows')} rows); "
                 "rerun the sweep to finish it")
        if "params_json" not in df.columns:
            raise ValueError(f"{args.results} is not an `allocsim sweep` results file (no params_json column)")
        check_rows(df, args.results)
        df = only_trace(df, args.trace)
        objectives = objectives_from_args(df, args.minimise, args.then, note)
        capacity = parse_bytes(args.capacity, round_down=True) if args.capacity is not None else default_capacity(df)
        sel = select(df, objectives, capacity)
    except OSError as exc:
        print(f"allocsim winners: error: {args.results}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except (AllocsimError, ValueError) as exc:
        print(f"allocsim winners: error: {exc}", file=sys.stderr)
        return 2
    fits = sel.fits if args.top is None or not args.json else sel.fits.head(args.top)
    result = {
        "objectives": objectives,
        "capacity_bytes": capacity,
        "pareto": [record(row, objectives) for _, row in sel.pareto.iterrows()],
        "fits": [record(row, objectives) for _, row in fits.iterrows()],
        "winner": None if sel.winner is None else record(sel.winner, objectives),
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(format_text(result, len(df), sel.dropped, args.top or 10))
    return 0 if result["winner"] is not None else 1
