"""The scratch folder a captured script writes to instead of the user's files: ``scratch_folder()``, then ``ScriptWrites``.

``allocsim capture`` makes the folder before the script runs (a new temporary folder, removed at the
end; or ``--keep-writes DIR``, made then and kept), the child's ``writeguard`` redirects every write
there, and what the script wrote, removed and renamed is said after the capture, in one line and in
the trace's notes. The child's account of it (``WriteGuard.journal``) comes over the capture's pipe
from the script's process, so it is checked and bounded here like every record from there; when the
child sent none (killed), the files in the folder are listed instead.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from typing import Any

from ..units import format_bytes

#: Entries kept of each list (the counts stay exact where the child gave them).
MAX_ITEMS = 200
#: Files listed from the folder itself when the child sent no account (killed).
MAX_WALKED = 10_000
#: Entries named in the one-line summary.
SHOWN = 4
_TEXT_CHARS = 500


def scratch_folder(keep: str | None) -> str:
    """A new folder for the script's writes: ``keep`` (must not exist; its parent must), else a temporary one."""
    if keep is None:
        return tempfile.mkdtemp(prefix="allocsim-capture-writes-")
    os.mkdir(keep, 0o700)
    return os.path.realpath(keep)


def check_keep_folder(path: str) -> None:
    """Refuse (ValueError, one line) a ``--keep-writes`` folder that exists or cannot be made."""
    from ..output_file import check_parent

    if os.path.lexists(path):
        raise ValueError(f"--keep-writes {path}: exists; name a new folder (the script's writes are kept there)")
    check_parent(path, "--keep-writes")


def _text(value: Any) -> str | None:
    return value[:_TEXT_CHARS] if isinstance(value, str) else None


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 62 else 0


