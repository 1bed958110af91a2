"""The sweep journal: finished rows on disk as they come, so a killed sweep loses nothing and resumes.

Layout, beside the results file (``RESULTS.parquet.parts/``):

- ``row-<row_key>.json``: one finished row, written to a temp file and renamed into place, so a file
  with that name is always complete (a SIGKILL leaves at most a ``.*.allocsim-tmp`` file, ignored and removed);
- ``batch-<hash>.jsonl``: many rows, one JSON object per line, made by ``compact()`` at the end of a
  complete sweep (then the ``row-*`` files it holds are deleted).

Rows are JSON because it keeps each value's exact type and the column order of the row; the
results file is built from them in one go (``results.write_results``). The journal is also the
cache: a later sweep with an overlapping grid reuses every row whose key it already holds. Delete
the folder to recompute everything.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

ROW_PREFIX, BATCH_PREFIX, TMP_PREFIX = "row-", "batch-", ".tmp-"


def journal_dir(output: str | os.PathLike) -> Path:
    """The journal folder of a results file: ``RESULTS.parquet`` -> ``RESULTS.parquet.parts``."""
    return Path(f"{os.fspath(output)}.parts")


def _atomic_write(path: Path, text: str) -> None:
    # A temporary file moved into place (``output_write.open_output``): a file with a row's name is
    # always complete, and a link planted in the journal folder is never written through.
    from ..output_file import write_output

    write_output(path, text, option="journal", what="a journal file")


class Journal:
    """Finished rows of a sweep, keyed by ``row_key``, in ``directory``."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)

    def _files(self) -> list[Path]:
        if not self.directory.is_dir():
            return []
        return sorted(p for p in self.directory.iterdir()
                      if p.name.startswith((ROW_PREFIX, BATCH_PREFIX)) and p.is_file())

    def load(self) -> dict[str, dict[str, Any]]:
        """Every journaled row by key (first copy wins); unreadable files are reported and skipped."""
        rows: dict[str, dict[str, Any]] = {}
        for path in self._files():
            try:
                lines = path.read_text(encoding="utf-8").splitlines()
                records = [json.loads(line) for line in lines if line.strip()]
            except (OSError, ValueError) as exc:
                print(f"allocsim sweep: warning: ignoring unreadable journal file {path}: {exc}", file=sys.stderr)
                continue
            for row in records:
                if isinstance(row, dict) and isinstance(row.get("row_key"), str):
                    rows.setdefault(row["row_key"], row)
        return rows

    def write(self, row: dict[str, Any]) -> Path:
        """Journal one finished row atomically; return its file."""
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"{ROW_PREFIX}{row['row_key']}.json"
        _atomic_write(path, json.dumps(row, separators=(",", ":")) + "\n")
        return path

    def compact(self) -> Path | None:
        """Merge every journaled row into one ``batch-*.jsonl`` and delete the files it replaces."""
        old = self._files()
        rows = self.load()
        from ..output_file import TEMP_SUFFIX

        stale = [*self.directory.glob(f"{TMP_PREFIX}*"), *self.directory.glob(f".*{TEMP_SUFFIX}")] \
            if self.directory.is_dir() else []
        for path in stale:
            path.unlink(missing_ok=True)
        if len(old) <= 1 or not rows:
            return old[0] if old else None
        keys = sorted(rows)
        name = hashlib.sha256("".join(keys).encode()).hexdigest()[:16]
        batch = self.directory / f"{BATCH_PREFIX}{name}.jsonl"
        _atomic_write(batch, "".join(json.dumps(rows[k], separators=(",", ":")) + "\n" for k in keys))
        for path in old:
            if path != batch:
                path.unlink(missing_ok=True)
        return batch
