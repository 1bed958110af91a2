"""allocsim's own trace files: Parquet (default) and CSV, both lossless.

Parquet: the events table is the file's data; metadata, labels and every side table (initial
state, recorded decisions) travel in the file's key-value metadata, the tables as Arrow IPC bytes so
their dtypes survive exactly. CSV: the events table, preceded by one ``# allocsim {json}`` line
holding the rest.
"""

from __future__ import annotations

import gzip
import io
import json
import os

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.ipc
import pyarrow.parquet as pq

from ..errors import TraceFormatError
from .schema import (
    BLOCK_DTYPES,
    DECISION_DTYPES,
    EVENT_DTYPES,
    INITIAL_ALLOC_DTYPES,
    SEGMENT_DTYPES,
    Trace,
    TraceMeta,
    check_schema,
    empty_frame,
)

FORMAT_VERSION = 1
_SIDE_TABLES = {
    "initial_allocs": INITIAL_ALLOC_DTYPES,
    "initial_segments": SEGMENT_DTYPES,
    "initial_blocks": BLOCK_DTYPES,
    "decisions": DECISION_DTYPES,
}


def _header(trace: Trace) -> dict:
    return {"allocsim_format": FORMAT_VERSION, "meta": trace.meta.to_dict(), "labels": list(trace.labels)}


def _table_to_ipc(frame: pd.DataFrame) -> bytes:
    sink = io.BytesIO()
    table = pa.Table.from_pandas(frame, preserve_index=False)
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def _typed(frame: pd.DataFrame, dtypes: dict, path: str, name: str) -> pd.DataFrame:
    """Cast a loaded table to its schema, naming the table, row and column of any bad value."""
    missing = [c for c in dtypes if c not in frame.columns]
    if missing:
        raise TraceFormatError(path, name, f"missing columns {missing}")
    out = {}
    for col, dtype in dtypes.items():
        out[col] = _typed_column(frame[col], dtype, path, name, col)
    return pd.DataFrame(out)


def _typed_column(values: pd.Series, dtype: np.dtype, path: str, name: str, col: str) -> np.ndarray:
    if dtype == np.dtype("object"):
        return values.astype(object).to_numpy()
    if values.isna().any():
        bad = int(np.flatnonzero(values.isna().to_numpy())[0])
        raise TraceFormatError(path, f"{name} row {bad}", f"column {col!r} is empty")
    if dtype == np.dtype("bool"):
        if pd.api.types.is_bool_dtype(values.dtype):
            return values.to_numpy().astype(bool)
        text = values.astype(str).str.strip().str.lower()
        ok = text.isin(["true", "false", "1", "0"])
        if not ok.all():
            bad = int(np.flatnonzero(~ok.to_numpy())[0])
            raise TraceFormatError(path, f"{name} row {bad}", f"column {col!r}: not a boolean: {values.iloc[bad]!r}")
        return text.isin(["true", "1"]).to_numpy()
    if not pd.api.types.is_numeric_dtype(values.dtype) or pd.api.types.is_bool_dtype(values.dtype):
        numeric = pd.to_numeric(values, errors="coerce")
        if numeric.isna().any():
            bad = int(np.flatnonzero(numeric.isna().to_numpy())[0])
            raise TraceFormatError(path, f"{name} row {bad}", f"column {col!r}: not a number: {values.iloc[bad]!r}")
        values = numeric
    array = values.to_numpy()
    if array.dtype.kind == "f":
        # Integers only: byte counts and times are exact, a fraction means a corrupt file.
        fractional = array != np.floor(array)
        if fractional.any():
            bad = int(np.flatnonzero(fractional)[0])
            raise TraceFormatError(path, f"{name} row {bad}", f"column {col!r}: not an integer: {array[bad]!r}")
    info = np.iinfo(dtype)
    if len(array) and (array.min() < info.min or array.max() > info.max):
        bad = int(np.flatnonzero((array < info.min) | (array > info.max))[0])
        raise TraceFormatError(path, f"{name} row {bad}", f"column {col!r}: {array[bad]} out of range for {dtype}")
    return array.astype(dtype)


def write_parquet(trace: Trace, path: str) -> None:
    """Write ``trace`` to ``path`` as allocsim Parquet (zstd-compressed)."""
    check_schema(trace)
    table = pa.Table.from_pandas(trace.events, preserve_index=False)
    metadata = dict(table.schema.metadata or {})
    metadata[b"allocsim"] = json.dumps(_header(trace)).encode()
    for name in _SIDE_TABLES:
        metadata[f"allocsim.{name}".encode()] = _table_to_ipc(getattr(trace, name))
    pq.write_table(table.replace_schema_metadata(metadata), path, compression="zstd")


