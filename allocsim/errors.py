"""The exception tree: catch ``AllocsimError`` to handle every error this package raises on purpose."""

from __future__ import annotations


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
