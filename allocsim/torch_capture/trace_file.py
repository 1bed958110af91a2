"""Write a capture's trace at ``-o`` without hanging and without replacing what allocsim did not write: ``write_capture(trace, path)``.

``allocsim capture`` checks ``-o`` before the script runs (``output_file.check_trace_output``), but
the script runs as the user for as long as it likes and may make that path a FIFO (opening it would
hang the write), a link, a folder, or a file of its own. So the trace is written to a new file in the
same folder (created with ``O_EXCL``, so nothing there is opened), the path is checked again right
before the rename (``os.lstat``: a link is never followed), and ``os.replace`` puts it in place
atomically, replacing only a regular file that is empty or an allocsim trace
(``output_marks.is_allocsim_trace``). When the path has become something else the trace goes to the
first free name beside it (``NAME.1.parquet``, ...), and the caller says where.
"""

from __future__ import annotations

import os
import secrets
import stat
from typing import Any

from ..output_file import TRACE_SUFFIXES

#: Names tried beside a path that cannot be replaced.
_MAX_OTHER_NAMES = 1000


def _suffix(path: str) -> str:
    return next((s for s in sorted(TRACE_SUFFIXES, key=len, reverse=True) if path.endswith(s)), ".parquet")


def replaceable(path: str) -> str:
    """Why the trace must not replace ``path`` now ("" when nothing is there, or an empty file or an allocsim trace)."""
    from ..output_marks import is_allocsim_trace

    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return ""
    except OSError as exc:
        return f"it cannot be checked ({exc.strerror or type(exc).__name__})"
    if stat.S_ISLNK(st.st_mode):
        return "it is a symbolic link"
    if not stat.S_ISREG(st.st_mode):
        kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a folder" if stat.S_ISDIR(st.st_mode) else
                "a socket" if stat.S_ISSOCK(st.st_mode) else "a device file")
        return f"it is {kind}"
    if st.st_size and not is_allocsim_trace(path):
        return "it is a file allocsim did not write"
    return ""


def write_capture(trace: Any, path: str) -> tuple[str, str]:
    """Write ``trace`` at ``path`` (module doc); return ``(the path written, why not path)``; OSError if nothing could be."""
    from ..trace import write_trace

    folder, name = os.path.split(os.path.abspath(path))
    suffix = _suffix(name)
    temp = os.path.join(folder, f".{name}.{secrets.token_hex(6)}.tmp{suffix}")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)    # new, ours, with the user's umask
    os.close(fd)
    try:
        write_trace(trace, temp)
        why = replaceable(path)
        if not why:
            os.replace(temp, path)
            return path, ""
        stem = name[:-len(suffix)]
        for n in range(1, _MAX_OTHER_NAMES + 1):
            other = os.path.join(folder, f"{stem}.{n}{suffix}")
            try:
                os.link(temp, other)              # fails if the name exists: nothing is replaced
            except FileExistsError:
                continue
            except OSError:                       # a file system without hard links
                if os.path.lexists(other):
                    continue
                os.rename(temp, other)
                return other, why
            os.unlink(temp)
            return other, why
        raise OSError(f"no free name beside {path}")
    except BaseException:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise
