"""Read a well-formed RMM log at columnar speed: ``rmm_columns(...)`` parses with pyarrow, checks in numpy.

Every field is read as text by ``pyarrow.csv`` (no quoting, as RMM writes none), then times,
pointers, sizes and streams are converted and checked as whole columns. Anything a reader must
name or repair (a bad field, a wrong field count, time going back, a null pointer in a request...)
makes ``rmm_columns`` return None and the reader reads the log line by line, its reference path.
"""

from __future__ import annotations

import dataclasses
import io

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from .builder import MAX_SIZE_BYTES

_TIME_RE = r"^(?P<h>\d{1,2}):(?P<m>\d{2}):(?P<s>\d{2})(?:(?P<sep>[.:])(?P<frac>\d{0,9}))?$"
_HEX_RE = r"^(0[xX])?[0-9a-fA-F]{1,16}$"
_NULLS = ["", "(nil)", "nil", "nullptr", "null", "(null)"]
_HEX_VALUES = np.full(256, -1, dtype=np.int64)
for _i, _c in enumerate(b"0123456789abcdef"):
    _HEX_VALUES[_c] = _i
for _i, _c in enumerate(b"ABCDEF"):
    _HEX_VALUES[_c] = 10 + _i


@dataclasses.dataclass
class RmmColumns:
    """A clean log as columns, one row per data line."""

    t_ns: np.ndarray | None       # None: no Time column
    action: np.ndarray            # 0 allocate, 1 free, 2 allocate failure
    pointer: np.ndarray           # int64 bits
    size: np.ndarray              # int64
    stream: np.ndarray | None
    time_separators: set
    pointer_0x: set
    stream_0x: set
    threads: int | None
    n_columns: int


def _text(table: pa.Table, index: int) -> pa.ChunkedArray:
    return pc.utf8_trim_whitespace(table.column(index))


def _hex(values: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(int64 bits, had 0x, is null) of a hex column, or None when a field is not hex."""
    lowered = pc.utf8_lower(values)
    is_null = pc.is_in(lowered, value_set=pa.array(_NULLS)).to_numpy(zero_copy_only=False)
    ok = pc.match_substring_regex(values, _HEX_RE).to_numpy(zero_copy_only=False)
    if not bool((ok | is_null).all()):
        return None
    has_0x = pc.starts_with(lowered, "0x").to_numpy(zero_copy_only=False) & ~is_null
    digits = pc.if_else(pa.array(is_null), "0", pc.replace_substring_regex(values, "^0[xX]", ""))
    padded = pc.utf8_lpad(digits, 16, "0")
    raw = np.frombuffer(pc.cast(padded, pa.binary()).combine_chunks().buffers()[2] or b"", dtype=np.uint8)
    n = len(values)
    if raw.size < 16 * n:
        return None
    nibbles = _HEX_VALUES[raw[: 16 * n].reshape(n, 16)]
    if n and int(nibbles.min()) < 0:
        return None
    value = np.zeros(n, dtype=np.uint64)
    for col in range(16):
        value = (value << np.uint64(4)) | nibbles[:, col].astype(np.uint64)
    return value.view(np.int64), has_0x, is_null


def rmm_columns(data: bytes, columns: dict[str, int], n_columns: int, header_end: int) -> RmmColumns | None:
    """Columns of the data lines after the header (``data[header_end:]``), or None (see module doc)."""
    body = data[header_end:]
    try:
        table = pacsv.read_csv(
            io.BytesIO(body),
            read_options=pacsv.ReadOptions(column_names=[f"c{i}" for i in range(n_columns)],
                                           block_size=1 << 24),
            parse_options=pacsv.ParseOptions(quote_char=False, newlines_in_values=False,
                                             ignore_empty_lines=True),
            convert_options=pacsv.ConvertOptions(column_types={f"c{i}": pa.string() for i in range(n_columns)},
                                                 strings_can_be_null=False, quoted_strings_can_be_null=False))
    except (pa.ArrowInvalid, pa.ArrowException, UnicodeDecodeError):
        return None
    n = table.num_rows
    action_text = pc.utf8_lower(_text(table, columns["action"]))
    action = np.full(n, -1, dtype=np.int8)
    for code, name in enumerate(("allocate", "free", "allocate failure")):
        action[pc.equal(action_text, name).to_numpy(zero_copy_only=False)] = code
    if n and int(action.min()) < 0:
        return None
    size_text = _text(table, columns["size"])
    if not bool(pc.all(pc.match_substring_regex(size_text, r"^\d{1,20}$")).as_py() or n == 0):
        return None
    try:
        size = pc.cast(size_text, pa.int64()).to_numpy()
    except (pa.ArrowInvalid, pa.ArrowException):
        return None
    if n and int(size.max()) > MAX_SIZE_BYTES:
        return None
    ptr = _hex(_text(table, columns["pointer"]))
    if ptr is None:
        return None
    pointer, ptr_0x, ptr_null = ptr
    # A null pointer is only valid in a failure, or with size 0 (skipped, counted by the reader).
    if bool(((pointer == 0) & (action != 2) & (size != 0)).any()):
        return None
    stream = None
    stream_0x: set = set()
    if "stream" in columns:
        st = _hex(_text(table, columns["stream"]))
        if st is None:
            return None
        stream, st_0x, _ = st
        stream_0x = set(st_0x[stream != 0].tolist())
    t_ns = None
    seps: set = set()
    if "time" in columns:
        parts = pc.extract_regex(_text(table, columns["time"]), _TIME_RE)
        if parts.null_count:
            return None
        h, m, s = (pc.cast(pc.struct_field(parts, k), pa.int64()).to_numpy() for k in ("h", "m", "s"))
        sep = pc.struct_field(parts, "sep")
        frac = pc.utf8_rpad(pc.struct_field(parts, "frac"), 9, "0")
        if n and (int(h.max()) > 23 or int(m.max()) > 59 or int(s.max()) > 60):
            return None
        t_ns = ((h * 60 + m) * 60 + s) * 10**9 + pc.cast(frac, pa.int64()).to_numpy()
        if n > 1 and bool((np.diff(t_ns) < 0).any()):
            return None    # time going back: midnight or disorder, the line-by-line path decides
        seps = set(pc.unique(sep).to_pylist())
    threads = None
    if "thread" in columns and n:
        sorted_threads = pc.array_sort_indices(table.column(columns["thread"]))
        ordered = pc.take(_text(table, columns["thread"]), sorted_threads).to_numpy(zero_copy_only=False)
        threads = int(1 + (ordered[1:] != ordered[:-1]).sum())
    return RmmColumns(t_ns=t_ns, action=action, pointer=pointer, size=size, stream=stream,
                      time_separators=seps, pointer_0x=set(ptr_0x[pointer != 0].tolist()),
                      stream_0x=stream_0x, threads=threads, n_columns=n_columns)
