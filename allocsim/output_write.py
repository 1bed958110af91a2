"""Write an output file safely: ``open_output(path, ...)`` (a context manager giving the file) or
``write_output(path, data)``; ``make_output_folder`` for a folder. ``output_file`` checks before any work.

A file is written into a new temporary file in the target's folder (``O_CREAT | O_EXCL |
O_NOFOLLOW``, opened relative to the folder so a link planted in a sub-folder is not followed
either), then moved into place only if the target is still absent (a hard link, which never
replaces anything), or still a regular file that may be replaced (``rename`` once ``lstat`` says
so): what appeared there while the command worked (a script under capture can make a FIFO, a link or
a file at its ``-o`` path) is refused at that moment too, and the finished output is kept under its
temporary name and named in the error (``OutputKept``). A device, FIFO, socket, directory or
symbolic link is never written over or through.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import secrets
import stat
from typing import IO, Callable, Iterator

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
#: Whether files can be opened relative to a folder's descriptor (POSIX; not Windows).
_DIR_FD = all(f in os.supports_dir_fd for f in (os.open, os.link, os.rename, os.stat, os.unlink, os.mkdir))


def kind_of(mode: int) -> str:
    """What an entry that is not a regular file is, in words (``lstat``'s mode)."""
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device file"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def os_reason(exc: OSError) -> str:
    """The reason an OS call failed, in words."""
    return exc.strerror or type(exc).__name__


def refusal(option: str, path: str, st: os.stat_result, ours: Callable[[str], bool] | None, what: str,
             inside: str | None = None) -> str | None:
    """Why an existing entry (``lstat`` result ``st``) must not be replaced, or None when it may be.

    ``inside``: the entry is that file of the folder ``path`` (a folder output), not ``path`` itself.
    """
    subject = f"{option} {path}: " + (f"{inside} " if inside is not None else "")
    if stat.S_ISDIR(st.st_mode):
        return subject + ("is a directory; give a file name" if inside is None else "is a directory")
    if stat.S_ISLNK(st.st_mode):
        return subject + "is a symbolic link; allocsim never writes through a link (remove it or choose another name)"
    if not stat.S_ISREG(st.st_mode):
        return subject + f"is {kind_of(st.st_mode)}, not a file; refusing to write over it"
    if ours is not None and st.st_size and not ours(path if inside is None else inside):
        return subject + f"exists and is not {what}; refusing to replace it (remove it or choose another name)"
    return None


def _open_folder(folder: str, within: str | None, option: str, path: str) -> int | None:
    """A descriptor of ``folder`` (None without ``dir_fd`` support), reached from ``within`` without following links."""
    if not _DIR_FD:
        _check_no_links(folder, within, option, path)
        return None
    flags = os.O_RDONLY | _DIRECTORY | _CLOEXEC
    if within is None:
        try:
            return os.open(folder or ".", flags)
        except FileNotFoundError:
            raise ValueError(f"{option} {path}: folder {folder} does not exist; create it first") from None
        except OSError as exc:
            raise ValueError(f"{option} {path}: cannot open folder {folder or '.'} ({os_reason(exc)})") from None
    rel = os.path.relpath(folder or ".", within)
    parts = [] if rel == os.curdir else rel.split(os.sep)
    if os.pardir in parts:
        raise ValueError(f"{option} {path}: {folder} is outside {within}")
    try:
        fd = os.open(within, flags)
    except OSError as exc:
        raise ValueError(f"{option} {path}: cannot open folder {within} ({os_reason(exc)})") from None
    try:
        for part in parts:
            try:
                sub = os.open(part, flags | _NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                why = ("is a symbolic link; allocsim never follows a link inside -o" if exc.errno in (errno.ELOOP, errno.ENOTDIR)
                       else os_reason(exc))
                raise ValueError(f"{option} {path}: {os.path.join(within, part)} {why}") from None
            os.close(fd)
            fd, within = sub, os.path.join(within, part)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check_no_links(folder: str, within: str | None, option: str, path: str) -> None:
    """Where folders cannot be opened relative to each other: no component from ``within`` to ``folder`` is a link."""
    if within is None:
        return
    rel = os.path.relpath(folder or ".", within)
    if rel == os.curdir:
        return
    if os.pardir in rel.split(os.sep):
        raise ValueError(f"{option} {path}: {folder} is outside {within}")
    current = within
    for part in rel.split(os.sep):
        current = os.path.join(current, part)
        if os.path.islink(current):
            raise ValueError(f"{option} {path}: {current} is a symbolic link; allocsim never follows a link inside -o")


def make_output_folders(path: str, within: str, option: str = "-o") -> None:
    """Create ``path`` and the folders between it and ``within`` (which must exist), none of them
    through a link: for a tool's own working folders (a cache), never for a user's ``-o``."""
    rel = os.path.relpath(path, within)
    if rel == os.curdir:
        return
    current = within
    for part in rel.split(os.sep):
        if part == os.pardir:
            raise ValueError(f"{option} {path}: outside {within}")
        current = os.path.join(current, part)
        make_output_folder(current, option, within=within)


def make_output_folder(path: str, option: str = "-o", within: str | None = None) -> None:
    """Create the folder ``path`` if absent (its parent must exist: nothing else is created); a link or
    a file there is refused. ``within``: the ``-o`` folder ``path`` lies in, whose links are not followed."""
    parent, name = os.path.split(os.path.normpath(path))
    if within is not None and os.path.normpath(path) == os.path.normpath(within):
        within = None
    if within is not None and not os.path.lexists(within):
        make_output_folder(os.fspath(within), option)        # the -o folder first (its parent must exist)
    fd = _open_folder(parent, within, option, path)
    try:
        try:
            os.mkdir(name if fd is not None else path, dir_fd=fd) if fd is not None else os.mkdir(path)
        except FileExistsError:
            pass
        except FileNotFoundError:
            raise ValueError(f"{option} {path}: folder {parent or '.'} does not exist; create it first") from None
        except OSError as exc:
            raise ValueError(f"{option} {path}: cannot create it ({os_reason(exc)})") from None
        st = os.lstat(path) if fd is None else os.stat(name, dir_fd=fd, follow_symlinks=False)
        if within is not None and not stat.S_ISDIR(st.st_mode):
            raise ValueError(f"{option} {path}: is {kind_of(st.st_mode)}, not a folder")
        if within is None and not os.path.isdir(path):
            raise ValueError(f"{option} {path}: is {kind_of(os.stat(path).st_mode)}, not a folder")
    finally:
        if fd is not None:
            os.close(fd)


#: How the temporary file of an output being written ends (``.NAME.RANDOM.allocsim-tmp`` beside it).
TEMP_SUFFIX = ".allocsim-tmp"


class OutputKept(ValueError):
    """The output was written, but what now stands at its name must not be replaced: it is kept under
    the temporary name the message gives."""


class _Target:
    """The folder (descriptor or path) and name an output goes to, and its temporary file."""

    def __init__(self, path: str, within: str | None, option: str):
        self.path, self.option = path, option
        self.folder, self.name = os.path.split(path)
        self.fd = _open_folder(self.folder, within, option, path)
        self.tmp = f".{self.name[:100]}.{secrets.token_hex(6)}{TEMP_SUFFIX}"

    def _at(self, name: str) -> str:
        return name if self.fd is not None else os.path.join(self.folder, name)

    def create(self) -> int:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC | getattr(os, "O_BINARY", 0)
        try:
            return os.open(self._at(self.tmp), flags, 0o666, dir_fd=self.fd)
        except OSError as exc:
            raise ValueError(f"{self.option} {self.path}: cannot create a file in {self.folder or '.'} "
                             f"({os_reason(exc)})") from None

    def lstat(self) -> os.stat_result | None:
        try:
            return os.stat(self._at(self.name), dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def commit(self, ours: Callable[[str], bool] | None, what: str) -> None:
        """Move the temporary file to the name: without replacing anything, or over a file that may be replaced."""
        src, dst = self._at(self.tmp), self._at(self.name)
        try:
            os.link(src, dst, src_dir_fd=self.fd, dst_dir_fd=self.fd, follow_symlinks=False)
        except FileExistsError:
            pass
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV, errno.EMLINK, errno.ENOSYS):
                raise
        else:
            os.unlink(src, dir_fd=self.fd)
            return
        st = self.lstat()
        if st is not None:
            refused = refusal(self.option, self.path, st, ours, what)
            if refused:
                raise OutputKept(f"{refused} (it appeared there while allocsim worked; the output is kept as "
                                 f"{os.path.join(self.folder, self.tmp)})")
        os.replace(src, dst, src_dir_fd=self.fd, dst_dir_fd=self.fd)

    def create_live(self, ours: Callable[[str], bool] | None, what: str) -> int:
        """Create the file at its own name (O_EXCL, O_NOFOLLOW), after removing a file that may be replaced."""
        st = self.lstat()
        if st is not None:
            refused = refusal(self.option, self.path, st, ours, what)
            if refused:
                raise ValueError(refused)
            os.unlink(self._at(self.name), dir_fd=self.fd)     # the entry itself: a link is never followed
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC | getattr(os, "O_BINARY", 0)
        try:
            return os.open(self._at(self.name), flags, 0o666, dir_fd=self.fd)
        except FileExistsError:
            raise ValueError(f"{self.option} {self.path}: something else was created there while allocsim "
                             "started writing it; refusing to write over it") from None
        except OSError as exc:
            raise ValueError(f"{self.option} {self.path}: cannot create it ({os_reason(exc)})") from None

    def discard(self) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self._at(self.tmp), dir_fd=self.fd)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)


