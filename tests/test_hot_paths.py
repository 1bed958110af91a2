"""Fast paths against the plain routes they shortcut: the compiled kernel, ``FreeList.free``, SimPy's run-ahead.

The pool policies run their hot path in the compiled kernel when it is built (``kernel.py``); the
Python reference (``Policy.malloc`` -> ``_do_malloc``, ``Policy.free_completed`` -> ``_do_free``)
is the other route. Two copies of each policy, one per route, replay the same long random program
and must agree in every piece of state after every call, including which calls raised (the
hypothesis-driven version of this is ``test_kernel.py``). The SimPy engine moves its clock itself
when no other event is due first, and ``replay_run`` takes runs of events at once; forcing a
timeout and a policy call per event instead must change nothing.
"""

from __future__ import annotations

import dataclasses
import os
import random
from bisect import bisect_left, insort
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from allocsim.cost import CostModel
from allocsim.device import SimulatedDevice
from allocsim.engine import _Environment, run_fast, run_simpy
from allocsim.errors import AllocsimError
from allocsim.policies import build_policy, kernel
from allocsim.policies.base import ReplayRun
from allocsim.policies.freelist import ADDR_BITS, FreeList
from allocsim.trace import read_trace
from allocsim.trace.schema import EventKind
from allocsim.units import MiB

from .policy_state import policy_state

needs_kernel = pytest.mark.skipif(kernel.compiled is None and os.environ.get("CI") != "true",
                                  reason=f"compiled kernel not built here: {kernel.LOAD_ERROR}")
FREE_LISTS = [pytest.param(FreeList, id="reference"),
              pytest.param(getattr(kernel, "CompiledFreeList", None), id="compiled", marks=needs_kernel)]

CASES = [
    ("pytorch", {}),
    ("pytorch", {"max_split_size": "24MiB"}),
    ("pytorch", {"roundup_power2_divisions": "[1:4,>:2]"}),
    ("pytorch", {"expandable_segments": "true"}),
    ("pytorch", {"garbage_collection_threshold": "0.5", "memory_fraction": "0.9"}),
    ("bestfit", {}),
    ("bestfit", {"growth": "pytorch"}),
    ("bestfit", {"growth": "chunk", "chunk": "4MiB", "carve_from_high_end": "true", "stream_bound": "true"}),
    ("stream-bound", {"cross_stream_reuse": "true"}),
    ("cupy", {}),
    ("paddle", {}),
    ("paddle", {"free_idle_chunk": "true"}),
    ("cuda-async", {"release_threshold": "16MiB"}),
    ("paddle-naive", {}),
]


def _built(name: str, params: dict, route: str, capacity: int | None = 160 * MiB):
    with kernel.route(route):
        return build_policy(name, device=SimulatedDevice(capacity), params=params)


def _call(fn, *args):
    """Run one call; return ``("ok", result)`` or ``("raised", exception type)``."""
    try:
        return "ok", fn(*args)
    except AllocsimError as exc:
        return "raised", type(exc)


