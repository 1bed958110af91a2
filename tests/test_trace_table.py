"""A Trace built from numpy columns gives the same DataFrames as one built from DataFrames, built only when asked."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from allocsim.trace.schema import (
    EVENT_DTYPES,
    FRAME_DTYPES,
    INITIAL_ALLOC_DTYPES,
    Trace,
    TraceMeta,
    check_schema,
    frame_from_columns,
    table_from_columns,
)

EVENTS = {"t_ns": [0, 5, 9], "kind": [1, 2, 3], "alloc_id": [0, 0, 0], "size_bytes": [512, 512, 512],
          "stream": [0, 0, 0], "device": [0, 0, 0]}          # no stack_id: filled with -1
INITIAL = {"alloc_id": [1], "size_bytes": [1024], "stream": [0], "device": [0], "addr": [4096],
           "block_size_bytes": [1024], "stack_id": [-1]}
FRAMES = {"frame_id": [0, 1], "filename": ["a.py", ""], "line": [3, 0], "name": ["f", "conv2d"]}


def _traces() -> tuple[Trace, Trace]:
    lazy = Trace(events=table_from_columns(EVENTS, EVENT_DTYPES), meta=TraceMeta(format="test"),
                 initial_allocs=table_from_columns(INITIAL, INITIAL_ALLOC_DTYPES),
                 frames=table_from_columns(FRAMES, FRAME_DTYPES))
    eager = Trace(events=frame_from_columns(EVENTS, EVENT_DTYPES), meta=TraceMeta(format="test"),
                  initial_allocs=frame_from_columns(INITIAL, INITIAL_ALLOC_DTYPES),
                  frames=frame_from_columns(FRAMES, FRAME_DTYPES))
    return lazy, eager


def test_columns_are_read_without_building_a_dataframe():
    lazy, _ = _traces()
    assert len(lazy) == 3 and lazy.devices == [0]
    assert lazy.column("stack_id").tolist() == [-1, -1, -1]
    assert lazy.table("frames")["name"].tolist() == ["f", "conv2d"]
    # Nothing asked for a DataFrame yet: every table is still held as columns.
    assert not [k for k, v in vars(lazy).items() if isinstance(v, pd.DataFrame)]


@pytest.mark.parametrize("name", ["events", "initial_allocs", "initial_segments", "initial_blocks", "decisions",
                                  "frames", "stacks", "recorded_series"])
def test_lazy_dataframes_equal_the_eager_ones(name):
    lazy, eager = _traces()
    pd.testing.assert_frame_equal(getattr(lazy, name), getattr(eager, name))
    assert getattr(lazy, name) is getattr(lazy, name)      # built once, then kept
    check_schema(lazy)


def test_a_dataframe_held_trace_reads_columns_too():
    _, eager = _traces()
    assert eager.table("initial_allocs")["size_bytes"].tolist() == [1024]
    assert eager.column("t_ns").tolist() == [0, 5, 9]
    # What replaces a table is what the trace holds afterwards.
    eager.initial_allocs = eager.initial_allocs.iloc[:0]
    assert len(eager.table("initial_allocs")) == 0
    copy = dataclasses.replace(eager, events=eager.events.iloc[:1])
    assert len(copy) == 1 and len(eager) == 3


def test_check_schema_refuses_a_column_of_the_wrong_dtype():
    lazy, _ = _traces()
    table = lazy.table("events")
    lazy.events = type(table)({**table.columns, "size_bytes": table["size_bytes"].astype(np.float64)}, table.dtypes)
    with pytest.raises(ValueError, match=r"events\.size_bytes: dtype float64 != int64"):
        check_schema(lazy)
