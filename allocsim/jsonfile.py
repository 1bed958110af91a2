"""Read JSON that a user hands in (grid files, cost models, results metadata) with one-line errors.

``json`` raises ``RecursionError`` on deeply nested arrays and ``JSONDecodeError`` on bad syntax;
both become a ``ValueError`` naming where the text came from, so a crafted file ends in one line
(exit 2), never a traceback.
"""

from __future__ import annotations

import json
import os
from typing import Any


def parse_json(text: str | bytes, where: str) -> Any:
    """Parse ``text``; raise ``ValueError`` starting with ``where`` when it is not JSON or nests too deeply."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError(f"{where}: JSON nested too deeply to read") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{where}: not valid JSON ({exc})") from None


def load_json_file(path: str | os.PathLike, where: str | None = None) -> Any:
    """Read and parse the JSON file ``path``; errors name ``where`` (default: the path)."""
    where = where or os.fspath(path)
    try:
        with open(path, "rb") as fh:
            text = fh.read()
    except OSError as exc:
        raise ValueError(f"{where}: {exc.strerror or exc}") from None
    return parse_json(text, where)
