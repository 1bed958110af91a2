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

from ...reading.builder import MAX_SIZE_BYTES

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


def _text(table: pa.Table, index: int, trim: bool = True) -> pa.ChunkedArray:
    column = table.column(index)
    return pc.utf8_trim_whitespace(column) if trim else column


def _flat(values) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, bytes) of a string column, as numpy views."""
    array = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    array = array.cast(pa.large_string()) if array.type != pa.large_string() else array
    offsets = np.frombuffer(array.buffers()[1], dtype=np.int64)[array.offset:array.offset + len(array) + 1]
    data = array.buffers()[2]
    return offsets, (np.frombuffer(data, dtype=np.uint8) if data is not None else np.empty(0, np.uint8))


def _hex_fast(values) -> tuple[np.ndarray, np.ndarray] | None:
    """(int64 bits, had 0x) of a column of plain hex numbers (``0x`` optional, 1-16 digits), or None.

    Rows are grouped by width; each group is a 2-D byte matrix decoded one column at a time.
    """
    offsets, data = _flat(values)
    n = len(offsets) - 1
    if n == 0:
        return np.empty(0, np.int64), np.empty(0, bool)
    starts = offsets[:-1]
    widths = np.diff(offsets)
    if int(widths.min()) < 1 or int(widths.max()) > 18:
        return None
    value = np.zeros(n, dtype=np.uint64)
    has_0x = np.zeros(n, dtype=bool)
    for width in np.unique(widths).tolist():
        rows = np.flatnonzero(widths == width)
        chars = data[starts[rows][:, None] + np.arange(width)[None, :]]
        prefixed = (chars[:, 0] == 48) & ((chars[:, 1] | 32) == ord("x")) if width >= 3 else np.zeros(len(rows), bool)
        nibbles = _HEX_VALUES[chars]
        for prefix in (False, True):
            sel = prefixed == prefix
            if not sel.any():
                continue
            digits = nibbles[sel][:, 2:] if prefix else nibbles[sel]
            if digits.shape[1] > 16 or digits.shape[1] == 0 or int(digits.min()) < 0:
                return None
            acc = np.zeros(len(digits), dtype=np.uint64)
            for col in range(digits.shape[1]):
                acc = (acc << np.uint64(4)) | digits[:, col].astype(np.uint64)
            value[rows[sel]] = acc
            has_0x[rows[sel]] = prefix
    return value.view(np.int64), has_0x


def _hex_column(values) -> tuple[np.ndarray, np.ndarray] | None:
    """``_hex_fast`` over the distinct values when they are few (streams), else over all rows."""
    array = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    # Encode only when a sample says the values are few (streams), not for distinct pointers.
    if len(array) > 1024 and len(pc.unique(array.slice(0, 4096))) * 16 < 4096:
        encoded = pc.dictionary_encode(array)
        if len(encoded.dictionary) * 16 < len(array):
            got = _hex_fast(encoded.dictionary) or _hex(pa.chunked_array([encoded.dictionary]))
            if got is None:
                return None
            index = encoded.indices.to_numpy(zero_copy_only=False)
            return got[0][index], got[1][index]
    return _hex_fast(array) or _hex(pa.chunked_array([array]))


def _time_fast(values) -> tuple[np.ndarray, set] | None:
    """ns since midnight of ``HH:MM:SS[.:]fffff`` times of one fixed width, or None."""
    offsets, data = _flat(values)
    n = len(offsets) - 1
    widths = np.diff(offsets)
    if n == 0 or int(widths.min()) != int(widths.max()) or not 8 <= int(widths[0]) <= 18:
        return None
    width = int(widths[0])
    chars = data[offsets[0]:offsets[0] + n * width].reshape(n, width)
    if (chars[:, 2] != 58).any() or (chars[:, 5] != 58).any():
        return None
    digit_cols = [0, 1, 3, 4, 6, 7] + list(range(9, width))
    d = chars[:, digit_cols].astype(np.int64) - 48
    if int(d.min()) < 0 or int(d.max()) > 9:
        return None
    seps = set()
    if width > 8:
        sep = chars[:, 8]
        if not np.isin(sep, [46, 58]).all() or width - 9 > 9:
            return None
        seps = {chr(c) for c in np.unique(sep).tolist()}
    h, m, sec = d[:, 0] * 10 + d[:, 1], d[:, 2] * 10 + d[:, 3], d[:, 4] * 10 + d[:, 5]
    if int(h.max()) > 23 or int(m.max()) > 59 or int(sec.max()) > 60:
        return None
    frac = np.zeros(n, dtype=np.int64)
    for k in range(width - 9):
        frac = frac * 10 + d[:, 6 + k]
    frac *= 10 ** (9 - (width - 9)) if width > 8 else 0
    return ((h * 60 + m) * 60 + sec) * 10**9 + frac, (seps or {""})


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
    """Columns of the data lines after the header (``data[header_end:]``), or None (see module doc).

    On the compiled route a one-pass parser in C (``rmm_scan``) reads the logs it models and hands
    the others to the pyarrow reference below.
    """
    from ...reading import compiled

    if compiled.active():
        got = _rmm_columns_compiled(memoryview(data)[header_end:], columns, n_columns)
        if got is not None:
            return got
    return rmm_columns_reference(data, columns, n_columns, header_end)


def _rmm_columns_compiled(body, columns: dict[str, int], n_columns: int) -> RmmColumns | None:
    from ...reading import compiled

    scan = compiled.ext.rmm_scan(body, n_columns, columns["action"], columns["pointer"], columns["size"],
                                 columns.get("time", -1), columns.get("stream", -1), columns.get("thread", -1))
    if scan is None:
        return None
    i64 = lambda raw: np.frombuffer(raw, dtype=np.int64) if raw is not None else None
    return RmmColumns(t_ns=i64(scan["t_ns"]), action=np.frombuffer(scan["action"], np.int8),
                      pointer=i64(scan["pointer"]), size=i64(scan["size"]), stream=i64(scan["stream"]),
                      time_separators=scan["time_separators"], pointer_0x=scan["pointer_0x"],
                      stream_0x=scan["stream_0x"], threads=scan["threads"], n_columns=n_columns)


def rmm_columns_reference(data: bytes, columns: dict[str, int], n_columns: int, header_end: int) -> RmmColumns | None:
    """``rmm_columns`` with pyarrow and numpy: the reference the compiled parser is held to."""
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
    trim = b" " in body or b"\t" in body or b"\r" in body   # RMM writes none: skip trimming
    encoded = pc.dictionary_encode(_text(table, columns["action"], trim).combine_chunks())
    names = [str(v).lower() for v in encoded.dictionary.to_pylist()]
    codes = {"allocate": 0, "free": 1, "allocate failure": 2}
    if any(name not in codes for name in names):
        return None
    action = np.array([codes[name] for name in names], dtype=np.int8)[
        encoded.indices.to_numpy(zero_copy_only=False)] if n else np.empty(0, np.int8)
    size_text = _text(table, columns["size"], trim)
    if b"+" in body:      # "+5" is no RMM size; the reference path says so
        return None
    if n and pc.any(pc.match_substring(size_text, "x", ignore_case=True)).as_py():
        return None       # Arrow's cast reads "0x200"; RMM writes sizes in decimal, the reference refuses
    try:
        size = pc.cast(size_text, pa.int64()).to_numpy()
    except (pa.ArrowInvalid, pa.ArrowException):
        return None
    if n and int(size.min()) < 0:
        return None
    if n and int(size.max()) > MAX_SIZE_BYTES:
        return None
    ptr_text = _text(table, columns["pointer"], trim)
    ptr = _hex_column(ptr_text)
    if ptr is None:
        return None
    pointer, ptr_0x = ptr[0], ptr[1]
    # A null pointer is only valid in a failure, or with size 0 (skipped, counted by the reader).
    if bool(((pointer == 0) & (action != 2) & (size != 0)).any()):
        return None
    stream = None
    stream_0x: set = set()
    if "stream" in columns:
        st_text = _text(table, columns["stream"], trim)
        st = _hex_column(st_text)
        if st is None:
            return None
        stream, st_0x = st[0], st[1]
        stream_0x = set(np.unique(st_0x[stream != 0]).tolist())
    t_ns = None
    seps: set = set()
    fast_time = _time_fast(_text(table, columns["time"], trim)) if "time" in columns else None
    if fast_time is not None:
        t_ns, seps = fast_time
        if n > 1 and bool((np.diff(t_ns) < 0).any()):
            return None
    elif "time" in columns:
        parts = pc.extract_regex(_text(table, columns["time"], trim), _TIME_RE)
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
        thread_text = _text(table, columns["thread"], trim)
        try:
            numeric = pc.cast(thread_text, pa.int64()).to_numpy()
            threads = int(len(np.unique(numeric)))
        except (pa.ArrowInvalid, pa.ArrowException):
            ordered = pc.take(thread_text, pc.array_sort_indices(thread_text)).to_numpy(zero_copy_only=False)
            threads = int(1 + (ordered[1:] != ordered[:-1]).sum())
    return RmmColumns(t_ns=t_ns, action=action, pointer=pointer, size=size, stream=stream,
                      time_separators=seps, pointer_0x=set(np.unique(ptr_0x[pointer != 0]).tolist()),
                      stream_0x=stream_0x, threads=threads, n_columns=n_columns)
