"""The driver's address order (``allocsim.driver_addresses``): the rule, its bounds, and the tie it decides."""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from allocsim.device import SimulatedDevice
from allocsim.driver_addresses import CHUNK_BYTES, LOW_DRIVER_TOP_ADDR, TOP_ADDR, FreeRanges
from allocsim.policies import kernel
from allocsim.policies.pytorch import PyTorchPolicy
from allocsim.policies.registry import build_policy
from allocsim.units import MiB

ROUTES = ["reference"] + (["compiled"] if kernel.compiled is not None else [])


# ------------------------------------------------------------------ the free ranges
def _brute(ranges: set[int], size: int, highest: bool) -> int | None:
    """Start of the lowest/highest maximal run of free 1-unit cells at least ``size`` long."""
    runs, start = [], None
    for cell in range(66):
        if cell in ranges and start is None:
            start = cell
        elif cell not in ranges and start is not None:
            runs.append((start, cell - start))
            start = None
    fits = [s for s, n in runs if n >= size]
    return (max(fits) if highest else min(fits)) if fits else None


@given(st.lists(st.tuples(st.sampled_from(["add", "carve", "low", "high"]), st.integers(0, 63),
                          st.integers(1, 8)), max_size=60))
def test_free_ranges_match_a_cell_by_cell_model(ops):
    free, cells = FreeRanges(), set()
    for op, start, size in ops:
        if op == "add":
            free.add(start, size)
            cells |= set(range(start, start + size))
        elif op == "carve":
            free.carve(start, size)
            cells -= set(range(start, start + size))
        else:
            found = free.lowest_fit(size) if op == "low" else free.highest_fit(size)
            assert found == _brute(cells, size, op == "high")
        # Touching free ranges are always one range, and the ranges are exactly the free cells.
        assert {c for s, n in free.size_at.items() for c in range(s, s + n)} == cells
        assert sum(free.size_at.values()) == len(cells)
        assert all(s + n not in free.size_at for s, n in free.size_at.items())
        assert free.start_ending_at == {s + n: s for s, n in free.size_at.items()}


def test_fit_queries_stay_logarithmic():
    """10,000 scattered free ranges: each query is a walk down the tree, not a scan (a trace cannot make it quadratic)."""
    free = FreeRanges()
    for k in range(10_000):
        free.add(k * 10, 1 + k % 7)
    t0 = time.perf_counter()
    for size in range(1, 8):
        for _ in range(1000):
            assert free.highest_fit(size) is not None and free.lowest_fit(size) is not None
    assert time.perf_counter() - t0 < 2.0   # about 0.05 s; a linear scan would take minutes
    assert free.highest_fit(7) == 9_995 * 10 and free.lowest_fit(7) == 6 * 10


# ------------------------------------------------------------------ the rule on a device
def driver_device(**kwargs) -> SimulatedDevice:
    return SimulatedDevice(address_order="driver", **kwargs)


def test_fresh_chunks_go_down_and_small_segments_fill_their_tails():
    dev = driver_device()
    weights = dev.malloc(20 * MiB)
    step = [dev.malloc(512 * MiB) for _ in range(2)]
    small = dev.malloc(2 * MiB)
    # 32 MiB chunks from the top, each below the last; the 2 MiB segment takes the rest of the first chunk.
    assert weights == TOP_ADDR - CHUNK_BYTES
    assert step == [weights - 512 * MiB, weights - 1024 * MiB]
    assert small == weights + 20 * MiB
    assert all(a % CHUNK_BYTES == 0 for a in [weights, *step])


def test_freed_ranges_are_reused_from_the_top_of_the_highest_that_fits():
    dev = driver_device()
    a, b, c = (dev.malloc(256 * MiB) for _ in range(3))
    dev.free(a)
    dev.free(c)
    # Both freed ranges fit 128 MiB: the higher one (a's), at its top.
    assert dev.malloc(128 * MiB) == a + 128 * MiB
    # 300 MiB fits in neither: a fresh chunk below everything.
    assert dev.malloc(300 * MiB) < c
    assert dev.malloc(256 * MiB) == c     # the lower freed range, exactly


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 40), st.sampled_from([2, 2, 20, 22, 40, 64, 512]))))
def test_driver_order_never_overlaps(ops):
    dev, live = driver_device(), []
    for is_free, pick, size_mib in ops:
        if is_free and live:
            dev.free(live.pop(pick % len(live)))
        else:
            live.append(dev.malloc(size_mib * MiB))
    ranges = sorted((a, dev._sizes[a]) for a in live)
    assert all(a + n <= b for (a, n), (b, _m) in zip(ranges, ranges[1:]))
    assert all(a >= LOW_DRIVER_TOP_ADDR for a, _n in ranges)


def test_recorded_and_adopted_ranges_are_never_handed_out_again():
    dev = driver_device()
    first = dev.malloc(20 * MiB)                 # leaves [first + 20 MiB, first + 32 MiB) free
    dev.hint_addresses([(first + 24 * MiB, 2 * MiB)])
    assert dev.malloc(2 * MiB) == first + 24 * MiB
    dev.adopt(first + 20 * MiB, 2 * MiB)
    got = [dev.malloc(2 * MiB) for _ in range(3)]
    assert got == [first + 22 * MiB, first + 26 * MiB, first + 28 * MiB]


