"""``allocsim scale`` says what it cannot know: refusal of mixed inputs, start-of-window pairing by size class, ranges.

Synthetic inputs (``tests/test_scale.py``'s Kineto program) check each rule exactly; the real GPU
series of ``../shared/traces/scale-series`` check that it holds where it was built for.
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from allocsim.cli import main as allocsim_main
from allocsim.scale import load_input, scale_inputs
from allocsim.scale.build import Scaler
from allocsim.scale.consistency import MixedInputs
from allocsim.scale.evaluate import peaks
from allocsim.scale.initial import initial_partners
from allocsim.scale.laws import fit_law
from allocsim.scale.ranges import BadRange, end_traces
from allocsim.trace import read_trace, write_trace
from allocsim.trace.schema import EVENT_DTYPES, INITIAL_ALLOC_DTYPES, Trace, TraceMeta, empty_frame
from tests.test_scale import program_events, write_kineto

SERIES = "traces/scale-series"


def _cli(*args: str) -> subprocess.CompletedProcess:
    """``allocsim ARGS`` in this process (a subprocess would add its start-up to every call)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = allocsim_main(list(args))
        except SystemExit as exc:       # --help
            status = int(exc.code or 0)
    return subprocess.CompletedProcess(args, status, out.getvalue(), err.getvalue())


# ---------------------------------------------------------------- laws


def test_one_point_spans_every_monomial_and_shrinking_is_flagged():
    law = fit_law([(Fraction(4), 100)], "seq")
    assert law.predict(Fraction(8))[0] == 100
    assert law.bounds(Fraction(8)) == (100, 400)                 # c, c*v, c*v^2 through (4, 100)
    assert fit_law([(Fraction(4), 100)], "batch").bounds(Fraction(8)) == (100, 200)   # batch: no v^2
    falling = fit_law([(Fraction(1), 30), (Fraction(2), 20)], "batch")
    assert falling.shrinking and falling.follows_no_monomial
    assert not fit_law([(Fraction(1), 30), (Fraction(2), 60)], "batch").shrinking


def test_two_points_no_monomial_fits_span_the_quadratics_through_them():
    law = fit_law([(Fraction(2), 96 + 2 * 3072), (Fraction(4), 96 + 4 * 3072)], "seq")
    assert law.kind == "linear" and law.follows_no_monomial
    low, high = law.bounds(Fraction(8))
    assert low <= 96 + 8 * 3072 <= high and low < high


# ---------------------------------------------------------------- start-of-window pairing


def _with_initial(sizes: list[int]) -> Trace:
    n = len(sizes)
    initial = pd.DataFrame({"alloc_id": np.arange(n, dtype=np.int64), "size_bytes": np.array(sizes, dtype=np.int64),
                            "stream": np.zeros(n, dtype=np.int64), "device": np.zeros(n, dtype=np.int16),
                            "addr": np.full(n, -1, dtype=np.int64), "block_size_bytes": np.full(n, -1, dtype=np.int64),
                            "stack_id": np.full(n, -1, dtype=np.int32)}).astype(INITIAL_ALLOC_DTYPES)
    return Trace(events=empty_frame(EVENT_DTYPES), meta=TraceMeta(format="test"), initial_allocs=initial)


def test_start_of_window_blocks_pair_by_size_class_not_by_position():
    # A weight (4096, constant) listed first at 128 and last at 256 (addresses moved); an activation
    # grows as c*v. By position the weight would "grow".
    ref = _with_initial([512 * 256, 4096])
    other = _with_initial([4096, 512 * 128])
    partner, open_powers = initial_partners(ref, Fraction(256), [(other, Fraction(128))])
    assert partner[:, 0].tolist() == [1, 0] and not open_powers