@contextlib.contextmanager
def open_output(path: str | os.PathLike, *, ours: Callable[[str], bool] | None = None,
                what: str = "an allocsim output file", option: str = "-o", within: str | os.PathLike | None = None,
                text: bool = False, encoding: str = "utf-8", errors: str = "strict",
                newline: str | None = None, live: bool = False) -> Iterator[IO]:
    """Write ``path`` through a temporary file in its folder, moved into place at the end (module doc).

    Yields a binary file (``text=True``: a text file with ``encoding``, ``errors``, ``newline``).
    An existing entry at ``path`` is replaced only when it is a regular file that is empty or that
    ``ours`` accepts (None: any regular file); a link, FIFO, device or folder never is, and the
    ValueError names the kept temporary file. ``within`` is the ``-o`` folder ``path`` lies in: no
    link between it and ``path`` is followed. An exception inside the block removes the temporary file.

    ``live``: a file to follow while it grows (a log): created at its own name from the start, with
    ``O_EXCL | O_NOFOLLOW`` once a file that may be replaced is removed, and kept as far as it got.
    """
    path = os.fspath(path)
    target = _Target(path, None if within is None else os.fspath(within), option)
    if live:
        try:
            fd = target.create_live(ours, what)
            with os.fdopen(fd, "wb") as raw:
                if text:
                    wrapper = io.TextIOWrapper(raw, encoding=encoding, errors=errors, newline=newline)
                    try:
                        yield wrapper
                    finally:
                        wrapper.flush()
                        wrapper.detach()
                else:
                    yield raw
        finally:
            target.close()
        return
    try:
        fd = target.create()
        try:
            raw = os.fdopen(fd, "wb")
        except BaseException:
            os.close(fd)
            raise
        try:
            with raw:
                if text:
                    wrapper = io.TextIOWrapper(raw, encoding=encoding, errors=errors, newline=newline)
                    yield wrapper
                    wrapper.flush()
                    wrapper.detach()         # ``raw`` closes it
                else:
                    yield raw
            target.commit(ours, what)
        except OutputKept:
            raise
        except BaseException:
            target.discard()
            raise
    finally:
        target.close()


def write_output(path: str | os.PathLike, data: bytes | str, **options) -> None:
    """Write ``data`` (bytes, or text as UTF-8) to ``path`` with ``open_output``'s rules (same options)."""
    if isinstance(data, str):
        data = data.encode(options.pop("encoding", "utf-8"), options.pop("errors", "strict"))
    with open_output(path, **options) as fh:
        fh.write(data)
