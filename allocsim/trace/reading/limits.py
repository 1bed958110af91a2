"""Caps on what an untrusted trace file may make a reader do: raise one with ``--limits KEY=VALUE``.

Every reader takes a ``Limits`` and every byte it reads comes through ``read_bytes`` /
``open_text``: decompression is streamed and stops at ``decompressed_bytes`` or when the output
grows past ``compression_ratio`` times the compressed size (a few MB of gzip cannot become
gigabytes). Counts (events, devices, streams, segments, frames), string and number lengths and
nesting depth are checked where values enter. An exceeded cap raises ``LimitExceeded``: one line
naming the file, the cap, its value and the option that raises it.

Operating-system failures (a directory, no permission, a FIFO or device file, a missing file)
become ``TraceFormatError`` lines too, never tracebacks.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import os
import re
import stat
import zlib
from typing import Any, Iterator

from ...errors import QUOTE_CHARS, TraceFormatError, quote
from ...units import GiB, MiB, parse_bytes

_GZIP_MAGIC = b"\x1f\x8b"
_CHUNK_BYTES = 1 << 20
#: Compressed bytes fed to zlib at the start of each gzip member (doubled while the member goes on).
_FIRST_WINDOW_BYTES = 1 << 10
_NONZERO_BYTE = re.compile(b"[^\\x00]")
#: Below this much output the ratio cap is not applied (small files compress arbitrarily well).
_RATIO_FLOOR_BYTES = 64 * MiB


@dataclasses.dataclass(frozen=True)
class Limits:
    """Named caps with documented defaults; every trace reader honours them."""

    decompressed_bytes: int = 16 * GiB   #: bytes a reader may read after decompression
    compression_ratio: int = 200         #: decompressed / compressed size, checked past 64 MiB
    events: int = 200_000_000            #: request events (and trace entries) in one trace
    devices: int = 1024                  #: distinct devices
    streams: int = 65_536                #: distinct streams
    segments: int = 10_000_000           #: segments and blocks of a snapshot's final state
    frames: int = 10_000_000             #: distinct stack frames, and frames in one stack
    string_chars: int = 65_536           #: characters in one string value (frame names, labels)
    number_chars: int = 64               #: characters of one number written as text
    depth: int = 64                      #: nesting depth of JSON / pickle containers
    memory_bytes: int = 32 * GiB         #: address space of the process that parses a snapshot
    seconds: int = 3600                  #: wall time of the process that parses a snapshot

    @classmethod
    def names(cls) -> list[str]:
        """The cap names ``--limits`` accepts."""
        return [f.name for f in dataclasses.fields(cls)]

    def with_overrides(self, overrides: dict[str, Any], option: str = "--limits") -> "Limits":
        """Return a copy with ``overrides`` (``{"events": "1e9"}``, sizes like ``"64GiB"``) applied.

        Every value goes through ``parse_limit_value``; a bad one raises ``ValueError`` naming
        ``option`` (the flag it came from), the cap and the allowed range.
        """
        changes = {}
        for key, raw in overrides.items():
            name = key.strip().replace("-", "_")
            if name not in self.names():
                raise ValueError(f"{option}: unknown limit {quote(key)}; known: {', '.join(self.names())}")
            changes[name] = parse_limit_value(name, raw, option)
        return dataclasses.replace(self, **changes)


DEFAULT_LIMITS = Limits()

#: How to raise each cap, quoted in every "limit exceeded" message.
def how_to_raise(name: str) -> str:
    """The command-line option that raises cap ``name``."""
    if name == "events":
        return "--max-events N or --limits events=N"
    if name == "decompressed_bytes":
        return "--max-decompressed SIZE or --limits decompressed_bytes=SIZE"
    return f"--limits {name}=VALUE"


#: The largest value each cap takes: what the readers' C code, ``setrlimit`` and ``alarm`` can hold
#: (2**62 leaves room for the sums the readers make; ``alarm`` takes a C int of seconds).
_MAX_COUNT = 1 << 62
MAX_LIMIT_VALUES = {name: _MAX_COUNT for name in Limits.names()}
MAX_LIMIT_VALUES.update(seconds=(1 << 31) - 1, depth=100_000)


def parse_limit_value(name: str, raw: Any, option: str = "--limits") -> int:
    """The whole number cap ``name`` is set to by ``raw`` (``"5e8"``, ``"64GiB"``, ``1000``), checked to
    be in 1..``MAX_LIMIT_VALUES[name]``; ``ValueError`` names ``option``, the cap and the range."""
    shown = quote(raw) if isinstance(raw, str) and len(raw) > QUOTE_CHARS else raw
    where = f"--limits {name}={shown}" if option == "--limits" else f"{option} {shown}"
    top = MAX_LIMIT_VALUES[name]
    if isinstance(raw, bool):
        raise ValueError(f"{where}: not a whole number")
    if isinstance(raw, int):
        value = raw
    elif name.endswith("_bytes"):
        text = str(raw).strip()
        if len(text) > 40:
            raise ValueError(f"{where}: not a size of at most {top:,} bytes")
        try:
            value = parse_bytes(text)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
    else:
        value = _whole_number(str(raw).strip().replace("_", ""))
        if value is None:
            raise ValueError(f"{where}: not a whole number (examples: 1000, 5e8)")
    if not 1 <= value <= top:
        raise ValueError(f"{where}: must be from 1 to {top:,}")
    return int(value)


def _whole_number(text: str) -> int | None:
    """``"1000"`` / ``"5e8"`` / ``"2.5e3"`` as an int; None for anything else (nan, inf, fractions, 0x10)."""
    if not text or len(text) > 40:
        return None
    if text.isascii() and text.isdigit():
        return int(text)
    from decimal import Decimal, InvalidOperation

    try:
        dec = Decimal(text)
    except (InvalidOperation, ValueError):
        return None
    if not dec.is_finite() or dec != dec.to_integral_value() or abs(dec.adjusted()) > 30:
        return None
    return int(dec)


def parse_limit_options(items: list[str] | None) -> dict[str, str]:
    """Turn ``["events=1e9", "depth=100,string_chars=1MiB"]`` into a dict; bad syntax raises ValueError."""
    out: dict[str, str] = {}
    for item in items or []:
        for part in str(item).split(","):
            if not part.strip():
                continue
            if "=" not in part:
                raise ValueError(f"--limits takes KEY=VALUE, got {quote(part)}")
            key, value = part.split("=", 1)
            out[key.strip()] = value.strip()
    return out


class LimitExceeded(TraceFormatError):
    """A trace file asked for more than a cap allows; the message says how to raise the cap."""

    def __init__(self, path: str, record: str | int | None, name: str, limit: int, what: str):
        self.limit_name = name
        super().__init__(path, record, f"{what}: over the limit {name}={limit} "
                                       f"(raise it with {how_to_raise(name)})")


def check_count(path: str, name: str, count: int, limits: Limits, what: str,
                record: str | None = None) -> None:
    """Raise ``LimitExceeded`` when ``count`` exceeds the cap ``name``."""
    limit = getattr(limits, name)
    if count > limit:
        raise LimitExceeded(path, record, name, limit, f"{count:,} {what}")


# ------------------------------------------------------------------------------------ files
def check_regular_file(path: str) -> int:
    """Return the size of ``path``; raise one ``TraceFormatError`` line for anything but a readable file."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise TraceFormatError(path, None, "no such file") from None
    except PermissionError:
        raise TraceFormatError(path, None, "permission denied") from None
    except OSError as exc:
        raise TraceFormatError(path, None, f"cannot read: {exc.strerror or type(exc).__name__}") from None
    mode = st.st_mode
    if stat.S_ISDIR(mode):
        raise TraceFormatError(path, None, "is a directory, not a trace file")
    if stat.S_ISFIFO(mode):
        raise TraceFormatError(path, None, "is a FIFO (named pipe), not a trace file")
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        raise TraceFormatError(path, None, "is a device file, not a trace file")
    if stat.S_ISSOCK(mode):
        raise TraceFormatError(path, None, "is a socket, not a trace file")
    if not stat.S_ISREG(mode):
        raise TraceFormatError(path, None, "is not a regular file")
    if not os.access(path, os.R_OK):
        raise TraceFormatError(path, None, "permission denied")
    if st.st_size == 0:
        raise TraceFormatError(path, None, "empty file")
    return st.st_size


