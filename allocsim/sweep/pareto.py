"""Pick configurations from sweep results: Pareto front, capacity fit, lexicographic winner.

``select(df, objectives, capacity_bytes)`` returns a ``Selection``:

- candidates: rows without ``error`` that ran to completion (an OOM-stopped run has partial metrics)
  and have every objective;
- ``pareto``: candidates no other candidate dominates (<= on every objective, < on one), sorted
  lexicographically by the objectives;
- ``fits``: candidates with ``peak_reserved_bytes <= capacity_bytes`` and no OOM, same order;
- ``winner``: the first of ``fits`` (None when nothing fits).

Ties sort by policy and ``params_json`` so the order is deterministic. ``record(row, objectives)``
turns a row into the JSON shape a validation harness takes, with the ``allocsim run`` command that
reproduces it (``command``).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any

import pandas as pd

DEFAULT_OBJECTIVES = ("peak_reserved_bytes", "alloc_latency_ns.p99")


@dataclass
class Selection:
    """Candidates, Pareto front, rows that fit, winner (DataFrames sorted by the objectives)."""

    objectives: list[str]
    capacity_bytes: int | None
    candidates: pd.DataFrame
    pareto: pd.DataFrame
    fits: pd.DataFrame
    dropped: int          # rows left out: error, incomplete run or missing objective

    @property
    def winner(self) -> pd.Series | None:
        return None if self.fits.empty else self.fits.iloc[0]


def _sorted(df: pd.DataFrame, objectives: list[str]) -> pd.DataFrame:
    keys = [*objectives, *(c for c in ("policy", "params_json", "trace") if c in df.columns)]
    return df.sort_values(keys, kind="mergesort").reset_index(drop=True)


def candidates(df: pd.DataFrame, objectives: list[str]) -> pd.DataFrame:
    """Rows usable for comparison: no error, completed, every objective present."""
    ok = pd.Series(True, index=df.index)
    if "error" in df.columns:
        ok &= df["error"].isna()
    if "completed" in df.columns:
        ok &= df["completed"].fillna(False).astype(bool)
    for metric in objectives:
        ok &= df[metric].notna()
    return df[ok]


def pareto_front(df: pd.DataFrame, objectives: list[str]) -> pd.DataFrame:
    """Rows of ``df`` no other row dominates, sorted lexicographically by ``objectives``.

    After a lexicographic sort any dominator of a row comes before it, and a dominated dominator
    is itself dominated by a front member, so checking each row against the front so far suffices.
    """
    ordered = _sorted(df, objectives)
    values = ordered[objectives].to_numpy(dtype=float)
    front: list[int] = []
    for i, v in enumerate(values):
        f = values[front]
        if not ((f <= v).all(axis=1) & (f < v).any(axis=1)).any():
            front.append(i)
    return ordered.iloc[front].reset_index(drop=True)


def fitting(df: pd.DataFrame, objectives: list[str], capacity_bytes: int | None) -> pd.DataFrame:
    """Rows with no OOM and, given a capacity, ``peak_reserved_bytes <= capacity_bytes``; sorted."""
    ok = pd.Series(True, index=df.index)
    if "oom_count" in df.columns:
        ok &= (df["oom_count"].fillna(0) == 0).astype(bool)
    if capacity_bytes is not None:
        ok &= (df["peak_reserved_bytes"] <= capacity_bytes).fillna(False).astype(bool)
    return _sorted(df[ok], objectives)


def check_objectives(df: pd.DataFrame, objectives: list[str]) -> None:
    """``ValueError`` naming a metric that is not in the results (with the numeric ones there are)."""
    for metric in objectives:
        if metric not in df.columns:
            numeric = [c for c in df.columns if pd.api.types.is_numeric_dtype(df[c]) and not c.startswith("param")]
            raise ValueError(f"no metric {metric!r} in the results; numeric columns include: "
                             f"{', '.join(numeric[:25])}, ...")
        if not pd.api.types.is_numeric_dtype(df[metric]) and df[metric].notna().any():
            raise ValueError(f"metric {metric!r} is not numeric")


def select(df: pd.DataFrame, objectives: list[str], capacity_bytes: int | None) -> Selection:
    """See the module docstring."""
    check_objectives(df, objectives)
    cands = candidates(df, objectives)
    return Selection(objectives=list(objectives), capacity_bytes=capacity_bytes, candidates=cands,
                     pareto=pareto_front(cands, objectives), fits=fitting(cands, objectives, capacity_bytes),
                     dropped=len(df) - len(cands))


def _plain(value: Any) -> Any:
    if value is None or value is pd.NA or (isinstance(value, float) and value != value):
        return None
    return value.item() if hasattr(value, "item") else value


def _size_text(size_bytes: int) -> str:
    from .grid import value_text

    class _Bytes:  # a stand-in ParamSpec: only the unit matters to value_text
        unit = "bytes"

    return value_text(_Bytes, int(size_bytes))


def command(row: pd.Series | dict[str, Any]) -> str:
    """The ``allocsim run`` command line that reproduces ``row`` (same trace, policy, params, options)."""
    from .grid import set_args

    params = json.loads(row["params_json"])
    argv = ["allocsim", "run", str(row["trace"]), "--policy", str(row["policy"]), *set_args(row["policy"], params)]
    capacity = _plain(row.get("capacity_bytes"))
    if capacity is not None:
        argv += ["--capacity", _size_text(capacity)]
    device = _plain(row.get("device"))
    if device is not None:
        argv += ["--device", str(int(device))]
    if bool(_plain(row.get("fast"))):
        argv.append("--fast")
    return shlex.join(argv)


def record(row: pd.Series, objectives: list[str]) -> dict[str, Any]:
    """One row as JSON: trace, policy, params (dict), the objective values, peak/oom facts, command."""
    out: dict[str, Any] = {"trace": row["trace"], "policy": row["policy"], "params": json.loads(row["params_json"])}
    for metric in objectives:
        out[metric] = _plain(row[metric])
    for extra in ("peak_reserved_bytes", "oom_count", "capacity_bytes"):
        if extra in row.index and extra not in out:
            out[extra] = _plain(row[extra])
    out["command"] = command(row)
    return out