@dataclasses.dataclass
class ScriptWrites:
    """What the script's writes did instead of changing the user's files."""

    folder: str
    kept: bool
    files: dict[str, int]                 # path the script wrote -> write opens (0: unknown)
    removed: list[str]
    made: list[str]                       # folders the script made (there, not in place)
    renamed: list[tuple[str, str]]
    skipped: dict[str, int]               # chmod, utime ... of a user's file, not applied
    refused: list[str]
    processes: list[str]
    copied_bytes: int
    from_child: bool                      # False: listed from the folder (the child sent no account)

    @classmethod
    def read(cls, journal: Any, folder: str, kept: bool) -> "ScriptWrites":
        """The child's ``journal`` checked and bounded, or the folder's files when it is missing or malformed."""
        if not isinstance(journal, dict):
            return cls(folder, kept, _walk(folder), [], [], [], {}, [], [], 0, False)
        files = journal.get("files") if isinstance(journal.get("files"), dict) else {}
        renamed = [pair for pair in _items(journal.get("renamed"))
                   if isinstance(pair, list) and len(pair) == 2 and _text(pair[0]) and _text(pair[1])]
        return cls(folder, kept,
                   {_text(k): _count(v) for k, v in list(files.items())[:MAX_ITEMS] if _text(k)},
                   [_text(x) for x in _items(journal.get("removed")) if _text(x)],
                   [_text(x) for x in _items(journal.get("made")) if _text(x)],
                   [(_text(a), _text(b)) for a, b in renamed],
                   {_text(k): _count(v) for k, v in list((journal.get("skipped") if isinstance(
                       journal.get("skipped"), dict) else {}).items())[:MAX_ITEMS] if _text(k)},
                   [_text(x) for x in _items(journal.get("refused")) if _text(x)],
                   [_text(x) for x in _items(journal.get("processes")) if _text(x)],
                   _count(journal.get("copied_bytes")), True)

    @property
    def empty(self) -> bool:
        return not (self.files or self.removed or self.made or self.renamed or self.skipped or self.refused or self.processes)

    def size_of(self, path: str) -> int | None:
        """Bytes of the script's version of ``path`` in the folder now (None: not a file there)."""
        mirrored = os.path.join(self.folder, "files", path.lstrip("/"))
        return os.path.getsize(mirrored) if os.path.isfile(mirrored) and not os.path.islink(mirrored) else None

    def to_dict(self) -> dict[str, Any]:
        return {"folder": self.folder if self.kept else None, "kept": self.kept,
                "files": [{"path": p, "writes": n, "size_bytes": self.size_of(p)} for p, n in self.files.items()],
                "removed": self.removed, "made": self.made, "renamed": [list(x) for x in self.renamed], "skipped": self.skipped,
                "refused": self.refused, "processes": self.processes, "copied_bytes": self.copied_bytes,
                "from_child": self.from_child}

    def line(self, cwd: str) -> str:
        """One sentence: what was written, removed and renamed instead, what was refused, where it went."""
        def shown(path: str) -> str:
            if not path.startswith(cwd.rstrip("/") + "/"):
                return path
            return os.path.relpath(path, cwd) + ("/" if path.endswith("/") else "")    # a folder stays one

        def listed(items: list[str]) -> str:
            more = f", and {len(items) - SHOWN} more" if len(items) > SHOWN else ""
            return "; ".join(items[:SHOWN]) + more

        parts = []
        if self.files:
            def described(path: str, count: int) -> str:
                size = self.size_of(path)
                bits = ([f"{count} write{'s' if count != 1 else ''}"] if count else []) + (
                    [format_bytes(size)] if size is not None else [])
                return shown(path) + (f" ({', '.join(bits)})" if bits else "")
            parts.append(f"{len(self.files)} file{'s' if len(self.files) != 1 else ''} written there instead of in "
                         f"place: {listed([described(p, n) for p, n in self.files.items()])}")
        if self.made:
            parts.append(f"{len(self.made)} folder{'s' if len(self.made) != 1 else ''} made there: "
                         f"{listed([shown(p) for p in self.made])}")
        if self.removed:
            parts.append(f"{len(self.removed)} removal{'s' if len(self.removed) != 1 else ''} not made: "
                         f"{listed([shown(p) for p in self.removed])}")
        if self.renamed:
            parts.append(f"{len(self.renamed)} rename{'s' if len(self.renamed) != 1 else ''} not made (copied "
                         f"there): {listed([f'{shown(a)} -> {shown(b)}' for a, b in self.renamed])}")
        if self.skipped:
            parts.append("not applied to your files: " + ", ".join(f"{n} {k}" for k, n in self.skipped.items()))
        if self.refused:
            parts.append(f"{len(self.refused)} change{'s' if len(self.refused) != 1 else ''} refused (the script "
                         f"got PermissionError): {listed(self.refused)}")
        if self.processes:
            parts.append(f"{len(self.processes)} process{'es' if len(self.processes) != 1 else ''} started "
                         f"without the guard: {listed(self.processes)}")
        where = (f"kept in {self.folder}" if self.kept else
                 "deleted after the capture (--keep-writes DIR keeps them)")
        source = "" if self.from_child else " (listed from the folder: the script's process sent no account)"
        return f"the script's writes went to a scratch folder, {where}{source}: " + "; ".join(parts)

    def remove(self) -> None:
        """Delete the folder unless it is kept."""
        if not self.kept:
            shutil.rmtree(self.folder, ignore_errors=True)


def _items(value: Any) -> list[Any]:
    return value[:MAX_ITEMS] if isinstance(value, list) else []


def _walk(folder: str) -> dict[str, int]:
    """The files under ``folder``/files, as the paths they stand for (at most ``MAX_WALKED``)."""
    mirror = os.path.join(folder, "files")
    found: dict[str, int] = {}
    for here, dirs, files in os.walk(mirror):
        dirs.sort()
        for name in sorted(files):
            if len(found) >= MAX_WALKED:
                return found
            found["/" + os.path.relpath(os.path.join(here, name), mirror)] = 0
    return found


__all__ = ["ScriptWrites", "check_keep_folder", "scratch_folder"]