@pytest.mark.full
@needs_kernel
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0] + "".join(f",{k}={v}" for k, v in c[1].items()))
@pytest.mark.parametrize("seed", [1, 2])
def test_compiled_route_matches_the_reference_route(case, seed):
    """A long random program through both routes: identical results, errors and state after every call."""
    name, params = case
    compiled, reference = _built(name, params, "compiled"), _built(name, params, "reference")
    rng = random.Random(seed)
    live: list[int] = []
    pending: list[int] = []
    for aid in range(1500):
        op = rng.random()
        if op < 0.45 or not live and not pending:
            size = rng.choice([0, rng.randrange(1, 4096), rng.randrange(4096, 2 * MiB),
                               rng.randrange(2 * MiB, 24 * MiB)])
            stream = rng.randrange(3)
            got = _call(compiled.malloc, aid, size, stream), _call(reference.malloc, aid, size, stream)
            if got[0][0] == "ok":
                live.append(aid)
        elif op < 0.75 and live:
            victim = live.pop(rng.randrange(len(live)))
            got = _call(compiled.free_requested, victim), _call(reference.free_requested, victim)
            pending.append(victim)
        elif op < 0.97 and (pending or live):
            source = pending if pending and rng.random() < 0.8 else live
            if not source:
                source = pending or live
            victim = source.pop(rng.randrange(len(source)))   # completes without a request when from live
            got = _call(compiled.free_completed, victim), _call(reference.free_completed, victim)
        else:
            got = _call(compiled.empty_cache), _call(reference.empty_cache)
        assert got[0] == got[1], f"step {aid}: compiled {got[0]} != reference {got[1]}"
        assert policy_state(compiled) == policy_state(reference), f"{name} diverged at step {aid}"
    # The misuse paths raise the same errors on both routes.
    if live:
        assert _call(compiled.malloc, live[0], 512, 0) == _call(reference.malloc, live[0], 512, 0)
    assert _call(compiled.free_completed, 10**9) == _call(reference.free_completed, 10**9)
    compiled.check_invariants()


def _free_reference(pool: FreeList, addr: int, size: int, stream_key: int) -> int:
    """``FreeList.free`` as take + add (the pre-fusion implementation)."""
    merges = 0
    if addr not in pool.segment_size_at:
        prev = pool.start_ending_at.get(addr)
        if prev is not None:
            prev_size = pool.size_at[prev]
            pool.take(stream_key, prev_size << ADDR_BITS | prev)
            addr, size, merges = prev, size + prev_size, merges + 1
    end = addr + size
    if end not in pool.segment_size_at and end in pool.size_at:
        next_size = pool.size_at[end]
        pool.take(stream_key, next_size << ADDR_BITS | end)
        size, merges = size + next_size, merges + 1
    pool.add(addr, size, stream_key)
    return merges


@pytest.mark.parametrize("free_list", FREE_LISTS)
@pytest.mark.parametrize("track_age", [False, True])
def test_freelist_free_matches_take_and_add(free_list, track_age):
    """Random frees into segments of two streams: the fused merge equals take/take/add, ages included."""
    rng = random.Random(7)
    pools = [free_list(track_age=track_age) for _ in range(2)]
    held: dict[int, tuple[int, int]] = {}   # addr -> (size, stream) of blocks not free
    for seg in range(6):
        base, stream = (1 << 40) + seg * (1 << 24), seg % 2
        for pool in pools:
            pool.add_segment(base, 1 << 24, stream)
        for k in range(16):   # 16 blocks of 1 MiB tile the segment; all start allocated
            held[base + k * (1 << 20)] = (1 << 20, stream)
    order = list(held)
    rng.shuffle(order)
    for step, addr in enumerate(order):
        size, stream = held.pop(addr)
        for pool in pools:
            pool.clock = step
        assert pools[0].free(addr, size, stream) == _free_reference(pools[1], addr, size, stream)
        a, b = pools
        assert (dict(a.size_at), dict(a.start_ending_at), dict(a.by_stream), a.inserted_at) == \
               (dict(b.size_at), dict(b.start_ending_at), dict(b.by_stream), b.inserted_at)
    pools[0].check()
    assert pools[0].free_bytes == 6 * (1 << 24) and pools[0].free_bytes_by_stream == {0: 3 << 24, 1: 3 << 24}
    assert all(pools[0].is_whole_free(base) for base in pools[0].segment_size_at)


