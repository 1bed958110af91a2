"""The results file: one tidy Parquet row per trace x policy x params, written atomically.

Columns, in order: ``trace``, ``trace_sha256``, ``policy``, ``params_json``, ``param.<key>`` (the
``--set`` text of each parameter; null where a policy lacks the key), ``capacity_bytes``,
``device`` (the ``--device`` option, null when not given), ``fast``, ``row_key``, ``error`` (null or the
message), every metric of ``allocsim run --json`` flattened (``peak_reserved_bytes``,
``alloc_latency_ns.p99``, ...; ``replayed_device`` is the device the row replayed), then the
wall-clock columns ``sim_seconds``, ``events_per_second``, ``wall_seconds``.

The file's key-value metadata ``allocsim.sweep`` holds ``{"complete": bool, "expected_rows": N,
"rows": n}``: an interrupted sweep still writes the rows it finished, marked incomplete.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable

import pyarrow as pa
import pyarrow.parquet as pq

from ..output_file import check_output_file, open_output
from ..jsonfile import parse_json
from .flatten import PERF_COLUMNS

HEAD_COLUMNS = ("trace", "trace_sha256", "policy", "params_json")
KEY_TAIL_COLUMNS = ("capacity_bytes", "device", "fast", "row_key", "error")
METADATA_KEY = b"allocsim.sweep"
SCHEMA = "allocsim-sweep/1"


def column_order(rows: list[dict[str, Any]]) -> list[str]:
    """Head columns, ``param.*``, key tail, metrics (first-seen order), wall-clock columns last."""
    seen: dict[str, None] = {}
    for row in rows:
        seen.update(dict.fromkeys(row))
    params = [c for c in seen if c.startswith("param.")]
    fixed = set(HEAD_COLUMNS) | set(KEY_TAIL_COLUMNS) | set(PERF_COLUMNS) | set(params)
    metrics = [c for c in seen if c not in fixed]
    # A nested dict that was None in every row (``oom`` when nothing ran out) stays one null column;
    # where some rows expanded it into dotted columns, the bare column is redundant.
    metrics = [c for c in metrics
               if not (any(m.startswith(c + ".") for m in metrics) and all(r.get(c) is None for r in rows))]
    tail = [c for c in PERF_COLUMNS if c in seen]
    return [*HEAD_COLUMNS, *params, *KEY_TAIL_COLUMNS, *metrics, *tail]


def _column(values: list[Any]) -> pa.Array:
    """An Arrow column with the natural type; mixed, incompatible values fall back to JSON text."""
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        return pa.array([None if v is None else (v if isinstance(v, str) else json.dumps(v)) for v in values],
                        type=pa.string())


def rows_to_table(rows: list[dict[str, Any]], metadata: dict[str, Any] | None = None) -> pa.Table:
    """The Arrow table of ``rows`` (in the given order) with ``column_order`` columns."""
    names = column_order(rows)
    arrays = [_column([row.get(name) for row in rows]) for name in names]
    table = pa.Table.from_arrays(arrays, names=names)
    if metadata is not None:
        table = table.replace_schema_metadata({METADATA_KEY: json.dumps(metadata).encode()})
    return table


def write_results(rows: Iterable[dict[str, Any]], path: str | os.PathLike, *, complete: bool,
                  expected_rows: int) -> Path:
    """Write ``rows`` to ``path`` atomically (``output_write.open_output``: temp file + rename, no link
    followed) with the sweep metadata."""
    rows = list(rows)
    path = Path(path)
    # Checked again here, right before the rename: only a results file this program wrote is replaced.
    check_output_file(os.fspath(path), ours=is_results_file, what="an allocsim results file")
    meta = {"schema": SCHEMA, "complete": complete, "expected_rows": expected_rows, "rows": len(rows)}
    table = rows_to_table(rows, meta)
    with open_output(path, ours=is_results_file, what="an allocsim results file") as fh:
        pq.write_table(table, fh)
    return path


def check_results_output(path: str | os.PathLike, option: str = "-o") -> None:
    """Refuse, before any run, a results path this command must not write (see ``output_file``)."""
    from .journal import journal_dir

    check_output_file(os.fspath(path), option, ours=is_results_file, what="an allocsim results file",
                      folder_beside=os.fspath(journal_dir(path)))


def is_results_file(path: str | os.PathLike) -> bool:
    """True when ``path`` is a Parquet file carrying the ``allocsim.sweep`` metadata (one this program wrote)."""
    try:
        return METADATA_KEY in (pq.read_schema(path).metadata or {})
    except Exception:  # noqa: BLE001 - anything unreadable as Parquet is not one of ours
        return False


def read_metadata(path: str | os.PathLike) -> dict[str, Any]:
    """The ``allocsim.sweep`` metadata of a results file ({} for a file without it)."""
    meta = pq.read_schema(path).metadata or {}
    raw = meta.get(METADATA_KEY)
    meta = parse_json(raw, f"{os.fspath(path)}: sweep metadata") if raw else {}
    if not isinstance(meta, dict):
        raise ValueError(f"{os.fspath(path)}: sweep metadata is not a JSON object")
    return meta


def read_results(path: str | os.PathLike):
    """The results file as a pandas DataFrame, one row per config; integer columns stay exact
    (nullable ``Int64``, since error rows have no metrics) instead of turning into floats."""
    import pandas as pd

    ints = {pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64()}
    return pq.read_table(path).to_pandas(types_mapper=lambda t: pd.Int64Dtype() if t in ints else None)
