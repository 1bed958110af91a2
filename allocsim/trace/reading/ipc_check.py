"""Size an Arrow IPC stream before decoding it: ``ipc_stream_bounds(raw)`` -> (rows, bytes).

A side table in a Parquet file's metadata is an Arrow IPC stream whose buffers may be compressed
(LZ4 / zstd): decoding a 0.5 MB stream could allocate gigabytes. The record batch headers say,
before anything is decompressed, how many rows each batch has and how long each buffer is; a
compressed buffer starts with its decompressed length. This module reads exactly that, from the
flatbuffer headers, so the reader can refuse a stream whose decoded size is over the caps.
"""

from __future__ import annotations

import struct

_CONTINUATION = 0xFFFFFFFF
_HEADER_RECORD_BATCH = 3


class IpcFormatError(ValueError):
    """The stream's framing or headers are malformed."""


def _u32(buf: bytes, pos: int) -> int:
    if pos < 0 or pos + 4 > len(buf):
        raise IpcFormatError("header offset out of bounds")
    return struct.unpack_from("<I", buf, pos)[0]


def _table_field(buf: bytes, table: int, index: int) -> int | None:
    """Absolute position of field ``index`` of the flatbuffer table at ``table``, or None if absent."""
    if table < 0 or table + 4 > len(buf):
        raise IpcFormatError("table offset out of bounds")
    vtable = table - struct.unpack_from("<i", buf, table)[0]
    if vtable < 0 or vtable + 4 > len(buf):
        raise IpcFormatError("vtable offset out of bounds")
    vsize = struct.unpack_from("<H", buf, vtable)[0]
    slot = 4 + 2 * index
    if slot + 2 > vsize or vtable + slot + 2 > len(buf):
        return None
    off = struct.unpack_from("<H", buf, vtable + slot)[0]
    return table + off if off else None


def _deref(buf: bytes, pos: int) -> int:
    return pos + _u32(buf, pos)


def ipc_stream_bounds(raw: bytes) -> tuple[int, int]:
    """(total rows, total decoded body bytes) of the record batches of an IPC stream."""
    pos, rows, body_bytes = 0, 0, 0
    while pos + 4 <= len(raw):
        length = _u32(raw, pos)
        pos += 4
        if length == _CONTINUATION:
            length = _u32(raw, pos)
            pos += 4
        if length == 0:
            break      # end-of-stream marker
        meta = raw[pos:pos + length]
        if len(meta) < length:
            raise IpcFormatError("truncated message header")
        pos += length
        message = _deref(meta, 0)
        htype_at = _table_field(meta, message, 1)
        header_at = _table_field(meta, message, 2)
        body_at = _table_field(meta, message, 3)
        body_len = struct.unpack_from("<q", meta, body_at)[0] if body_at is not None else 0
        if body_len < 0 or pos + body_len > len(raw):
            raise IpcFormatError("message body out of bounds")
        htype = meta[htype_at] if htype_at is not None else 0
        if htype == _HEADER_RECORD_BATCH and header_at is not None:
            batch = _deref(meta, header_at)
            length_at = _table_field(meta, batch, 0)
            n_rows = struct.unpack_from("<q", meta, length_at)[0] if length_at is not None else 0
            if n_rows < 0:
                raise IpcFormatError("negative row count")
            rows += n_rows
            compressed = _table_field(meta, batch, 3) is not None
            buffers_at = _table_field(meta, batch, 2)
            decoded = body_len
            if compressed and buffers_at is not None:
                vec = _deref(meta, buffers_at)
                count = _u32(meta, vec)
                decoded = 0
                for i in range(count):
                    item = vec + 4 + 16 * i
                    if item + 16 > len(meta):
                        raise IpcFormatError("buffer list out of bounds")
                    offset, blen = struct.unpack_from("<qq", meta, item)
                    if blen < 8:
                        decoded += max(blen, 0)
                        continue
                    start = pos + offset
                    if offset < 0 or start + 8 > len(raw):
                        raise IpcFormatError("buffer out of bounds")
                    (plain,) = struct.unpack_from("<q", raw, start)
                    decoded += blen if plain < 0 else plain   # -1: stored uncompressed
            body_bytes += decoded
        pos += body_len
    return rows, body_bytes