@pytest.mark.parametrize("free_list", FREE_LISTS)
def test_sorted_keys_and_best_fit_takes_the_smallest_then_lowest(free_list):
    """Per stream, keys are sorted (size, address): best fit = first key >= size << ADDR_BITS."""
    pool = free_list()
    pool.add_segment(1 << 40, 64 * MiB, 0)
    keys = []
    for addr, size in [(0, 3 * MiB), (8 * MiB, 1 * MiB), (16 * MiB, 3 * MiB), (24 * MiB, 2 * MiB)]:
        pool.add((1 << 40) + addr, size, 0)
        insort(keys, size << ADDR_BITS | (1 << 40) + addr)
    assert list(pool.keys(0)) == keys == sorted(keys)
    assert pool.best_fit(0, 2 * MiB + 1) == 3 * MiB << ADDR_BITS | 1 << 40      # 3 MiB, lowest address
    assert pool.next_key(0, pool.best_fit(0, 2 * MiB + 1)) == 3 * MiB << ADDR_BITS | (1 << 40) + 16 * MiB
    assert pool.pop_best_fit(0, 5 * MiB) == -1
    assert pool.pop_best_fit(0, 1) == keys[bisect_left(keys, 1 << ADDR_BITS)]   # the 1 MiB block
    with pytest.raises(ValueError):
        pool.take(0, 7 << ADDR_BITS)


# ---------------------------------------------------------------------------------------------- SimPy
def _multi_stream(trace, streams: int, quantum_ns: int):
    """The trace with allocations spread over ``streams`` and frees completed on another stream, times coarsened.

    Coarse times make many events share a timestamp (ties), cross-stream frees make dependencies.
    """
    events = trace.events.copy()
    aid, kind = events["alloc_id"].to_numpy(), events["kind"].to_numpy()
    events["stream"] = np.where(kind == EventKind.FREE_COMPLETED, (aid * 7 + 1) % streams, aid * 7 % streams)
    events["t_ns"] = events["t_ns"].to_numpy() // quantum_ns * quantum_ns
    return dataclasses.replace(trace, events=events.astype(trace.events.dtypes.to_dict()))


@pytest.fixture(scope="module")
def bert_head():
    trace = read_trace(Path(__file__).resolve().parents[1] / "traces" / "bert_fp32.json.gz")
    return dataclasses.replace(trace, events=trace.events.iloc[:4000].reset_index(drop=True))


@pytest.mark.full
@pytest.mark.parametrize("policy", ["direct", "pytorch", "cuda-async", "paddle"])
@pytest.mark.parametrize("cost", ["default", "zero", "slow-sync"])
@pytest.mark.parametrize("streams", [1, 3])
def test_simpy_run_ahead_equals_yielding_every_event(monkeypatch, bert_head, policy, cost, streams):
    """Moving the clock without SimPy events (``advance_to``, ``replay_run``) = a timeout per event."""
    trace = bert_head if streams == 1 else _multi_stream(bert_head, streams, 20_000)
    model = {"default": CostModel(), "zero": CostModel(**{n: 0 for n in CostModel.constant_names()}),
             "slow-sync": CostModel(device_sync_ns=2_000_000, pool_hit_ns=5_000)}[cost]

    def run(batches: bool):
        built = build_policy(policy, device=SimulatedDevice(3 << 30))
        if not batches:
            built.replay_run = None   # one policy call per event
        return run_simpy(trace, built, model, continue_on_oom=True)

    fast_lane = run(True)
    monkeypatch.setattr(_Environment, "advance_to", lambda self, t_ns: False)   # always yield a timeout
    reference = run(False)
    assert fast_lane.summary == reference.summary
    pd.testing.assert_frame_equal(fast_lane.timeseries, reference.timeseries)
    pd.testing.assert_frame_equal(fast_lane.ooms, reference.ooms)
    if streams > 1 and policy == "direct" and cost != "zero":
        assert reference.summary["dependency_wait_ns"] > 0 and reference.summary["stall_ns"] > 0


# ------------------------------------------------------------------------------- replay_run (batches)
BATCH_CASES = [("pytorch", {}), ("pytorch", {"max_split_size": "24MiB"}), ("pytorch", {"roundup_power2_divisions": "4"}),
               ("pytorch", {"garbage_collection_threshold": "0.5", "memory_fraction": "0.9"}),
               ("pytorch", {"expandable_segments": "true"}),
               ("bestfit", {"growth": "pytorch"}), ("paddle", {}), ("cupy", {})]