def test_a_block_that_grew_into_another_size_is_open_with_two_inputs_and_settled_by_a_third():
    # At 128: 10240 and 20480; at 256: 20480 and 40960. Either both grow as c*v, or 20480 is a constant
    # and 10240 -> 40960 is c*v^2: two inputs cannot tell, so both rows are open (the range spans both).
    ref = _with_initial([20480, 40960])
    small = _with_initial([10240, 20480])
    _, open_powers = initial_partners(ref, Fraction(256), [(small, Fraction(128))])
    assert set(open_powers) == {0, 1}
    # A third input at 512 holds 40960 and 81920: only c*v fits every input.
    large = _with_initial([40960, 81920])
    partner, open_powers = initial_partners(ref, Fraction(256), [(small, Fraction(128)), (large, Fraction(512))])
    assert not open_powers
    assert partner.tolist() == [[0, 0], [1, 1]]


def test_pairing_many_distinct_sizes_is_near_linear(monkeypatch):
    # A hostile start-of-window state: 4,000 distinct sizes in one group (odd multiples of 512 at 128,
    # twice that at 256). Pairing by size class looks at each family a bounded number of times; taking
    # the best family by rescanning every size each time would look 4,000 times as often.
    import allocsim.scale.initial as initial

    calls = 0
    counted = initial._support

    def counting(*args):
        nonlocal calls
        calls += 1
        return counted(*args)

    monkeypatch.setattr(initial, "_support", counting)
    n = 4000
    small = [512 * (2 * i + 1) for i in range(n)]
    ref = _with_initial([2 * s for s in reversed(small)])
    partner, open_powers = initial_partners(ref, Fraction(256), [(_with_initial(small), Fraction(128))])
    assert partner[:, 0].tolist() == list(reversed(range(n))) and not open_powers
    assert calls <= 10 * n


# ---------------------------------------------------------------- refusal


def test_sizes_that_shrink_as_the_value_grows_are_refused(tmp_path):
    # The run "at 4" has the sizes of the program at 2 and vice versa: every growing size shrinks.
    swapped = [load_input(write_kineto(tmp_path / f"x{v}.json.gz", program_events(6 - v)), Fraction(v)) for v in (2, 4)]
    with pytest.raises(MixedInputs, match="shrink as seq grows"):
        scale_inputs(swapped, Fraction(8), "seq")
    result = scale_inputs(swapped, Fraction(8), "seq", allow_mixed=True)
    assert not result.report.consistent and result.report.shrinking > 0
    assert any("shrink" in text for text in result.report.differences)


def test_different_allocator_settings_are_refused(tmp_path):
    inputs = [load_input(write_kineto(tmp_path / f"p{v}.json.gz", program_events(v)), Fraction(v)) for v in (2, 4)]
    inputs[0].trace.meta.allocator_settings = {"expandable_segments": False}
    inputs[1].trace.meta.allocator_settings = {"expandable_segments": True}
    with pytest.raises(MixedInputs, match="allocator setting expandable_segments"):
        Scaler(inputs, "seq")
    assert Scaler(inputs, "seq", allow_mixed=True).differences[0].kind == "settings"


# ---------------------------------------------------------------- the range, judged by run


def test_run_judges_both_ends_of_a_prediction(tmp_path):
    # Two inputs of a program whose softmax (40 v^2 + 8 v) and addmm (96 + 3072 v) follow no monomial:
    # the range is open; the program really run at 1024 lies inside it.
    # Sizes of megabytes (v = 256 .. 1024), so that the ends need different segments.
    inputs = [load_input(write_kineto(tmp_path / f"p{v}.json.gz", program_events(v)), Fraction(v)) for v in (256, 512)]
    result = scale_inputs(inputs, Fraction(1024), "seq")
    rng = result.report.prediction_range
    truth = peaks(read_trace(write_kineto(tmp_path / "p1024.json.gz", program_events(1024))))
    for key in ("peak_live_bytes", "peak_reserved_bytes"):
        assert rng[key]["low"] <= truth[key] <= rng[key]["high"]
    out = tmp_path / "p1024.parquet"
    write_trace(result.trace, out)
    low, high = end_traces(read_trace(str(out)))
    low_res, high_res = peaks(low)["peak_reserved_bytes"], peaks(high)["peak_reserved_bytes"]
    assert low_res < high_res
    between = _cli("run", str(out), "--policy", "pytorch", "--fast", "--capacity", str(low_res))
    assert between.returncode == 3, between.stderr
    assert between.stdout.strip().splitlines()[-1].startswith(
        "prediction range: fits at the low end, not at the high end")
    both = _cli("run", str(out), "--policy", "pytorch", "--fast", "--capacity", str(high_res), "--json")
    assert both.returncode == 0, both.stderr
    assert json.loads(both.stdout)["prediction_range"]["fits"] is True


