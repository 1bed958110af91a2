"""One conformance battery for every registered policy (RMM's ``mr_ref_test`` idea).

Every policy in ``policy_specs()`` runs with its defaults, ``deferred-gc`` runs over each inner
policy, and a few non-default configurations run too. What is checked, exactly:

* alignment: every address is a multiple of ``policy.address_alignment_bytes``: 512 B for
  PyTorch, CuPy, cuda-async, bestfit/stream-bound (their ``alignment_bytes``) and direct (the
  device's alignment); 256 B for paddle and paddle-naive; an adaptor inherits its inner's;
* no two live blocks overlap: the ranges ``[addr, addr + allocated)`` are disjoint;
* ``allocated >= requested`` for each live block and ``reserved >= allocated`` overall;
* conservation ``allocated + cached_free == reserved`` at every step, where a pool computes
  ``cached_free`` from its own free lists (plus the device's rounding of segments), so the
  identity holds only if the free lists account for every byte; ``check_invariants()`` also
  checks that live and free blocks tile each segment with no gap or overlap;
* ``largest_free_block_bytes() <= cached_free_bytes()``;
* ``OutOfMemory`` (never the device's own error) at a small capacity, after the policy's retry
  path, with the live state unchanged; frees of unknown or freed ids raise ``InvalidFree``;
* ``empty_cache`` after every free leaves nothing reserved.
"""

from __future__ import annotations

import numpy as np
import pytest
from sortedcontainers import SortedList

from allocsim.device import DeviceOutOfMemory, SimulatedDevice
from allocsim.errors import InvalidFree, OutOfMemory
from allocsim.policies import build_policy, policy_specs
from allocsim.policies.pool import PoolPolicy
from allocsim.units import MiB

BASE_CASES = [(spec.name, {}) for spec in policy_specs() if spec.name != "deferred-gc"]
DEFERRED_CASES = [("deferred-gc", {"inner": name, "threshold": "8MiB"}) for name, _ in BASE_CASES]
VARIANT_CASES = [
    ("pytorch", {"expandable_segments": "true"}),
    ("pytorch", {"max_split_size": "24MiB", "garbage_collection_threshold": "0.5", "memory_fraction": "0.95"}),
    ("pytorch", {"roundup_power2_divisions": "[1:4,>:2]"}),
    ("bestfit", {"growth": "pytorch"}),
    ("bestfit", {"growth": "chunk", "chunk": "4MiB", "carve_from_high_end": "true", "stream_bound": "true"}),
    ("stream-bound", {"cross_stream_reuse": "true"}),
    ("cuda-async", {"release_threshold": "64MiB"}),
    ("paddle", {"chunk_size": "8MiB"}),
]
CASES = BASE_CASES + DEFERRED_CASES + VARIANT_CASES
EXPECTED_ALIGNMENT = {"paddle": 256, "paddle-naive": 256}

#: Policies that release cached segments and retry when the device refuses a cudaMalloc.
RELEASES_ON_OOM = {"bestfit", "stream-bound", "pytorch", "paddle", "cupy"}


def case_id(case: tuple[str, dict]) -> str:
    name, params = case
    return name + ("[" + ",".join(f"{k}={v}" for k, v in params.items()) + "]" if params else "")


def make(case: tuple[str, dict], capacity_bytes: int | None = 256 * MiB):
    """Build the policy of ``case`` over a fresh device."""
    name, params = case
    return build_policy(name, device=SimulatedDevice(capacity_bytes), params=params)


def inner_name(policy) -> str:
    """The name of the policy that places blocks (an adaptor's inner policy)."""
    return policy.upstream.name if policy.name == "deferred-gc" else policy.name


class LiveRanges:
    """Live ``[addr, end)`` ranges; adding one checks it overlaps no other."""

    def __init__(self) -> None:
        self.ranges = SortedList()
        self.by_id: dict[int, tuple[int, int]] = {}

    def add(self, alloc_id: int, addr: int, allocated: int) -> None:
        if allocated == 0:
            return
        end = addr + allocated
        i = self.ranges.bisect_left((addr, end))
        if i > 0:
            assert self.ranges[i - 1][1] <= addr, f"block {alloc_id} at {addr:#x} overlaps the one before it"
        if i < len(self.ranges):
            assert self.ranges[i][0] >= end, f"block {alloc_id} at {addr:#x} overlaps the one after it"
        self.ranges.add((addr, end))
        self.by_id[alloc_id] = (addr, end)

    def remove(self, alloc_id: int) -> None:
        if alloc_id in self.by_id:
            self.ranges.remove(self.by_id.pop(alloc_id))


def check_step(policy) -> None:
    """The cheap per-step checks: accounting identities that must hold after every call."""
    reserved = policy.reserved_bytes
    assert policy.allocated_bytes + policy.cached_free_bytes() == reserved
    assert reserved >= policy.allocated_bytes >= policy.requested_bytes
    assert 0 <= policy.largest_free_block_bytes() <= policy.cached_free_bytes()
    if policy.name == "direct":
        assert policy.cached_free_bytes() == 0


def random_size(rs: np.random.RandomState) -> int:
    """Sizes shaped like a training step: mostly small tensors, some activations, a few big buffers."""
    kind = rs.choice(3, p=[0.6, 0.3, 0.1])
    if kind == 0:
        return int(rs.randint(0, 1 * MiB))
    if kind == 1:
        return int(rs.randint(1 * MiB, 10 * MiB))
    return int(rs.randint(10 * MiB, 48 * MiB))


