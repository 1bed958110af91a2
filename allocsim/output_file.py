"""Refuse an output path before any work when writing it would fail or destroy something: call
``check_output_file(path)`` (files) or ``check_output_folder(path)`` (folders) first.

The rules every ``-o`` follows: the parent folder must already exist and accept new files (nothing
is created silently); a device, FIFO, socket or directory is never written over (a FIFO would hang
the write); and an existing non-empty file that allocsim did not write is left alone (``ours``, and
``output_marks`` for how each kind of file is recognised; a folder checks the files the command
writes in it). Each refusal is a ``ValueError`` whose one line starts with ``-o PATH:``.
"""

from __future__ import annotations

import os
import stat
import tempfile
from typing import Callable, Iterable


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device file"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


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
        raise ValueError(f"{option} {path}: cannot create files in folder {shown} "
                         f"({exc.strerror or type(exc).__name__})") from None
    return folder


def check_output_file(path: str, option: str = "-o", *, ours: Callable[[str], bool] | None = None,
                      what: str = "an allocsim output file", folder_beside: str | None = None) -> None:
    """Refuse (ValueError, one line) an output file ``path`` that must not or cannot be written.

    ``ours(path)`` says whether an existing regular file is one this program wrote (and so may be
    replaced); ``folder_beside`` names a companion folder the command also writes (a journal), which
    must be a folder if it exists.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise ValueError(f"{option} {path}: cannot check it ({exc.strerror or type(exc).__name__})") from None
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise ValueError(f"{option} {path}: is a directory; give a file name")
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{option} {path}: is {_kind(st.st_mode)}, not a file; refusing to write over it")
        if ours is not None and st.st_size and not ours(path):
            raise ValueError(f"{option} {path}: exists and is not {what}; refusing to replace it "
                             "(remove it or choose another name)")
    check_parent(path, option)
    if folder_beside is not None and os.path.lexists(folder_beside) and not os.path.isdir(folder_beside):
        raise ValueError(f"{option} {path}: {folder_beside} (written beside it) exists and is not a folder")


def check_output_folder(path: str, option: str = "-o", files: Iterable[str] = ()) -> None:
    """Refuse (ValueError, one line) an output folder that is something else or whose parent is missing,
    or in which one of ``files`` (names relative to it: what the command writes there; ``sub/`` a
    folder) exists and is not a regular file allocsim wrote (``output_marks.written_by_allocsim``)."""
    from .output_marks import written_by_allocsim

    if os.path.lexists(path):
        try:
            mode = os.stat(path).st_mode
        except OSError as exc:
            raise ValueError(f"{option} {path}: cannot check it ({exc.strerror or type(exc).__name__})") from None
        if not stat.S_ISDIR(mode):
            raise ValueError(f"{option} {path}: is {_kind(mode) if not stat.S_ISREG(mode) else 'a file'}, "
                             "not a folder")
        check_parent(path, option, folder=path)
    else:
        check_parent(path, option)
    for name in files:
        target = os.path.join(path, name)
        try:
            st = os.stat(target)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise ValueError(f"{option} {path}: cannot check {target} ({exc.strerror or type(exc).__name__})") from None
        if name.endswith("/"):      # a folder the command writes into
            if not stat.S_ISDIR(st.st_mode):
                raise ValueError(f"{option} {path}: {target} exists and is not a folder")
            continue
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{option} {path}: {target} is {_kind(st.st_mode)}; refusing to write over it")
        if st.st_size and not written_by_allocsim(target):
            raise ValueError(f"{option} {path}: {target} exists and is not a file allocsim wrote; refusing to "
                             "replace it (remove it or choose another folder)")


#: What a trace output may be named (``convert``, ``scale``, ``capture``): Parquet, or CSV when it ends so.
TRACE_SUFFIXES = (".parquet", ".csv", ".csv.gz")


def check_trace_output(path: str, option: str = "-o") -> None:
    """Refuse, before any work, a trace output path (``-o OUT.parquet``) that must not or cannot be
    written: an unknown extension, a missing folder, a FIFO or device, or an existing file that is not
    an allocsim trace (``output_marks.is_allocsim_trace``: only those are replaced)."""
    from .output_marks import is_allocsim_trace

    if not path.endswith(TRACE_SUFFIXES):
        raise ValueError(f"{option} {path}: unknown extension; name the output .parquet, .csv or .csv.gz")
    check_output_file(path, option, ours=is_allocsim_trace, what="an allocsim trace")
