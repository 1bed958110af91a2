"""The ``pytorch`` preset against known answers: PyTorch's sizing rules, its decisions, real snapshots.

Rule references are to ``../shared/research/pytorch.md`` §1. The real-trace tests replay
``torch.cuda.memory._dump_snapshot`` pickles recorded by PyTorch users and compare the preset's
device calls with the ones PyTorch's real allocator recorded in the same file.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from allocsim.device import SimulatedDevice
from allocsim.errors import OutOfMemory
from allocsim.policies import build_policy
from allocsim.policies.pytorch import PyTorchPolicy
from allocsim.settings.divisions import parse_roundup_power2_divisions
from allocsim.policies.pytorch_rules import (
    get_allocation_size,
    oversize_rejects,
    round_size,
    roundup_power2_next_division,
    should_split,
)
from allocsim.trace import read_trace
from allocsim.units import KiB, MiB

SNAPSHOTS = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "pytorch-snapshots"
SILMONT = SNAPSHOTS / "silmont2000__mem_snapshot.pickle"
CONSTRUCTOR_SUN = SNAPSHOTS / "Constructor-Sun__memory_snapshot.pickle"


def replay(trace, policy, device: int | None = None) -> int:
    """Feed a trace's events to a policy in order (the engine's job, minus time and streams); count OOMs."""
    events = trace.events
    if device is not None:
        events = events[events["device"] == device]
    columns = (events[c].tolist() for c in ("kind", "alloc_id", "size_bytes", "stream"))
    ooms = 0
    for kind, alloc_id, size, stream in zip(*columns):
        if kind == 1:
            try:
                policy.malloc(alloc_id, size, stream)
            except OutOfMemory:
                ooms += 1
        elif kind == 2:
            policy.free_requested(alloc_id)
        elif kind == 3:
            policy.free_completed(alloc_id)
        elif kind == 4:
            policy.empty_cache()
    return ooms


def pytorch(capacity_bytes: int | None = None, **kwargs) -> PyTorchPolicy:
    return PyTorchPolicy(SimulatedDevice(capacity_bytes), record_decisions=True, **kwargs)


def device_calls(policy: PyTorchPolicy) -> list[tuple[str, int]]:
    return [(action, size) for action, _addr, size, _stream in policy.decisions]


# ---------------------------------------------------------------------- sizing rules (§1.4-1.7)
@pytest.mark.parametrize("size, expected", [(1, 512), (0, 512), (511, 512), (512, 512), (513, 1024),
                                            (100_000, 100_352), (1 * MiB, 1 * MiB), (1 * MiB + 1, 1 * MiB + 512)])
def test_round_size_rounds_to_512_bytes(size, expected):
    assert round_size(size) == expected


def test_roundup_power2_next_division_matches_the_docs_example():
    # docs/source/notes/cuda.rst: 1200 lies between 1024 and 2048; 4 divisions give 1024, 1280, 1536, 1792.
    assert roundup_power2_next_division(1200, 4) == 1280
    assert roundup_power2_next_division(1024, 4) == 1024           # powers of two are unchanged
    assert roundup_power2_next_division(1280, 4) == 1280
    assert roundup_power2_next_division(5 * MiB + 1, 4) == 6 * MiB
    assert roundup_power2_next_division(3, 4) == 4                 # step 0: next power of two


def test_round_size_applies_divisions_only_above_512_times_divisions():
    four = (4,) * 16
    # The C++ guard `size > kMinBlockSize * divisions` keeps 1200 (< 2048) on the 512-byte grid.
    assert round_size(1200, four) == 1536
    assert round_size(3000, four) == 3072                          # 2048 + 2 * 512
    assert round_size(5 * MiB + 1, four) == 6 * MiB
    assert round_size(300 * MiB, (0,) * 8 + (2,) + (0,) * 7) == 384 * MiB   # 256-512 MiB interval in halves
    assert round_size(300 * MiB, None) == 300 * MiB


def test_roundup_power2_divisions_parse_every_spelling():
    settings = {str(1 << i): 0 for i in range(16)}
    assert parse_roundup_power2_divisions(settings) is None
    assert parse_roundup_power2_divisions({**settings, "256": 4})[8] == 4
    assert parse_roundup_power2_divisions(4) == (4,) * 16
    assert parse_roundup_power2_divisions("4") == (4,) * 16
    table = parse_roundup_power2_divisions("[256:1,512:2,1024:4,>:8]")
    assert table == (1,) * 9 + (2, 4) + (8,) * 5     # index = log2(MB): 256 MB -> 8
    assert parse_roundup_power2_divisions("[1:4,>:2]") == (4,) + (2,) * 15
    assert parse_roundup_power2_divisions("[64:2,256:4]") == (2,) * 7 + (0, 4) + (0,) * 7
    with pytest.raises(ValueError):
        parse_roundup_power2_divisions("[3:4]")
    with pytest.raises(ValueError):
        parse_roundup_power2_divisions(3)


@pytest.mark.parametrize("size, expected", [
    (512, 2 * MiB), (1 * MiB, 2 * MiB),                              # small pool: 2 MiB segments
    (1 * MiB + 512, 20 * MiB), (10 * MiB - 512, 20 * MiB),          # 1-10 MiB: kLargeBuffer
    (10 * MiB, 10 * MiB), (10 * MiB + 512, 12 * MiB), (511 * MiB, 512 * MiB),   # >= 10 MiB: 2 MiB steps
])
def test_get_allocation_size(size, expected):
    assert get_allocation_size(size) == expected


def test_should_split():
    assert should_split(2 * MiB, 2 * MiB - 512, small_pool=True)              # 512 left: split
    assert not should_split(2 * MiB, 2 * MiB, small_pool=True)
    assert not should_split(20 * MiB, 19 * MiB, small_pool=False)             # exactly 1 MiB left: keep
    assert should_split(20 * MiB, 19 * MiB - 512, small_pool=False)           # > 1 MiB left: split
    assert not should_split(100 * MiB, 30 * MiB, small_pool=False, max_split_size_bytes=30 * MiB)
    assert should_split(20 * MiB, 20 * MiB - 512, small_pool=False, expandable_segments=True)


def test_oversize_rules():
    limit = {"max_split_size_bytes": 32 * MiB}
    assert oversize_rejects(40 * MiB, 8 * MiB, **limit)          # small request never takes an oversize block
    assert not oversize_rejects(30 * MiB, 8 * MiB, **limit)
    assert not oversize_rejects(55 * MiB, 36 * MiB, **limit)     # within 20 MiB of the request
    assert oversize_rejects(56 * MiB, 36 * MiB, **limit)         # 20 MiB larger: refused
    assert oversize_rejects(46 * MiB, 36 * MiB, max_non_split_rounding_bytes=10 * MiB, **limit)
    assert not oversize_rejects(1 << 40, 8 * MiB)                # unlimited: anything goes


# ---------------------------------------------------------------------- the policy's decisions
def test_small_requests_share_a_2mib_segment_low_addresses_first():
    policy = pytorch()
    a = policy.malloc(1, 100 * KiB, 0)
    b = policy.malloc(2, 100 * KiB, 0)
    c = policy.malloc(3, 1000, 0)
    assert device_calls(policy) == [("segment_alloc", 2 * MiB)]
    assert b == a + 100 * KiB and c == b + 100 * KiB
    assert policy.live[3][2] == 1024
    assert policy.n_splits == 3 and policy.n_pool_hits == 2


def test_mid_sized_requests_share_a_20mib_segment_and_large_ones_are_rounded():
    policy = pytorch()
    policy.malloc(1, 8 * MiB, 0)
    policy.malloc(2, 8 * MiB, 0)
    policy.malloc(3, 8 * MiB, 0)                  # only 4 MiB left in the first segment
    policy.malloc(4, 13 * MiB, 0)                 # 14 MiB segment, 1 MiB left is not > 1 MiB: no split
    policy.malloc(5, 11 * MiB, 0)                 # best fit: the free 12 MiB tail, taken whole
    assert device_calls(policy) == [("segment_alloc", 20 * MiB), ("segment_alloc", 20 * MiB),
                                    ("segment_alloc", 14 * MiB)]
    assert policy.live[4][2] == 14 * MiB and policy.live[5][2] == 12 * MiB
    assert policy.reserved_bytes == 54 * MiB
    assert policy.cached_free_bytes() == 4 * MiB


def test_free_blocks_are_bound_to_their_stream():
    policy = pytorch()
    policy.malloc(1, 8 * MiB, 1)
    policy.free(1)
    policy.malloc(2, 8 * MiB, 2)                  # stream 1's free 20 MiB is not visible to stream 2
    assert device_calls(policy) == [("segment_alloc", 20 * MiB)] * 2
    assert policy.stranded_bytes(2) == 20 * MiB
    assert policy.stranded_bytes(1) == 12 * MiB
    policy.malloc(3, 8 * MiB, 1)                  # stream 1 reuses its own block
    assert len(policy.decisions) == 2


def test_freed_blocks_coalesce_with_both_neighbours():
    policy = pytorch()
    for alloc_id in (1, 2, 3):
        policy.malloc(alloc_id, 256 * KiB, 0)
    policy.free(1)
    policy.free(3)                                # merges with the free tail of the segment
    policy.free(2)                                # merges with both neighbours
    assert policy.n_merges == 3
    assert policy.small.free_bytes == 2 * MiB
    assert policy.largest_free_block_bytes() == 2 * MiB
    policy.empty_cache()
    assert device_calls(policy) == [("segment_alloc", 2 * MiB), ("segment_free", 2 * MiB)]


def test_empty_cache_frees_only_unsplit_blocks():
    policy = pytorch()
    policy.malloc(1, 8 * MiB, 0)
    policy.malloc(2, 8 * MiB, 0)
    policy.malloc(3, 30 * MiB, 0)
    policy.free(1)
    policy.free(3)
    policy.empty_cache()
    assert device_calls(policy)[-1] == ("segment_free", 30 * MiB)
    assert policy.reserved_bytes == 20 * MiB       # the 20 MiB segment still holds block 2


def test_max_split_size_keeps_oversize_blocks_whole():
    policy = pytorch(max_split_size_bytes=32 * MiB)
    policy.malloc(1, 40 * MiB, 0)
    policy.free(1)
    policy.malloc(2, 8 * MiB, 0)                   # may not take the 40 MiB block: new 20 MiB segment
    policy.malloc(3, 36 * MiB, 0)                  # takes the 40 MiB block whole (< 36 + 20 MiB)
    assert device_calls(policy) == [("segment_alloc", 40 * MiB), ("segment_alloc", 20 * MiB)]
    assert policy.live[3][2] == 40 * MiB
    policy.free(3)
    policy.malloc(4, 18 * MiB, 0)                  # 18 < 32: the 40 MiB block is refused
    assert device_calls(policy)[-1] == ("segment_alloc", 18 * MiB)


def test_oom_releases_cached_blocks_then_retries():
    policy = pytorch(capacity_bytes=64 * MiB)
    policy.malloc(1, 30 * MiB, 0)
    policy.malloc(2, 30 * MiB, 0)
    policy.free(1)
    policy.free(2)
    policy.malloc(3, 40 * MiB, 0)                  # needs release_cached_blocks first
    assert device_calls(policy) == [("segment_alloc", 30 * MiB)] * 2 + [("segment_free", 30 * MiB)] * 2 + [
        ("segment_alloc", 40 * MiB)]
    assert policy.num_alloc_retries == 1
    with pytest.raises(OutOfMemory):
        policy.malloc(4, 30 * MiB, 0)
    assert policy.decisions[-1][0] == "oom"
    assert policy.n_ooms == 1


def test_release_available_cached_blocks_frees_only_what_the_request_needs():
    policy = pytorch(capacity_bytes=100 * MiB, max_split_size_bytes=20 * MiB)
    policy.malloc(1, 40 * MiB, 0)
    policy.malloc(2, 30 * MiB, 0)
    policy.malloc(3, 100 * KiB, 0)
    policy.malloc(4, 20 * MiB, 0)
    for alloc_id in (1, 2, 3, 4):
        policy.free(alloc_id)
    # No cached block fits 50 MiB; oversize blocks are freed from the largest down until 50 MiB are free.
    policy.malloc(5, 50 * MiB, 0)
    assert device_calls(policy)[4:] == [("segment_free", 40 * MiB), ("segment_free", 30 * MiB),
                                        ("segment_alloc", 50 * MiB)]
    assert policy.small.segment_bytes == 2 * MiB   # release_cached_blocks never ran
    assert policy.num_alloc_retries == 0


def test_release_available_cached_blocks_frees_one_block_when_one_is_big_enough():
    policy = pytorch(capacity_bytes=100 * MiB, max_split_size_bytes=20 * MiB)
    policy.malloc(1, 60 * MiB, 0)
    policy.malloc(2, 30 * MiB, 0)
    policy.malloc(3, 100 * KiB, 0)
    for alloc_id in (1, 2, 3):
        policy.free(alloc_id)
    # 8 MiB < max_split_size may not use the oversize blocks; its 20 MiB segment does not fit, so the
    # smallest cached block >= max(8 MiB, max_split_size) -- the 30 MiB one -- is freed, and only it.
    policy.malloc(4, 8 * MiB, 0)
    assert device_calls(policy)[3:] == [("segment_free", 30 * MiB), ("segment_alloc", 20 * MiB)]
    assert policy.reserved_bytes == 82 * MiB
    assert policy.num_alloc_retries == 0


def test_garbage_collection_needs_a_memory_fraction():
    def run(**kwargs):
        policy = pytorch(capacity_bytes=200 * MiB, garbage_collection_threshold=0.5, **kwargs)
        for alloc_id in (1, 2, 3):
            policy.malloc(alloc_id, 30 * MiB, 0)
        for alloc_id in (1, 2, 3):
            policy.free(alloc_id)
        policy.malloc(4, 40 * MiB, 0)
        return policy

    without = run()
    assert without.reserved_bytes == 130 * MiB and without.n_gc_batches == 0
    with_fraction = run(memory_fraction=0.5)       # allowed 100 MiB, GC above 50 MiB
    assert with_fraction.n_gc_batches == 1
    assert with_fraction.reserved_bytes == 40 * MiB
    assert device_calls(with_fraction)[3:] == [("segment_free", 30 * MiB)] * 3 + [("segment_alloc", 40 * MiB)]


def test_memory_fraction_caps_reserved_memory():
    policy = pytorch(capacity_bytes=200 * MiB, memory_fraction=0.25)
    policy.malloc(1, 40 * MiB, 0)
    with pytest.raises(OutOfMemory):
        policy.malloc(2, 12 * MiB, 0)              # 40 + 12 > 50 MiB allowed, the device has room
    assert policy.device.n_failed_mallocs == 0


def test_expandable_segments_map_pages_and_unmap_them_on_empty_cache():
    policy = pytorch(expandable_segments=True)
    policy.malloc(1, 100 * KiB, 0)                 # small pool: one 2 MiB page
    policy.malloc(2, 19 * MiB + 512 * KiB, 0)      # large pool: one 20 MiB page, split (small-pool rule)
    policy.malloc(3, 30 * MiB, 0)                  # 512 KiB left + 29.5 MiB more: two more pages
    assert device_calls(policy) == [("segment_map", 2 * MiB), ("segment_map", 20 * MiB),
                                    ("segment_map", 40 * MiB)]
    assert policy.live[2][2] == 19 * MiB + 512 * KiB
    assert policy.reserved_bytes == 62 * MiB
    assert policy.device.n_maps == 3 and policy.device.map_bytes == 62 * MiB
    policy.free(3)
    policy.empty_cache()                           # pages wholly inside the free tail go back
    assert device_calls(policy)[-1] == ("segment_unmap", 40 * MiB)
    assert policy.device.n_unmaps == 1 and policy.device.unmapped_bytes == 40 * MiB
    policy.free(1)
    policy.free(2)
    policy.empty_cache()
    assert policy.reserved_bytes == 0
    policy.check_invariants()


def test_decisions_are_recorded_only_when_asked():
    policy = PyTorchPolicy(SimulatedDevice())
    policy.malloc(1, 8 * MiB, 0)
    assert policy.decisions == [] and policy.device.n_mallocs == 1


def test_allocator_settings_become_constructor_kwargs_and_params_override_them():
    settings = {"max_split_size": -1, "garbage_collection_threshold": 0.0, "expandable_segments": True,
                "roundup_power2_divisions": {str(1 << i): 0 for i in range(16)}, "PYTORCH_CUDA_ALLOC_CONF": "x"}
    assert PyTorchPolicy.from_allocator_settings(settings) == {
        "max_split_size_bytes": None, "garbage_collection_threshold": 0.0, "expandable_segments": True,
        "roundup_power2_divisions": None}
    assert PyTorchPolicy.from_allocator_settings({"max_split_size": 256 * MiB})["max_split_size_bytes"] == 256 * MiB
    device = SimulatedDevice()
    assert build_policy("pytorch", device=device, allocator_settings=settings).expandable_segments
    policy = build_policy("pytorch", device=device, allocator_settings=settings,
                          params={"expandable_segments": "false", "max_split_size": "256MiB"})
    assert not policy.expandable_segments and policy.max_split_size_bytes == 256 * MiB


# ---------------------------------------------------------------------- real snapshots
@pytest.mark.shared
def test_silmont_snapshot_makes_the_same_nine_segments_as_pytorch():
    if not SILMONT.is_file():
        pytest.skip(f"{SILMONT} is absent")
    trace = read_trace(SILMONT)
    assert trace.initial_allocs.empty                       # the window starts from an empty device
    policy = build_policy("pytorch", device=SimulatedDevice(), allocator_settings=trace.meta.allocator_settings,
                          params={"record_decisions": True})
    replay(trace, policy)
    decisions = trace.decisions
    real_sizes = decisions.loc[decisions["action"] == "segment_alloc", "size_bytes"].tolist()
    assert policy.device.n_mallocs == 9
    assert policy.device.peak_reserved_bytes == 3_781_165_056
    assert [size for action, size in device_calls(policy)] == real_sizes
    assert sum(real_sizes) == 3_781_165_056


@pytest.mark.shared
@pytest.mark.parametrize("device, capacity_bytes", [(0, None), (1, 84_298_432_512), (2, None)])
def test_expandable_snapshot_maps_and_unmaps_exactly_like_pytorch(device, capacity_bytes):
    """Constructor-Sun ran with expandable_segments:True on three GPUs; GPU 1 ran out of memory.

    GPU 1's capacity is the reserved bytes at its ``oom`` entry plus the free bytes it reported, so
    the replay releases cache at the same request and then fails the request that really failed
    (the trace layer made it an ALLOC event: it left no ``alloc`` entry).
    """
    if not CONSTRUCTOR_SUN.is_file():
        pytest.skip(f"{CONSTRUCTOR_SUN} is absent")
    trace = read_trace(CONSTRUCTOR_SUN)
    policy = build_policy("pytorch", device=SimulatedDevice(capacity_bytes),
                          allocator_settings=trace.meta.allocator_settings, params={"record_decisions": True})
    assert replay(trace, policy, device=device) == (1 if device == 1 else 0)
    decisions = trace.decisions[(trace.decisions["device"] == device)
                                & trace.decisions["action"].str.startswith("segment_")]
    real = list(zip(decisions["action"], decisions["size_bytes"]))
    assert [call for call in device_calls(policy) if call[0] != "oom"] == real
    # Offsets inside the large pool's segment match too, not just sizes.
    real_base = int(decisions["addr"].iloc[0])
    sim_base = policy.decisions[0][1]
    large = [(a, addr - sim_base) for a, addr, size, _ in policy.decisions if size % (20 * MiB) == 0]
    real_large = [(a, int(addr) - real_base) for a, addr, size in
                  zip(decisions["action"], decisions["addr"], decisions["size_bytes"]) if size % (20 * MiB) == 0]
    assert large == real_large
    policy.check_invariants()


@pytest.mark.shared
def test_load_state_takes_over_a_real_start_state_exactly():
    """MAGMA27's window starts mid-run: 216 segments, 227 live blocks, the free gaps between them."""
    path = SNAPSHOTS / "MAGMA27__memory_snapshot.pickle"
    if not path.is_file():
        pytest.skip(f"{path} is absent")
    trace = read_trace(path)
    policy = build_policy("pytorch", device=SimulatedDevice(), allocator_settings=trace.meta.allocator_settings,
                          params={"record_decisions": True})
    policy.load_state(trace.initial_segments, trace.initial_blocks)
    policy.check_invariants()
    assert policy.reserved_bytes == int(trace.initial_segments["size_bytes"].sum()) == 14_180_941_824
    live = trace.initial_blocks[trace.initial_blocks["alloc_id"] >= 0]
    assert len(policy.live) == len(live) == len(trace.initial_allocs)
    assert policy.allocated_bytes == int(live["size_bytes"].sum())
    replay(trace, policy)                     # every free of a pre-window block finds its block
    assert policy.decisions == [] and policy.device.peak_reserved_bytes == 14_180_941_824
    policy.check_invariants()


def test_max_split_size_below_20_mib_is_refused_like_pytorch():
    import pytest as _pytest

    from allocsim.device import SimulatedDevice
    from allocsim.policies.registry import build_policy

    with _pytest.raises(ValueError, match="at least 20971520"):
        build_policy("pytorch", device=SimulatedDevice(), params={"max_split_size": "8MiB"})
    assert build_policy("pytorch", device=SimulatedDevice(), params={"max_split_size": "20MiB"}).max_split_size_bytes == 20 << 20
