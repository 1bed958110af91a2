"""The exception tree: catch ``AllocsimError`` to handle every error this package raises on purpose.

``quote`` is how every message shows a value taken from a file or a user (cut, with its length noted).
"""

from __future__ import annotations

from typing import Any

#: Quoted values in messages are cut to this many characters (the full length is noted).
QUOTE_CHARS = 80


class AllocsimError(Exception):
    """Base class of every error allocsim raises deliberately."""


class TraceFormatError(AllocsimError, ValueError):
    """A trace file could not be read; the message names the file, the record and the reason."""

    def __init__(self, path: str, record: str | int | None, reason: str):
        self.path = str(path)
        self.record = record
        self.reason = reason
        where = f"{self.path}"
        if record is not None:
            where += f": record {record}" if isinstance(record, int) else f": {record}"
        super().__init__(f"{where}: {reason}")


class UnsafePickleError(TraceFormatError):
    """A pickle asked to import a global; it was refused before anything could run."""


class OutOfMemory(AllocsimError, MemoryError):
    """A policy could not satisfy a request even after its own retry path."""

    def __init__(self, requested_bytes: int, reason: str = ""):
        self.requested_bytes = requested_bytes
        super().__init__(f"out of memory allocating {requested_bytes} bytes{': ' + reason if reason else ''}")


class InvalidFree(AllocsimError, ValueError):
    """A free named an allocation id that is not live (double free or unknown id)."""


def quote(value: Any, max_chars: int = QUOTE_CHARS) -> str:
    """``repr`` of a value from a file, cut to ``max_chars`` with its full length noted."""
    if type(value) is int and value.bit_length() > 200:
        return f"<{value.bit_length()}-bit integer>"
    if isinstance(value, (str, bytes)):
        text = repr(value[: max_chars + 1])
        if len(value) > max_chars:
            return f"{text[:max_chars]}... ({len(value):,} characters)"
        return text
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a value from a hostile file may not even repr
        return f"<{type(value).__name__}>"
    if len(text) > max_chars:
        return f"{text[:max_chars]}... ({len(text):,} characters)"
    return text
