"""The start-of-window layout of a scaled trace: the one a period of a repeating window leaves behind."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pandas as pd

from allocsim.engine import run_fast
from allocsim.scale import load_input
from allocsim.scale.evaluate import peaks
from allocsim.scale.start_layout import fresh_start
from allocsim.scale.start_layout import (as_predicted, carried_layout, find_period, one_cache, steady_start,
                                         step_boundary)
from allocsim.trace.schema import EVENT_DTYPES, INITIAL_ALLOC_DTYPES, EventKind, Trace, TraceMeta

MIB = 1 << 20
ALLOC, FREE_REQ, FREE_DONE = EventKind.ALLOC, EventKind.FREE_REQUESTED, EventKind.FREE_COMPLETED


def _trace(initial: list[tuple[int, int]], events: list[tuple[int, int, int]]) -> Trace:
    """A one-stream trace: start allocations ``(alloc_id, size)`` and events ``(kind, alloc_id, size)``."""
    n = len(events)
    ev = pd.DataFrame({"t_ns": np.arange(n, dtype=np.int64) * 1000, "kind": [e[0] for e in events],
                       "alloc_id": [e[1] for e in events], "size_bytes": [e[2] for e in events],
                       "stream": np.zeros(n, dtype=np.int64), "device": np.zeros(n, dtype=np.int16),
                       "stack_id": np.full(n, -1, dtype=np.int32)}).astype(EVENT_DTYPES)
    m = len(initial)
    init = pd.DataFrame({"alloc_id": [a for a, _ in initial], "size_bytes": [s for _, s in initial],
                         "stream": np.zeros(m, dtype=np.int64), "device": np.zeros(m, dtype=np.int16),
                         "addr": np.full(m, -1, dtype=np.int64), "block_size_bytes": np.full(m, -1, dtype=np.int64),
                         "stack_id": np.full(m, -1, dtype=np.int32)}).astype(INITIAL_ALLOC_DTYPES)
    return Trace(events=ev, meta=TraceMeta(format="test", devices=[0]), initial_allocs=init)


def _periodic(periods: int = 3) -> Trace:
    """A weight (id 0) alive all window and an activation (id 1) of the step in progress, freed first.

    Each period frees the previous step's activation, allocates the next one and a temporary.
    """
    events, previous, next_id = [], 1, 2
    for _ in range(periods):
        activation, temporary = next_id, next_id + 1
        next_id += 2
        events += [(FREE_REQ, previous, 24 * MIB), (FREE_DONE, previous, 24 * MIB), (ALLOC, activation, 24 * MIB),
                   (ALLOC, temporary, 12 * MIB), (FREE_REQ, temporary, 12 * MIB), (FREE_DONE, temporary, 12 * MIB)]
        previous = activation
    return _trace([(0, 40 * MIB), (1, 24 * MIB)], events)


def test_a_repeating_window_starts_from_the_layout_its_steps_leave_behind():
    trace = _periodic()
    assert find_period(trace) == 6 and step_boundary(trace) == 2
    laid_out = steady_start(trace)
    assert laid_out is not None
    # Every start allocation has a block in the layout, and the engine starts from it.
    live = laid_out.initial_blocks[laid_out.initial_blocks["alloc_id"] >= 0]
    assert sorted(live["alloc_id"].tolist()) == [0, 1]
    assert (laid_out.initial_allocs["addr"] >= 0).all()
    run = run_fast(laid_out, "pytorch").summary
    assert run["start_state"] == "recorded" and run["oom_count"] == 0
    assert peaks(laid_out)["peak_live_bytes"] == peaks(trace)["peak_live_bytes"]


def test_a_window_that_does_not_repeat_keeps_the_fresh_placement():
    trace = _periodic()
    events = trace.events.copy()
    events.loc[len(events) - 4, "size_bytes"] = 13 * MIB   # the last temporary differs: no period
    events.loc[len(events) - 3, "size_bytes"] = 13 * MIB
    events.loc[len(events) - 2, "size_bytes"] = 13 * MIB
    changed = Trace(events=events, meta=trace.meta, initial_allocs=trace.initial_allocs)
    assert find_period(changed) is None and steady_start(changed) is None


def test_start_allocations_without_an_address_are_placed_after_a_partial_layout():
    laid_out = steady_start(_periodic())
    blocks = laid_out.initial_blocks.copy()
    # Take the activation out of the layout: its block becomes free, and it has no address.
    blocks.loc[blocks["alloc_id"] == 1, ["alloc_id", "requested_bytes", "state"]] = [-1, 0, "inactive"]
    initial = laid_out.initial_allocs.copy()
    initial.loc[initial["alloc_id"] == 1, ["addr", "block_size_bytes"]] = -1
    partial = Trace(events=laid_out.events, meta=laid_out.meta, initial_allocs=initial,
                    initial_segments=laid_out.initial_segments, initial_blocks=blocks)
    run = run_fast(partial, "pytorch").summary
    assert run["start_state"] == "recorded" and run["oom_count"] == 0
    assert peaks(partial)["peak_live_bytes"] == peaks(laid_out)["peak_live_bytes"]
    # A recorded start allocation (with an address) left outside the layout still means: place all anew.
    initial.loc[initial["alloc_id"] == 1, "addr"] = 0
    recorded = Trace(events=laid_out.events, meta=laid_out.meta, initial_allocs=initial,
                     initial_segments=laid_out.initial_segments, initial_blocks=blocks)
    assert run_fast(recorded, "pytorch").summary["start_state"] == "allocated"


def test_the_steady_layout_reproduces_a_real_ring_buffer_tail(shared_dir):
    # GPT-2 medium at ctx 1024, a 10,000-entry ring-buffer tail that opens mid-run: placed anew in id
    # order its start state costs +6.3% peak reserved; weights where they were and the rest as a step
    # of the window leaves it, the recording's peak reserved to the byte.
    name = "cherryni2022_cs336-assignment2-system_memory_nvtx_medium_1024_forward.pickle"
    truth = load_input(str(shared_dir / "traces" / "scale-series" / name), Fraction(1024)).trace
    recorded = peaks(truth)["peak_reserved_bytes"]
    fresh = peaks(fresh_start(truth))["peak_reserved_bytes"]
    steady = peaks(as_predicted(truth)[0])["peak_reserved_bytes"]
    assert find_period(truth) == 4056
    assert fresh - recorded > 0.06 * recorded
    assert steady == recorded


def _segments(sizes: list[int]) -> pd.DataFrame:
    n = len(sizes)
    return pd.DataFrame({"device": np.zeros(n, dtype=np.int16), "addr": (np.arange(n, dtype=np.int64) + 1) << 32,
                         "size_bytes": np.array(sizes, dtype=np.int64), "stream": np.zeros(n, dtype=np.int64),
                         "pool": ["large"] * n, "is_expandable": np.zeros(n, dtype=bool)})


def test_inputs_whose_start_segments_nest_share_one_cache():
    def with_segments(sizes):
        return Trace(events=_periodic().events, meta=TraceMeta(format="test", devices=[0]),
                     initial_segments=_segments(sizes))

    # A process that ran 128 then 256 kept 128's segments: 256 starts with all of them and more.
    assert one_cache([with_segments([20 * MIB, 40 * MIB]), with_segments([20 * MIB, 40 * MIB, 80 * MIB])])
    # Separate processes: 256 lacks one of 128's segments.
    assert not one_cache([with_segments([20 * MIB, 20 * MIB]), with_segments([20 * MIB, 80 * MIB])])
    assert not one_cache([with_segments([20 * MIB])])


def test_weights_keep_the_reference_layout_and_resized_allocations_are_placed_anew():
    reference = steady_start(_periodic())
    # At the target the weight (id 0) keeps its size, the activation (id 1) doubles.
    initial = reference.initial_allocs.copy()
    initial.loc[initial["alloc_id"] == 1, "size_bytes"] = 48 * MIB
    initial["addr"], initial["block_size_bytes"] = -1, -1
    target = Trace(events=reference.events, meta=reference.meta, initial_allocs=initial)
    carried = carried_layout(target, reference)
    weight = reference.initial_blocks[reference.initial_blocks["alloc_id"] == 0]
    live = carried.initial_blocks[carried.initial_blocks["alloc_id"] >= 0]
    assert live["alloc_id"].tolist() == [0] and live["addr"].tolist() == weight["addr"].tolist()
    assert carried.initial_allocs.set_index("alloc_id")["addr"].to_dict() == {0: int(weight["addr"].iloc[0]), 1: -1}
    # Only segments that hold a kept allocation stay, unless the cache is kept.
    assert set(carried.initial_segments["addr"]) == set(live["segment_addr"])
    cached = carried_layout(target, reference, keep_cached=True)
    assert set(cached.initial_segments["addr"]) == set(reference.initial_segments["addr"])
    assert run_fast(cached, "pytorch").summary["start_state"] == "recorded"
