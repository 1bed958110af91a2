"""The vectorised builder against the sequential ``TraceBuilder``: same columns, or a hand-back."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocsim.errors import TraceFormatError
from allocsim.trace.reading.builder import TraceBuilder
from allocsim.trace.reading.columnar import (
    OP_ALLOC, OP_FREE, OP_FREE_COMPLETED, OP_FREE_REQUESTED, OP_MARKER, OP_NONE, Records, build_columns, match_keys,
)

_OPS = [OP_ALLOC, OP_FREE_REQUESTED, OP_FREE_COMPLETED, OP_FREE, OP_MARKER, OP_NONE]


@st.composite
def records(draw):
    n = draw(st.integers(0, 40))
    t = 0
    rows = []
    for _ in range(n):
        t += draw(st.integers(-1 if draw(st.booleans()) and draw(st.booleans()) else 0, 3))
        op = draw(st.sampled_from(_OPS))
        device = draw(st.sampled_from([0, 0, 1]))
        addr = draw(st.sampled_from([512, 1024, 2048]))
        size = draw(st.sampled_from([100, 512, 512, 4096]))
        rows.append((t, op, device, addr, size))
    return rows


def _sequential(rows):
    b = TraceBuilder("x", "test")
    labels = {}
    for i, (t, op, dev, addr, size) in enumerate(rows):
        if op == OP_ALLOC:
            b.alloc(i, t, dev, 0, addr, size, stack_id=i)
        elif op == OP_FREE_REQUESTED:
            b.free_requested(i, t, dev, 0, addr, size, stack_id=i)
        elif op == OP_FREE_COMPLETED:
            b.free_completed(i, t, dev, 0, addr, size, stack_id=i)
        elif op == OP_FREE:
            b.free(i, t, dev, 0, addr, size, stack_id=i)
        elif op == OP_MARKER:
            labels.setdefault("m", 0)
            b.marker(i, t, "m", dev, 0, size)
        else:
            if b._last_t_ns is not None and t < b.last_t_ns:   # as TraceBuilder._check_time
                raise TraceFormatError("x", i, "time goes back")
            b.decision(b.next_event_index, t, "oom", -1, size, 0, dev)
    return b.finish()


@pytest.mark.full
@settings(max_examples=300, deadline=None)
@given(records())
def test_vectorised_builder_matches_the_sequential_one(rows):
    try:
        expected = _sequential(rows)
    except TraceFormatError:
        expected = None
    rec = Records(
        t_ns=np.array([r[0] for r in rows], np.int64), op=np.array([r[1] for r in rows], np.uint8),
        device=np.array([r[2] for r in rows], np.int64), stream=np.zeros(len(rows), np.int64),
        addr=np.array([r[3] for r in rows], np.int64), size=np.array([r[4] for r in rows], np.int64),
        stack_id=np.arange(len(rows), dtype=np.int32), label=np.zeros(len(rows), np.int64))
    built = build_columns(rec)
    if built is None:
        return          # handed back: the reader replays the records through TraceBuilder
    assert expected is not None, "the vectorised builder accepted records the reference refuses"
    for col in ("t_ns", "kind", "alloc_id", "size_bytes", "stream", "device"):
        assert built.events[col].tolist() == expected.events[col].tolist(), col
    kinds = built.events["kind"]
    requests = kinds != 5
    assert built.events["stack_id"][requests].tolist() == expected.events["stack_id"][requests].tolist()
    for col in ("alloc_id", "size_bytes", "device", "addr"):
        assert built.initial[col].tolist() == expected.initial_allocs[col].tolist(), col
    oom = [i for i, r in enumerate(rows) if r[1] == OP_NONE]
    assert built.row_event[oom].tolist() == expected.decisions["event_index"].tolist()


def test_match_keys_is_a_join():
    a_dev, a_addr = np.array([0, 0, 1]), np.array([5, 7, 5])
    b_dev, b_addr = np.array([1, 0, 0, 2, 0]), np.array([5, 7, 6, 5, 5])
    assert match_keys(a_dev, a_addr, b_dev, b_addr).tolist() == [2, 1, -1, -1, 0]
    assert match_keys(a_dev[:0], a_addr[:0], b_dev, b_addr).tolist() == [-1] * 5
