"""Every setting ``advise`` tries, and any valid ``PYTORCH_CUDA_ALLOC_CONF``, replays every real snapshot.

A valid setting must never crash the core: each run ends in a verdict (fits or out of memory) and
the policy's books still balance. The default suite replays a sample of the ``advise`` grid on
every shared snapshot at the real peak and at a tight capacity (where the out-of-memory path
releases cached blocks);
``pytest -m slow tests/test_knob_combinations.py`` replays the whole grid at three capacities.
"""

from __future__ import annotations

import itertools
import random
import subprocess
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocsim.advise.knobs import preset_for
from allocsim.settings.alloc_conf import parse_alloc_conf
from allocsim.commands.run import EXIT_OOM
from allocsim.device import SimulatedDevice
from allocsim.engine import run_fast
from allocsim.metrics.state import is_state_only
from allocsim.policies.freelist import ADDR_BITS, ADDR_MASK
from allocsim.policies.pytorch import PyTorchPolicy
from allocsim.policies.registry import build_policy
from allocsim.trace import read_trace
from allocsim.trace.inference.recorded import recorded_run

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
FOLDERS = ("pytorch-snapshots", "scale-series")
MiB = 1 << 20


def _snapshot_files() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (TRACES / folder).glob("*.pickle"))


@lru_cache(maxsize=None)
def _device_traces() -> tuple[tuple[str, Any], ...]:
    """(label, one-device trace) for every device with history of every shared snapshot."""
    out = []
    for path in _snapshot_files():
        trace = read_trace(path)
        if is_state_only(trace):
            continue
        for device in trace.devices:
            out.append((f"{path.stem}:{device}", trace.for_device(device)))
    return tuple(out)


def device_traces() -> tuple[tuple[str, Any], ...]:
    if not TRACES.is_dir():
        pytest.skip("../shared/traces is not beside this checkout")
    return _device_traces()


