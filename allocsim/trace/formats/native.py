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
import re

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc
import pyarrow.parquet as pq
from struct import error as struct_error

from ...errors import TraceFormatError, quote
from ...units import MiB
from ..inference.completeness import reason_from_header
from ..reading.builder import MAX_SIZE_BYTES
from ..reading.ipc_check import IpcFormatError, ipc_stream_bounds
from ..reading.limits import DEFAULT_LIMITS, Limits, LimitExceeded, check_count, check_regular_file, open_binary
from ..reading.surrogates import repair_value, surrogate_note
from ..schema import (
    EVENT_DTYPES,
    OPTIONAL_COLUMNS,
    Trace,
    TraceMeta,
    check_schema,
    empty_frame,
)
from ..transport import TABLES

FORMAT_VERSION = 1
#: The tables kept beside the events (in the Parquet file's metadata, as Arrow IPC).
_SIDE_TABLES = {name: dtypes for name, dtypes in TABLES.items() if name != "events"}
#: Bytes one decoded row of a table may take at most, for the decompression-ratio check.
_ROW_BYTES = 8 * 12
_INTEGER_TEXT = re.compile(r"\s*[+-]?\d+\s*")


def _header(trace: Trace) -> dict:
    return {"allocsim_format": FORMAT_VERSION, "meta": trace.meta.to_dict(), "labels": list(trace.labels)}


def _table_to_ipc(frame: pd.DataFrame) -> bytes:
    sink = io.BytesIO()
    table = pa.Table.from_pandas(frame, preserve_index=False)
    # Compressed: side tables live in the footer, and deep stacks make the stacks table millions of
    # rows (the reader sizes compressed streams from their headers before decoding them).
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write_table(table)
    return sink.getvalue()


def _typed(frame: pd.DataFrame, dtypes: dict, path: str, name: str, limits: Limits = DEFAULT_LIMITS) -> pd.DataFrame:
    """Cast a loaded table to its schema, naming the table, row and column of any bad value."""
    missing = [c for c in dtypes if c not in frame.columns and c not in OPTIONAL_COLUMNS]
    if missing:
        raise TraceFormatError(path, name, f"missing columns {missing}")
    out = {}
    for col, dtype in dtypes.items():
        if col not in frame.columns:
            out[col] = np.full(len(frame), OPTIONAL_COLUMNS[col], dtype=dtype)
            continue
        out[col] = _typed_column(frame[col], dtype, path, name, col, limits)
    return pd.DataFrame(out, copy=False)


def _int_column(array: np.ndarray, dtype: np.dtype, path: str, name: str, col: str) -> np.ndarray:
    if dtype == np.dtype("object") or dtype == np.dtype("bool"):
        raise TraceFormatError(path, name, f"column {col!r} holds integers where text or booleans belong")
    info = np.iinfo(dtype)
    if len(array) and (int(array.min()) < info.min or int(array.max()) > info.max):
        bad = _first((array < info.min) | (array > info.max)) if array.dtype.kind == "i" or info.max < np.iinfo(
            array.dtype).max else _first(array > info.max)
        raise TraceFormatError(path, f"{name} row {bad}", f"column {col!r}: {array[bad]} out of range for {dtype}")
    return array.astype(dtype, copy=False)


