"""Move a ``Trace`` between processes as plain columns: ``trace_to_payload`` / ``payload_to_trace``.

The payload holds numbers as numpy arrays, text columns as category codes plus a list of strings,
and metadata as JSON-able values, so the receiving side rebuilds the trace without unpickling
anything (see ``isolate.encode_payload``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from .schema import (
    BLOCK_DTYPES,
    DECISION_DTYPES,
    EVENT_DTYPES,
    FRAME_DTYPES,
    INITIAL_ALLOC_DTYPES,
    RECORDED_SERIES_DTYPES,
    SEGMENT_DTYPES,
    STACK_DTYPES,
    Trace,
    TraceMeta,
    table_from_columns,
)

#: Every table of a ``Trace`` with its schema.
TABLES: dict[str, dict[str, np.dtype]] = {
    "events": EVENT_DTYPES,
    "initial_allocs": INITIAL_ALLOC_DTYPES,
    "initial_segments": SEGMENT_DTYPES,
    "initial_blocks": BLOCK_DTYPES,
    "decisions": DECISION_DTYPES,
    "frames": FRAME_DTYPES,
    "stacks": STACK_DTYPES,
    "recorded_series": RECORDED_SERIES_DTYPES,
}
_CODES_SUFFIX = "\x00codes"


def trace_to_payload(trace: Trace) -> dict[str, Any]:
    """Plain columns and JSON-able metadata of ``trace``."""
    tables: dict[str, dict[str, Any]] = {}
    for name, dtypes in TABLES.items():
        table = trace.table(name)      # the columns as held: no DataFrame (text stays Python objects)
        cols: dict[str, Any] = {}
        for col, dtype in dtypes.items():
            values = table[col]
            if dtype == np.dtype("object"):
                codes, uniques = pd.factorize(pd.Series(values, dtype=object))
                cols[col + _CODES_SUFFIX] = codes.astype(np.int32)
                cols[col] = [str(u) for u in uniques]
            else:
                cols[col] = np.ascontiguousarray(values.astype(dtype, copy=False))
        tables[name] = cols
    return {"meta": trace.meta.to_dict(), "labels": list(trace.labels), "tables": tables}


def payload_to_trace(payload: dict[str, Any]) -> Trace:
    """Rebuild the ``Trace`` of ``trace_to_payload``."""
    tables = {}
    for name, dtypes in TABLES.items():
        cols = payload["tables"][name]
        out: dict[str, Any] = {}
        for col, dtype in dtypes.items():
            if dtype == np.dtype("object"):
                uniques = np.asarray(cols[col], dtype=object)
                codes = np.asarray(cols[col + _CODES_SUFFIX])
                out[col] = uniques[codes] if len(codes) else np.empty(0, dtype=object)
            else:
                out[col] = cols[col]
        tables[name] = table_from_columns(out, dtypes)
    return Trace(meta=TraceMeta.from_dict(payload["meta"]), labels=[str(x) for x in payload["labels"]], **tables)
