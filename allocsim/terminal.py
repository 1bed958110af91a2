"""Text for a terminal: wrap a command in ``escaped_output()`` and nothing it prints can drive the terminal.

A trace's text (op and frame names, file names, step labels, device names, values quoted in an
error) is the file author's, and a terminal obeys some characters: ESC starts sequences that set
the window title, erase a line or move the cursor, CR returns to the line's start, and the Unicode
bidi controls reorder what is shown, so an op name could erase the verdict line and forge "FITS in
80.00 GiB". ``printable`` writes each such character as its escape (``\\x1b``, ``\\u202e``); the
command line's stdout and stderr go through it (``escaped_output``), so every printer of every
command is covered, and a line break or tab of our own stays as it is. JSON output is escaped by
``json.dumps`` itself (``ensure_ascii``); files (CSV, Parquet, the report page) keep the text as read.

Escaped: every control character but newline and tab (C0, DEL, C1: ESC, CR, backspace, the 8-bit
CSI), every Unicode format character (bidi embeddings, overrides and isolates U+202A-202E and
U+2066-2069, the marks U+200E/F and U+061C, zero-width characters, the soft hyphen, BOM, tag
characters), the line and paragraph separators U+2028/9, and lone surrogates (which no terminal
encoding can carry): Unicode 14's categories Cc, Cf, Zl, Zp and Cs.
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
from typing import Any, Iterator

#: Unicode 14's Cc, Cf, Zl, Zp and Cs code points, less newline and tab (computed with unicodedata).
_UNSAFE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e"
    "\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ud800-\udfff\ufeff\ufff9-\ufffb"
    "\U000110bd\U000110cd\U00013430-\U00013438\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
    "\U000e0001\U000e0020-\U000e007f]")


def _escape(match: re.Match) -> str:
    code = ord(match.group())
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(text: str) -> str:
    """``text`` with every character that could drive a terminal written as its escape (see module doc)."""
    return _UNSAFE.sub(_escape, text)


class EscapingWriter(io.TextIOBase):
    """A text stream that writes ``printable(text)`` to ``raw``; everything else is ``raw``'s."""

    def __init__(self, raw: Any):
        super().__init__()
        self.raw = raw

    def write(self, text: str) -> int:
        self.raw.write(printable(text))
        return len(text)

    def flush(self) -> None:
        self.raw.flush()

    def isatty(self) -> bool:
        return self.raw.isatty()

    def fileno(self) -> int:
        return self.raw.fileno()

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.raw, "encoding", "utf-8")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)


def raw_stream(stream: Any) -> Any:
    """The stream under an ``EscapingWriter`` (for our own terminal control: a progress bar's redraws)."""
    return stream.raw if isinstance(stream, EscapingWriter) else stream


@contextlib.contextmanager
def escaped_output() -> Iterator[None]:
    """Route ``sys.stdout`` and ``sys.stderr`` through ``printable`` while the block runs."""
    saved = sys.stdout, sys.stderr
    sys.stdout = EscapingWriter(raw_stream(sys.stdout))
    sys.stderr = EscapingWriter(raw_stream(sys.stderr))
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        sys.stdout, sys.stderr = saved