def _first(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def _typed_column(values: pd.Series, dtype: np.dtype, path: str, name: str, col: str,
                  limits: Limits = DEFAULT_LIMITS) -> np.ndarray:
    if isinstance(values, np.ndarray) and values.dtype.kind in "iu":
        return _int_column(values, dtype, path, name, col)
    if dtype == np.dtype("object"):
        text = values.astype(object).to_numpy()
        lengths = pd.Series(text).map(lambda v: len(v) if isinstance(v, str) else 0).to_numpy()
        if len(lengths) and int(lengths.max()) > limits.string_chars:
            bad = _first(lengths > limits.string_chars)
            raise LimitExceeded(path, f"{name} row {bad}", "string_chars", limits.string_chars,
                                f"column {col!r}: a string of {int(lengths[bad]):,} characters")
        return text
    if values.isna().any():
        bad = _first(values.isna().to_numpy())
        raise TraceFormatError(path, f"{name} row {bad}", f"column {col!r} is empty")
    if dtype == np.dtype("bool"):
        if pd.api.types.is_bool_dtype(values.dtype):
            return values.to_numpy().astype(bool)
        text = values.astype(str).str.strip().str.lower()
        ok = text.isin(["true", "false", "1", "0"])
        if not ok.all():
            bad = _first(~ok.to_numpy())
            raise TraceFormatError(path, f"{name} row {bad}", f"column {col!r}: not a boolean: {quote(values.iloc[bad])}")
        return text.isin(["true", "1"]).to_numpy()
    if pd.api.types.is_float_dtype(values.dtype) and len(values):
        # Byte counts and times are exact integers: a float column is refused, not rounded.
        raise TraceFormatError(path, name, f"column {col!r} holds floating-point numbers "
                               f"({values.dtype}); allocsim traces store integers only")
    if not pd.api.types.is_numeric_dtype(values.dtype) or pd.api.types.is_bool_dtype(values.dtype):
        text = values.astype(str)
        too_long = text.str.len().to_numpy() > limits.number_chars
        if too_long.any():
            bad = _first(too_long)
            raise LimitExceeded(path, f"{name} row {bad}", "number_chars", limits.number_chars,
                                f"column {col!r}: a number of {len(text.iloc[bad]):,} characters")
        ok = text.str.fullmatch(_INTEGER_TEXT.pattern).fillna(False).to_numpy(dtype=bool)
        if not ok.all():
            bad = _first(~ok)
            raise TraceFormatError(path, f"{name} row {bad}", f"column {col!r}: not a number: {quote(values.iloc[bad])}")
        as_int = [int(v) for v in text.tolist()]
        info = np.iinfo(dtype)
        out_of_range = [i for i, v in enumerate(as_int) if not info.min <= v <= info.max]
        if out_of_range:
            bad = out_of_range[0]
            raise TraceFormatError(path, f"{name} row {bad}",
                                   f"column {col!r}: {quote(as_int[bad])} out of range for {dtype}")
        return np.array(as_int, dtype=dtype)
    array = values.to_numpy() if isinstance(values, pd.Series) else values
    info = np.iinfo(dtype)
    if len(array) and array.dtype.kind == "u" and int(array.max()) > info.max:
        bad = _first(array > info.max)
        raise TraceFormatError(path, f"{name} row {bad}", f"column {col!r}: {array[bad]} out of range for {dtype}")
    if len(array) and (int(array.min()) < info.min or int(array.max()) > info.max):
        bad = _first((array < info.min) | (array > info.max))
        raise TraceFormatError(path, f"{name} row {bad}", f"column {col!r}: {array[bad]} out of range for {dtype}")
    return array.astype(dtype, copy=False)


def write_parquet(trace: Trace, path: str) -> None:
    """Write ``trace`` to ``path`` as allocsim Parquet (zstd-compressed)."""
    check_schema(trace)
    table = pa.Table.from_pandas(trace.events, preserve_index=False)
    metadata = dict(table.schema.metadata or {})
    metadata[b"allocsim"] = json.dumps(_header(trace)).encode()
    for name in _SIDE_TABLES:
        metadata[f"allocsim.{name}".encode()] = _table_to_ipc(getattr(trace, name))
    pq.write_table(table.replace_schema_metadata(metadata), path, compression="zstd")


def open_parquet(path: str, file_bytes: int, **options) -> pq.ParquetFile:
    """``pq.ParquetFile`` whose footer may be as large as the file itself (side tables travel in
    the footer's metadata; pyarrow's default 100 MB cap would refuse files allocsim wrote)."""
    footer_cap = max(_THRIFT_DEFAULT_BYTES, file_bytes + 1)
    return pq.ParquetFile(path, thrift_string_size_limit=footer_cap, **options)


#: pyarrow's default cap on the footer's thrift strings.
_THRIFT_DEFAULT_BYTES = 100_000_000


def read_parquet(path: str, *, lenient: bool = False, limits: Limits | None = None) -> Trace:
    """Read allocsim Parquet written by ``write_parquet`` (or by hand: only the event columns are required).

    Sizes are checked before anything is decoded: the row count and the events' decoded size
    against the caps, each side table's rows and decoded bytes from its IPC headers.
    """
    limits = limits or DEFAULT_LIMITS
    file_bytes = check_regular_file(path)
    try:
        pf = open_parquet(path, file_bytes)
        meta = pf.metadata
        schema = pf.schema_arrow
    except (pa.ArrowException, OSError) as exc:
        raise TraceFormatError(path, None, f"not a readable Parquet file: {quote(str(exc))}") from None
    check_count(path, "events", meta.num_rows, limits, "rows in the events table", "events")
    _check_ratio(path, meta.num_rows * _ROW_BYTES, file_bytes, limits, "the events table")
    metadata = schema.metadata or {}
    header = _load_header(path, metadata.get(b"allocsim"), limits)
    side = {}
    for name, dtypes in _SIDE_TABLES.items():
        raw = metadata.get(f"allocsim.{name}".encode())
        if raw is None:
            side[name] = empty_frame(dtypes)
            continue
        side[name] = _read_side_table(path, name, raw, dtypes, file_bytes, limits)
    for col, field in zip(schema.names, schema):
        if col in EVENT_DTYPES and pa.types.is_floating(field.type) and meta.num_rows:
            raise TraceFormatError(path, "events", f"column {col!r} holds floating-point numbers "
                                   f"({field.type}); allocsim traces store integers only")
    events = _events_from_arrow(pf, [c for c in EVENT_DTYPES if c in schema.names], path, limits, file_bytes)
    return _assemble(path, events, header, side, "allocsim-parquet", lenient, limits)


def _read_column(pf: pq.ParquetFile, col: str, path: str, limits: Limits = DEFAULT_LIMITS,
                 file_bytes: int = 0) -> pa.ChunkedArray:
    try:
        field = pf.schema_arrow.field(col)
        if _is_variable_width(field.type):
            return _read_variable_width(pf, col, path, limits, file_bytes)
        return pf.read(columns=[col]).column(0)
    except (pa.ArrowException, OSError) as exc:
        raise TraceFormatError(path, None, f"not a readable Parquet file: {quote(str(exc))}") from None


def _is_variable_width(kind: pa.DataType) -> bool:
    return (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind)
            or pa.types.is_large_binary(kind)
            or (pa.types.is_dictionary(kind) and _is_variable_width(kind.value_type)))


