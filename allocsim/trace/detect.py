"""Recognise a trace file's format from its first bytes, not its name."""

from __future__ import annotations

import gzip
import os

from ..errors import TraceFormatError

FORMATS = ("pytorch-snapshot", "kineto", "rmm-csv", "allocsim-parquet", "allocsim-csv")


def _head(path: str, n_bytes: int = 4096) -> bytes:
    with open(path, "rb") as fh:
        head = fh.read(n_bytes)
    if head[:2] == b"\x1f\x8b":
        try:
            with gzip.open(path, "rb") as fh:
                return fh.read(n_bytes)
        except (OSError, EOFError) as exc:
            raise TraceFormatError(path, None, f"corrupt gzip data: {exc}") from None
    return head


def detect_format(path: str | os.PathLike) -> str:
    """Return one of ``FORMATS`` for the file at ``path``, or raise ``TraceFormatError`` saying why not."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise TraceFormatError(path, None, "no such file")
    if os.path.getsize(path) == 0:
        raise TraceFormatError(path, None, "empty file")
    head = _head(path)
    if not head:
        raise TraceFormatError(path, None, "empty file (after decompression)")
    if head[:4] == b"PAR1":
        return "allocsim-parquet"
    if head[:1] == b"\x80" or path.endswith((".pickle", ".pkl")):
        # Protocol >= 2 pickles start with PROTO (0x80); older protocols are recognised by name.
        return "pytorch-snapshot"
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if text[:1] in (b"{", b"["):
        return "kineto"
    first_line = text.split(b"\n", 1)[0].decode("utf-8", "replace")
    if first_line.startswith("# allocsim"):
        return "allocsim-csv"
    fields = [f.strip().lower() for f in first_line.split(",")]
    if {"action", "pointer", "size"} <= set(fields):
        return "rmm-csv"
    if fields[:6] == ["t_ns", "kind", "alloc_id", "size_bytes", "stream", "device"]:
        return "allocsim-csv"
    raise TraceFormatError(path, None, "unknown trace format (expected a PyTorch snapshot pickle, "
                           "Kineto JSON, RMM log CSV, or allocsim Parquet/CSV)")
