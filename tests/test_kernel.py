"""The compiled policy kernel against the Python reference: same decisions, call for call and run for run.

Hypothesis draws random programs (requests of every size class on three streams, free requests,
completions with and without a request, frees left pending while other streams go on, empty_cache,
misuse) and random traces (multi-stream, cross-stream frees, capacity limits with OOM retries and
continue_on_oom, start states loaded with ``load_state``); the same input goes through a policy
built on each route and everything must match: each call's result or error, every piece of policy
and device state after every call (block addresses, free lists, counters, device ranges, PyTorch's
recorded device calls), and each engine run's summary, time series and OOM table. The loader's
switch (``ALLOCSIM_KERNEL``), its reporting (``--version``, ``run`` output) and the fallback
when the extension is missing are checked at the end.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocsim.cost import CostModel
from allocsim.device import SimulatedDevice
from allocsim.engine import run_fast, run_simpy
from allocsim.errors import AllocsimError
from allocsim.policies import build_policy, kernel
from allocsim.trace.schema import (
    BLOCK_DTYPES, EVENT_DTYPES, INITIAL_ALLOC_DTYPES, SEGMENT_DTYPES, EventKind, Trace, TraceMeta, frame_from_columns,
)
from allocsim.units import MiB

from .policy_state import export_start_state, policy_state

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(kernel.compiled is None and os.environ.get("CI") != "true",
                                reason=f"compiled kernel not built here: {kernel.LOAD_ERROR}")

#: Every pool policy and the parameter combinations whose rules the kernel runs.
CASES = [
    ("pytorch", {}),
    ("pytorch", {"max_split_size": "24MiB"}),
    ("pytorch", {"max_split_size": "24MiB", "max_non_split_rounding": "2MiB"}),
    ("pytorch", {"roundup_power2_divisions": "4"}),
    ("pytorch", {"roundup_power2_divisions": "[1:4,>:2]", "max_split_size": "40MiB"}),
    ("pytorch", {"garbage_collection_threshold": "0.5", "memory_fraction": "0.9"}),
    ("pytorch", {"garbage_collection_threshold": "0.3", "memory_fraction": "0.6", "max_split_size": "24MiB"}),
    ("pytorch", {"expandable_segments": "true"}),
    ("pytorch", {"expandable_segments": "true", "roundup_power2_divisions": "2"}),
    ("bestfit", {}),
    ("bestfit", {"growth": "pytorch"}),
    ("bestfit", {"growth": "chunk", "chunk": "4MiB", "carve_from_high_end": "true", "stream_bound": "true"}),
    ("bestfit", {"growth": "round", "chunk": "2MiB", "small_pool_max": "64KiB", "min_split_remainder": "4KiB",
                 "oom_release": "stream-then-all", "stream_bound": "true"}),
    ("bestfit", {"alignment": "1000", "oom_release": "none", "min_split_remainder": "1"}),
    ("stream-bound", {"cross_stream_reuse": "true"}),
    ("stream-bound", {"growth": "chunk", "chunk": "8MiB", "oom_release": "stream-then-all"}),
    ("cupy", {}),
    ("cupy", {"limit": "48MiB"}),
    ("paddle", {}),
    ("paddle", {"chunk_size": "4MiB"}),
    ("paddle", {"free_idle_chunk": "true"}),
    ("paddle", {"free_when_no_cache_hit": "true", "alignment": "512"}),
    ("cuda-async", {"release_threshold": "16MiB"}),
    ("paddle-naive", {"gpu_memory": "256MiB"}),
    ("deferred-gc", {"inner": "pytorch", "threshold": "8MiB"}),
]
CASE_IDS = [name + "".join(f",{k}={v}" for k, v in params.items()) for name, params in CASES]

POSITIVE_SIZES = st.one_of(
    st.integers(1, 64).map(lambda k: k * MiB // 2),   # lattices: exact fits and the rules' boundaries
    st.integers(1, 64).map(lambda k: k * 512),
    st.integers(1, 4096),
    st.integers(4097, 2 * MiB),
    st.integers(2 * MiB, 26 * MiB),
    st.sampled_from([512, MiB - 512, MiB, MiB + 1, 10 * MiB - 1, 10 * MiB, 20 * MiB, 24 * MiB, 40 * MiB]),
)
SIZES = st.one_of(st.just(0), POSITIVE_SIZES)
MALLOC = st.tuples(st.just("malloc"), SIZES, st.integers(0, 2))
#: Programs repeat sizes (a training step does): a request for a recently freed size, or one near it.
DELTAS = st.sampled_from([0, 0, 512, -512, MiB, -MiB, 2 * MiB, -2 * MiB, 4 * MiB])
AGAIN = st.tuples(st.just("again"), st.integers(0, 1 << 20), DELTAS, st.integers(0, 2))
OPS = st.lists(st.one_of(
    MALLOC, MALLOC, AGAIN, AGAIN,
    st.tuples(st.just("request"), st.integers(0, 1 << 20)),
    st.tuples(st.just("complete"), st.integers(0, 1 << 20), st.booleans()),
    st.tuples(st.just("complete"), st.integers(0, 1 << 20), st.just(True)),
    st.tuples(st.just("empty_cache")),
    st.tuples(st.just("misuse"), st.integers(0, 3)),
), min_size=30, max_size=200)
CAPACITIES = st.sampled_from([None, 48 * MiB, 96 * MiB, 200 * MiB])


def _build(name: str, params: dict, capacity: int | None, route: str):
    with kernel.route(route):
        return build_policy(name, device=SimulatedDevice(capacity), params=params)


def _call(fn, *args):
    """One call's outcome: ``("ok", result)`` or ``("raised", type, message)``."""
    try:
        return "ok", fn(*args)
    except AllocsimError as exc:
        return "raised", type(exc).__name__, str(exc)