def _read_variable_width(pf: pq.ParquetFile, col: str, path: str, limits: Limits,
                         file_bytes: int) -> pa.ChunkedArray:
    """A text column, bounded by its decoded size before it is decoded.

    Fixed bytes per row do not bound text: a dictionary page can hold one 2 MiB value that a
    thousand rows repeat. The column is read still dictionary-encoded (pages are bounded by the
    footer's uncompressed sizes first), every used value's length is checked against the string
    and number caps, and the sum of the lengths against the decoded-size caps; only then decoded.
    """
    index = pf.schema_arrow.get_field_index(col)
    meta = pf.metadata
    stored = sum(meta.row_group(g).column(index).total_uncompressed_size for g in range(meta.num_row_groups))
    _check_ratio(path, stored, file_bytes, limits, f"column {col!r}")
    encoded = open_parquet(path, file_bytes, read_dictionary=[col]).read(columns=[col]).column(0)
    max_value_bytes = 4 * max(limits.string_chars, limits.number_chars)   # UTF-8: at most 4 bytes a character
    decoded_bytes = row = 0
    for chunk in encoded.chunks:
        if not pa.types.is_dictionary(chunk.type):
            chunk = chunk.dictionary_encode()
        lengths = pc.take(pc.binary_length(chunk.dictionary), chunk.indices)
        longest = pc.max(lengths).as_py() or 0
        if longest > max_value_bytes:
            bad = row + pc.index(lengths, longest).as_py()
            cap, name = ((limits.number_chars, "number_chars") if limits.number_chars > limits.string_chars
                         else (limits.string_chars, "string_chars"))
            raise LimitExceeded(path, f"events row {bad}", name, cap,
                                f"column {col!r}: a value of {longest:,} bytes")
        decoded_bytes += pc.sum(lengths).as_py() or 0
        row += len(chunk)
    if decoded_bytes > limits.decompressed_bytes:
        raise LimitExceeded(path, "events", "decompressed_bytes", limits.decompressed_bytes,
                            f"column {col!r} decodes to {decoded_bytes:,} bytes")
    _check_ratio(path, decoded_bytes, file_bytes, limits, f"column {col!r}")
    value_type = encoded.type.value_type if pa.types.is_dictionary(encoded.type) else encoded.type
    return pa.chunked_array([c.cast(value_type) if pa.types.is_dictionary(c.type) else c for c in encoded.chunks],
                            type=value_type)


