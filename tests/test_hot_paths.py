"""Fast paths against the plain routes they shortcut: the fused pool calls, ``FreeList.free``, SimPy's run-ahead.

``PoolPolicy`` and ``PyTorchPolicy`` serve pool hits and completed frees inline for speed; the
template route (``Policy.malloc`` -> ``_do_malloc``, ``Policy.free_completed`` -> ``_do_free``)
stays the reference. Two copies of each policy replay the same random program, one through the
public methods, one through the base-class methods, and must agree in every piece of state after
every call, including which calls raised. The SimPy engine moves its clock itself when no other
event is due first; forcing a timeout per event instead must change nothing.
"""

from __future__ import annotations

import dataclasses
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
from allocsim.policies import build_policy
from allocsim.policies.base import Policy, ReplayRun
from allocsim.policies.freelist import ADDR_BITS, FreeList
from allocsim.policies.pytorch import PyTorchPolicy
from allocsim.trace import read_trace
from allocsim.trace.schema import EventKind
from allocsim.units import MiB

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


def _state(policy) -> dict:
    """Everything a policy and its device hold, as plain comparable values."""
    pools = getattr(policy, "pools", ())
    index = {id(pool): k for k, pool in enumerate(pools)}
    dev = policy.device
    return {
        "live": dict(policy.live), "pending": set(policy.pending),
        "counters": {name: getattr(policy, name) for name in (
            "requested_bytes", "allocated_bytes", "pending_free_bytes", "n_mallocs", "n_ooms", "n_pool_hits",
            "n_splits", "n_merges", "n_gc_batches", "last_stream", "n_released_segments", "released_bytes",
            "total_allocated_memory", "num_alloc_retries") if hasattr(policy, name)},
        "pools": [(dict(pool.size_at), dict(pool.start_ending_at), {k: list(v) for k, v in pool.by_stream.items()},
                   dict(pool.segment_size_at), dict(pool.segment_stream_at), pool.segment_bytes, pool.clock,
                   pool.inserted_at) for pool in pools],
        "pool_of": {addr: index[id(pool)] for addr, pool in getattr(policy, "_pool_of", {}).items()},
        "foreign": dict(getattr(policy, "_foreign", {})),
        "device": (dev.reserved_bytes, dev.n_mallocs, dev.malloc_bytes, dev.n_frees, dev.freed_bytes, dev.n_maps,
                   dev.n_unmaps, dev.n_failed_mallocs, dev.n_failed_maps, dict(dev._sizes), dict(dev._mapped)),
    }


def _call(fn, *args):
    """Run one call; return ``("ok", result)`` or ``("raised", exception type)``."""
    try:
        return "ok", fn(*args)
    except AllocsimError as exc:
        return "raised", type(exc)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0] + "".join(f",{k}={v}" for k, v in c[1].items()))
@pytest.mark.parametrize("seed", [1, 2])
def test_fused_route_matches_the_template_route(case, seed):
    """Public methods (fused where the class has a hot path) and base-class methods make identical state."""
    name, params = case
    fused, generic = (build_policy(name, device=SimulatedDevice(160 * MiB), params=params) for _ in range(2))
    rng = random.Random(seed)
    live: list[int] = []
    pending: list[int] = []
    for aid in range(1500):
        op = rng.random()
        if op < 0.45 or not live and not pending:
            size = rng.choice([0, rng.randrange(1, 4096), rng.randrange(4096, 2 * MiB),
                               rng.randrange(2 * MiB, 24 * MiB)])
            stream = rng.randrange(3)
            got = _call(fused.malloc, aid, size, stream), _call(Policy.malloc, generic, aid, size, stream)
            if got[0][0] == "ok":
                live.append(aid)
        elif op < 0.75 and live:
            victim = live.pop(rng.randrange(len(live)))
            got = _call(fused.free_requested, victim), _call(Policy.free_requested, generic, victim)
            pending.append(victim)
        elif op < 0.97 and (pending or live):
            source = pending if pending and rng.random() < 0.8 else live
            if not source:
                source = pending or live
            victim = source.pop(rng.randrange(len(source)))   # completes without a request when from live
            got = _call(fused.free_completed, victim), _call(Policy.free_completed, generic, victim)
        else:
            got = _call(fused.empty_cache), _call(generic.empty_cache)
        assert got[0] == got[1], f"step {aid}: fused {got[0]} != generic {got[1]}"
        assert _state(fused) == _state(generic), f"{name} diverged at step {aid}"
    # The misuse paths go through the generic route too.
    if live:
        assert _call(fused.malloc, live[0], 512, 0) == _call(Policy.malloc, generic, live[0], 512, 0)
    assert _call(fused.free_completed, 10**9) == _call(Policy.free_completed, generic, 10**9)
    fused.check_invariants()


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


@pytest.mark.parametrize("track_age", [False, True])
def test_freelist_free_matches_take_and_add(track_age):
    """Random frees into segments of two streams: the fused merge equals take/take/add, ages included."""
    rng = random.Random(7)
    pools = [FreeList(track_age=track_age) for _ in range(2)]
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
        assert (a.size_at, a.start_ending_at, a.by_stream, a.inserted_at) == \
               (b.size_at, b.start_ending_at, b.by_stream, b.inserted_at)
    pools[0].check()
    assert pools[0].free_bytes == 6 * (1 << 24) and pools[0].free_bytes_by_stream == {0: 3 << 24, 1: 3 << 24}
    assert all(pools[0].is_whole_free(base) for base in pools[0].segment_size_at)