class Program:
    """Plays ops on several policies at once and checks after every call that they agree."""

    def __init__(self, policies, next_id: int = 0, live=(), pending=()):
        self.policies = policies
        self.next_id = next_id
        self.live = [aid for aid in live if aid not in set(pending)]
        self.pending = list(pending)
        self.sizes: dict[int, int] = {}   # alloc id -> requested size
        self.freed: list[int] = []        # sizes of completed frees, most recent last

    def same(self, calls, step):
        outcomes = [_call(*call) for call in calls]
        assert all(o == outcomes[0] for o in outcomes), f"step {step}: outcomes differ: {outcomes}"
        states = [policy_state(p) for p in self.policies]
        assert all(s == states[0] for s in states[1:]), f"step {step}: states differ"
        return outcomes[0]

    def play(self, ops):
        for step, op in enumerate(ops):
            kind = op[0]
            if kind in ("malloc", "again"):
                size = op[1]
                if kind == "again":
                    if not self.freed:
                        continue
                    size = max(1, self.freed[-1 - op[1] % min(8, len(self.freed))] + op[2])
                aid, self.next_id = self.next_id, self.next_id + 1
                got = self.same([(p.malloc, aid, size, op[-1]) for p in self.policies], step)
                if got[0] == "ok":
                    self.live.append(aid)
                    self.sizes[aid] = size
            elif kind == "request" and self.live:
                aid = self.live.pop(op[1] % len(self.live))
                self.same([(p.free_requested, aid) for p in self.policies], step)
                self.pending.append(aid)
            elif kind == "complete" and (self.live or self.pending):
                source = self.pending if (op[2] and self.pending) or not self.live else self.live
                aid = source.pop(op[1] % len(source))   # from live: completes without a request
                self.same([(p.free_completed, aid) for p in self.policies], step)
                if aid in self.sizes:
                    self.freed.append(self.sizes.pop(aid))
            elif kind == "empty_cache":
                self.same([(p.empty_cache,) for p in self.policies], step)
            elif kind == "misuse":
                which = op[1]
                if which == 0 and self.live:   # a duplicate id
                    self.same([(p.malloc, self.live[0], 512, 0) for p in self.policies], step)
                elif which == 1:   # a free of an unknown id, requested and completed
                    self.same([(p.free_completed, -7) for p in self.policies], step)
                    self.same([(p.free_requested, -8) for p in self.policies], step)
                elif which == 2 and self.pending:   # a second free request
                    self.same([(p.free_requested, self.pending[0]) for p in self.policies], step)
                else:   # a negative size takes the reference's path on both routes
                    aid, self.next_id = self.next_id, self.next_id + 1
                    if self.same([(p.malloc, aid, -5, 1) for p in self.policies], step)[0] == "ok":
                        self.live.append(aid)