def _events_from_arrow(pf: pq.ParquetFile, names: list[str], path: str, limits: Limits,
                       file_bytes: int = 0) -> pd.DataFrame:
    """The events table from the file's columns, read one at a time (so at most one column is held
    twice): integer columns go to numpy without pandas in between."""
    columns = {}
    n = pf.metadata.num_rows
    for col in names:
        data = _read_column(pf, col, path, limits, file_bytes)
        if pa.types.is_integer(data.type) and data.null_count == 0:
            if data.num_chunks == 1:
                columns[col] = data.chunk(0).to_numpy(zero_copy_only=False)
            else:
                out = np.empty(len(data), dtype=data.type.to_pandas_dtype())
                at = 0
                for chunk in data.chunks:
                    out[at:at + len(chunk)] = chunk.to_numpy(zero_copy_only=False)
                    at += len(chunk)
                columns[col] = out
        else:
            columns[col] = data.to_pandas()
        del data
    missing = [c for c in EVENT_DTYPES if c not in columns and c not in OPTIONAL_COLUMNS]
    if missing:
        raise TraceFormatError(path, "events", f"missing columns {missing}")
    out = {}
    for col, dtype in EVENT_DTYPES.items():
        if col not in columns:
            out[col] = np.full(n, OPTIONAL_COLUMNS[col], dtype=dtype)
        elif isinstance(columns[col], np.ndarray):
            out[col] = _typed_column(columns[col], dtype, path, "events", col, limits)
        else:
            out[col] = _typed_column(columns[col], dtype, path, "events", col, limits)
    return pd.DataFrame(out, copy=False)


def _check_ratio(path: str, decoded_bytes: int, file_bytes: int, limits: Limits, what: str) -> None:
    if decoded_bytes > max(64 << 20, limits.compression_ratio * file_bytes):
        raise LimitExceeded(path, None, "compression_ratio", limits.compression_ratio,
                            f"{what} would decode to about {decoded_bytes:,} bytes from a {file_bytes:,}-byte file")


def _read_side_table(path: str, name: str, raw: bytes, dtypes: dict, file_bytes: int,
                     limits: Limits) -> pd.DataFrame:
    try:
        rows, body_bytes = ipc_stream_bounds(raw)
    except (IpcFormatError, struct_error) as exc:
        raise TraceFormatError(path, name, f"corrupt side table: {quote(str(exc))}") from None
    check_count(path, "events", rows, limits, f"rows in side table {name}", name)
    if body_bytes > limits.decompressed_bytes:
        raise LimitExceeded(path, name, "decompressed_bytes", limits.decompressed_bytes,
                            f"side table decodes to {body_bytes:,} bytes")
    if not _deep_stacks_table(name, rows, body_bytes, limits):
        _check_ratio(path, body_bytes, file_bytes, limits, f"side table {name}")
    try:
        frame = pa.ipc.open_stream(raw).read_all().to_pandas()
    except (pa.ArrowException, OSError) as exc:
        raise TraceFormatError(path, name, f"corrupt side table: {quote(str(exc))}") from None
    return _typed(frame, dtypes, path, name, limits)


