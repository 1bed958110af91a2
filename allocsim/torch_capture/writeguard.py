"""Keep a captured script off the user's files: ``WriteGuard(scratch).install()`` before the script runs.

A script under capture saves checkpoints of placeholder tensors, appends to logs, removes and renames
files. None of that may touch the user's files: every write, creation, removal and rename of a path
goes to a private scratch overlay instead (``SCRATCH/files`` mirrors the absolute path), and the
script's reads of a path it wrote see its own version (a best-checkpoint reload works); paths it did
not touch are read where they are. What is redirected:

* Python's file API: ``open`` / ``io.open`` (write, append, exclusive and update modes), ``os.open``
  with write flags, ``os.mkdir`` (so ``os.makedirs``), ``os.remove`` / ``unlink`` / ``rmdir`` /
  ``rename`` / ``replace`` / ``truncate`` / ``mkfifo`` / ``mknod``, ``shutil.rmtree``; ``chmod``,
  ``chown``, ``utime`` and extended attributes apply to the script's own copies and are skipped on
  the user's files; ``symlink`` and ``link`` make a copy in the overlay (a link there could point
  out of it). ``os.stat``, ``lstat``, ``statvfs``, ``access``, ``listdir``, ``scandir``, ``chdir`` and ``getcwd``
  show the overlay, so ``os.path.exists``, ``glob``, ``pathlib`` and ``shutil.copy*`` / ``move``
  (built on these) see what the script did. A real file the script appends to or renames is copied
  into the overlay first (at most ``COPY_LIMIT_BYTES`` in all).
* Native writers that open files themselves: torch's zip writer (``torch._C.PyTorchFileWriter``, what
  ``torch.save`` and ``torch.package`` use), ``torch.load`` (its memory-mapped read opens the path in
  C++), safetensors' Rust ``serialize_file`` / ``safe_open`` (``save_file``, ``save_model``,
  ``load_file``) when safetensors is installed, and pyarrow's ``memory_map``, ``create_memory_map``,
  ``input_stream``, ``output_stream`` and ``OSFile`` once the script imports pyarrow (Hugging Face
  ``datasets`` writes its Arrow cache with ``open`` and memory-maps it back). pyarrow's filesystem
  layer (``pyarrow.fs``, ``pyarrow.parquet`` / ``pyarrow.dataset`` by path) is not redirected.
* The backstop: a ``sys.addaudithook`` hook refuses, with ``PermissionError``, every audited write,
  removal, rename, link, permission or attribute change whose path is outside the scratch folder
  (what the redirect did not catch: ``posix.open``, ``io.FileIO``, a ``rmtree`` bound before the
  guard), and records the processes the script starts.

Not guarded: native code that opens files itself without an audit event (C extensions, ``ctypes``,
h5py, sqlite's own files are refused at ``sqlite3.connect``), and processes the script starts
(``subprocess``, ``os.system``, multiprocessing's spawned workers: they get ``TMPDIR`` in the scratch
folder and nothing else); forked workers (a DataLoader's) keep the guard. ``journal()`` says what was
redirected, for the capture's summary. Only the standard library is used: this runs in the user's
interpreter.
"""

from __future__ import annotations

import builtins
import errno
import io
import os
import shutil
import stat as stat_mod
import sys
import threading
from typing import Any, Callable

from .distributed.lazy import Patches

#: Copies of the user's files into the overlay (appending to a real log, renaming a real file) stop here.
COPY_LIMIT_BYTES = 4 << 30
#: Paths the overlay may track; past this a write is refused (a script cannot grow allocsim's memory unbounded).
MAX_NODES = 1_000_000
#: Entries of each list in the journal (the counts stay exact).
JOURNAL_ITEMS = 200
#: Special files a script may write where they are (they hold no user data).
PASS_THROUGH = frozenset({"/dev/null", "/dev/zero", "/dev/full", "/dev/stdout", "/dev/stderr", "/dev/tty"})

#: POSIX shared memory (multiprocessing, DataLoader workers): the processes' own, never a user's file.
SHARED_MEMORY = "/dev/shm/"

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_PASS, _FILE, _DIR, _GONE = "pass", "file", "dir", "gone"


class _Node:
    """One path the overlay changed: ``pass`` (real, changed below), ``file`` / ``dir`` (in the mirror), ``gone``."""

    __slots__ = ("kind", "children")

    def __init__(self, kind: str):
        self.kind = kind
        self.children: dict[str, _Node] = {}


def _enoent(path: Any) -> OSError:
    return FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)


def _error(code: int, path: Any) -> OSError:
    return OSError(code, os.strerror(code), path)


