"""``allocsim scale --find-max``: the largest value that fits, checked against asking every value."""

from __future__ import annotations

import json
import math
from fractions import Fraction

import pytest

from allocsim.cli import main
from allocsim.metrics.summary import lower_bound_bytes
from allocsim.runner import Capacity, simulate_trace
from allocsim.scale import load_input
from allocsim.scale.build import Scaler
from allocsim.scale.findmax import find_max
from allocsim.trace import write_trace
from allocsim.units import MiB
from tests.test_scale import program_events, write_kineto


@pytest.fixture(scope="module")
def specs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("findmax")
    return [f"{write_kineto(tmp / f'p{v}.json.gz', program_events(v))}@{v}" for v in (1, 2, 3, 4)]


@pytest.fixture(scope="module")
def scaler(specs):
    inputs = [load_input(spec.rsplit("@", 1)[0], Fraction(int(spec.rsplit("@", 1)[1]))) for spec in specs]
    return Scaler(inputs, "seq")


def every_value(scaler: Scaler, capacity: int, values) -> tuple[dict[int, bool], dict[int, bool]]:
    """Brute force: for each value, (peak live fits, the recorded settings' replay fits)."""
    live, replay = {}, {}
    for v in values:
        trace = scaler.at(Fraction(v)).trace
        live[v] = lower_bound_bytes(trace) <= capacity
        replay[v] = bool(simulate_trace(trace, "pytorch", capacity=Capacity(capacity, "given"),
                                        fast=True).summary["verdict"]["fits"])
    return live, replay


def largest(fits: dict[int, bool]) -> int | None:
    ok = [v for v, f in fits.items() if f]
    return max(ok) if ok else None


CAPACITY = 5 * MiB


@pytest.mark.full
def test_the_search_finds_what_asking_every_value_finds(scaler):
    found = find_max(scaler, CAPACITY, advise=False)
    live, replay = every_value(scaler, CAPACITY, range(1, 200))
    # Both answers are monotone here (the assumption the search makes), so the largest is well defined.
    assert all(live[v] for v in range(1, largest(live) + 1))
    assert all(replay[v] for v in range(1, largest(replay) + 1))
    assert found.bound.value == largest(live) and found.bound.first_failing == largest(live) + 1
    assert found.recorded.value == largest(replay) < found.bound.value
    assert found.recorded.first_failing == largest(replay) + 1
    assert "FITS in" in found.recorded.at_value.line and "OUT OF MEMORY" in found.recorded.at_failing.line
    # Galloping then bisection: a handful of replays, not one per value.
    assert len(found.probes["replays"]) <= math.ceil(math.log2(found.bound.value)) + 1
    assert found.advised is None and found.best is found.recorded


@pytest.mark.full
def test_the_best_advise_setting_fits_further_and_says_what_to_paste(scaler, tmp_path, capsys):
    found = find_max(scaler, CAPACITY)
    advised = found.advised
    assert found.recorded.value <= advised.value <= found.bound.value
    assert advised.value > found.recorded.value              # here a setting does better than the defaults
    assert advised.at_value.line.startswith("PYTORCH_CUDA_ALLOC_CONF=")
    assert advised.first_failing == advised.value + 1 and not advised.at_failing.fits
    # Replaying the answer with the printed options fits, and the recorded settings do not.
    path = tmp_path / "answer.parquet"
    write_trace(scaler.at(advised.value).trace, path)
    for options, fits in ((advised.at_value.run_args, True), (["--policy", "pytorch"], False)):
        main(["run", str(path), *options, "--capacity", "5MiB", "--fast", "--json"])
        assert json.loads(capsys.readouterr().out)["verdict"]["fits"] is fits


def test_values_are_multiples_and_the_extrapolation_is_reported(scaler):
    found = find_max(scaler, CAPACITY, multiple=8, advise=False)
    assert found.recorded.value % 8 == 0 and found.bound.value % 8 == 0
    plain = find_max(scaler, CAPACITY, advise=False)
    assert plain.recorded.value - 8 < found.recorded.value <= plain.recorded.value
    assert found.extrapolation() == found.recorded.value / 4
    text = found.format_text()
    assert "multiples of 8" in text and "largest input (4)" in text and "covers 2x" in text