def _deep_stacks_table(name: str, rows: int, body_bytes: int, limits: Limits) -> bool:
    """True for a stacks table within the cap the trace readers apply when they build stacks.

    Each stack repeats its parent's frames, so deeply nested ops (a 1 MB Kineto file of 4,400
    nested ops gives 9.7M stack rows) compress far past the ratio cap; what ``convert`` wrote must
    read back, so the stacks table is held to the readers' cap instead: at most ``frames`` x 8
    rows of a few fixed-width columns.
    """
    return name == "stacks" and rows <= limits.frames * 8 and body_bytes <= _STACK_ROW_BYTES * rows + MiB


#: Decoded bytes a stacks row may take (three int32 columns, validity bitmaps and padding, generously).
_STACK_ROW_BYTES = 64


def _load_header(path: str, raw: bytes | str | None, limits: Limits = DEFAULT_LIMITS) -> dict:
    if raw is None:
        return {"meta": {"format": "allocsim"}, "labels": []}
    if len(raw) > limits.decompressed_bytes:
        raise LimitExceeded(path, "header", "decompressed_bytes", limits.decompressed_bytes,
                            f"a {len(raw):,}-byte header")
    try:
        header = _bounded_json(raw, limits)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError, ValueError) as exc:
        raise TraceFormatError(path, "header", f"metadata is not JSON: {quote(str(exc))}") from None
    if not isinstance(header, dict) or not isinstance(header.get("meta", {}), dict):
        raise TraceFormatError(path, "header", "metadata is not an object")
    version = header.get("allocsim_format", FORMAT_VERSION)
    if not isinstance(version, int):
        raise TraceFormatError(path, "header", f"allocsim_format is not an integer: {quote(version)}")
    if version > FORMAT_VERSION:
        raise TraceFormatError(path, "header", f"written by a newer allocsim (format {quote(version)})")
    # JSON's \ud800 escapes make lone surrogates, which the tables built from the header (Arrow text
    # columns) cannot hold: they are repaired here, as ``read_trace`` repairs every other reader's.
    header, repaired = repair_value(header)
    if repaired:
        header.setdefault("meta", {}).setdefault("notes", []).append(surrogate_note(repaired))
    return header


def _assemble(path: str, events: pd.DataFrame, header: dict, side: dict, fmt: str, lenient: bool,
              limits: Limits = DEFAULT_LIMITS) -> Trace:
    from ..reading.validate import validate_events

    try:
        meta = _meta_from_header(header, fmt)
        raw_labels = header.get("labels", [])
        if not isinstance(raw_labels, list):
            raise TypeError("labels is not a list")
        labels = [str(x) for x in raw_labels]
    except (TypeError, ValueError, AttributeError, OverflowError) as exc:
        raise TraceFormatError(path, "header", f"malformed metadata: {quote(str(exc))}") from None
    if meta.allocator_settings is not None:
        from ...settings.recorded import checked_allocator_settings

        meta.allocator_settings = checked_allocator_settings(meta.allocator_settings, path, lenient,
                                                             meta.notes, lambda value: value)
    check_count(path, "events", len(labels), limits, "labels", "header")
    check_count(path, "devices", len(meta.devices), limits, "devices", "header")
    long_label = next((x for x in labels if len(x) > limits.string_chars), None)
    if long_label is not None:
        raise LimitExceeded(path, "header", "string_chars", limits.string_chars,
                            f"a label of {len(long_label):,} characters")
    if meta.format != fmt:
        # Say what the file is, and remember what it was converted from.
        meta.version_hints = {**meta.version_hints, "converted_from": meta.version_hints.get("converted_from", meta.format)}
        meta.format = fmt
    if meta.source and meta.source != os.path.basename(path):
        meta.version_hints = {**meta.version_hints, "converted_from_file": meta.source}
    meta.source = os.path.basename(path)
    for name, col in (("initial_allocs", "size_bytes"), ("initial_allocs", "block_size_bytes"),
                      ("initial_segments", "size_bytes"), ("initial_blocks", "size_bytes"),
                      ("initial_blocks", "requested_bytes"), ("decisions", "size_bytes")):
        values = side[name][col].to_numpy()
        bad = np.flatnonzero((values < -1) | (values > MAX_SIZE_BYTES))
        if len(bad):
            raise TraceFormatError(path, f"{name} row {int(bad[0])}",
                                   f"column {col!r}: {int(values[bad[0]])} is not a byte count")
    trace = Trace(events=events, meta=meta, labels=labels, **side)
    check_schema(trace)
    validate_events(trace, path, lenient=lenient, limits=limits)
    return trace