class WriteGuard:
    """The overlay of one capture: ``install()`` patches the file API and adds the audit hook (for good)."""

    def __init__(self, scratch: str):
        self.root = os.path.realpath(scratch)
        self.mirror = os.path.join(self.root, "files")
        self.tmp = os.path.join(self.root, "tmp")
        self._top = _Node(_PASS)
        self._nodes = 0
        self._lock = threading.RLock()
        self._orig: dict[str, Callable[..., Any]] = {}
        self.writes: dict[str, int] = {}          # view path -> write opens (first JOURNAL_ITEMS paths)
        self.write_opens = 0
        self.removed: list[str] = []
        self.made: list[str] = []                 # folders made (in the mirror)
        self.renamed: list[list[str]] = []
        self.skipped: dict[str, int] = {}         # chmod / utime ... of a user's file, not applied
        self.refused: list[str] = []
        self.processes: list[str] = []
        self.copied_bytes = 0
        self.installed = False

    # ------------------------------------------------------------------------------------------ paths
    def _getcwd(self) -> str:
        return self._orig.get("getcwd", os.getcwd)()

    def _inside(self, path: str) -> bool:
        return path == self.root or path.startswith(self.root + os.sep)

    def _fd_path(self, fd: int) -> str | None:
        try:
            return os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return None

    def view(self, path: Any, dir_fd: int | None = None) -> str:
        """The absolute path the script means (a path into the mirror is the path it mirrors)."""
        text = os.fsdecode(os.fspath(path))
        if not os.path.isabs(text):
            base = self._fd_path(dir_fd) if dir_fd is not None else None
            text = os.path.join(base if base is not None else self._getcwd(), text)
        text = os.path.normpath(text)
        if text.startswith("//"):
            text = "/" + text.lstrip("/")
        if text == self.mirror:
            return "/"
        if text.startswith(self.mirror + os.sep):
            return text[len(self.mirror):]
        return text

    def mirror_of(self, view: str) -> str:
        return os.path.join(self.mirror, view.lstrip("/"))

    def _parts(self, view: str) -> list[str]:
        return [p for p in view.split("/") if p]

    def _node(self, view: str) -> _Node | None:
        node = self._top
        for part in self._parts(view):
            node = node.children.get(part)
            if node is None:
                return None
        return node

    def lookup(self, view: str) -> tuple[str, str]:
        """``("real", view)``, ``("mirror", path in the mirror)`` or ``("gone", view)``: where ``view`` lives.

        A path in the scratch folder itself (``TMPDIR``: tempfile's files) lives there, as the mirror does.
        """
        if self._inside(view):
            return "mirror", view
        if not self._top.children:
            return "real", view
        node = self._top
        parts = self._parts(view)
        for i, part in enumerate(parts):
            child = node.children.get(part)
            if child is None:
                return ("mirror", self.mirror_of(view)) if node.kind == _DIR else ("real", view)
            if child.kind == _GONE:
                return "gone", view
            if child.kind == _FILE:
                return ("mirror", self.mirror_of(view)) if i == len(parts) - 1 else ("gone", view)
            node = child
        return ("mirror", self.mirror_of(view)) if node.kind == _DIR else ("real", view)

    def _set(self, view: str, kind: str) -> None:
        node = self._top
        parts = self._parts(view)
        for part in parts[:-1]:
            child = node.children.get(part)
            if child is None:
                if self._nodes >= MAX_NODES:
                    raise PermissionError(errno.EACCES, f"allocsim capture: the script changed more than "
                                          f"{MAX_NODES:,} paths; refused", view)
                child = node.children[part] = _Node(_PASS)
                self._nodes += 1
            node = child
        if parts:
            if parts[-1] not in node.children:
                self._nodes += 1
            node.children[parts[-1]] = _Node(kind)

    def _lstat(self, where: str, path: str) -> os.stat_result | None:
        if where == "gone":
            return None
        try:
            return self._orig["lstat"](path)
        except OSError:
            return None

    def _is_dir(self, view: str) -> bool:
        where, path = self.lookup(view)
        if where == "gone":
            return False
        try:
            return stat_mod.S_ISDIR(self._orig["stat"](path).st_mode)
        except OSError:
            return False

    def _exists(self, view: str) -> bool:
        where, path = self.lookup(view)
        return self._lstat(where, path) is not None

    def _isdir(self, path: str) -> bool:
        """Whether ``path`` (a real path, or one in the mirror) is a folder, asked of the file system itself."""
        try:
            return stat_mod.S_ISDIR(self._orig["stat"](path).st_mode)
        except OSError:
            return False

    def _lexists(self, path: str) -> bool:
        try:
            self._orig["lstat"](path)
            return True
        except OSError:
            return False

    def _mkdirs(self, path: str) -> None:
        if self._isdir(path):
            return
        parent = os.path.dirname(path)
        if parent != path:
            self._mkdirs(parent)
        try:
            self._orig["mkdir"](path)
        except FileExistsError:
            pass

    def _need_parent(self, view: str, shown: Any) -> None:
        parent = os.path.dirname(view)
        if not self._is_dir(parent):
            raise _enoent(shown)
        where, path = self.lookup(parent)
        self._mkdirs(self.mirror_of(parent) if where == "real" else path)

    def _copy_in(self, source: str, target: str) -> None:
        """Copy the user's file or folder ``source`` into the mirror at ``target`` (bounded in all).

        Regular files and folders only (a link inside is copied as what it leads to, never as a link:
        one in the mirror could lead out of it); the file system is asked directly, not the overlay.
        """
        files: list[tuple[str, str]] = []
        folders: list[str] = []
        size = 0
        todo = [(source, target)]
        seen: set[tuple[int, int]] = set()
        while todo:
            src, dst = todo.pop()
            st = self._orig["stat"](src)
            if stat_mod.S_ISDIR(st.st_mode):
                if (st.st_dev, st.st_ino) in seen:     # a link back up the tree
                    continue
                seen.add((st.st_dev, st.st_ino))
                folders.append(dst)
                todo += [(os.path.join(src, n), os.path.join(dst, n)) for n in self._orig["listdir"](src)]
            elif stat_mod.S_ISREG(st.st_mode):
                files.append((src, dst))
                size += st.st_size
            if self.copied_bytes + size > COPY_LIMIT_BYTES:
                raise PermissionError(errno.EACCES, f"allocsim capture: changing {source} would copy more than "
                                      f"{COPY_LIMIT_BYTES:,} bytes of your files into the scratch folder; refused",
                                      source)
        self.copied_bytes += size
        for folder in folders:
            self._mkdirs(folder)
        for src, dst in files:
            with self._orig["io_open"](src, "rb") as fin, self._orig["io_open"](dst, "wb") as fout:
                shutil.copyfileobj(fin, fout, 1 << 20)

    def _count_write(self, view: str) -> None:
        if self._inside(view):                       # tempfile's own files: nothing of the user's
            return
        self.write_opens += 1
        if view in self.writes or len(self.writes) < JOURNAL_ITEMS:
            self.writes[view] = self.writes.get(view, 0) + 1

    def _note(self, items: list, item: Any) -> None:
        if len(items) < JOURNAL_ITEMS:
            items.append(item)

    # ------------------------------------------------------------------------------------------ write side
    def for_write(self, path: Any, *, truncate: bool, create: bool = True, exclusive: bool = False,
                  dir_fd: int | None = None) -> Any:
        """Where a write of ``path`` goes: its copy in the mirror (made ready), or ``path`` itself (a special file)."""
        view = self.view(path, dir_fd)
        with self._lock:
            where, real = self.lookup(view)
            st = self._lstat(where, real)
            if where == "real" and view in PASS_THROUGH:
                return view
            if st is not None and exclusive:
                raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), path)
            if st is not None and stat_mod.S_ISDIR(st.st_mode):
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
            if st is None and not create:
                raise _enoent(path)
            if where == "mirror":
                self._need_parent(view, path)
                self._count_write(view)
                return real
            self._need_parent(view, path)
            target = self.mirror_of(view)
            if st is not None and not truncate and stat_mod.S_ISREG(st.st_mode):
                self._copy_in(real, target)          # appended to, or read and written: start from its bytes
            self._set(view, _FILE)
            self._count_write(view)
            return target

    def for_read(self, path: Any, dir_fd: int | None = None) -> Any:
        """What to open for reading ``path``: the mirror's copy, or ``path`` as given (``FileNotFoundError`` if removed)."""
        if isinstance(path, int) or not self._top.children:
            return path
        view = self.view(path, dir_fd)
        where, real = self.lookup(view)
        if where == "gone":
            raise _enoent(path)
        return real if where == "mirror" and not self._inside(view) else path

    def remove(self, path: Any, dir_fd: int | None = None, *, folder: bool = False) -> None:
        view = self.view(path, dir_fd)
        with self._lock:
            where, real = self.lookup(view)
            st = self._lstat(where, real)
            if st is None:
                raise _enoent(path)
            is_dir = stat_mod.S_ISDIR(st.st_mode)
            if folder and not is_dir:
                raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
            if not folder and is_dir:
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
            if folder and self._listing(view):
                raise _error(errno.ENOTEMPTY, path)
            if where == "mirror":
                (self._orig["rmdir"] if folder else self._orig["unlink"])(real)
                node = self._node(view)
                if node is not None and node.kind in (_FILE, _DIR):
                    self._set(view, _GONE)       # a user's file of that name stays hidden
                return
            self._set(view, _GONE)
            self._note(self.removed, view)

    def rmtree(self, path: Any) -> None:
        view = self.view(path)
        with self._lock:
            where, real = self.lookup(view)
            st = self._lstat(where, real)
            if st is None:
                raise _enoent(path)
            if not stat_mod.S_ISDIR(st.st_mode):
                raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
            if where == "mirror":
                self._orig["rmtree"](real)
                if self._node(view) is None:
                    return
            else:
                self._note(self.removed, view + "/")
            self._set(view, _GONE)

    def rename(self, src: Any, dst: Any, src_dir_fd: int | None = None, dst_dir_fd: int | None = None) -> None:
        src_view, dst_view = self.view(src, src_dir_fd), self.view(dst, dst_dir_fd)
        with self._lock:
            where, real = self.lookup(src_view)
            st = self._lstat(where, real)
            if st is None:
                raise _enoent(src)
            if src_view == dst_view:
                return
            dst_where, dst_real = self.lookup(dst_view)
            dst_st = self._lstat(dst_where, dst_real)
            is_dir = stat_mod.S_ISDIR(st.st_mode)
            if dst_st is not None and stat_mod.S_ISDIR(dst_st.st_mode) != is_dir:
                raise (IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), dst) if not is_dir else
                       NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), dst))
            if dst_st is not None and is_dir and self._listing(dst_view):
                raise _error(errno.ENOTEMPTY, dst)
            self._need_parent(dst_view, dst)
            target = dst_real if dst_where == "mirror" else self.mirror_of(dst_view)
            if self._lexists(target):                # the script's own file of that name, replaced
                if self._isdir(target):
                    self._orig["rmtree"](target)
                else:
                    self._orig["unlink"](target)
            if where == "mirror":
                self._orig["rename"](real, target)
            else:
                self._copy_in(real, target)
                self._note(self.renamed, [src_view, dst_view])
            if dst_where != "mirror" or self._node(dst_view) is not None:
                self._set(dst_view, _DIR if is_dir else _FILE)
            if where != "mirror" or self._node(src_view) is not None:
                self._set(src_view, _GONE)
            if not is_dir:
                self._count_write(dst_view)

    def mkdir(self, path: Any, mode: int = 0o777, dir_fd: int | None = None) -> None:
        view = self.view(path, dir_fd)
        with self._lock:
            if self._exists(view):
                raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), path)
            self._need_parent(view, path)
            where, real = self.lookup(view)
            if where == "mirror":
                self._orig["mkdir"](real, mode)
                return
            target = self.mirror_of(view)
            if self._isdir(target):
                self._orig["rmtree"](target)           # what an earlier, removed folder of that name left
            self._orig["mkdir"](target, mode)
            self._set(view, _DIR)
            self._note(self.made, view)

    def metadata(self, name: str, path: Any, *args: Any, dir_fd: int | None = None, **kwargs: Any) -> Any:
        """``chmod`` / ``chown`` / ``utime`` / ``setxattr`` ...: on the script's own copy, skipped on a user's file."""
        if isinstance(path, int):
            return self._orig[name](path, *args, **kwargs)
        view = self.view(path, dir_fd)
        where, real = self.lookup(view)
        if where == "gone":
            raise _enoent(path)
        if where == "mirror" or self._inside(view):
            return self._orig[name](real, *args, **kwargs)
        if self._lstat(where, real) is None:
            raise _enoent(path)
        self.skipped[name] = self.skipped.get(name, 0) + 1
        return None

    def truncate(self, path: Any, length: int) -> None:
        if isinstance(path, int):
            return self._orig["truncate"](path, length)
        return self._orig["truncate"](self.for_write(path, truncate=False, create=False), length)

    def link_as_copy(self, src: Any, dst: Any, dir_fd: int | None = None) -> None:
        """``os.symlink`` / ``os.link``: the overlay gets a copy (a real link there could lead out of it)."""
        src_view = self.view(src if os.path.isabs(os.fsdecode(src)) else
                             os.path.join(os.path.dirname(self.view(dst, dir_fd)), os.fsdecode(src)))
        dst_view = self.view(dst, dir_fd)
        with self._lock:
            where, real = self.lookup(src_view)
            if self._lstat(where, real) is None:
                raise _enoent(src)
            if self._exists(dst_view):
                raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), dst)
            self._need_parent(dst_view, dst)
            dst_where, dst_real = self.lookup(dst_view)
            self._copy_in(real, dst_real if dst_where == "mirror" else self.mirror_of(dst_view))
            if dst_where != "mirror":
                self._set(dst_view, _DIR if self._isdir(real) else _FILE)
            self._count_write(dst_view)

    # ------------------------------------------------------------------------------------------ listing
    def _listing(self, view: str) -> list[str]:
        where, real = self.lookup(view)
        if where == "gone":
            raise _enoent(view)
        names = self._orig["listdir"](real)
        node = self._node(view) if where == "real" else None
        if node is None or not node.children:
            return names
        hidden = {name for name, child in node.children.items() if child.kind == _GONE}
        added = [name for name, child in node.children.items() if child.kind in (_FILE, _DIR)
                 and name not in names]
        return [n for n in names if n not in hidden] + added

    def listdir(self, path: Any = ".") -> list[Any]:
        if isinstance(path, int) or not self._top.children:
            return self._orig["listdir"](path)
        names = self._listing(self.view(path))
        return [os.fsencode(n) for n in names] if isinstance(path, bytes) else names

    def scandir(self, path: Any = ".") -> Any:
        if isinstance(path, int) or not self._top.children:
            return self._orig["scandir"](path)
        view = self.view(path)
        where, real = self.lookup(view)
        if where == "gone":
            raise _enoent(path)
        if where == "mirror":
            return self._orig["scandir"](real)
        node = self._node(view)
        if node is None or not node.children:
            return self._orig["scandir"](path)
        return _MergedScandir(self, path, view, node)

    # ------------------------------------------------------------------------------------------ install
    def install(self) -> "WriteGuard":
        """Patch the file API, torch's and safetensors' writers, and add the audit hook (for the process's life)."""
        for folder in (self.mirror, self.tmp):
            os.makedirs(folder, exist_ok=True)
        import tempfile  # noqa: PLC0415

        os.environ["TMPDIR"] = self.tmp               # tempfile here and in the processes the script starts
        tempfile.tempdir = self.tmp
        sys.dont_write_bytecode = True                # no __pycache__ beside the user's modules
        for name in ("open", "stat", "lstat", "access", "listdir", "scandir", "mkdir", "remove", "unlink", "rmdir",
                     "rename", "replace", "truncate", "chmod", "chown", "lchown", "utime", "symlink", "link",
                     "mkfifo", "mknod", "chdir", "getcwd", "setxattr", "removexattr", "listxattr", "getxattr", "statvfs"):
            if hasattr(os, name):
                self._orig[name] = getattr(os, name)
        self._orig["rmtree"] = shutil.rmtree
        self._orig["io_open"] = io.open
        _patch_python_api(self)
        _patch_native_writers(self)
        sys.addaudithook(self._audit)
        self.installed = True
        return self

    def _audit(self, event: str, args: tuple) -> None:
        if event not in _AUDITED:
            return
        kind = _AUDITED[event]
        if kind == "process":
            if len(self.processes) < JOURNAL_ITEMS:
                self.processes.append(_process_text(event, args))
            return
        if kind == "open":
            path, mode, flags = args
            if mode is not None:
                if not any(c in str(mode) for c in "wax+"):
                    return
            elif not (flags or 0) & _WRITE_FLAGS:
                return
            paths: list[tuple[Any, Any]] = [(path, None)]
        elif kind == "refuse":
            paths = [(None, None)]
        elif kind == "two":
            paths = [(args[0], args[2]), (args[1], args[3])]
        elif kind == "sqlite":
            if args[0] in (":memory:", "") or str(args[0]).startswith("file::memory:"):
                return
            paths = [(args[0], None)]
        else:                                       # (path, ..., dir_fd) events
            dir_fd = args[-1] if kind == "dir_fd" else None
            paths = [(args[0], dir_fd if isinstance(dir_fd, int) else None)]
        for path, dir_fd in paths:
            if not self._allowed(path, dir_fd, event == "open"):
                shown = path if path is not None else args[1] if len(args) > 1 else ""
                text = f"{event} of {shown!r}"
                if len(self.refused) < JOURNAL_ITEMS:
                    self.refused.append(text)
                raise PermissionError(errno.EACCES, "allocsim capture: the script may change files only in its "
                                      f"scratch folder, and this could not be redirected there ({text}); your "
                                      "files are left as they are", shown)

    def _allowed(self, path: Any, dir_fd: int | None, is_open: bool) -> bool:
        if path is None:
            return False
        if isinstance(path, int):
            if is_open:
                return True                          # an open descriptor: its own mode decides
            target = self._fd_path(path)
            return target is not None and (self._inside(target) or target.startswith(SHARED_MEMORY))
        try:
            text = os.fsdecode(os.fspath(path))
        except TypeError:
            return False
        if not os.path.isabs(text):
            base = self._fd_path(dir_fd) if dir_fd is not None else None
            if base is None:
                return False                         # every redirected path is absolute
            text = os.path.join(base, text)
        text = os.path.normpath(text)
        return self._inside(text) or (is_open and text in PASS_THROUGH) or text.startswith(SHARED_MEMORY)

    def journal(self) -> dict[str, Any]:
        """What the script's writes did instead (the capture's summary of them): JSON-ready, bounded."""
        return {"scratch": self.root, "files": dict(self.writes), "write_opens": self.write_opens,
                "removed": list(self.removed), "made": list(self.made), "renamed": [list(x) for x in self.renamed],
                "skipped": dict(self.skipped), "refused": list(self.refused), "processes": list(self.processes),
                "copied_bytes": self.copied_bytes}