def test_sorted_key_lists_stay_sorted_and_best_fit_takes_the_smallest_then_lowest():
    """The per-stream lists are plain sorted lists: best fit = first key >= size << ADDR_BITS."""
    pool = FreeList()
    pool.add_segment(1 << 40, 64 * MiB, 0)
    keys = []
    for addr, size in [(0, 3 * MiB), (8 * MiB, 1 * MiB), (16 * MiB, 3 * MiB), (24 * MiB, 2 * MiB)]:
        pool.add((1 << 40) + addr, size, 0)
        insort(keys, size << ADDR_BITS | (1 << 40) + addr)
    assert pool.keys(0) == keys == sorted(keys)
    assert pool.best_fit(0, 2 * MiB + 1) == 3 * MiB << ADDR_BITS | 1 << 40      # 3 MiB, lowest address
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


@pytest.mark.parametrize("policy", ["direct", "pytorch", "cuda-async"])
@pytest.mark.parametrize("cost", ["default", "zero", "slow-sync"])
@pytest.mark.parametrize("streams", [1, 3])
def test_simpy_run_ahead_equals_yielding_every_event(monkeypatch, bert_head, policy, cost, streams):
    """Moving the clock without SimPy events (``advance_to``, ``replay_run``) = a timeout per event."""
    trace = bert_head if streams == 1 else _multi_stream(bert_head, streams, 20_000)
    model = {"default": CostModel(), "zero": CostModel(**{n: 0 for n in CostModel.constant_names()}),
             "slow-sync": CostModel(device_sync_ns=2_000_000, pool_hit_ns=5_000)}[cost]

    def run():
        return run_simpy(trace, policy, model, capacity_bytes=3 << 30, continue_on_oom=True)

    fast_lane = run()
    monkeypatch.setattr(_Environment, "advance_to", lambda self, t_ns: False)   # always yield a timeout
    monkeypatch.setattr(PyTorchPolicy, "replay_run", None)                      # and one call per event
    reference = run()
    assert fast_lane.summary == reference.summary
    pd.testing.assert_frame_equal(fast_lane.timeseries, reference.timeseries)
    pd.testing.assert_frame_equal(fast_lane.ooms, reference.ooms)
    if streams > 1 and policy == "direct" and cost != "zero":
        assert reference.summary["dependency_wait_ns"] > 0 and reference.summary["stall_ns"] > 0


# ------------------------------------------------------------------------------- replay_run (batches)
@pytest.mark.parametrize("params", [{}, {"max_split_size": "24MiB"}, {"roundup_power2_divisions": "4"}],
                         ids=["default", "max_split", "roundup"])
@pytest.mark.parametrize("streams", [1, 3])
@pytest.mark.parametrize("capacity", [None, "tight"])
def test_replay_run_equals_per_event_calls(monkeypatch, bert_head, params, streams, capacity):
    """PyTorchPolicy.replay_run (fast and SimPy mode) gives the results of one policy call per event.

    Tight capacity makes misses, releases and OOMs (continue_on_oom) interleave with the runs; three
    streams make dependencies and other streams' events end runs early.
    """
    trace = bert_head if streams == 1 else _multi_stream(bert_head, streams, 20_000)
    capacity_bytes = None if capacity is None else 1200 * MiB
    ran = []
    batched = PyTorchPolicy.replay_run

    def counting(self, run):
        start = run.pos
        batched(self, run)
        ran.append(run.pos - start)

    monkeypatch.setattr(PyTorchPolicy, "replay_run", counting)
    results = [run_fast(trace, "pytorch", params=params, capacity_bytes=capacity_bytes, continue_on_oom=True),
               run_simpy(trace, "pytorch", params=params, capacity_bytes=capacity_bytes, continue_on_oom=True)]
    assert sum(ran) > len(trace.events) // 2, sum(ran)   # a good part of both runs went through replay_run
    monkeypatch.setattr(PyTorchPolicy, "replay_run", None)
    reference = [run_fast(trace, "pytorch", params=params, capacity_bytes=capacity_bytes, continue_on_oom=True),
                 run_simpy(trace, "pytorch", params=params, capacity_bytes=capacity_bytes, continue_on_oom=True)]
    for got, want in zip(results, reference):
        assert got.summary == want.summary
        pd.testing.assert_frame_equal(got.timeseries, want.timeseries)
        pd.testing.assert_frame_equal(got.ooms, want.ooms)
    if capacity is not None:
        assert reference[0].summary["oom_count"] > 0


@pytest.mark.parametrize("streams", [1, 3])
def test_replay_run_leaves_the_policy_as_per_event_calls_do(bert_head, streams):
    """After a trace through replay_run (per-event calls where it stops) the state equals the per-event route's."""
    trace = bert_head if streams == 1 else _multi_stream(bert_head, streams, 1)
    batched, plain = (build_policy("pytorch", device=SimulatedDevice()) for _ in range(2))
    run = ReplayRun(*(memoryview(np.zeros(len(trace.events) + 1, dtype=np.int64)) for _ in range(3)))
    columns = [trace.column(c).tolist() for c in ("kind", "alloc_id", "size_bytes", "stream")]
    run.kind, run.alloc_id, run.size_bytes, run.stream = columns

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
        assert _state(batched) == _state(plain), f"diverged before event {pos}"
    assert stops < len(columns[0]) // 10   # the runs were long
    batched.check_invariants()