@pytest.mark.full
@needs_kernel
@pytest.mark.parametrize("case", BATCH_CASES, ids=lambda c: c[0] + "".join(f",{k}={v}" for k, v in c[1].items()))
@pytest.mark.parametrize("streams", [1, 3])
@pytest.mark.parametrize("capacity", [None, "tight"])
def test_replay_run_equals_per_event_calls(bert_head, case, streams, capacity):
    """The kernel's replay_run (fast and SimPy mode) gives the results of one policy call per event.

    Tight capacity makes misses, releases and OOMs (continue_on_oom) interleave with the runs; three
    streams make dependencies and other streams' events end runs early.
    """
    name, params = case
    trace = bert_head if streams == 1 else _multi_stream(bert_head, streams, 20_000)
    capacity_bytes = 2 << 30 if capacity is None else 1200 * MiB
    ran = []

    def built(batches: bool):
        policy = _built(name, params, "compiled", capacity_bytes)
        batched = policy.replay_run
        assert batched is not None

        def counting(run):
            start = run.pos
            batched(run)
            ran.append(run.pos - start)

        policy.replay_run = counting if batches else None
        return policy

    results = [run_fast(trace, built(True), continue_on_oom=True), run_simpy(trace, built(True), continue_on_oom=True)]
    assert sum(ran) > len(trace.events) // 2, sum(ran)   # a good part of both runs went through replay_run
    reference = [run_fast(trace, built(False), continue_on_oom=True),
                 run_simpy(trace, built(False), continue_on_oom=True)]
    for got, want in zip(results, reference):
        assert got.summary == want.summary
        pd.testing.assert_frame_equal(got.timeseries, want.timeseries)
        pd.testing.assert_frame_equal(got.ooms, want.ooms)
    if capacity is not None and name == "pytorch":
        assert reference[0].summary["oom_count"] > 0


@needs_kernel
@pytest.mark.parametrize("streams", [1, 3])
@pytest.mark.parametrize("columns_as", ["lists", "buffers"])
def test_replay_run_leaves_the_policy_as_per_event_calls_do(bert_head, streams, columns_as):
    """After a trace through replay_run (per-event calls where it stops) the state equals the reference route's."""
    trace = bert_head if streams == 1 else _multi_stream(bert_head, streams, 1)
    batched, plain = _built("pytorch", {}, "compiled", None), _built("pytorch", {}, "reference", None)
    run = ReplayRun(*(memoryview(np.zeros(len(trace.events) + 1, dtype=np.int64)) for _ in range(3)))
    names = ("kind", "alloc_id", "size_bytes", "stream")
    columns = [trace.column(c).tolist() for c in names]
    if columns_as == "lists":
        run.kind, run.alloc_id, run.size_bytes, run.stream = columns
    else:
        run.kind, run.alloc_id, run.size_bytes, run.stream = (memoryview(trace.column(c)) for c in names)

    def call(policy, pos):
        kind, aid, size, stream = (column[pos] for column in columns)
        if kind == EventKind.ALLOC:
            policy.malloc(aid, size, stream)
        elif kind == EventKind.FREE_REQUESTED:
            policy.free_requested(aid)
        elif kind == EventKind.FREE_COMPLETED:
            policy.free_completed(aid)

    pos, stops = 0, 0
    while pos < len(columns[0]):
        run.pos = pos
        batched.replay_run(run)
        for ran in range(pos, run.pos):
            call(plain, ran)
        pos = run.pos
        if pos < len(columns[0]):   # where replay_run stopped: one call per event on both, as the engine does
            call(batched, pos)
            call(plain, pos)
            run.row += 1
            pos += 1
            stops += 1
        assert policy_state(batched) == policy_state(plain), f"diverged before event {pos}"
    assert stops < len(columns[0]) // 10   # the runs were long
    batched.check_invariants()