def _bounded_json(raw: bytes | str, limits: Limits) -> object:
    """``json.loads`` of a header: too deep a nesting or too long a number is a clean error."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def _meta_from_header(header: dict, fmt: str) -> TraceMeta:
    """Rebuild ``TraceMeta`` from a header, checking the types a hand-edited file could break."""
    data = header.get("meta") or {"format": fmt}
    meta = TraceMeta.from_dict(data)
    for name in ("devices", "repairs", "notes"):
        if not isinstance(getattr(meta, name), list):
            raise TypeError(f"meta.{name} is not a list")
    for name in ("version_hints", "recorded"):
        if not isinstance(getattr(meta, name), dict):
            raise TypeError(f"meta.{name} is not an object")
    if meta.allocator_settings is not None and not isinstance(meta.allocator_settings, dict):
        raise TypeError("meta.allocator_settings is not an object")
    if not isinstance(meta.format, str) or not isinstance(meta.source, str):
        raise TypeError("meta.format and meta.source must be strings")
    meta.devices = [int(d) for d in meta.devices]
    if any(not -(1 << 15) <= d < (1 << 15) for d in meta.devices):
        raise ValueError("meta.devices holds a device id outside int16")
    # Whether the recording stops early is read once, here: every verdict takes it from meta.incomplete.
    meta.incomplete = reason_from_header(meta.incomplete, meta.notes, meta.version_hints)
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


def read_csv(path: str, *, lenient: bool = False, limits: Limits | None = None) -> Trace:
    """Read allocsim CSV written by ``write_csv`` (a header-less events CSV is accepted too)."""
    limits = limits or DEFAULT_LIMITS
    with open_binary(path, limits) as raw:
        fh = io.TextIOWrapper(raw, encoding="utf-8", errors="replace", newline="")
        first = fh.readline(limits.decompressed_bytes)
        header: dict = {"meta": {"format": "allocsim-csv"}, "labels": []}
        rest = fh
        if first.startswith("# allocsim"):
            header = _load_header(path, first[len("# allocsim"):].strip(), limits)
        else:
            rest = io.StringIO(first + fh.read())
        try:
            frame = pd.read_csv(rest, dtype=str, keep_default_na=False)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
            raise TraceFormatError(path, None, f"bad CSV: {quote(str(exc), 160)}") from None
    check_count(path, "events", len(frame), limits, "event rows", "events")
    frame = frame.replace("", np.nan)
    events = _typed(frame, EVENT_DTYPES, path, "events", limits)
    side = {}
    tables = header.get("tables", {})
    if not isinstance(tables, dict):
        raise TraceFormatError(path, "header", "tables is not an object")
    for name, dtypes in _SIDE_TABLES.items():
        columns = tables.get(name)
        if columns and not isinstance(columns, dict):
            raise TraceFormatError(path, name, "side table is not an object of columns")
        try:
            side[name] = empty_frame(dtypes) if not columns else _typed(pd.DataFrame(columns), dtypes, path, name, limits)
        except (ValueError, TypeError) as exc:
            if isinstance(exc, TraceFormatError):
                raise
            raise TraceFormatError(path, name, f"malformed side table: {quote(str(exc))}") from None
    return _assemble(path, events, header, side, "allocsim-csv", lenient, limits)


def _is_gzip(path: str) -> bool:
    with open(path, "rb") as fh:
        return fh.read(2) == b"\x1f\x8b"