def test_find_max_searches_the_high_end_and_judges_its_answer_at_both_ends(tmp_path):
    specs = [f"{write_kineto(tmp_path / f'p{v}.json.gz', program_events(v))}@{v}" for v in (256, 512)]
    proc = _cli("scale", *specs, "--name", "seq", "--capacity", str(256 << 20), "--find-max", "--multiple-of", "64",
                "--no-advise")
    # The point fits up to 1152; whatever the open laws are, 1088: at 1152 the high end runs out of memory.
    assert proc.returncode == 3, proc.stderr
    assert "  recorded settings: seq 1152 fits" in proc.stdout
    assert "  recorded settings, high end of the range: seq 1088 fits" in proc.stdout
    assert "  at seq 1152: prediction range: fits at the low end, not at the high end" in proc.stdout


def test_a_tampered_range_is_one_clean_error(tmp_path):
    inputs = [load_input(write_kineto(tmp_path / f"p{v}.json.gz", program_events(v)), Fraction(v)) for v in (2, 4)]
    trace = scale_inputs(inputs, Fraction(8), "seq").trace
    trace.meta.version_hints["scale"]["range"]["low"][0] = -5
    with pytest.raises(BadRange):
        end_traces(trace)
    out = tmp_path / "bad.parquet"
    write_trace(trace, out)
    proc = _cli("run", str(out), "--policy", "pytorch", "--fast")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "range" in proc.stderr


def test_help_explains_refusal_allow_mixed_and_the_range():
    text = _cli("scale", "--help").stdout
    assert "--allow-mixed" in text and "refused with one line" in text
    assert "prediction_range" in text and "low and high" in text and "exit 3 unless both fit" in text


# ---------------------------------------------------------------- real GPU series


def _series(shared_dir, name: str, values) -> list:
    return [load_input(str(shared_dir / SERIES / name.format(v=v)), Fraction(v)) for v in values]


def _mixed_pair_args(shared_dir, tmp_path) -> list[str]:
    folder = shared_dir / SERIES
    fp32 = folder / "charliesabino_cs336-assignment2_2.7B-128-fwd-memory-snapshot.pickle"
    mixed = folder / "charliesabino_cs336-assignment2_2.7B-256-fwd-memory-snapshot_mixed.pickle"
    return ["scale", f"{fp32}@128", f"{mixed}@256", "--name", "seq", "--to", "512", "-o", str(tmp_path / "m.parquet")]


def test_the_fp32_run_with_its_autocast_run_is_refused(shared_dir, tmp_path):
    refused = _cli(*_mixed_pair_args(shared_dir, tmp_path))
    assert refused.returncode == 2 and not (tmp_path / "m.parquet").exists()
    line, = refused.stderr.strip().splitlines()
    assert "autocast in charliesabino_cs336-assignment2_2.7B-256-fwd-memory-snapshot_mixed.pickle" in line
    assert "record every input with the same precision" in line and "--allow-mixed" in line