@pytest.mark.full
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_random_mix_keeps_every_invariant(case, seed):
    rs = np.random.RandomState(seed)
    policy = make(case)
    ranges = LiveRanges()
    n_streams = 1 + seed * 2          # seed 0: one stream, seed 1: three
    live: list[int] = []
    pending: list[int] = []
    next_id = 0
    align = policy.address_alignment_bytes
    assert align == EXPECTED_ALIGNMENT.get(inner_name(policy), 512)
    for step in range(500):
        r = rs.rand()
        if r < 0.5:
            size = random_size(rs)
            try:
                addr = policy.malloc(next_id, size, int(rs.randint(n_streams)))
            except OutOfMemory:
                pass
            else:
                assert addr % align == 0
                _, requested, allocated, _ = policy.live[next_id]
                assert requested == size and allocated >= size
                ranges.add(next_id, addr, allocated)
                live.append(next_id)
            next_id += 1
        elif r < 0.7 and live:
            alloc_id = live.pop(rs.randint(len(live)))
            policy.free_requested(alloc_id)
            pending.append(alloc_id)
        elif r < 0.9 and pending:
            alloc_id = pending.pop(rs.randint(len(pending)))
            policy.free_completed(alloc_id)
            ranges.remove(alloc_id)
        elif r < 0.99 and live:
            alloc_id = live.pop(rs.randint(len(live)))
            policy.free(alloc_id)
            ranges.remove(alloc_id)
        else:
            policy.empty_cache()
        check_step(policy)
        if step % 50 == 0:
            policy.check_invariants()
    policy.check_invariants()
    assert policy.n_mallocs + policy.n_ooms == next_id


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_out_of_memory_is_the_policys_error_and_changes_nothing_live(case):
    policy = make(case, capacity_bytes=64 * MiB)
    ids = []
    with pytest.raises(OutOfMemory) as info:
        for alloc_id in range(100):
            policy.malloc(alloc_id, 4 * MiB, 0)
            ids.append(alloc_id)
    assert not isinstance(info.value, DeviceOutOfMemory)
    assert ids, "at least one 4 MiB block fits in 64 MiB"
    before = (dict(policy.live), policy.requested_bytes, policy.allocated_bytes, set(policy.pending))
    for size in (4 * MiB, 128 * MiB):
        with pytest.raises(OutOfMemory):
            policy.malloc(1000, size, 0)
        assert (dict(policy.live), policy.requested_bytes, policy.allocated_bytes, set(policy.pending)) == before
        assert 1000 not in policy.live
        check_step(policy)
        policy.check_invariants()
    assert policy.n_ooms == 3
    for alloc_id in ids:
        policy.free(alloc_id)
    policy.empty_cache()
    assert policy.reserved_bytes == 0


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_cached_memory_is_released_to_serve_a_request_that_fits(case):
    policy = make(case, capacity_bytes=64 * MiB)
    for alloc_id in range(6):
        policy.malloc(alloc_id, 8 * MiB, 0)
    for alloc_id in range(6):
        policy.free(alloc_id)
    failed_before = policy.device.n_failed_mallocs
    policy.malloc(100, 40 * MiB, 0)     # fits only once the cache is given back (or reused)
    policy.check_invariants()
    if case[0] in RELEASES_ON_OOM and not case[1]:
        # Default configurations: the first cudaMalloc failed and the retry after releasing the cache succeeded.
        assert policy.device.n_failed_mallocs == failed_before + 1


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_double_free_and_unknown_ids_raise_invalid_free(case):
    policy = make(case)
    policy.malloc(1, 1000, 0)
    policy.free(1)
    with pytest.raises(InvalidFree):
        policy.free(1)
    with pytest.raises(InvalidFree):
        policy.free_completed(1)
    with pytest.raises(InvalidFree):
        policy.free_requested(99)
    with pytest.raises(InvalidFree):
        policy.free_completed(99)
    policy.malloc(2, 3 * MiB, 0)
    with pytest.raises(InvalidFree):
        policy.malloc(2, 10, 0)           # the id is still live
    policy.free_requested(2)
    with pytest.raises(InvalidFree):
        policy.free_requested(2)
    policy.free_completed(2)
    policy.check_invariants()
    assert policy.allocated_bytes == policy.requested_bytes == 0


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_empty_cache_releases_every_fully_free_segment(case):
    rs = np.random.RandomState(7)
    policy = make(case, capacity_bytes=None)
    ids = list(range(60))
    for alloc_id in ids:
        policy.malloc(alloc_id, random_size(rs), alloc_id % 2)
    keep = set(ids[::5])
    for alloc_id in ids:
        if alloc_id not in keep:
            policy.free(alloc_id)
    policy.empty_cache()
    policy.check_invariants()
    pools = policy.upstream if policy.name == "deferred-gc" else policy
    if isinstance(pools, PoolPolicy) and not getattr(pools, "expandable_segments", False):
        for pool in pools.pools:
            assert pool.whole_free_segments() == [], "a wholly free segment survived empty_cache"
    for alloc_id in keep:
        policy.free(alloc_id)
    policy.empty_cache()
    assert policy.reserved_bytes == 0
    assert policy.cached_free_bytes() == 0


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_zero_byte_requests_are_tracked_without_memory(case):
    policy = make(case)
    policy.malloc(1, 0, 0)
    assert policy.live[1][1] == 0
    policy.free(1)
    policy.check_invariants()
    assert policy.requested_bytes == 0