def test_nothing_fits_and_everything_fits(scaler):
    tiny = find_max(scaler, 1024, advise=False)
    assert tiny.bound.value is None and tiny.recorded.value is None and tiny.bound.first_failing == 1
    assert "no value fits" in tiny.format_text()
    huge = find_max(scaler, 1 << 40, max_value=64, advise=False)
    assert huge.bound.value == huge.recorded.value == 64 and huge.bound.first_failing is None
    assert "the search limit" in huge.format_text()


@pytest.mark.full
def test_values_whose_sizes_no_device_holds_do_not_fit(scaler, specs, tmp_path, capsys):
    # 48 v^2 bytes pass a petabyte (the readers' bound on a size) near v = 1.5e8: the search stops there.
    found = find_max(scaler, 1 << 60, max_value=1 << 40, advise=False)
    assert found.bound.first_failing is not None and found.bound.value < 2e8
    assert "too far from the inputs" in found.bound.at_failing.line
    assert main(["scale", *specs, "--name", "seq", "--to", "99999999999", "-o", str(tmp_path / "x.parquet")]) == 2
    err = capsys.readouterr().err
    assert "too far from the inputs" in err and err.count("\n") == 1


@pytest.mark.full
def test_cli_find_max_writes_the_answer_and_exits_by_whether_anything_fits(specs, tmp_path, capsys):
    out = tmp_path / "best.parquet"
    argv = ["scale", *specs, "--name", "seq", "--capacity", "6MiB", "--find-max", "--workers", "1", "-o", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "find-max: the largest seq that fits in 6.00 MiB" in text and "limits:" in text
    command = text.strip().splitlines()[-1].split("replay it: ", 1)[1].split()
    assert command[:3] == ["allocsim", "run", str(out)]
    assert main([*command[1:], "--fast"]) == 0
    assert "FITS in 6.00 MiB" in capsys.readouterr().out
    assert main([*argv[:-2], "--json", "--no-advise"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["find_max"]["advised"] is None and data["find_max"]["recorded"]["value"] > 0
    assert data["report_at_answer"]["limits"]
    assert main(["scale", *specs, "--capacity", "1KiB", "--find-max", "--no-advise"]) == 1


@pytest.mark.parametrize("extra, message", [
    (["--find-max"], "--find-max needs --capacity"),
    (["--find-max", "--capacity", "1GiB", "--to", "8"], "either --to VALUE or --find-max"),
    ([], "give --to VALUE"),
    (["--to", "8"], "give -o OUT"),
    (["--find-max", "--capacity", "1GiB", "--multiple-of", "0"], "--multiple-of must be >= 1"),
])
def test_cli_find_max_usage_errors_exit_2(specs, extra, message, capsys):
    assert main(["scale", *specs, *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_cli_find_max_on_a_gpu_uses_what_run_gpu_leaves_the_allocator(specs, capsys):
    from allocsim.gpus import allocator_capacity, find_gpu

    # FITS only with the unknown terms at their high end (Kineto inputs: the context's alone)
    capacity = allocator_capacity(find_gpu("T4"), end="high")
    assert main(["scale", *specs, "--name", "seq", "--gpu", "T4", "--find-max", "--no-advise", "--json"]) == 0
    on_gpu = json.loads(capsys.readouterr().out)["find_max"]
    assert main(["scale", *specs, "--name", "seq", "--capacity", str(capacity), "--find-max", "--no-advise",
                 "--json"]) == 0
    given = json.loads(capsys.readouterr().out)["find_max"]
    assert on_gpu["recorded"]["value"] == given["recorded"]["value"] > 0
    assert on_gpu["capacity_bytes"] == given["capacity_bytes"] == capacity


@pytest.mark.parametrize("extra, message", [
    (["--find-max", "--gpu", "T4", "--capacity", "1GiB"], "give --gpu or --capacity, not both"),
    (["--find-max", "--gpu", "GTX 9999"], "unknown GPU 'GTX 9999'"),
])
def test_cli_gpu_usage_errors_exit_2(specs, extra, message, capsys):
    assert main(["scale", *specs, *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
