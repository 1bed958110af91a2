"""Read a Chrome trace with the reader of the profiler that wrote it: ``read_chrome(path)``.

``detect_format`` decides from a file's head; when the head does not show Paddle's fields (they
may come late in a big file) the whole file decides here, so a Paddle trace detected as
``kineto`` is still read by the Paddle reader.
"""

from __future__ import annotations

from ...errors import TraceFormatError
from ..reading.limits import DEFAULT_LIMITS, Limits, read_bytes
from ..schema import Trace
from .detect import chrome_framework
from .kineto.reader import read_kineto_data
from .paddle import read_paddle_data


def read_chrome(path, *, lenient: bool = False, limits: Limits | None = None) -> Trace:
    """Read a torch.profiler / Kineto or a PaddlePaddle Chrome trace, whichever its memory fields say."""
    path = str(path)
    limits = limits or DEFAULT_LIMITS
    data = read_bytes(path, limits)
    if not data.strip():
        raise TraceFormatError(path, None, "empty file")
    if chrome_framework(data) == "paddle":
        return read_paddle_data(path, data, lenient=lenient, limits=limits)
    return read_kineto_data(path, data, lenient=lenient, limits=limits)