def os_error(path: str, exc: BaseException) -> TraceFormatError:
    """One line for an ``OSError`` (or zlib/EOF error) met while reading ``path``."""
    if isinstance(exc, PermissionError):
        return TraceFormatError(path, None, "permission denied")
    if isinstance(exc, IsADirectoryError):
        return TraceFormatError(path, None, "is a directory, not a trace file")
    if isinstance(exc, (zlib.error, EOFError, gzip.BadGzipFile)):
        return TraceFormatError(path, None, f"truncated or corrupt gzip data ({type(exc).__name__}: "
                                f"{quote(str(exc))})")
    return TraceFormatError(path, None, f"cannot read: {quote(getattr(exc, 'strerror', None) or str(exc))}")


class BoundedReader(io.RawIOBase):
    """A binary stream over ``path`` that decompresses gzip on the fly under the byte and ratio caps."""

    def __init__(self, path: str, limits: Limits = DEFAULT_LIMITS):
        super().__init__()
        self.path = path
        self.limits = limits
        self.file_bytes = check_regular_file(path)
        try:
            self._raw = open(path, "rb")
        except OSError as exc:
            raise os_error(path, exc) from None
        magic = self._raw.read(2)
        self._raw.seek(0)
        self.compressed = magic == _GZIP_MAGIC
        self._inflate = zlib.decompressobj(wbits=31) if self.compressed else None
        # Compressed input read from the file and not yet consumed: ``_buf[_pos:]``. Each call feeds
        # zlib a window of it that doubles while a member goes on, so a member's leftover (which zlib
        # copies into ``unused_data``) costs at most twice what the member consumed.
        self._buf = b""
        self._pos = 0
        self._window = _FIRST_WINDOW_BYTES
        self._in_member = self.compressed
        self.total_out = 0
        self._eof = False

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
        super().close()

    def _count(self, n: int) -> None:
        self.total_out += n
        limits = self.limits
        if self.total_out > limits.decompressed_bytes:
            what = "decompressed data" if self.compressed else "file"
            raise LimitExceeded(self.path, None, "decompressed_bytes", limits.decompressed_bytes,
                                f"{what} is over {limits.decompressed_bytes:,} bytes")
        if (self.compressed and self.total_out > _RATIO_FLOOR_BYTES
                and self.total_out > limits.compression_ratio * self.file_bytes):
            raise LimitExceeded(self.path, None, "compression_ratio", limits.compression_ratio,
                                f"gzip data expands more than {limits.compression_ratio}x "
                                f"({self.file_bytes:,} bytes to over {self.total_out:,}): a decompression bomb?")

    def _next_chunk(self, size: int) -> bytes:
        """The next decompressed chunk; OS, zlib and EOF errors propagate (``read_bytes`` names them)."""
        if self._inflate is None:
            chunk = self._raw.read(size)
            if not chunk:
                self._eof = True
            return chunk
        while True:
            if self._pos >= len(self._buf):
                self._buf, self._pos = self._raw.read(_CHUNK_BYTES), 0
                if not self._buf:
                    return self._end_of_file(size)
            if not self._in_member and not self._start_member():
                continue
            end = min(len(self._buf), self._pos + self._window)
            out = self._inflate.decompress(memoryview(self._buf)[self._pos:end], size)
            if self._inflate.eof:
                # unused_data and unconsumed_tail can both hold the same leftover: count it once.
                left = len(self._inflate.unused_data)
                self._in_member = False
            else:
                left = len(self._inflate.unconsumed_tail)
                if not left:
                    self._window = min(2 * self._window, _CHUNK_BYTES)
            self._pos = end - left
            if out:
                return out

    def _start_member(self) -> bool:
        """Skip zero padding after a member; True once the next member has begun, False to read on.

        Between members only zero bytes or another gzip member may follow (as ``gzip -d`` accepts).
        """
        found = _NONZERO_BYTE.search(self._buf, self._pos)
        if found is None:
            self._pos = len(self._buf)
            return False
        self._pos = found.start()
        if len(self._buf) - self._pos < len(_GZIP_MAGIC):
            more = self._raw.read(_CHUNK_BYTES)
            if not more:
                raise zlib.error("trailing garbage after the gzip stream")
            self._buf, self._pos = self._buf[self._pos:] + more, 0
            return False
        if not self._buf.startswith(_GZIP_MAGIC, self._pos):
            raise zlib.error("trailing garbage after the gzip stream")
        self._inflate = zlib.decompressobj(wbits=31)
        self._in_member = True
        self._window = _FIRST_WINDOW_BYTES
        return True

    def _end_of_file(self, size: int) -> bytes:
        """Output zlib still holds once the file is read, or b"" at a clean end; EOFError mid-member."""
        if self._in_member:
            out = self._inflate.decompress(b"", size)
            if self._inflate.eof:
                self._in_member = False
            if out:
                return out
            if self._in_member:
                raise EOFError("compressed file ended before the end-of-stream marker")
        self._eof = True
        return b""

    def readinto(self, buffer) -> int:
        if self._eof or not len(buffer):
            return 0
        view = memoryview(buffer).cast("B")
        chunk = self._next_chunk(min(len(view), _CHUNK_BYTES))
        n = len(chunk)
        if n:
            self._count(n)
            view[:n] = chunk
        return n