def capacities(trace: Any) -> dict[str, int | None]:
    """Unlimited, the real run's peak reserved, and a tight one where the release paths run."""
    peak = recorded_run(trace, trace.devices[0]).peak_reserved_bytes
    largest = int(max(np.max(trace.initial_allocs["size_bytes"].to_numpy(), initial=0),
                      np.max(trace.column("size_bytes"), initial=0)))
    tight = max(largest, peak * 85 // 100) // (2 * MiB) * (2 * MiB) + 2 * MiB
    return {"unlimited": None, "peak": peak, "tight": tight}


def grid(trace: Any) -> list[dict[str, Any]]:
    """Every combination of the knobs ``advise --policy pytorch`` searches on this trace."""
    knobs = preset_for("pytorch", trace.meta.allocator_settings, 1 << 40).knobs()
    combos = []
    for choices in itertools.product(*(knob.choices for knob in knobs)):
        params: dict[str, Any] = {}
        for choice in choices:
            params.update(choice.params)
        combos.append(params)
    return combos


def replay(trace: Any, params: dict[str, Any], capacity_bytes: int | None) -> dict[str, Any]:
    """Replay to the end (or the first OOM) and check the policy's invariants; any exception fails."""
    policy = build_policy("pytorch", device=SimulatedDevice(capacity_bytes), params=dict(params),
                          allocator_settings=trace.meta.allocator_settings)
    summary = run_fast(trace, policy).summary
    policy.check_invariants()
    assert summary["completed"] or summary["oom"] is not None
    assert capacity_bytes is None or summary["peak_reserved_bytes"] <= capacity_bytes
    return summary


# ----------------------------------------------------------------------------- the crash itself
@pytest.mark.shared
def test_release_passes_over_free_pieces_of_split_segments():
    """A start state recorded without max_split_size holds a 231 MiB free piece of a partly used segment:
    release_available_cached_blocks must release a whole segment, never take that piece for one."""
    path = TRACES / "pytorch-snapshots" / "MAGMA27__memory_snapshot.pickle"
    if not path.exists():
        pytest.skip("../shared/traces is not beside this checkout")
    trace = read_trace(path)
    policy = PyTorchPolicy(SimulatedDevice(None), max_split_size_bytes=64 * MiB, record_decisions=True)
    policy.load_state(trace.initial_segments, trace.initial_blocks)
    stream = int(trace.initial_segments["stream"].iloc[0])
    pieces = [k for k in policy.large.keys(stream)
              if k >> ADDR_BITS >= 64 * MiB and not policy.large.is_whole_free(k & ADDR_MASK)]
    assert [k >> ADDR_BITS for k in pieces] == [242_647_040]    # the free piece of a split segment
    piece_addr = pieces[0] & ADDR_MASK
    assert policy.large.segment_size(piece_addr) is None        # not a segment's base

    # 200 MiB: the best fit at or above it is that piece; the next whole segment is released instead.
    assert policy._release_available_cached_blocks(policy.large, stream, 200 * MiB)
    [(action, addr, size, _stream)] = policy.decisions
    assert action == "segment_free" and size >= 200 * MiB and addr != piece_addr
    assert policy.large.block_size(piece_addr) == 242_647_040
    policy.check_invariants()


@pytest.mark.full
@pytest.mark.shared
def test_max_split_with_roundup_on_a_real_snapshot_gives_a_verdict(tmp_path):
    """The command of the bug report, on the snapshot that crashed: a verdict, never a traceback."""
    path = TRACES / "pytorch-snapshots" / "MAGMA27__memory_snapshot.pickle"
    if not path.exists():
        pytest.skip("../shared/traces is not beside this checkout")
    peak = recorded_run(read_trace(path), 0).peak_reserved_bytes
    proc = subprocess.run([sys.executable, "-m", "allocsim", "run", str(path), "--policy", "pytorch",
                           "--alloc-conf", "max_split_size_mb:64,roundup_power2_divisions:2",
                           "--capacity", f"{peak}B", "--fast"], capture_output=True, text=True, timeout=300)
    assert "Traceback" not in proc.stderr and proc.returncode in (0, EXIT_OOM), proc.stderr
    assert proc.stdout.rstrip().splitlines()[-1].startswith(("FITS", "OUT OF MEMORY"))


# ----------------------------------------------------------------------------- the advise grid
def _sample(label: str, combos: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Two settings per trace: the smallest max_split_size with rounding (the most oversize blocks,
    where recorded start states clash with the rule), and one drawn from the rest of the grid."""
    both = [c for c in combos if c.get("max_split_size") == 64 * MiB and c.get("roundup_power2_divisions") == "2"]
    return [both[0], random.Random(label).choice(combos)]


@pytest.mark.full
@pytest.mark.shared
def test_sampled_advise_grid_on_every_snapshot():
    """On every shared trace the smallest max_split_size with rounding at the real run's peak reserved;
    on every third one also a setting drawn from the grid at a tight capacity."""
    runs = 0
    for k, (label, trace) in enumerate(device_traces()):
        caps = capacities(trace)
        sample = _sample(label, grid(trace))[:1 if k % 3 else 2]   # the drawn setting on every third trace
        for params, cap in zip(sample, (caps["peak"], caps["tight"])):
            try:
                replay(trace, params, cap)
            except Exception as exc:   # name the row: which trace and which setting crashed
                raise AssertionError(f"{label} {params} at {cap} bytes: {type(exc).__name__}: {exc}") from exc
            runs += 1
    assert runs >= 30 + 10   # 30+ device traces are shared: a missing folder must not pass quietly


@pytest.mark.slow
@pytest.mark.shared
def test_whole_advise_grid_on_every_snapshot_at_three_capacities():
    failures, runs = [], 0
    for label, trace in device_traces():
        for cap_name, cap in capacities(trace).items():
            for params in grid(trace):
                try:
                    replay(trace, params, cap)
                except Exception as exc:
                    failures.append(f"{label} {params} {cap_name}={cap}: {type(exc).__name__}: {exc}")
                runs += 1
        print(f"{label}: {runs} replays so far, {len(failures)} failed", flush=True)   # progress under -s
    print(f"{runs} replays of the advise grid")
    assert not failures, f"{len(failures)} of {runs} replays failed:\n" + "\n".join(failures[:20])


# ----------------------------------------------------------------------------- random settings
def _divisions() -> st.SearchStrategy[str]:
    power = st.sampled_from([0, 1, 2, 4, 8, 16, 32])
    one = power.filter(bool).map(str)        # 0 (off) only inside a list, as PyTorch's parser takes it
    keys = st.lists(st.integers(0, 15), min_size=1, max_size=4, unique=True).map(sorted)
    table = st.tuples(keys, st.lists(power, min_size=5, max_size=5), st.booleans()).map(
        lambda t: "[" + ",".join([f"{1 << k}:{d}" for k, d in zip(t[0], t[1])]
                                 + ([f">:{t[1][-1]}"] if t[2] else [])) + "]")
    return st.one_of(one, table)


def alloc_conf_strings() -> st.SearchStrategy[str]:
    """Valid ``PYTORCH_CUDA_ALLOC_CONF`` values over the keys the native allocator's placement reads."""
    items = st.fixed_dictionaries({}, optional={
        "max_split_size_mb": st.integers(20, 4096).map(str),
        "max_non_split_rounding_mb": st.integers(20, 1024).map(str),
        "roundup_power2_divisions": _divisions(),
        "garbage_collection_threshold": st.floats(0.01, 0.99).map(lambda v: f"{v:.3f}"),
        "per_process_memory_fraction": st.floats(0.05, 1.0).map(lambda v: f"{v:.3f}"),
        "expandable_segments": st.sampled_from(["True", "False"]),
    })
    return items.map(lambda d: ",".join(f"{k}:{v}" for k, v in d.items()))


def _random_conf_case(label_index: int, text: str, cap_name: str) -> None:
    traces = device_traces()
    label, trace = traces[label_index % len(traces)]
    conf = parse_alloc_conf(text)
    assert conf.policy == "pytorch"
    cap = capacities(trace)[cap_name]
    try:
        replay(trace, conf.params, cap)
    except Exception as exc:
        raise AssertionError(f"{label} PYTORCH_CUDA_ALLOC_CONF={text} at {cap}: {type(exc).__name__}: {exc}") from exc


@pytest.mark.full
@pytest.mark.shared
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10_000), alloc_conf_strings(), st.sampled_from(["peak", "tight"]))
def test_random_alloc_conf_strings_replay_every_snapshot(label_index, text, cap_name):
    _random_conf_case(label_index, text, cap_name)


@pytest.mark.slow
@pytest.mark.shared
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10_000), alloc_conf_strings(), st.sampled_from(["unlimited", "peak", "tight"]))
def test_many_random_alloc_conf_strings_replay_every_snapshot(label_index, text, cap_name):
    _random_conf_case(label_index, text, cap_name)
