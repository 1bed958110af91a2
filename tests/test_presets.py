"""Presets other than PyTorch, the deferred-GC adaptor and the registry, against the rules in the notes.

Rule references: ``../shared/research/paddle_cupy.md`` (Paddle auto_growth §1.2, naive_best_fit
§1.3, StreamSafe §1.4, eager-deletion GC §2, CuPy §3) and ``rmm_peers.md`` §2 (cudaMallocAsync).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from allocsim.policies.adaptors import DeferredGC
from allocsim.device import SimulatedDevice
from allocsim.errors import OutOfMemory
from allocsim.policies import build_policy, parse_param, policy_specs
from allocsim.trace import read_trace
from allocsim.units import GiB, KiB, MiB

SNAPSHOTS = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "pytorch-snapshots"
NAMES = {"direct", "bestfit", "stream-bound", "deferred-gc", "pytorch", "paddle", "paddle-naive", "cupy",
         "cuda-async"}


def build(name: str, capacity_bytes: int | None = None, **params):
    return build_policy(name, device=SimulatedDevice(capacity_bytes), params=params)


# ---------------------------------------------------------------------- paddle (auto_growth)
def test_paddle_rounds_to_256_bytes_and_carves_from_the_high_end():
    policy = build("paddle", chunk_size="1MiB")
    a = policy.malloc(1, 1000, 0)
    b = policy.malloc(2, 1000, 0)
    base = next(iter(policy.large.segment_size_at))
    assert policy.live[1][2] == 1024
    assert a == base + 1 * MiB - 1024 and b == a - 1024      # the free remainder stays at the low end
    assert policy.device.n_mallocs == 1
    assert policy.large.size_at[base] == 1 * MiB - 2048


def test_paddle_default_chunk_is_the_request_itself():
    policy = build("paddle")
    policy.malloc(1, 1000, 0)
    policy.malloc(2, 5000, 0)
    assert sorted(policy.large.segment_size_at.values()) == [1024, 5120]
    assert policy.cached_free_bytes() == 2 * (2 * MiB) - 1024 - 5120   # only the driver's rounding is spare


def test_paddle_pools_are_per_stream_and_oom_releases_own_stream_first():
    policy = build("paddle", capacity_bytes=6 * MiB, chunk_size="2MiB")
    for alloc_id, stream in ((1, 0), (2, 1), (3, 2)):
        policy.malloc(alloc_id, 2 * MiB, stream)
        policy.free(alloc_id)
    assert policy.device.n_mallocs == 3                       # no cross-stream reuse
    policy.malloc(4, 4 * MiB, 0)
    # 1st cudaMalloc fails -> stream 0's idle chunk goes -> still too big -> every stream's idle chunks go.
    assert policy.device.n_failed_mallocs == 2
    assert policy.device.n_frees == 3


def test_paddle_free_idle_chunk_returns_chunks_at_once():
    policy = build("paddle", free_idle_chunk="true")
    policy.malloc(1, 3 * MiB, 0)
    policy.free(1)
    assert policy.reserved_bytes == 0


# ---------------------------------------------------------------------- paddle-naive (naive_best_fit)
def test_paddle_naive_reserves_a_fraction_of_free_memory_and_adds_a_header():
    policy = build("paddle-naive", capacity_bytes=1 * GiB)
    policy.malloc(1, 1000, 0)
    policy.malloc(2, 192, 0)
    policy.malloc(3, 193, 0)
    assert [policy.live[i][2] for i in (1, 2, 3)] == [1280, 256, 512]
    (chunk,) = policy.large.segment_size_at.values()
    expected = int((GiB - int(np.float32(0.05) * np.float32(GiB))) * 0.92)   # (free - 5 %) x fraction
    assert chunk == expected
    assert 0.8739 * GiB < chunk < 0.8741 * GiB                          # 0.95 x 0.92
    assert policy.device.n_mallocs == 1


def test_paddle_naive_sends_huge_requests_to_the_device_and_never_releases_on_oom():
    policy = build("paddle-naive", capacity_bytes=1 * GiB)
    policy.malloc(1, 100 * MiB, 0)
    policy.free(1)                                            # the chunk is wholly free again
    with pytest.raises(OutOfMemory):
        policy.malloc(2, 900 * MiB, 0)                        # > the largest chunk: direct cudaMalloc
    assert policy.device.n_frees == 0                         # the free chunk was not given back
    policy.empty_cache()
    policy.malloc(3, 900 * MiB, 0)
    assert policy.device.n_mallocs == 2
    policy.free(3)
    assert policy.reserved_bytes == 0                         # huge chunks go straight back


def test_paddle_naive_refills_with_a_fraction_of_what_is_left():
    policy = build("paddle-naive", capacity_bytes=1 * GiB, initial_gpu_memory="64MiB",
                   reallocate_gpu_memory="32MiB")
    policy.malloc(1, 60 * MiB, 0)
    policy.malloc(2, 20 * MiB, 0)                             # 4 MiB left in the first chunk: refill 32 MiB
    assert sorted(policy.large.segment_size_at.values()) == [32 * MiB, 64 * MiB]


# ---------------------------------------------------------------------- cupy
def test_cupy_uses_512_byte_units_and_exact_segments():
    policy = build("cupy")
    policy.malloc(1, 1, 0)
    policy.malloc(2, 3000, 0)
    assert policy.live[1][2] == 512 and policy.live[2][2] == 3072
    assert sorted(policy.large.segment_size_at.values()) == [512, 3072]
    policy.free(2)
    addr = policy.malloc(3, 1000, 0)                          # best fit in the 3072 B chunk, low end
    assert addr == policy.live[3][0] and policy.large.free_bytes == 2048
    assert policy.device.n_mallocs == 2


def test_cupy_arenas_are_per_stream_and_free_all_blocks_spans_them():
    policy = build("cupy", capacity_bytes=8 * MiB)
    policy.malloc(1, 4 * MiB, 0)
    policy.free(1)
    policy.malloc(2, 4 * MiB, 1)                              # stream 0's chunk is not reused
    policy.free(2)
    assert policy.device.n_mallocs == 2
    policy.malloc(3, 6 * MiB, 2)
    assert policy.device.n_failed_mallocs == 1 and policy.device.n_frees == 2


def test_cupy_limit_frees_cached_blocks_before_refusing():
    policy = build("cupy", limit="10MiB")
    policy.malloc(1, 6 * MiB, 0)
    policy.free(1)
    policy.malloc(2, 6 * MiB, 1)                              # 12 MiB > limit: free_all_blocks, then fits
    assert policy.device.n_frees == 1 and policy.device.n_failed_mallocs == 0
    with pytest.raises(OutOfMemory):
        policy.malloc(3, 6 * MiB, 1)


# ---------------------------------------------------------------------- cuda-async
def test_cuda_async_grows_in_32mib_steps_and_trims_to_the_threshold():
    policy = build("cuda-async", release_threshold="64MiB")
    for alloc_id in range(4):
        policy.malloc(alloc_id, 40 * MiB, alloc_id % 2)
    assert policy.reserved_bytes == 4 * 64 * MiB
    for alloc_id in range(4):
        policy.free(alloc_id)
    assert policy.reserved_bytes == 64 * MiB                  # held back to the release threshold
    policy.malloc(10, 40 * MiB, 3)                            # any stream reuses the pool
    assert policy.device.n_mallocs == 4
    policy.free(10)
    policy.empty_cache()
    assert policy.reserved_bytes == 0


def test_cuda_async_with_threshold_zero_returns_memory_at_every_sync():
    policy = build("cuda-async")
    policy.malloc(1, 1, 0)
    assert policy.reserved_bytes == 32 * MiB
    policy.malloc(2, 33 * MiB, 0)
    assert policy.reserved_bytes == 96 * MiB
    policy.free(2)
    assert policy.reserved_bytes == 32 * MiB
    policy.free(1)
    assert policy.reserved_bytes == 0 and policy.n_trims == 2


# ---------------------------------------------------------------------- bestfit and stream-bound
@pytest.mark.parametrize("growth, chunk, size, segment", [
    ("exact", "2MiB", 3000, 3072), ("chunk", "4MiB", 3000, 4 * MiB), ("chunk", "4MiB", 5 * MiB, 5 * MiB),
    ("round", "4MiB", 5 * MiB, 8 * MiB), ("pytorch", "2MiB", 3 * MiB, 20 * MiB),
])
def test_bestfit_growth_rules(growth, chunk, size, segment):
    policy = build("bestfit", growth=growth, chunk=chunk)
    policy.malloc(1, size, 0)
    assert list(policy.large.segment_size_at.values()) == [segment]


def test_bestfit_split_rule_and_cross_stream_reuse():
    policy = build("bestfit", growth="chunk", chunk="10MiB", min_split_remainder="1MiB")
    policy.malloc(1, 10 * MiB - 512 * KiB, 0)                 # 512 KiB left < 1 MiB: not split
    assert policy.live[1][2] == 10 * MiB and policy.n_splits == 0
    policy.free(1)
    policy.malloc(2, 4 * MiB, 1)                              # not stream-bound: stream 1 reuses it
    assert policy.device.n_mallocs == 1 and policy.n_splits == 1 and policy.n_pool_hits == 1


def test_stream_bound_reports_stranded_bytes():
    policy = build("stream-bound")
    policy.malloc(1, 8 * MiB, 0)
    policy.free(1)
    policy.malloc(2, 8 * MiB, 1)
    assert policy.device.n_mallocs == 2
    assert policy.stranded_bytes() == 8 * MiB                 # the last request's stream is 1
    assert policy.stranded_bytes(0) == 0


def test_stream_bound_reuses_a_block_only_after_its_free_completes():
    policy = build("stream-bound", cross_stream_reuse="true")
    policy.malloc(1, 8 * MiB, 0)
    policy.free_requested(1)
    policy.malloc(2, 4 * MiB, 1)                              # pending: not reusable yet
    assert policy.device.n_mallocs == 2
    policy.free_completed(1)
    policy.malloc(3, 4 * MiB, 1)                              # now stream 1 may take stream 0's block
    assert policy.device.n_mallocs == 2 and policy.n_cross_stream_hits == 1
    assert policy.stranded_bytes(0) == 0 and policy.stranded_bytes(1) == 4 * MiB
    policy.free(3)                                            # goes back to its owner, stream 0
    assert policy.large.free_bytes_by_stream[0] == 8 * MiB
    policy.check_invariants()


# ---------------------------------------------------------------------- deferred GC
def test_deferred_gc_batches_completed_frees():
    policy = build("deferred-gc", inner="bestfit", threshold="10MiB")
    for alloc_id in range(3):
        policy.malloc(alloc_id, 4 * MiB, 0)
    policy.free(0)
    policy.free(1)
    assert policy.queued_bytes == 8 * MiB
    assert policy.upstream.allocated_bytes == 12 * MiB and policy.allocated_bytes == 4 * MiB
    assert policy.cached_free_bytes() == 8 * MiB
    policy.free(2)                                            # 12 MiB >= 10 MiB: one batch
    assert policy.queued_bytes == 0 and policy.upstream.allocated_bytes == 0
    assert policy.n_gc_batches == 1 and policy.n_deferred_frees == 3
    policy.check_invariants()


def test_deferred_gc_threshold_zero_frees_at_once_and_empty_cache_flushes():
    now = build("deferred-gc", inner="cupy")
    now.malloc(1, 4 * MiB, 0)
    now.free(1)
    assert now.upstream.allocated_bytes == 0 and now.n_gc_batches == 0
    later = build("deferred-gc", inner="cupy", threshold="1GiB")
    later.malloc(1, 4 * MiB, 0)
    later.free(1)
    later.malloc(1, 4 * MiB, 0)                               # the id is reused while its block is queued
    assert later.upstream.allocated_bytes == 8 * MiB
    later.free(1)
    later.empty_cache()
    assert later.reserved_bytes == 0 and later.n_gc_batches == 1
    assert later.upstream.n_gc_batches == 0                   # each layer counts its own events


def training_like_trace(steps: int = 4, seed: int = 0) -> list[tuple[int, int, int]]:
    """A forward/backward loop: activations freed in reverse, gradients and temporaries in between."""
    rs = np.random.RandomState(seed)
    layer_sizes = [int(s) for s in rs.choice([2, 4, 8, 16, 24, 48], size=24) * MiB]
    ops: list[tuple[int, int, int]] = []     # (kind, alloc_id, size): 1 malloc, 3 free
    next_id = 0
    weights = []
    for size in layer_sizes[:8]:
        ops.append((1, next_id, size // 2))
        weights.append(next_id)
        next_id += 1
    for _ in range(steps):
        acts = []
        for size in layer_sizes:
            ops.append((1, next_id, size))
            acts.append(next_id)
            tmp = next_id + 1
            ops.append((1, tmp, size // 4 + int(rs.randint(1, 1000))))
            ops.append((3, tmp, 0))
            next_id += 2
        for act in reversed(acts):
            grad = next_id
            next_id += 1
            ops.append((1, grad, 8 * MiB))
            ops.append((3, act, 0))
            ops.append((3, grad, 0))
    return ops


def peak_with_threshold(ops, threshold: str, inner: str = "paddle") -> int:
    policy = build("deferred-gc", inner=inner, threshold=threshold)
    for kind, alloc_id, size in ops:
        if kind == 1:
            policy.malloc(alloc_id, size, 0)
        else:
            policy.free(alloc_id)
    return policy.device.peak_reserved_bytes


THRESHOLDS = ["0", "64MiB", "256MiB", "1GiB"]


@pytest.mark.parametrize("inner", ["paddle", "pytorch", "cupy"])
def test_a_higher_gc_threshold_raises_peak_reserved_on_a_training_loop(inner):
    ops = training_like_trace()
    peaks = [peak_with_threshold(ops, t, inner) for t in THRESHOLDS]
    assert peaks == sorted(peaks), peaks
    assert peaks[-1] > peaks[0]


@pytest.mark.shared
def test_a_higher_gc_threshold_raises_peak_reserved_on_a_real_trace():
    path = SNAPSHOTS / "silmont2000__memory_forward_fp32_128.pickle"
    if not path.is_file():
        pytest.skip(f"{path} is absent")
    trace = read_trace(path)
    initial = set(trace.initial_allocs["alloc_id"].tolist())   # live before the window, never freed in it
    events = trace.events
    ops = [(1 if k == 1 else 3, a, s) for k, a, s in
           zip(events["kind"].tolist(), events["alloc_id"].tolist(), events["size_bytes"].tolist())
           if k in (1, 3) and a not in initial]
    peaks = [peak_with_threshold(ops, t) for t in THRESHOLDS]
    assert peaks == sorted(peaks) and peaks[-1] > peaks[0], peaks


# ---------------------------------------------------------------------- registry
def test_registry_lists_every_policy_with_typed_parameters():
    specs = policy_specs()
    assert {spec.name for spec in specs} == NAMES
    for spec in specs:
        assert spec.description
        for param in spec.params:
            assert param.unit in {"bytes", "fraction", "bool", ""}
            assert param.doc and isinstance(param.type, type)
            assert parse_param(param, param.default) == param.default or param.default is None
        policy = build_policy(spec.name, device=SimulatedDevice())
        assert policy.name == spec.name


def test_registry_parses_command_line_strings():
    policy = build("pytorch", max_split_size="256MiB", expandable_segments="true", garbage_collection_threshold="0.5",
                   memory_fraction="0.8", roundup_power2_divisions="[256:2,>:4]")
    assert policy.max_split_size_bytes == 256 * MiB and policy.expandable_segments
    assert policy.garbage_collection_threshold == 0.5 and policy.memory_fraction == 0.8
    assert policy.roundup_power2_divisions[8] == 2
    assert build("pytorch", max_split_size="unlimited").max_split_size_bytes is None
    assert build("pytorch", max_split_size_bytes=str(64 * MiB)).max_split_size_bytes == 64 * MiB
    gc = build("deferred-gc", threshold="1GiB", inner="pytorch", max_split_size="32MiB")
    assert isinstance(gc, DeferredGC) and gc.threshold_bytes == GiB
    assert gc.upstream.max_split_size_bytes == 32 * MiB
    assert build("stream-bound", cross_stream_reuse="no").cross_stream_reuse is False
    assert build("paddle-naive", fraction_of_gpu_memory_to_use="0.5").fraction_of_gpu_memory_to_use == 0.5


def test_registry_rejects_unknown_names_keys_and_values():
    with pytest.raises(ValueError, match="known: direct"):
        build("tcmalloc")
    with pytest.raises(ValueError, match="valid: max_split_size, max_non_split_rounding"):
        build("pytorch", max_split_mb="1")
    with pytest.raises(ValueError, match="valid: inner, threshold, chunk_size"):
        build("deferred-gc", bogus="1")
    with pytest.raises(ValueError, match="expandable_segments"):
        build("pytorch", expandable_segments="maybe")
    with pytest.raises(ValueError, match="max_split_size"):
        build("pytorch", max_split_size="lots")
    with pytest.raises(ValueError):
        build("deferred-gc", inner="deferred-gc")
    with pytest.raises(ValueError):
        build("bestfit", growth="doubling")


def test_accepted_params_include_the_inner_policys_for_deferred_gc():
    from allocsim.policies import accepted_params

    names = [p.name for p in accepted_params("deferred-gc", {"inner": "pytorch"})]
    assert names[:2] == ["inner", "threshold"] and "max_split_size" in names
    assert [p.name for p in accepted_params("cupy")] == ["limit"]


def test_allocator_settings_reach_only_pytorch():
    settings = {"expandable_segments": True, "max_split_size": -1}
    device = SimulatedDevice()
    assert build_policy("pytorch", device=device, allocator_settings=settings).expandable_segments
    assert build_policy("cupy", device=device, allocator_settings=settings).name == "cupy"
    inner = build_policy("deferred-gc", device=device, params={"inner": "pytorch"}, allocator_settings=settings)
    assert inner.upstream.expandable_segments
