"""Read a Chrome trace with the reader of the profiler that wrote it: ``read_chrome(path)``.

``detect_format`` decides from a file's head; the whole file decides here (``memory_framework``:
field names, and where both profilers' names occur, the ``[memory]`` events' own args), so a Paddle
trace detected as ``kineto`` (its fields come late in a big file) is still read by the Paddle reader,
and a file detected as ``paddle`` whose later events are Kineto's is refused in one line.
"""

from __future__ import annotations

from ...errors import TraceFormatError
from ..reading.limits import DEFAULT_LIMITS, Limits, read_bytes
from ..schema import Trace
from .detect import memory_framework
from .kineto.reader import read_kineto_data
from .paddle import read_paddle_data


def read_chrome(path, *, lenient: bool = False, limits: Limits | None = None) -> Trace:
    """Read a torch.profiler / Kineto or a PaddlePaddle Chrome trace, whichever its [memory] events are."""
    path = str(path)
    limits = limits or DEFAULT_LIMITS
    data = read_bytes(path, limits)
    if not data.strip():
        raise TraceFormatError(path, None, "empty file")
    if memory_framework(path, data) == "paddle":
        return read_paddle_data(path, data, lenient=lenient, limits=limits)
    return read_kineto_data(path, data, lenient=lenient, limits=limits)