class _MergedScandir:
    """``os.scandir`` of a real folder the script changed: its entries less the removed, plus the overlay's."""

    def __init__(self, guard: WriteGuard, path: Any, view: str, node: _Node):
        self._its: list[Any] = []
        hidden = {name for name, child in node.children.items() if child.kind != _PASS}
        ours = {name for name, child in node.children.items() if child.kind in (_FILE, _DIR)}
        real = guard._orig["scandir"](path)
        self._its.append(real)
        mirror = guard.mirror_of(view)
        extra = guard._orig["scandir"](mirror) if ours and guard._isdir(mirror) else None
        if extra is not None:
            self._its.append(extra)
        self._entries = [e for e in real if os.fsdecode(e.name) not in hidden]
        if extra is not None:
            self._entries += [e for e in extra if e.name in ours]
        self.close()

    def __iter__(self):
        return iter(self._entries)

    def __next__(self):
        raise TypeError("iterate over scandir() with for")

    def __enter__(self):
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        for it in self._its:
            it.close()


#: Audited events the hook checks: how their arguments name paths.
_AUDITED = {
    "open": "open",
    "os.remove": "dir_fd", "os.rmdir": "dir_fd", "os.mkdir": "dir_fd", "os.chmod": "dir_fd", "os.chown": "dir_fd",
    "os.utime": "dir_fd", "os.truncate": "path", "os.setxattr": "path", "os.removexattr": "path",
    "os.chflags": "path", "os.lchflags": "path", "shutil.rmtree": "dir_fd", "sqlite3.connect": "sqlite",
    "os.rename": "two", "os.link": "refuse", "os.symlink": "refuse",
    "subprocess.Popen": "process", "os.system": "process", "os.exec": "process", "os.posix_spawn": "process",
    "os.spawn": "process",
}