@pytest.mark.full
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, capacity=CAPACITIES)
def test_kernel_calls_match_the_reference(case, ops, capacity):
    """Call for call, the compiled route returns and raises what the reference does and leaves the same state."""
    name, params = case
    if "memory_fraction" in params and capacity is None:
        capacity = 200 * MiB   # garbage collection acts only under a memory fraction of a capacity
    compiled, reference = (_build(name, params, capacity, route) for route in ("compiled", "reference"))
    assert kernel.route_of(reference) == "reference"
    assert kernel.route_of(compiled) == ("reference" if name == "paddle-naive" else "compiled")
    Program([compiled, reference]).play(ops)
    compiled.check_invariants()
    reference.check_invariants()


@pytest.mark.full
@pytest.mark.parametrize("case", [c for c in CASES if c[0] == "pytorch"], ids=lambda c: ",".join(map(str, c[1].items())))
@settings(max_examples=10, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(warmup=OPS, ops=OPS, capacity=CAPACITIES)
def test_kernel_matches_the_reference_from_a_loaded_start_state(case, warmup, ops, capacity):
    """pytorch: both routes load the same recorded layout (load_state), then agree on every later call."""
    _name, params = case
    if "memory_fraction" in params and capacity is None:
        capacity = 200 * MiB
    source = _build("pytorch", params, None, "reference")
    program = Program([source])
    program.play(warmup)
    segments, blocks = export_start_state(source)
    policies = [_build("pytorch", params, capacity, route) for route in ("compiled", "reference")]
    for policy in policies:
        try:
            policy.load_state(segments, blocks)
        except ValueError as exc:   # e.g. the layout exceeds the capacity: both must refuse alike
            pytest.skip(f"start state refused: {exc}")
    resumed = Program(policies, program.next_id, live=program.live + program.pending, pending=program.pending)
    resumed.same([(lambda: None,)], "load")
    resumed.play(ops)
    for policy in policies:
        policy.check_invariants()


@pytest.mark.parametrize("max_split, rounding", [(24 * MiB, 2 * MiB), (24 * MiB, 20 * MiB), (40 * MiB, 4 * MiB)])
def test_kernel_matches_the_reference_at_the_oversize_rules_edges(max_split, rounding):
    """get_free_block's rules at their exact edges: a freed block around max_split and max_split + rounding, then
    requests around max_split (each request of 10 MiB or more has a segment of its own, rounded to 2 MiB)."""
    params = {"max_split_size": max_split, "max_non_split_rounding": rounding}
    outcomes = set()
    for block in (max_split - 512, max_split, max_split + 512, max_split + rounding - 512, max_split + rounding,
                  max_split + rounding + 512, 2 * max_split):
        for request in (max_split // 2, max_split - 512, max_split, max_split + 512):
            policies = [_build("pytorch", params, None, route) for route in ("compiled", "reference")]
            program = Program(policies)
            # A block of exactly `block` bytes, freed: requests >= 10 MiB get their own segment, and a
            # request at or above max_split is never split.
            program.play([("malloc", block, 0), ("complete", 0, False), ("malloc", request, 0),
                          ("malloc", request, 0)])
            outcomes.add(policies[0].n_pool_hits)
    assert outcomes == {0, 1}   # both a reuse and a refusal happened among the edges


# ---------------------------------------------------------------------------------------------- engine runs
EVENTS = st.lists(st.tuples(
    st.sampled_from(["alloc", "alloc", "again", "free", "free", "empty_cache"]),
    POSITIVE_SIZES, st.integers(0, 2), st.integers(0, 1 << 20), st.integers(0, 3),
    st.integers(0, 2)), min_size=20, max_size=200)


def _trace(rows, *, initial: int, cross_stream: bool, start_state=None) -> Trace:
    """A valid trace from drawn rows: (what, size, stream, pick, gap_ns, completion stream)."""
    events, live, t = [], [], 1_000
    initial_allocs = []
    next_id = 0
    for k in range(initial):   # alive when the trace starts: freed inside it
        initial_allocs.append((next_id, (k + 1) * 3 * MiB // 2, k % 2))
        live.append((next_id, (k + 1) * 3 * MiB // 2, k % 2))
        next_id += 1
    held_back = []   # frees requested whose completion comes later on another stream
    if start_state is not None:
        live_ids, pending = start_state["live"], start_state["pending"]
        initial_allocs = [(aid, req, stream) for aid, (req, stream) in sorted(live_ids.items())]
        live = [(aid, req, stream) for aid, (req, stream) in sorted(live_ids.items()) if aid not in pending]
        held_back = [(aid, req, stream) for aid, (req, stream) in sorted(live_ids.items()) if aid in pending]
        next_id = max(live_ids, default=-1) + 1
    freed = []
    for what, size, stream, pick, gap, done_stream in rows:
        t += gap * 500   # gap 0: a tie with the previous event
        if what == "again" and freed:   # a recently freed size again, or one near it
            what, size = "alloc", max(1, freed[-1 - pick % min(8, len(freed))] + (pick % 5 - 2) * MiB)
        if what == "alloc":
            events.append((t, EventKind.ALLOC, next_id, size, stream))
            live.append((next_id, size, stream))
            next_id += 1
        elif what == "free" and live:
            aid, size_b, stream_b = live.pop(pick % len(live))
            freed.append(size_b)
            events.append((t, EventKind.FREE_REQUESTED, aid, size_b, stream_b))
            if cross_stream and done_stream != stream_b:
                held_back.append((aid, size_b, done_stream))
            else:
                events.append((t, EventKind.FREE_COMPLETED, aid, size_b, stream_b))
        elif what == "empty_cache":
            events.append((t, EventKind.EMPTY_CACHE, -1, 0, stream))
        if held_back and pick % 3 == 0:   # a pending free completes a while later
            aid, size_b, done = held_back.pop(0)
            events.append((t, EventKind.FREE_COMPLETED, aid, size_b, done))
    for aid, size_b, done in held_back:
        t += 500
        events.append((t, EventKind.FREE_COMPLETED, aid, size_b, done))
    columns = {name: [row[k] for row in events] for k, name in enumerate(("t_ns", "kind", "alloc_id", "size_bytes",
                                                                          "stream"))}
    columns["device"] = [0] * len(events)
    trace = Trace(events=frame_from_columns(columns, EVENT_DTYPES), meta=TraceMeta(format="test", devices=[0]))
    trace.initial_allocs = frame_from_columns({
        "alloc_id": [a for a, _, _ in initial_allocs], "size_bytes": [s for _, s, _ in initial_allocs],
        "stream": [st_ for _, _, st_ in initial_allocs], "device": [0] * len(initial_allocs),
        "addr": [-1] * len(initial_allocs), "block_size_bytes": [-1] * len(initial_allocs)}, INITIAL_ALLOC_DTYPES)
    if start_state is not None:
        segs, blocks = start_state["segments"], start_state["blocks"]
        trace.initial_segments = frame_from_columns(
            {c: [row.get(c, 0) for row in segs] for c in SEGMENT_DTYPES}, SEGMENT_DTYPES)
        trace.initial_blocks = frame_from_columns(
            {c: [row.get(c, 0) for row in blocks] for c in BLOCK_DTYPES}, BLOCK_DTYPES)
    return trace


def _runs(trace, name, params, capacity, cost):
    out = []
    for route in ("compiled", "reference"):
        for mode in ("fast", "simpy"):
            policy = _build(name, params, capacity, route)
            if mode == "fast":
                result = run_fast(trace, policy, continue_on_oom=True)
            else:
                result = run_simpy(trace, policy, cost, continue_on_oom=True)
            assert result.perf["policy_kernel"] == kernel.route_of(policy)
            out.append((route, mode, result, policy_state(policy)))
    return out


ENGINE_CASES = [c for c in CASES if c[0] != "paddle-naive"]
COSTS = [CostModel(), CostModel(device_sync_ns=2_000_000, pool_hit_ns=5_000)]


@pytest.mark.full
@pytest.mark.parametrize("case", ENGINE_CASES, ids=[i for c, i in zip(CASES, CASE_IDS) if c in ENGINE_CASES])
@settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(rows=EVENTS, capacity=CAPACITIES, initial=st.integers(0, 3), cross_stream=st.booleans(),
       cost=st.sampled_from(COSTS))
def test_kernel_runs_match_the_reference(case, rows, capacity, initial, cross_stream, cost):
    """run_fast and run_simpy (replay_run batches, per-event calls where they stop) give identical results."""
    name, params = case
    if "memory_fraction" in params and capacity is None:
        capacity = 200 * MiB
    trace = _trace(rows, initial=initial, cross_stream=cross_stream)
    runs = _runs(trace, name, params, capacity, cost)
    by = {(route, mode): (result, state) for route, mode, result, state in runs}
    for mode in ("fast", "simpy"):
        got, got_state = by["compiled", mode]
        want, want_state = by["reference", mode]
        assert got.summary == want.summary
        pd.testing.assert_frame_equal(got.timeseries, want.timeseries)
        pd.testing.assert_frame_equal(got.ooms, want.ooms)
        assert got_state == want_state


@pytest.mark.full
@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(warmup=OPS, rows=EVENTS, params=st.sampled_from([c[1] for c in CASES if c[0] == "pytorch"]),
       capacity=st.sampled_from([None, 400 * MiB]))
def test_kernel_runs_match_the_reference_from_a_recorded_start_state(warmup, rows, params, capacity):
    """A trace carrying a recorded start layout (as a snapshot does): both routes adopt it and agree on the run."""
    if "memory_fraction" in params and capacity is None:
        capacity = 400 * MiB
    source = _build("pytorch", params, None, "reference")
    program = Program([source])
    program.play(warmup)
    segments, blocks = export_start_state(source)
    live = {aid: (req, stream) for aid, (_a, req, alloc, stream) in source.live.items() if alloc}
    for b in blocks:
        b["device"] = 0
    for s in segments:
        s["device"] = 0
    trace = _trace(rows, initial=0, cross_stream=True,
                   start_state={"live": live, "pending": set(source.pending), "segments": segments, "blocks": blocks})
    runs = _runs(trace, "pytorch", params, capacity, CostModel())
    by = {(route, mode): (result, state) for route, mode, result, state in runs}
    for mode in ("fast", "simpy"):
        got, want = by["compiled", mode][0], by["reference", mode][0]
        assert got.summary == want.summary
        pd.testing.assert_frame_equal(got.timeseries, want.timeseries)
        assert by["compiled", mode][1] == by["reference", mode][1]


# ---------------------------------------------------------------------------------------------- free lists
VALUE_OPS = st.lists(st.tuples(st.sampled_from(["free", "take", "pop", "remove", "age"]),
                               st.integers(0, 63), st.integers(1, 3), st.integers(0, 2)), max_size=200)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(ops=VALUE_OPS, track_age=st.booleans())
def test_compiled_free_list_matches_the_reference_method_for_method(ops, track_age):
    """Both FreeLists, driven by the same calls (frees of random pieces, best fits, takes, releases), agree exactly."""
    from allocsim.policies.freelist import FreeList

    pools = [kernel.CompiledFreeList(track_age=track_age), FreeList(track_age=track_age)]
    unit = 4096
    held = {}   # addr -> (size, stream key) of pieces not free
    for seg in range(4):
        base = (1 << 40) + seg * (1 << 22)
        for pool in pools:
            pool.add_segment(base, 64 * unit, seg % 2)
        for k in range(0, 64, 4):
            held[base + k * unit] = (4 * unit, seg % 2)
    for step, (what, a, b, c) in enumerate(ops):
        for pool in pools:
            pool.clock = step
        if what == "free" and held:
            addr = sorted(held)[a % len(held)]
            size, skey = held.pop(addr)
            results = [pool.free(addr, size, skey) for pool in pools]
        elif what in ("take", "pop"):
            size = b * unit
            results = [(pool.best_fit(c % 2, size), pool.next_key(c % 2, size << 64)) for pool in pools]
            key = results[0][0]
            if key >= 0:
                got = [_call(pool.take, c % 2, key) if what == "take" else ("ok", pool.pop_best_fit(c % 2, size))
                       for pool in pools]
                assert got[0] == got[1]
                held[key & ((1 << 64) - 1)] = (key >> 64, c % 2)
        elif what == "remove":
            whole = [pool.whole_free_segments(None) for pool in pools]
            results = whole
            if whole[0]:
                addr = whole[0][a % len(whole[0])][0]
                results = [pool.remove_segment(addr) for pool in pools]
                for pool in pools:
                    pool.add_segment(addr, 64 * unit, 0)
                    pool.add(addr, 64 * unit, 0)
        else:
            results = [(pool.largest(), pool.stream_bytes(c % 2), pool.inserted_clock((1 << 40) + a * unit))
                       for pool in pools]
        assert results[0] == results[1], f"step {step}: {what} -> {results}"
        from .policy_state import pool_state

        assert pool_state(pools[0]) == pool_state(pools[1]), f"step {step}: {what}"
        assert sorted(pools[0].blocks()) == sorted(pools[1].blocks())
    pools[0].check()


@settings(max_examples=8, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**32 - 1), pieces=st.sampled_from([600, 3000]))
def test_compiled_free_list_matches_the_reference_on_thousands_of_blocks(seed, pieces):
    """Deep per-stream sets (node splits, emptied nodes, a collapsing root): random frees, best fits and takes."""
    import random

    from allocsim.policies.freelist import FreeList

    rng = random.Random(seed)
    pools = [kernel.CompiledFreeList(), FreeList()]
    base, unit = 1 << 40, 512
    for pool in pools:
        pool.add_segment(base, pieces * 4 * unit, 7)
    sizes = [rng.choice([1, 1, 2, 3]) * unit for _ in range(pieces)]
    starts = [base + 4 * unit * k for k in range(pieces)]   # pieces 4 units apart: never neighbours
    order = list(range(pieces))
    rng.shuffle(order)
    for step, k in enumerate(order):
        assert pools[0].free(starts[k], sizes[k], 7) == pools[1].free(starts[k], sizes[k], 7) == 0
        if step % 7 == 3:   # take some back: best fits of random sizes, lowest address among equals
            want = rng.choice([1, 2, 3, 4]) * unit
            got = [pool.pop_best_fit(7, want) for pool in pools]
            assert got[0] == got[1]
        if step % 97 == 0:
            assert pools[0].keys(7) == list(pools[1].keys(7))
    assert pools[0].keys(7) == list(pools[1].keys(7)) and pools[0].largest() == pools[1].largest()
    keys = list(pools[1].keys(7))   # empty the set one key at a time, in random order
    rng.shuffle(keys)
    for n, key in enumerate(keys):
        for pool in pools:
            pool.take(7, key)
        if n % 101 == 0:
            assert pools[0].keys(7) == list(pools[1].keys(7))
            assert pools[0].best_fit(7, 2 * unit) == pools[1].best_fit(7, 2 * unit)
            probe = keys[(n * 7919) % len(keys)]
            assert pools[0].next_key(7, probe) == pools[1].next_key(7, probe)
    assert pools[0].keys(7) == [] and pools[0].best_fit(7, 1) == -1 and pools[0].largest() == 0
    pools[0].check()


def test_compiled_free_list_refuses_values_outside_its_range():
    """Addresses and sizes are uint63 in C: anything else is a clear ValueError, never a silent wrap."""
    pool = kernel.CompiledFreeList()
    with pytest.raises(ValueError, match="ALLOCSIM_KERNEL=reference"):
        pool.add_segment(1 << 63, 512, 0)
    with pytest.raises(ValueError):
        pool.free(-512, 512, 0)
    with pytest.raises(ValueError, match="stream key"):
        pool.add(512, 512, 1 << 70)
    assert pool.best_fit(0, 1 << 80) == -1 and pool.pop_best_fit(0, -3) == -1


# ---------------------------------------------------------------------------------------------- the switch
def test_route_switch_and_status(monkeypatch):
    """ALLOCSIM_KERNEL picks the route of new policies; route() overrides it for a block; status() says why."""
    monkeypatch.setenv(kernel.ENV_VAR, "reference")
    assert kernel.status()["route"] == "reference" and not kernel.active()
    assert kernel.route_of(build_policy("pytorch", device=SimulatedDevice())) == "reference"
    with kernel.route("compiled"):
        assert kernel.route_of(build_policy("cupy", device=SimulatedDevice())) == "compiled"
    monkeypatch.setenv(kernel.ENV_VAR, "compiled")
    assert kernel.status()["route"] == "compiled"
    monkeypatch.setenv(kernel.ENV_VAR, "sometimes")
    with pytest.raises(AllocsimError, match="ALLOCSIM_KERNEL"):
        build_policy("bestfit", device=SimulatedDevice())
    monkeypatch.setattr(kernel, "compiled", None)
    monkeypatch.setattr(kernel, "LOAD_ERROR", "the compiled kernel is not available (test)")
    monkeypatch.setenv(kernel.ENV_VAR, "compiled")
    with pytest.raises(kernel.KernelUnavailable, match="not available"):
        build_policy("paddle", device=SimulatedDevice())
    monkeypatch.setenv(kernel.ENV_VAR, "auto")
    assert kernel.route_of(build_policy("paddle", device=SimulatedDevice())) == "reference"
    assert kernel.status() == {"route": "reference", "reason": "the compiled kernel is not available (test)"}


def test_every_pool_policy_attaches_the_kernel():
    """Each pool preset's own __init__ attaches the kernel (a subclass that forgot would silently run slow)."""
    served = {}
    with kernel.route("compiled"):
        for name in ("bestfit", "stream-bound", "cupy", "paddle", "pytorch", "cuda-async", "paddle-naive"):
            policy = build_policy(name, device=SimulatedDevice())
            served[name] = tuple(n for n in ("malloc", "free_completed", "replay_run") if n in policy.__dict__)
        policy = build_policy("pytorch", device=SimulatedDevice(), params={"expandable_segments": True})
        served["pytorch-expandable"] = tuple(n for n in ("malloc", "free_completed", "replay_run")
                                             if n in policy.__dict__)
    full = ("malloc", "free_completed", "replay_run")
    assert served == {"bestfit": full, "stream-bound": full, "cupy": full, "paddle": full, "pytorch": full,
                      "pytorch-expandable": full, "cuda-async": ("malloc",), "paddle-naive": ()}


def _cli(args, env_extra=None, code=None):
    env = dict(os.environ, **(env_extra or {}))
    command = [sys.executable, "-c", code or "from allocsim.cli import main; raise SystemExit(main())", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, timeout=120)


@pytest.mark.full
def test_version_and_run_output_name_the_route(tmp_path):
    """--version and run (text and JSON) say which route ran; ALLOCSIM_KERNEL=reference switches both."""
    trace = str(REPO / "traces" / "bert_fp32.json.gz")
    out = _cli(["--version"], {kernel.ENV_VAR: "auto"})
    assert out.returncode == 0 and "policy kernel: compiled" in out.stdout
    ref = _cli(["--version"], {kernel.ENV_VAR: "reference"})
    assert "policy kernel: reference (ALLOCSIM_KERNEL=reference)" in ref.stdout
    runs = {}
    for route in ("compiled", "reference"):
        got = _cli(["run", trace, "--policy", "pytorch", "--fast", "--json"], {kernel.ENV_VAR: route})
        assert got.returncode == 0, got.stderr
        runs[route] = json.loads(got.stdout)
        assert runs[route].pop("policy_kernel") == route
        for key in ("sim_seconds", "events_per_second"):
            runs[route].pop(key)
    assert runs["compiled"] == runs["reference"]
    text = _cli(["run", trace, "--policy", "cupy", "--fast"], {kernel.ENV_VAR: "reference"})
    assert "policy kernel: reference" in text.stdout


@pytest.mark.full
def test_without_the_extension_allocsim_runs_on_the_reference(tmp_path):
    """As on a machine with no compiler: the import fails, --version says so and run still works (exit 0)."""
    block = ("import sys; sys.modules['allocsim.policies._kernel'] = None; "
             "from allocsim.cli import main; raise SystemExit(main())")
    version = _cli(["--version"], {kernel.ENV_VAR: "auto"}, code=block)
    assert version.returncode == 0 and "policy kernel: reference (the compiled kernel is not available" in version.stdout
    run = _cli(["run", str(REPO / "traces" / "bert_fp32.json.gz"), "--policy", "pytorch", "--fast", "--json"],
               {kernel.ENV_VAR: "auto"}, code=block)
    assert run.returncode == 0 and json.loads(run.stdout)["policy_kernel"] == "reference"
    required = _cli(["run", str(REPO / "traces" / "bert_fp32.json.gz"), "--policy", "pytorch", "--fast"],
                    {kernel.ENV_VAR: "compiled"}, code=block)
    assert required.returncode == 2 and "ALLOCSIM_KERNEL=compiled" in required.stderr
    assert "Traceback" not in required.stderr
