"""Which existing files allocsim wrote, and so may replace: ``written_by_allocsim(path)``; every writer marks its files.

A command writes over an existing file only when the file carries allocsim's mark
(``output_file.check_output_file(ours=...)``); anything else, a user's notes as much as a Parquet
file of their own, is left alone. The marks, by kind of file:

- a trace (``convert``, ``scale``, ``capture``): allocsim Parquet (the ``allocsim`` key in its
  metadata) or allocsim CSV (first line ``# allocsim``, gzip-compressed or not): ``is_allocsim_trace``;
- a table (``run -o``, ``plot``): Parquet with an ``allocsim.table`` metadata key (``write_table``;
  ``is_table``), exactly that key: a trace (``allocsim``) or a sweep results file (``allocsim.sweep``)
  in a run's folder is not a table and is left alone;
- JSON (``summary.json``, ``perf.json``, ``state.json``): an object whose first key is ``"schema"``
  with a value starting ``allocsim-`` (``write_json``);
- a figure: PNG whose ``Software`` text chunk says ``allocsim``, SVG whose creator is ``allocsim``
  (``FIGURE_METADATA``);
- the report page: an HTML file whose ``<title>`` starts ``allocsim report`` (``is_report_page``);
- a validation report (``python -m validate.report merge``, ``validate replay``): ``report.md`` whose
  first line starts ``# allocsim validation`` beside its ``results.json`` (JSON as above);
- a cost model (``python -m validate calibrate -o FILE``): JSON whose first key is ``"_format"`` with a
  value starting ``allocsim-cost-model`` (``is_cost_model_file``).

Each test reads at most the file's first few KiB (Parquet: its footer). Every writer here goes
through ``output_write.open_output``: a temporary file moved into place, never through a link.
"""

from __future__ import annotations

import gzip
import json
import os
import re
from typing import Any

#: What ``savefig`` writes into each figure (matplotlib's own keys): the mark of a figure we drew.
FIGURE_METADATA = {"png": {"Software": "allocsim"}, "svg": {"Creator": "allocsim"}}
#: The metadata key of a table ``write_table`` wrote.
TABLE_KEY = b"allocsim.table"
_HEAD_BYTES = 4096
_JSON_MARK = re.compile(rb'\A\{\s*"schema":\s*"allocsim-')
#: A cost model: ``"_format"`` first (``CostModel.save``), or at the top level of the first few KiB
#: (files written before it came first had the keys sorted: ``"_backend"``, ``"_date_utc"``, ``"_device"``).
_COST_MODEL_MARK = re.compile(rb'\A\{\s*"_format":\s*"allocsim-cost-model')
_COST_MODEL_SORTED = re.compile(rb'\n  "_format": "allocsim-cost-model/')
_MARKDOWN_MARK = b"# allocsim validation"
_PAGE_MARK = re.compile(rb"\A<!DOCTYPE html>\s*<html[^>]*><head><meta charset=\"utf-8\">\s*(<meta [^>]*>\s*)*"
                        rb"<title>allocsim report")


def _head(path: str, n_bytes: int = _HEAD_BYTES) -> bytes:
    with open(path, "rb") as fh:
        return fh.read(n_bytes)


def _parquet_keys(path: str) -> set[bytes]:
    import pyarrow.parquet as pq

    return set(pq.read_schema(path).metadata or {})


def is_allocsim_trace(path: str) -> bool:
    """True for allocsim Parquet (``allocsim`` metadata) or allocsim CSV (``# allocsim`` first, gzip or not)."""
    try:
        if path.endswith(".parquet"):
            return b"allocsim" in _parquet_keys(path)
        if path.endswith(".gz"):
            with gzip.open(path, "rb") as fh:
                return fh.read(len(b"# allocsim")) == b"# allocsim"
        return _head(path, len(b"# allocsim")) == b"# allocsim"
    except Exception:  # noqa: BLE001 - anything unreadable is not one of ours
        return False