def read_parquet(path: str, *, lenient: bool = False) -> Trace:
    """Read allocsim Parquet written by ``write_parquet`` (or by hand: only the event columns are required)."""
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        raise TraceFormatError(path, None, f"not a readable Parquet file: {exc}") from None
    metadata = table.schema.metadata or {}
    header = _load_header(path, metadata.get(b"allocsim"))
    side = {}
    for name, dtypes in _SIDE_TABLES.items():
        raw = metadata.get(f"allocsim.{name}".encode())
        if raw is None:
            side[name] = empty_frame(dtypes)
            continue
        try:
            frame = pa.ipc.open_stream(raw).read_all().to_pandas()
        except pa.ArrowException as exc:
            raise TraceFormatError(path, name, f"corrupt side table: {exc}") from None
        side[name] = _typed(frame, dtypes, path, name)
    events = _typed(table.to_pandas(), EVENT_DTYPES, path, "events")
    return _assemble(path, events, header, side, "allocsim-parquet", lenient)


def _load_header(path: str, raw: bytes | str | None) -> dict:
    if raw is None:
        return {"meta": {"format": "allocsim"}, "labels": []}
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TraceFormatError(path, "header", f"metadata is not JSON: {exc}") from None
    if not isinstance(header, dict) or not isinstance(header.get("meta", {}), dict):
        raise TraceFormatError(path, "header", "metadata is not an object")
    version = header.get("allocsim_format", FORMAT_VERSION)
    if not isinstance(version, int):
        raise TraceFormatError(path, "header", f"allocsim_format is not an integer: {version!r}")
    if version > FORMAT_VERSION:
        raise TraceFormatError(path, "header", f"written by a newer allocsim (format {header['allocsim_format']})")
    return header


def _assemble(path: str, events: pd.DataFrame, header: dict, side: dict, fmt: str, lenient: bool) -> Trace:
    from .validate import validate_events

    try:
        meta = _meta_from_header(header, fmt)
        labels = [str(x) for x in header.get("labels", [])]
    except (TypeError, ValueError, AttributeError) as exc:
        raise TraceFormatError(path, "header", f"malformed metadata: {exc}") from None
    if meta.format != fmt:
        # Say what the file is, and remember what it was converted from.
        meta.version_hints = {**meta.version_hints, "converted_from": meta.version_hints.get("converted_from", meta.format)}
        meta.format = fmt
    if meta.source and meta.source != os.path.basename(path):
        meta.version_hints = {**meta.version_hints, "converted_from_file": meta.source}
    meta.source = os.path.basename(path)
    trace = Trace(events=events, meta=meta, labels=labels, **side)
    check_schema(trace)
    validate_events(trace, path, lenient=lenient)
    return trace


def _meta_from_header(header: dict, fmt: str) -> TraceMeta:
    """Rebuild ``TraceMeta`` from a header, checking the types a hand-edited file could break."""
    data = header.get("meta") or {"format": fmt}
    meta = TraceMeta.from_dict(data)
    for name in ("devices", "repairs", "notes"):
        if not isinstance(getattr(meta, name), list):
            raise TypeError(f"meta.{name} is not a list")
    for name in ("version_hints",):
        if not isinstance(getattr(meta, name), dict):
            raise TypeError(f"meta.{name} is not an object")
    if not isinstance(meta.format, str) or not isinstance(meta.source, str):
        raise TypeError("meta.format and meta.source must be strings")
    meta.devices = [int(d) for d in meta.devices]
    return meta


def write_csv(trace: Trace, path: str) -> None:
    """Write ``trace`` as allocsim CSV: a ``# allocsim`` JSON header line, then the event rows."""
    check_schema(trace)
    header = _header(trace)
    header["tables"] = {
        name: getattr(trace, name).astype(object).to_dict(orient="list") for name in _SIDE_TABLES
    }
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wt", newline="") as fh:
        fh.write("# allocsim " + json.dumps(header, default=_json_default) + "\n")
        trace.events.to_csv(fh, index=False)


def _json_default(value):
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def read_csv(path: str, *, lenient: bool = False) -> Trace:
    """Read allocsim CSV written by ``write_csv`` (a header-less events CSV is accepted too)."""
    opener = gzip.open if _is_gzip(path) else open
    with opener(path, "rt", newline="") as fh:
        first = fh.readline()
        header: dict = {"meta": {"format": "allocsim-csv"}, "labels": []}
        if first.startswith("# allocsim"):
            header = _load_header(path, first[len("# allocsim"):].strip())
        else:
            fh.seek(0)
        try:
            frame = pd.read_csv(fh, dtype=str, keep_default_na=False)
        except (pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
            raise TraceFormatError(path, None, f"bad CSV: {exc}") from None
    frame = frame.replace("", np.nan)
    events = _typed(frame, EVENT_DTYPES, path, "events")
    side = {}
    tables = header.get("tables", {})
    for name, dtypes in _SIDE_TABLES.items():
        columns = tables.get(name)
        side[name] = empty_frame(dtypes) if not columns else _typed(pd.DataFrame(columns), dtypes, path, name)
    return _assemble(path, events, header, side, "allocsim-csv", lenient)


def _is_gzip(path: str) -> bool:
    with open(path, "rb") as fh:
        return fh.read(2) == b"\x1f\x8b"
