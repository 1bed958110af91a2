"""An inferred capacity says what the recording proves: a lower bound is "at least", with its range."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from allocsim.advise.advice import Advice
from allocsim.advise.knobs import preset_for
from allocsim.advise.report import _head, advice_to_dict
from allocsim.metrics.summary import lower_bound_bytes
from allocsim.metrics.verdict import verdict
from allocsim.runner import resolve_capacity
from allocsim.trace import read_trace
from allocsim.trace.inference.recorded import recorded_run

SNAPSHOTS = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "pytorch-snapshots"


def snapshot(name: str) -> Path:
    path = SNAPSHOTS / name
    if not path.exists():
        pytest.skip("../shared/traces is not beside this checkout")
    return path


@pytest.mark.shared
def test_a_lower_bound_capacity_fits_at_least_and_names_the_proven_range(cli):
    path = snapshot("Maphsge4__snapshot.pickle")
    low, high = recorded_run(read_trace(path), 0).capacity_range
    assert low < high                        # releases on the OOM path prove only a range
    code, out, _ = cli("run", path, "--policy", "pytorch", "--fast", "--json")
    v = json.loads(out)["verdict"]
    assert code == 0 and v["capacity_source"] == "inferred" and v["capacity_is_lower_bound"]
    assert v["capacity_range"] == [low, high] and v["capacity_bytes"] == low
    assert v["line"].startswith("FITS in at least 20.97 GiB (inferred; the recording proves 20.97 GiB to 21.01 GiB)")
    assert "headroom at least" in v["line"]
    # The same capacity given by the user is a plain, exact verdict.
    code, out, _ = cli("run", path, "--policy", "pytorch", "--fast", "--json", "--capacity", f"{low}B")
    v = json.loads(out)["verdict"]
    assert v["capacity_source"] == "given" and not v["capacity_is_lower_bound"]
    assert v["line"].startswith("FITS in 20.97 GiB: ")


@pytest.mark.shared
def test_an_oom_recorded_with_the_drivers_free_bytes_is_an_exact_capacity(cli):
    path = snapshot("Constructor-Sun__memory_snapshot.pickle")
    low, high = recorded_run(read_trace(path).for_device(1), 1).capacity_range
    assert low == high
    code, out, _ = cli("run", path, "--policy", "pytorch", "--fast", "--json", "--device", "1")
    v = json.loads(out)["verdict"]
    assert v["capacity_source"] == "inferred" and not v["capacity_is_lower_bound"]
    assert "at least" not in v["line"] and "lower bound" not in v["line"]


def test_an_oom_at_a_lower_bound_is_not_a_verdict_on_the_device():
    oom = {"event_index": 7, "t_rel_ns": None, "requested_bytes": 1 << 30, "reserved_bytes": 20 << 30,
           "allocated_bytes": 19 << 30, "live_bytes": 19 << 30}
    v = verdict(capacity_bytes=21 << 30, peak_reserved_bytes=21 << 30, lower_bound_bytes=19 << 30, oom=oom,
                capacity_source="inferred", capacity_range=(21 << 30, None))
    assert v["line"].startswith("OUT OF MEMORY in 21.00 GiB (inferred lower bound; the recording proves "
                                "21.00 GiB or more: give --capacity SIZE) at event 7")


@pytest.mark.shared
def test_advise_says_what_it_assumed_of_a_lower_bound():
    """The capacity advise searches at, as advise resolves it from the real recording, and its report's head."""
    path = snapshot("Maphsge4__snapshot.pickle")
    trace = read_trace(path)
    capacity = resolve_capacity(trace, None)
    advice = Advice(trace=str(path), source=trace.meta.source, device=None, policy="pytorch",
                    capacity_bytes=capacity.bytes, capacity_source=capacity.source, capacity_note=capacity.note,
                    capacity_range=capacity.range, lower_bound_bytes=lower_bound_bytes(trace),
                    step_bytes=2 << 20, fast=True,
                    preset=preset_for("pytorch", trace.meta.allocator_settings, capacity.bytes))
    assumed = ("assumed: the device had exactly 20.97 GiB, the least of the 20.97 GiB to 21.01 GiB the recording "
               "proves; give --capacity SIZE for the real one")
    assert advice.assumption == assumed and _head(advice)[2] == assumed
    data = advice_to_dict(advice)
    assert data["capacity_assumed"] == assumed and data["capacity_range"] == list(capacity.range)
    given = resolve_capacity(trace, capacity.bytes)
    advice.capacity_source, advice.capacity_range = given.source, given.range
    assert advice.assumption is None and len(_head(advice)) == 3


@pytest.mark.slow
@pytest.mark.shared
def test_advise_cli_says_what_it_assumed(tmp_path, cli):
    path = snapshot("Maphsge4__snapshot.pickle")
    code, out, _ = cli("advise", path, "--fast", "--workers", "1", "-o", tmp_path / "r.parquet", "--json")
    data = json.loads(out)
    assert data["capacity_source"] == "inferred" and data["capacity_range"][0] == data["capacity_bytes"]
    assert data["capacity_assumed"].startswith("assumed: the device had exactly 20.97 GiB")
    code, out, _ = cli("advise", path, "--fast", "--workers", "1", "-o", tmp_path / "r.parquet")
    assert data["capacity_assumed"] in out.splitlines()


@pytest.mark.shared
def test_info_says_at_least_for_a_lower_bound(cli):
    path = snapshot("Maphsge4__snapshot.pickle")
    code, out, _ = cli("info", path)
    assert code == 0
    assert "capacity at least 20.97 GiB (the recording proves 20.97 GiB to 21.01 GiB: the real peak reserved" in out
    code, out, _ = cli("info", path, "--json")
    assert json.loads(out)["recorded"]["0"]["capacity_range"] == [22_519_218_176, 22_556_966_911]


@pytest.mark.shared
def test_sweep_says_at_least_for_a_lower_bound(tmp_path, cli):
    path = snapshot("Maphsge4__snapshot.pickle")
    code, out, _ = cli("sweep", path, "--policy", "pytorch", "--fast", "--workers", "1",
                       "-o", tmp_path / "r.parquet", "--json")
    [entry] = json.loads(out)["capacities"]
    assert code == 0 and entry["source"] == "inferred" and entry["range"] == [22_519_218_176, 22_556_966_911]
    code, out, _ = cli("sweep", path, "--policy", "pytorch", "--fast", "--workers", "1",
                       "-o", tmp_path / "r.parquet")
    assert out.startswith(f"capacity at least 20.97 GiB for {path}, inferred from the recording: ")
