"""Refuse an output path before any work, then write it safely: ``check_output_file(path)`` (files) or
``check_output_folder(path)`` (folders) first, and every write through ``open_output(path, ...)``.

The rules every ``-o`` follows: the parent folder must already exist and accept new files (nothing
is created silently); a device, FIFO, socket, directory or symbolic link is never written over or
through (a FIFO would hang the write, a link would send it elsewhere: a dangling link in an ``-o``
folder pointed outside it); and an existing non-empty file that allocsim did not write is left
alone (``ours``, and ``output_marks`` for how each kind of file is recognised; a folder checks the
files the command writes in it). Each refusal is a ``ValueError`` whose one line starts with ``-o PATH:``.

Then every file is written through ``output_write.open_output`` (re-exported here): a temporary file
in the target's folder moved into place, never through a link (see there).
"""

from __future__ import annotations

import os
import stat
import tempfile
from typing import Callable, Iterable

from .output_write import (TEMP_SUFFIX, OutputKept, kind_of, make_output_folder, make_output_folders,  # noqa: F401
                           open_output, os_reason, refusal, write_output)


def check_parent(path: str, option: str = "-o", folder: str | None = None) -> str:
    """The folder ``path`` goes in (or ``folder``), once it exists and accepts new files (else ValueError)."""
    shown = folder if folder is not None else (os.path.dirname(path) or ".")
    folder = os.path.abspath(shown)
    if not os.path.exists(folder):
        raise ValueError(f"{option} {path}: folder {shown} does not exist; create it first")
    if not os.path.isdir(folder):
        raise ValueError(f"{option} {path}: {shown} is not a folder")
    try:
        # Permission bits do not tell (root, read-only mounts, /proc): create and remove a real file.
        fd, probe = tempfile.mkstemp(prefix=".tmp-allocsim-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ValueError(f"{option} {path}: cannot create files in folder {shown} ({os_reason(exc)})") from None
    return folder


def check_output_file(path: str, option: str = "-o", *, ours: Callable[[str], bool] | None = None,
                      what: str = "an allocsim output file", folder_beside: str | None = None) -> None:
    """Refuse (ValueError, one line) an output file ``path`` that must not or cannot be written.

    ``ours(path)`` says whether an existing regular file is one this program wrote (and so may be
    replaced); ``folder_beside`` names a companion folder the command also writes (a journal), which
    must be a real folder (not a link) if it exists.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise ValueError(f"{option} {path}: cannot check it ({os_reason(exc)})") from None
    if st is not None:
        refused = refusal(option, path, st, ours, what)
        if refused:
            raise ValueError(refused)
    check_parent(path, option)
    if folder_beside is not None and os.path.lexists(folder_beside):
        mode = os.lstat(folder_beside).st_mode
        if not stat.S_ISDIR(mode):
            raise ValueError(f"{option} {path}: {folder_beside} (written beside it) exists and is "
                             f"{kind_of(mode) if not stat.S_ISREG(mode) else 'a file'}, not a folder")


def check_output_folder(path: str, option: str = "-o", files: Iterable[str] = ()) -> None:
    """Refuse (ValueError, one line) an output folder that is something else or whose parent is missing,
    or in which one of ``files`` (names relative to it: what the command writes there; ``sub/`` a
    folder) exists and is a link, or is not a regular file allocsim wrote (``output_marks.written_by_allocsim``)."""
    from .output_marks import written_by_allocsim

    if os.path.lexists(path):
        try:
            mode = os.stat(path).st_mode      # the folder itself is the user's to name, through a link or not
        except OSError as exc:
            raise ValueError(f"{option} {path}: cannot check it ({os_reason(exc)})") from None
        if not stat.S_ISDIR(mode):
            raise ValueError(f"{option} {path}: is {kind_of(mode) if not stat.S_ISREG(mode) else 'a file'}, "
                             "not a folder")
        check_parent(path, option, folder=path)
    else:
        check_parent(path, option)
    for name in files:
        target = os.path.join(path, name.rstrip("/"))
        try:
            st = os.lstat(target)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as exc:
            raise ValueError(f"{option} {path}: cannot check {target} ({os_reason(exc)})") from None
        if name.endswith("/"):      # a folder the command writes into: a real one, not a link out
            if not stat.S_ISDIR(st.st_mode):
                raise ValueError(f"{option} {path}: {target} exists and is {kind_of(st.st_mode) if not stat.S_ISREG(st.st_mode) else 'a file'}, "
                                 "not a folder")
            continue
        refused = refusal(option, path, st, written_by_allocsim, "a file allocsim wrote", inside=target)
        if refused:
            raise ValueError(refused)


#: What a trace output may be named (``convert``, ``scale``, ``capture``): Parquet, or CSV when it ends so.
TRACE_SUFFIXES = (".parquet", ".csv", ".csv.gz")


def check_trace_output(path: str, option: str = "-o") -> None:
    """Refuse, before any work, a trace output path (``-o OUT.parquet``) that must not or cannot be
    written: an unknown extension, a missing folder, a FIFO, device or link, or an existing file that
    is not an allocsim trace (``output_marks.is_allocsim_trace``: only those are replaced)."""
    from .output_marks import is_allocsim_trace

    if not path.endswith(TRACE_SUFFIXES):
        raise ValueError(f"{option} {path}: unknown extension; name the output .parquet, .csv or .csv.gz")
    check_output_file(path, option, ours=is_allocsim_trace, what="an allocsim trace")