def read_bytes(path: str, limits: Limits = DEFAULT_LIMITS) -> bytes:
    """Return the whole (decompressed) content of ``path`` under the caps; empty content is an error."""
    reader = BoundedReader(path, limits)
    try:
        parts = []
        if reader.compressed:
            data = _inflate_whole(reader)
            if data is not None:
                if not data:
                    raise TraceFormatError(path, None, "empty file (after decompression)")
                return data
        else:
            # A plain file: one read of its size (and one byte more, to see the end); more only if it grew.
            first = reader._raw.read(min(reader.file_bytes, limits.decompressed_bytes) + 1)
            reader._count(len(first))
            if len(first) <= reader.file_bytes:
                if not first:
                    raise TraceFormatError(path, None, "empty file (after decompression)")
                return first
            parts.append(first)
        while True:
            chunk = reader._next_chunk(_CHUNK_BYTES)
            if not chunk:
                break
            reader._count(len(chunk))
            parts.append(chunk)
    except (OSError, zlib.error, EOFError) as exc:
        raise os_error(path, exc) from None
    finally:
        reader.close()
    data = b"".join(parts)
    if not data:
        raise TraceFormatError(path, None, "empty file (after decompression)")
    return data


#: Compressed files up to this size are inflated in one call (a bigger one streams in chunks).
_WHOLE_INFLATE_BYTES = 256 * MiB


def _inflate_whole(reader: BoundedReader) -> bytes | None:
    """A single-member gzip file inflated in one call, stopped one byte past what the caps allow;
    None (nothing consumed) when the file is big or is more than one clean member."""
    if reader.file_bytes > _WHOLE_INFLATE_BYTES:
        return None
    limits = reader.limits
    allowed = min(limits.decompressed_bytes, max(_RATIO_FLOOR_BYTES, limits.compression_ratio * reader.file_bytes))
    raw = reader._raw.read(reader.file_bytes + 1)
    inflate = zlib.decompressobj(wbits=31)
    out = inflate.decompress(raw, allowed + 1)
    if len(raw) > reader.file_bytes or not inflate.eof or inflate.unused_data.strip(b"\x00"):
        # Grown, over the caps, truncated, or another member follows: the streaming reader says which.
        reader._raw.seek(0)
        reader._inflate = zlib.decompressobj(wbits=31)
        return None
    reader._count(len(out))
    return out


def open_binary(path: str, limits: Limits = DEFAULT_LIMITS) -> io.BufferedReader:
    """A buffered binary stream of the (decompressed) content of ``path`` under the caps."""
    return io.BufferedReader(BoundedReader(path, limits), buffer_size=_CHUNK_BYTES)


def read_head(path: str, n_bytes: int = 4096) -> bytes:
    """The first ``n_bytes`` of the (decompressed) content, for format detection."""
    reader = BoundedReader(path, DEFAULT_LIMITS)
    try:
        out = b""
        while len(out) < n_bytes:
            chunk = reader._next_chunk(n_bytes)
            if not chunk:
                break
            out += chunk
        return out[:n_bytes]
    except (OSError, zlib.error, EOFError) as exc:
        if out:
            return out[:n_bytes]   # enough to recognise the format; the reader reports the damage
        raise os_error(path, exc) from None
    finally:
        reader.close()


def iter_chunks(path: str, limits: Limits = DEFAULT_LIMITS) -> Iterator[bytes]:
    """Yield the (decompressed) content of ``path`` in chunks of about 1 MiB, under the caps."""
    reader = BoundedReader(path, limits)
    try:
        while True:
            try:
                chunk = reader._next_chunk(_CHUNK_BYTES)
            except (OSError, zlib.error, EOFError) as exc:
                raise os_error(path, exc) from None
            if not chunk:
                return
            reader._count(len(chunk))
            yield chunk
    finally:
        reader.close()
