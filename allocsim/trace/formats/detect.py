"""Recognise a trace file's format from its first bytes, not its name."""

from __future__ import annotations

import os

from ...errors import TraceFormatError
from ..reading.limits import check_regular_file, read_head

FORMATS = ("pytorch-snapshot", "kineto", "paddle", "rmm-csv", "allocsim-parquet", "allocsim-csv")

# Chrome traces come from several profilers; their [memory] events' args tell them apart. Plain
# substring tests (memchr speed) over the whole file: a regular expression would crawl over every '"'.
_PADDLE_FIELDS = (b'"increase_bytes"', b'"current_allocated"')
_KINETO_FIELDS = (b'"Bytes"', b'"Total Allocated"')
#: Paddle's top-level keys (``ChromeTracingLogger``): they tell a Paddle file recorded without memory.
_PADDLE_TOP_KEYS = (b'"span_index"', b'"ExtraInfo"')


def chrome_framework(data: bytes) -> str:
    """Which profiler wrote a Chrome trace, by its memory fields: ``"paddle"`` or ``"kineto"``.

    PaddlePaddle's ``[memory]`` args carry ``increase_bytes`` / ``current_allocated``, PyTorch's
    (Kineto) ``Bytes`` / ``Total Allocated``. A file with Paddle's fields (or, recorded without
    memory, Paddle's top-level ``span_index`` / ``ExtraInfo``) and none of Kineto's is Paddle's;
    everything else goes to the Kineto reader, which names what it finds.
    """
    if any(f in data for f in _KINETO_FIELDS):    # Kineto's fields come early in its files: cheap
        return "kineto"
    return "paddle" if any(f in data for f in _PADDLE_FIELDS + _PADDLE_TOP_KEYS) else "kineto"


def memory_framework(path: str, data: bytes) -> str:
    """Which profiler's ``[memory]`` events a whole Chrome trace holds: ``"paddle"`` or ``"kineto"``.

    ``chrome_framework`` looks for field names anywhere in the file, which is enough when only one
    profiler's names occur. When both do (a Paddle file with an annotation named ``Bytes``, or ``[memory]``
    events of both profilers in one file) the ``[memory]`` events' own args decide: all Paddle's
    (``increase_bytes``) or all Kineto's (``Bytes``); events of both are refused in one line that counts
    each and names the first of each, since no reader reads the other's events.
    """
    kineto, paddle = (any(f in data for f in _KINETO_FIELDS), any(f in data for f in _PADDLE_FIELDS))
    if not (kineto and paddle):
        return chrome_framework(data)
    from .kineto.fast import decode_events, raw_args

    decoded = decode_events(data)
    if decoded is None:           # not JSON the fast decoder takes: the reader names the problem
        return chrome_framework(data)
    first: dict[str, int] = {}
    count = {"kineto": 0, "paddle": 0}
    for pos, event in enumerate(decoded[0]):
        if event.name != "[memory]":
            continue
        args = raw_args(event.args)
        kind = ("paddle" if isinstance(args, dict) and "increase_bytes" in args else
                "kineto" if isinstance(args, dict) and "Bytes" in args else None)
        if kind is not None:
            count[kind] += 1
            first.setdefault(kind, pos)
    if count["kineto"] and count["paddle"]:
        raise TraceFormatError(
            path, None, f"its [memory] events come from two profilers: {count['kineto']:,} "
            f"{'carries' if count['kineto'] == 1 else 'carry'} PyTorch's Kineto "
            f"fields (Bytes; the first is traceEvents[{first['kineto']}]) and {count['paddle']:,} PaddlePaddle's "
            f"(increase_bytes; the first is traceEvents[{first['paddle']}]); record each profiler to its own file")
    if count["kineto"] or count["paddle"]:
        return "paddle" if count["paddle"] else "kineto"
    return "paddle" if any(f in data for f in _PADDLE_TOP_KEYS) else "kineto"


#: Formats whose files are text: a NUL byte in one is damage, never data.
TEXT_FORMATS = ("kineto", "paddle", "rmm-csv", "allocsim-csv")
_ZERO_FILL = "a sparse file, or a copy filled with zeros where it was cut?"


def refuse_zero_fill(path: str, head: bytes, size_bytes: int) -> None:
    """Refuse, from its first and last bytes, a file that holds zero bytes where no trace format has
    any (``head``: its first bytes after decompression): no format starts or ends with one (a pickle
    ends with its STOP opcode, Parquet with ``PAR1``, JSON and CSV with text, gzip with its checksum
    and length, which are not checked), so a sparse or zero-filled file is refused before it is read."""
    with open(path, "rb") as fh:
        first = fh.read(2)
        fh.seek(max(0, size_bytes - 4096))
        tail = fh.read(4096)
    if first[:1] == b"\x00" or head[:1] == b"\x00":
        raise TraceFormatError(path, None, f"starts with zero bytes, as no trace format does ({_ZERO_FILL})")
    if first != b"\x1f\x8b" and tail.endswith(b"\x00"):
        zeros = len(tail) - len(tail.rstrip(b"\x00"))
        run = f"{zeros:,}" if zeros < len(tail) else f"at least {zeros:,}"
        raise TraceFormatError(path, None, f"ends in {run} zero bytes, as no trace format does ({_ZERO_FILL})")


def detect_format(path: str | os.PathLike) -> str:
    """Return one of ``FORMATS`` for the file at ``path``, or raise ``TraceFormatError`` saying why not."""
    path = os.fspath(path)
    size_bytes = check_regular_file(path)   # one line for a directory, FIFO, device file, missing or unreadable file
    head = read_head(path)
    if not head:
        raise TraceFormatError(path, None, "empty file (after decompression)")
    refuse_zero_fill(path, head, size_bytes)
    fmt = _format_of(path, head)
    zero = head.find(b"\x00")
    if fmt in TEXT_FORMATS and zero >= 0:
        raise TraceFormatError(path, f"byte {zero:,}", f"a zero byte in a text trace (JSON and CSV hold none: "
                               f"{_ZERO_FILL})")
    return fmt


def _format_of(path: str, head: bytes) -> str:
    if head[:4] == b"PAR1":
        return "allocsim-parquet"
    if head[:1] == b"\x80" or path.endswith((".pickle", ".pkl")):
        # Protocol >= 2 pickles start with PROTO (0x80); older protocols are recognised by name.
        return "pytorch-snapshot"
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if text[:1] in (b"{", b"["):
        return chrome_framework(head)
    first_line = text.split(b"\n", 1)[0].decode("utf-8", "replace")
    if first_line.startswith("# allocsim"):
        return "allocsim-csv"
    fields = [f.strip().lower() for f in first_line.split(",")]
    if {"action", "pointer", "size"} <= set(fields):
        return "rmm-csv"
    if fields[:6] == ["t_ns", "kind", "alloc_id", "size_bytes", "stream", "device"]:
        return "allocsim-csv"
    raise TraceFormatError(path, None, "unknown trace format (expected a PyTorch snapshot pickle, "
                           "Kineto or PaddlePaddle profiler JSON, RMM log CSV, or allocsim Parquet/CSV)")
