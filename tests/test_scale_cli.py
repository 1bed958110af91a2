"""``allocsim scale`` on the command line: output readable by ``run``, report, clean errors."""

from __future__ import annotations

import json

import pytest

from allocsim.cli import main
from allocsim.scale.steps import live_bytes
from allocsim.trace import read_trace
from tests.test_scale import program_events, write_kineto


@pytest.fixture
def specs(tmp_path):
    return [f"{write_kineto(tmp_path / f'p{v}.json.gz', program_events(v))}@{v}" for v in (1, 2, 4)]


def test_scale_writes_a_trace_that_run_answers(specs, tmp_path, capsys):
    out = tmp_path / "p8.parquet"
    assert main(["scale", *specs, "--to", "8", "--name", "seq", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "alignment by operator" in text and "limits:" in text and "allocsim run" in text
    trace = read_trace(out)
    truth = read_trace(write_kineto(tmp_path / "p8.json.gz", program_events(8)))
    assert trace.events["size_bytes"].tolist() == truth.events["size_bytes"].tolist()
    assert main(["run", str(out), "--policy", "pytorch", "--fast", "--capacity", "80GiB", "--json"]) == 0
    ran = json.loads(capsys.readouterr().out)
    assert ran["peak_live_lower_bound_bytes"] == int(live_bytes(truth).max())


def test_json_report_has_the_shares_and_laws(specs, tmp_path, capsys):
    out = tmp_path / "p8.parquet"
    assert main(["scale", *specs, "--to", "8", "--name", "seq", "-o", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["output"] == str(out)
    assert report["aligned_share"] == 1.0 and report["aligned_bytes_share"] == 1.0
    assert report["laws"]["quadratic"] > 0 and report["keyer"] == "operator"
    assert [i["reference"] for i in report["inputs"]] == [False, False, True]
    # Where the user reads it: how far this prediction extrapolates, and what no prediction can know.
    assert report["extrapolation"] == 2.0
    assert any(check.startswith("seq 8 is 2x the largest input (4)") for check in report["checks"])
    assert any("before profiling began" in check for check in report["checks"])
    assert any("exist only at the target scale" in limit for limit in report["limits"])


@pytest.mark.parametrize("argv, message", [
    (["only.json@2"], "at least two traces"),
    (["a.json@2", "b.json@x"], "not a positive number"),
    (["a.json", "b.json@2"], "expected TRACE@VALUE"),
    (["a.json@0", "b.json@2"], "must be > 0"),
])
def test_bad_arguments_exit_2_with_one_line(argv, message, tmp_path, capsys):
    for name in ("only.json", "a.json", "b.json"):
        # One CPU [memory] event: a readable profile (one without memory is refused on reading).
        (tmp_path / name).write_text(json.dumps({"traceEvents": [{"ph": "i", "name": "[memory]", "ts": 1, "args": {
            "Addr": 4096, "Bytes": 512, "Device Type": 0, "Device Id": -1}}]}))
    argv = [str(tmp_path / a) if "@" in a or a.endswith(".json") else a for a in argv]
    assert main(["scale", *argv, "--to", "8", "-o", str(tmp_path / "o.parquet")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("allocsim scale: error:") and message in err and "\n" not in err


def test_same_value_twice_and_broken_files_exit_2(specs, tmp_path, capsys):
    same = [specs[0], specs[1].rsplit("@", 1)[0] + "@1"]
    assert main(["scale", *same, "--to", "8", "-o", str(tmp_path / "o.parquet")]) == 2
    assert "same scale value" in capsys.readouterr().err
    broken = tmp_path / "broken.json.gz"
    broken.write_bytes(b"\x1f\x8b\x08\x00garbage")
    assert main(["scale", specs[0], f"{broken}@3", "--to", "8", "-o", str(tmp_path / "o.parquet")]) == 2
    err = capsys.readouterr().err
    assert "broken.json.gz" in err and err.count("\n") == 1


@pytest.mark.shared
def test_state_only_inputs_are_refused_as_such(shared_dir, tmp_path, capsys):
    # verl's snapshot holds 543 live blocks and no trace: nothing to align, whatever the other input.
    verl = shared_dir / "traces" / "state-only-snapshots" / "volcengine_verl_mem.pickle"
    assert main(["scale", f"{verl}@1", f"{verl}@2", "--to", "4", "-o", str(tmp_path / "out.parquet")]) == 2
    err = capsys.readouterr().err
    assert "records the final state only, no history to scale" in err and len(err.strip().splitlines()) == 1
    assert "_record_memory_history" in err and not (tmp_path / "out.parquet").exists()


@pytest.mark.shared
def test_inputs_without_step_markers_are_said_to_be_one_window(shared_dir, tmp_path, capsys):
    # Snapshots carry no step markers: each input is one whole window (it used to read "1 steps (none)").
    series = shared_dir / "traces" / "scale-series"
    specs = [f"{series / f'yyin-dev_cs336-a2_xl_b4_fwd_ctx_{v}.pickle'}@{v}" for v in (128, 256)]
    assert main(["scale", *specs, "--to", "512", "--name", "seq", "-o", str(tmp_path / "p.parquet")]) == 0
    inputs = capsys.readouterr().out.split("inputs:", 1)[1].split("\n\n", 1)[0].strip().splitlines()
    assert len(inputs) == 2 and all("2696 allocations, one whole window: no step markers," in line for line in inputs)