@pytest.mark.slow
def test_allow_mixed_predicts_and_lists_every_difference(shared_dir, tmp_path):
    allowed = _cli(*_mixed_pair_args(shared_dir, tmp_path), "--allow-mixed", "--json")
    assert allowed.returncode == 0, allowed.stderr
    report = json.loads(allowed.stdout)
    assert report["consistent"] is False
    kinds = " ".join(report["differences"])
    assert len(report["differences"]) == 3
    assert "autocast" in kinds and "_to_copy" in kinds and "32 allocations shrink as seq grows" in kinds
    assert round(100 * report["aligned_share"], 1) == 55.5      # above the 50% floor: not a difference here


def test_hyperion_series_predicted_within_its_range(shared_dir):
    name = "Hyperion-shuo_assignment2-systems_memory_snapshot_large_cl{v}_fw_with_grad.pickle"
    *inputs, truth = _series(shared_dir, name, (128, 256, 512))
    report = Scaler(inputs, "seq").at(truth.value).report
    assert report.consistent and report.shrinking == 0 and report.no_monomial == 0
    # Every start-of-window block is paired; 72 of them (a block at 256 that could be a constant or
    # grown from half its size) are open, and the recorded run lies inside the range.
    assert report.initial["aligned"] == report.initial["allocations"] == 1203
    assert report.undetermined == 72
    rng = report.prediction_range
    true = peaks(truth.trace)
    for key in ("peak_live_bytes", "peak_reserved_bytes"):
        assert rng[key]["low"] <= true[key] <= rng[key]["high"]
        assert abs(rng[key]["point"] - true[key]) <= 0.0002 * true[key]


def test_weights_stay_constant_when_the_start_of_window_is_paired_by_size(shared_dir):
    # GPT-2 XL at batch 4: the 439 blocks alive at the start (weights) are listed in another order at
    # each size; paired by size class they keep their size, and 128 + 256 -> 512 is exact.
    *inputs, truth = _series(shared_dir, "yyin-dev_cs336-a2_xl_b4_fwd_ctx_{v}.pickle", (128, 256, 512))
    result = Scaler(inputs, "seq").at(truth.value)
    predicted_start = int(result.trace.initial_allocs["size_bytes"].sum())
    assert predicted_start == int(truth.trace.initial_allocs["size_bytes"].sum())
    assert result.report.prediction_range["determined"]
    assert result.report.prediction_range["peak_live_bytes"]["point"] == peaks(truth.trace)["peak_live_bytes"]


@pytest.mark.slow
def test_every_shared_series_as_the_readme_table_says(shared_dir):
    # python traces/scale_series.py: the table of docs/scale.md, row by row.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "traces"))
    import scale_series

    directory = shared_dir / SERIES
    rows = {name: scale_series.series_row(directory, name) for name in scale_series.SERIES}
    for name, row in rows.items():
        assert abs(row["live_error"]) <= 0.0002 and row["live_in_range"], name
        # Peak reserved within 5% and inside the range on every series.
        assert abs(row["reserved_error"]) <= 0.05 and row["reserved_in_range"], name
    errors = {name: round(100 * row["reserved_error"], 2) for name, row in rows.items()}
    layouts = {name: row["start_layout"] for name, row in rows.items()}
    # GPT-2 medium's ring-buffer tail starts from the layout a step leaves behind (+6.29% placed anew),
    # GPT-2 XL's whole-step window from the one its warm-up step left (-0.22% placed anew).
    assert errors["cherryni2022 medium"] == errors["cherryni2022 small"] == errors["yyin-dev xl b4"] == 0
    assert layouts["cherryni2022 medium"] == layouts["yyin-dev xl b4"] == "steady"
    # One process ran the charliesabino sizes in turn (-6.86% without the segments it kept cached).
    assert layouts["charliesabino 2.7B fp32"] == layouts["charliesabino 2.7B mixed"] == "cached"
    assert errors["charliesabino 2.7B fp32"] == -2.98 and errors["charliesabino 2.7B mixed"] == -1.28
    assert rows["Hyperion-shuo large"]["undetermined"] == 72
    assert scale_series.mixed_pair(directory).startswith("refused: inputs are not one configuration: autocast in")