def _process_text(event: str, args: tuple) -> str:
    if event == "os.system":
        words: Any = args[0]
    elif event == "os.spawn":
        words = args[2]
    else:
        words = args[1]
    if isinstance(words, (list, tuple)):
        words = " ".join(os.fsdecode(w) if isinstance(w, (str, bytes)) else str(w) for w in words)
    return os.fsdecode(words)[:200] if isinstance(words, (str, bytes)) else str(words)[:200]


def _is_write_mode(mode: str) -> bool:
    return any(c in mode for c in "wax+")


def _patch_python_api(guard: WriteGuard) -> None:
    orig = guard._orig

    def open_(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if isinstance(file, int):
            return orig["io_open"](file, mode, *args, **kwargs)
        opener = kwargs.get("opener", args[5] if len(args) > 5 else None)
        if opener is not None and _is_write_mode(mode):
            return _open_with_opener(file, mode, opener, args, kwargs)
        if _is_write_mode(mode):
            target = guard.for_write(file, truncate="w" in mode, create="r" not in mode, exclusive="x" in mode)
        else:
            target = guard.for_read(file)
        return orig["io_open"](target, mode, *args, **kwargs)

    def _open_with_opener(file: Any, mode: str, opener: Any, args: tuple, kwargs: dict) -> Any:
        # The opener opens the file, through the patched os.open (tempfile.NamedTemporaryFile's makes a
        # file in its dir=, which io.open is given as the path): the opener gets the script's path, io.open's
        # own audit event a path in the scratch folder, and the file object keeps the script's name.
        def through(_path: Any, flags: int) -> int:
            return opener(file, flags)

        if "opener" in kwargs:
            kwargs = dict(kwargs, opener=through)
        else:
            args = args[:5] + (through,) + args[6:]
        handle = orig["io_open"](guard.tmp, mode, *args, **kwargs)
        raw = handle
        while hasattr(raw, "buffer") or hasattr(raw, "raw"):
            raw = getattr(raw, "buffer", None) or raw.raw
        try:
            raw.name = file
        except (AttributeError, TypeError):
            pass
        return handle

    def os_open(path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        if flags & _WRITE_FLAGS:
            target = guard.for_write(path, truncate=bool(flags & os.O_TRUNC), create=bool(flags & os.O_CREAT),
                                     exclusive=bool(flags & os.O_EXCL and flags & os.O_CREAT), dir_fd=dir_fd)
            return orig["open"](target, flags, mode)
        target = guard.for_read(path, dir_fd)
        return orig["open"](target, flags, mode, dir_fd=None if target is not path else dir_fd)

    def reader(name: str) -> Callable[..., Any]:
        def call(path: Any, *args: Any, dir_fd: int | None = None, **kwargs: Any) -> Any:
            target = guard.for_read(path, dir_fd)
            if target is path:
                return orig[name](path, *args, dir_fd=dir_fd, **kwargs) if dir_fd is not None else \
                    orig[name](path, *args, **kwargs)
            return orig[name](target, *args, **kwargs)
        return call

    def remove(path: Any, *, dir_fd: int | None = None) -> None:
        guard.remove(path, dir_fd)

    def rmdir(path: Any, *, dir_fd: int | None = None) -> None:
        guard.remove(path, dir_fd, folder=True)

    def rename(src: Any, dst: Any, *, src_dir_fd: int | None = None, dst_dir_fd: int | None = None) -> None:
        guard.rename(src, dst, src_dir_fd, dst_dir_fd)

    def mkdir(path: Any, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
        guard.mkdir(path, mode, dir_fd)

    def special(path: Any, mode: int = 0o600, *args: Any, dir_fd: int | None = None) -> None:
        target = guard.for_write(path, truncate=True, exclusive=True, dir_fd=dir_fd)
        fd = orig["open"](target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode & 0o777)   # an empty file stands in
        os.close(fd)

    def metadata(name: str) -> Callable[..., Any]:
        def call(path: Any, *args: Any, dir_fd: int | None = None, **kwargs: Any) -> Any:
            return guard.metadata(name, path, *args, dir_fd=dir_fd, **kwargs)
        return call

    def link(src: Any, dst: Any, *args: Any, dir_fd: int | None = None, **kwargs: Any) -> None:
        guard.link_as_copy(src, dst, dir_fd)

    def chdir(path: Any) -> None:
        orig["chdir"](guard.for_read(path))

    def getcwd() -> str:
        return guard.view(orig["getcwd"]())

    def rmtree(path: Any, *args: Any, **kwargs: Any) -> None:
        onerror = kwargs.get("onerror") or kwargs.get("onexc")
        ignore = kwargs.get("ignore_errors") or (args[0] if args else False)
        try:
            guard.rmtree(path)
        except OSError as exc:
            if ignore:
                return
            if onerror is not None:
                onerror(os.rmdir, path, exc if "onexc" in kwargs else sys.exc_info())
                return
            raise

    patches = {
        (builtins, "open"): open_, (io, "open"): open_, (os, "open"): os_open,
        (os, "stat"): reader("stat"), (os, "lstat"): reader("lstat"), (os, "access"): reader("access"),
        (os, "listdir"): guard.listdir, (os, "scandir"): guard.scandir,
        (os, "remove"): remove, (os, "unlink"): remove, (os, "rmdir"): rmdir, (os, "rename"): rename,
        (os, "replace"): rename, (os, "mkdir"): mkdir, (os, "truncate"): guard.truncate,
        (os, "mkfifo"): special, (os, "mknod"): special, (os, "symlink"): link, (os, "link"): link,
        (os, "chdir"): chdir, (os, "getcwd"): getcwd, (shutil, "rmtree"): rmtree,
    }
    for name in ("chmod", "chown", "lchown", "utime", "setxattr", "removexattr"):
        if name in orig:
            patches[(os, name)] = metadata(name)
    for name in ("listxattr", "getxattr", "statvfs"):     # statvfs: Hugging Face datasets' lock files
        if name in orig:
            patches[(os, name)] = reader(name)
    for (owner, name), fn in patches.items():
        setattr(owner, name, fn)
    # modules imported before the guard that hold the builtin open under another name
    logging = sys.modules.get("logging")
    if logging is not None and hasattr(logging, "FileHandler"):
        logging.FileHandler._builtin_open = staticmethod(open_)
    tarfile = sys.modules.get("tarfile")
    if tarfile is not None and hasattr(tarfile, "bltn_open"):
        tarfile.bltn_open = open_


def _patch_native_writers(guard: WriteGuard) -> None:
    """torch's zip writer and ``torch.load`` (when torch is imported), safetensors' Rust I/O (when installed)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        writer = torch._C.PyTorchFileWriter

        class GuardedFileWriter(writer):                # torch.save(obj, "path") opens the file in C++
            def __init__(self, file: Any, *args: Any, **kwargs: Any) -> None:
                if isinstance(file, (str, os.PathLike)):
                    file = guard.for_write(file, truncate=True)
                super().__init__(file, *args, **kwargs)

        GuardedFileWriter.__name__ = GuardedFileWriter.__qualname__ = writer.__name__
        torch._C.PyTorchFileWriter = GuardedFileWriter
        load = torch.load

        def guarded_load(f: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(f, (str, os.PathLike)):
                f = guard.for_read(f)                  # mmap=True opens the path itself in C++
            return load(f, *args, **kwargs)

        guarded_load.__wrapped__ = load                # type: ignore[attr-defined]
        torch.load = guarded_load
    _PYARROW_HOOK.when_imported("pyarrow", lambda: _pyarrow_patches(guard))
    try:
        import safetensors  # noqa: PLC0415
        import safetensors.torch as safetensors_torch  # noqa: PLC0415
    except Exception:                                  # not installed, or it cannot import here
        return
    serialize_file, safe_open = safetensors.serialize_file, safetensors.safe_open

    def guarded_serialize_file(tensors: Any, filename: Any, *args: Any, **kwargs: Any) -> Any:
        return serialize_file(tensors, guard.for_write(filename, truncate=True), *args, **kwargs)

    def guarded_safe_open(filename: Any, *args: Any, **kwargs: Any) -> Any:
        return safe_open(guard.for_read(filename), *args, **kwargs)

    for module in (safetensors, safetensors_torch, sys.modules.get("safetensors.numpy")):
        if module is None:
            continue
        if hasattr(module, "serialize_file"):
            module.serialize_file = guarded_serialize_file
        if hasattr(module, "safe_open"):
            module.safe_open = guarded_safe_open


#: pyarrow is patched when the script imports it (Hugging Face ``datasets`` does), never imported here.
_PYARROW_HOOK = Patches()


def _pyarrow_patches(guard: WriteGuard) -> list[tuple[Any, str, Any]]:
    """pyarrow's file functions open a path in C++: the overlay's path instead (``datasets`` writes its cache
    through Python's ``open``, redirected, then memory-maps it with ``pyarrow.memory_map``)."""
    pa = sys.modules["pyarrow"]
    patches: list[tuple[Any, str, Any]] = []

    def is_path(value: Any) -> bool:
        return isinstance(value, (str, bytes, os.PathLike))

    def wrap(name: str, where: Callable[..., Any]) -> None:
        original = getattr(pa, name, None)
        if original is None:
            return

        def call(path: Any, *args: Any, **kwargs: Any) -> Any:
            return original(where(path, *args, **kwargs) if is_path(path) else path, *args, **kwargs)

        call.__name__ = call.__qualname__ = name
        call.__doc__ = getattr(original, "__doc__", None)
        call.__wrapped__ = original                    # type: ignore[attr-defined]
        patches.append((pa, name, call))

    def memory_map_path(path: Any, mode: str = "r", *_: Any, **__: Any) -> Any:
        return guard.for_read(path) if mode == "r" else guard.for_write(path, truncate=False, create=False)

    wrap("memory_map", memory_map_path)
    wrap("create_memory_map", lambda path, *_, **__: guard.for_write(path, truncate=True))
    wrap("input_stream", lambda path, *_, **__: guard.for_read(path))
    wrap("output_stream", lambda path, *_, **__: guard.for_write(path, truncate=True))
    os_file = getattr(pa, "OSFile", None)
    if isinstance(os_file, type):
        try:
            class GuardedOSFile(os_file):              # type: ignore[misc,valid-type]
                def __new__(cls, path: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
                    if is_path(path):                  # its __cinit__ opens the path it is made with
                        path = guard.for_read(path) if mode == "r" else guard.for_write(path, truncate=mode != "a")
                    return super().__new__(cls, path, mode, *args, **kwargs)
        except TypeError:                              # a final extension type: left as it is
            return patches
        GuardedOSFile.__name__ = GuardedOSFile.__qualname__ = os_file.__name__
        GuardedOSFile.__module__ = os_file.__module__
        patches.append((pa, "OSFile", GuardedOSFile))
    return patches


__all__ = ["COPY_LIMIT_BYTES", "JOURNAL_ITEMS", "MAX_NODES", "PASS_THROUGH", "WriteGuard"]