def is_table(path: str) -> bool:
    """True for a Parquet table ``write_table`` wrote (the ``allocsim.table`` metadata key)."""
    try:
        return TABLE_KEY in _parquet_keys(path)
    except Exception:  # noqa: BLE001 - anything unreadable is not one of ours
        return False


def is_json_output(path: str) -> bool:
    """True for JSON ``write_json`` wrote (first key ``"schema"``, its value starting ``allocsim-``)."""
    try:
        return _JSON_MARK.match(_head(path, 256)) is not None
    except OSError:
        return False


def is_cost_model_file(path: str) -> bool:
    """True for a cost model ``CostModel.save`` wrote (key ``"_format": "allocsim-cost-model..."``)."""
    try:
        head = _head(path)
    except OSError:
        return False
    return _COST_MODEL_MARK.match(head) is not None or (head.startswith(b"{") and
                                                         _COST_MODEL_SORTED.search(head) is not None)


def is_report_page(path: str) -> bool:
    """True for a page ``allocsim report`` wrote (its ``<title>`` starts ``allocsim report``)."""
    try:
        return _PAGE_MARK.match(_head(path)) is not None
    except OSError:
        return False


def written_by_allocsim(path: str) -> bool:
    """True when the file at ``path`` carries the mark of what a folder output (``run -o``, ``plot -o``,
    a validation report) writes under that name's extension: a table for ``.parquet`` (a trace or a
    sweep results file is not one), allocsim JSON, a figure, the report page, a validation report."""
    name = os.path.basename(path).lower()
    try:
        if name.endswith(".parquet"):
            return TABLE_KEY in _parquet_keys(path)
        if name.endswith(".json"):
            return _JSON_MARK.match(_head(path, 256)) is not None
        if name.endswith(".png"):
            head = _head(path)
            return head.startswith(b"\x89PNG") and b"Software\x00allocsim" in head
        if name.endswith(".svg"):
            return b"<dc:title>allocsim</dc:title>" in _head(path)
        if name.endswith((".html", ".htm")):
            return is_report_page(path)
        if name.endswith(".md"):
            return _head(path, len(_MARKDOWN_MARK)) == _MARKDOWN_MARK
    except Exception:  # noqa: BLE001 - anything unreadable is not one of ours
        return False
    return False


def write_table(frame: Any, path: str | os.PathLike, name: str | None = None, *,
                within: str | os.PathLike | None = None) -> None:
    """Write a pandas DataFrame as Parquet (as ``to_parquet(index=False)``) with allocsim's mark
    (``open_output``: replaces only a table allocsim wrote; ``within``: the ``-o`` folder)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from .output_write import open_output

    table = pa.Table.from_pandas(frame, preserve_index=False)
    mark = (name or os.path.basename(os.fspath(path))).encode()
    with open_output(path, ours=is_table, what="a table allocsim wrote", within=within) as fh:
        pq.write_table(table.replace_schema_metadata({**(table.schema.metadata or {}), TABLE_KEY: mark}), fh)


def write_json(data: dict[str, Any], path: str | os.PathLike, schema: str, *,
               within: str | os.PathLike | None = None, allow_nan: bool = True) -> None:
    """Write ``data`` as indented JSON whose first key is ``"schema": schema`` (allocsim's mark; keeps
    a ``schema`` already first in ``data``), through ``open_output`` (replaces only such a file)."""
    from .output_write import open_output

    if not schema.startswith("allocsim-"):
        raise ValueError(f"schema {schema!r} must start with 'allocsim-'")
    body = {"schema": data.get("schema", schema), **{k: v for k, v in data.items() if k != "schema"}}
    text = json.dumps(body, indent=2, allow_nan=allow_nan) + "\n"
    with open_output(path, ours=is_json_output, what="a JSON file allocsim wrote", within=within, text=True) as fh:
        fh.write(text)
