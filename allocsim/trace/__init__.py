"""Read any supported trace file into one ``Trace``: start with ``read_trace(path)``.

Supported: PyTorch memory snapshots (``_dump_snapshot`` pickles), torch.profiler / Kineto
Chrome-trace JSON (``.json``/``.json.gz``) memory events, PaddlePaddle profiler Chrome traces, RMM ``logging_resource_adaptor`` CSV,
and allocsim's own Parquet and CSV. The format is detected from the content.
"""

from __future__ import annotations

import os
import zlib
from typing import TYPE_CHECKING, Any, Callable

from ..errors import TraceFormatError, quote
from .formats.detect import FORMATS, detect_format
from .reading.headroom import headroom, over_room
from .reading.limits import DEFAULT_LIMITS, LimitExceeded, Limits, os_error

if TYPE_CHECKING:
    from .schema import Trace

#: The schema's names, imported on first use: the schema needs pandas, which a command that only
#: parses its arguments (``allocsim --help``) should not wait for.
_SCHEMA = ("EventKind", "Trace", "TraceMeta", "EVENT_DTYPES", "check_schema")
__all__ = [
    *_SCHEMA, "FORMATS", "read_trace", "write_trace", "detect_format", "Limits", "LimitExceeded",
]


def __getattr__(name: str) -> Any:
    if name in _SCHEMA:
        from . import schema

        return getattr(schema, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _reader(fmt: str) -> Callable[..., Trace]:
    # Imported lazily so that a broken optional reader cannot stop the others from loading.
    if fmt == "pytorch-snapshot":
        from .formats.snapshot.reader import read_snapshot
        return read_snapshot
    if fmt in ("kineto", "paddle"):     # the whole file decides between the two (``formats.chrome``)
        from .formats.chrome import read_chrome
        return read_chrome
    if fmt == "rmm-csv":
        from .formats.rmm.reader import read_rmm_csv
        return read_rmm_csv
    if fmt == "allocsim-parquet":
        from .formats.native import read_parquet
        return read_parquet
    if fmt == "allocsim-csv":
        from .formats.native import read_csv
        return read_csv
    raise ValueError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")


def read_trace(path: str | os.PathLike, *, format: str | None = None, lenient: bool = False,
               limits: Limits | None = None) -> Trace:
    """Read the trace at ``path``; bad input raises ``TraceFormatError`` naming file, record and reason.

    With ``lenient=True`` readers repair what they can (documented per reader) and list every
    repair in ``trace.meta.repairs`` instead of raising. ``limits`` caps what the file may make a
    reader do (``allocsim.trace.reading.limits.Limits``; an exceeded cap raises ``LimitExceeded``).
    """
    path = os.fspath(path)
    limits = limits or DEFAULT_LIMITS
    fmt = format or detect_format(path)
    try:
        trace = _reader(fmt)(path, lenient=lenient, limits=limits)
    except TraceFormatError:
        raise
    except (OSError, EOFError, zlib.error) as exc:
        raise os_error(path, exc) from None
    except (UnicodeDecodeError, MemoryError, RecursionError) as exc:
        room = headroom() if isinstance(exc, MemoryError) else None
        if room is not None:
            raise over_room(path, room) from None
        raise TraceFormatError(path, None, f"cannot read as {fmt}: {type(exc).__name__}: {quote(str(exc))}") from None
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError) as exc:
        # Readers name the record for every failure they foresee; this net keeps a damaged file
        # the reader did not foresee from ever surfacing as a traceback.
        raise TraceFormatError(path, None, f"malformed {fmt} data: {type(exc).__name__}: {quote(str(exc))}") from None
    from .reading.surrogates import repair_surrogates
    from .reading.validate import check_live_bytes, check_time_range

    check_time_range(path, trace.column("t_ns"))
    check_live_bytes(path, trace)
    repair_surrogates(trace)     # once, for every reader and route: nothing later meets a lone surrogate
    return trace


def write_trace(trace: Trace, path: str | os.PathLike) -> None:
    """Write ``trace`` losslessly: Parquet unless ``path`` ends in ``.csv`` (or ``.csv.gz``).

    Through ``output_write.open_output``: a temporary file moved into place, never through a link,
    and an existing file is replaced only if it is an allocsim trace (ValueError otherwise).
    """
    from ..output_file import open_output
    from ..output_marks import is_allocsim_trace
    from .formats.native import write_csv, write_parquet

    path = os.fspath(path)
    with open_output(path, ours=is_allocsim_trace, what="an allocsim trace") as fh:
        if path.endswith(".csv") or path.endswith(".csv.gz"):
            write_csv(trace, fh, compress=path.endswith(".gz"))
        else:
            write_parquet(trace, fh)