def test_a_low_address_driver_keeps_packing_upwards():
    """Segments recorded below 2**44 (WSL, Windows) come from a driver that packs upwards: new ones go above."""
    dev = driver_device()
    dev.adopt(0x704400000, 20 * MiB)
    small = dev.malloc(2 * MiB)
    large = dev.malloc(40 * MiB)
    assert 0x704400000 + 20 * MiB <= small < large          # creation order above the recorded range


def test_the_pytorch_preset_asks_for_the_driver_order_and_others_keep_creation_order():
    assert PyTorchPolicy(SimulatedDevice()).device.address_order == "driver"
    assert build_policy("pytorch", device=SimulatedDevice()).device.address_order == "driver"
    assert PyTorchPolicy(SimulatedDevice(address_order="creation")).device.address_order == "creation"
    for name in ("bestfit", "cupy", "paddle"):
        assert build_policy(name, device=SimulatedDevice()).device.address_order == "creation"
    with pytest.raises(ValueError, match="address_order"):
        SimulatedDevice(address_order="upwards")
    dev = SimulatedDevice()
    dev.malloc(2 * MiB)
    dev.prefer_address_order("driver")           # too late: addresses were handed out already
    assert dev.address_order == "creation"


# ------------------------------------------------------------------ the tie it decides
def _warm_up(route: str, order: str) -> tuple[int, list[int]]:
    """Weights, then a first step that makes two 512 MiB segments, frees them, and asks for 512 MiB again."""
    with kernel.route(route):
        policy = PyTorchPolicy(SimulatedDevice(address_order=order))
        policy.malloc(0, 12 * MiB, 0)                        # weights: a 20 MiB segment
        policy.malloc(1, 512 * MiB, 0)
        policy.malloc(2, 512 * MiB, 0)
        policy.free(1)
        policy.free(2)
        policy.malloc(3, 512 * MiB, 0)                       # two equal free blocks: the lower address wins
        segments = sorted(policy.large.segment_size_at)
        return policy.live[3][0], segments


@pytest.mark.parametrize("route", ROUTES)
def test_equal_free_blocks_go_to_the_segment_the_driver_placed_lowest(route):
    addr, segments = _warm_up(route, "driver")
    weights, first, second = sorted(segments, reverse=True)
    assert first > second and addr == second                 # the newest segment, placed lowest
    addr, segments = _warm_up(route, "creation")
    assert addr == sorted(segments)[1]                       # creation order: the older one


def test_both_routes_place_alike():
    assert len(ROUTES) == 1 or _warm_up("compiled", "driver") == _warm_up("reference", "driver")


@pytest.mark.shared
def test_silmont_warm_up_ties_follow_the_recorded_addresses(shared_dir):
    """``silmont2000`` ran weights (a 20 MiB segment) and a step making seven 512 MiB segments.

    Replayed with the segments placed by the device instead of at their recorded addresses, the
    driver order reproduces every decision; creation order takes the older of three free 512 MiB
    blocks where the real allocator took the newest (lowest) one.
    """
    from validate.fidelity import check_snapshot

    path = shared_dir / "traces" / "pytorch-snapshots" / "silmont2000__mem_snapshot.pickle"
    for route in ROUTES:
        with kernel.route(route):
            driver = check_snapshot(path, 0, recorded_addresses=False)
            creation = check_snapshot(path, 0, recorded_addresses=False, address_order="creation")
        assert driver["address_order"] == "driver" and driver["matched"] == driver["decisions"] == 45
        assert creation["matched"] == 40 and creation["first_mismatch"]["cause"] == "wrong segment"
        assert creation["first_mismatch"]["real"]["addr"] == 0x7F2084000000   # the lowest of the three


@pytest.mark.shared
@pytest.mark.full
def test_the_evidence_command_gives_the_documented_figures(shared_dir):
    """``python -m validate addresses`` over every shared snapshot: the counts docs/addresses.md quotes (7 s)."""
    from validate.addresses import measure

    traces = shared_dir / "traces"
    paths = [p for folder in ("pytorch-snapshots", "scale-series", "state-only-snapshots")
             for p in sorted((traces / folder).glob("*.pickle"))]
    report = measure(paths)
    large, small = report["totals"]["placements"]["large"], report["totals"]["placements"]["small"]
    assert (large["segments"], large["below_all"], large["between"], large["above_all"]) == (2023, 958, 1061, 3)
    assert (small["segments"], small["right_after_a_segment"], small["at_32MiB_boundary"]) == (202, 199, 0)
    assert large["at_32MiB_boundary"] == 1774
    replays = report["totals"]["replays"]
    assert (replays["driver"]["matched"], replays["driver"]["decisions"]) == (20_969, 22_054)
    assert (replays["creation"]["matched"], replays["creation"]["decisions"]) == (13_647, 22_366)
    [wsl] = [r for r in report["series"] if r["earlier"].startswith("Wedsonlin")]
    assert (wsl["new_segments"], wsl["below_all"], wsl["above_all"]) == (282, 0, 271)
    linux = [r for r in report["series"] if not r["earlier"].startswith("Wedsonlin")]
    assert linux and all(r["above_all"] == 0 for r in linux)
