"""validate.milabench: row extraction, the fitted terms and the tables, on small synthetic input."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from validate import milabench as mb

MiB = mb.MiB

V2 = """
resnet50:
  observations:
  - {batch_size: 128, cpu: 8, memory: 7257 MiB, perf: 1206.49, time: 1744818506}
  - {batch_size: 256, cpu: 8, memory: 13297 MiB, perf: 1123.66, time: 1744830110}
  - {batch_size: 256, cpu: 16, memory: 13301 MiB, perf: 1120.0, time: 1744830111}
bert-fp32:
  observations:
  - {batch_size: 8, cpu: 8, memory: 7159 MiB, perf: 63.37, time: 1744929450}
brax:
  observations:
  - {batch_size: 512, cpu: 0, memory: 2885 MiB, perf: 823634.9, time: 1741955657}
version: 2.0
"""
V1 = """
version: 1.0
bert-fp16:
  arg: --batch-size
  model:
    1: 4108.75 MiB
    2: 475.0 MiB
    8: 8614.75 MiB
  optimized: 128
"""


def test_both_file_formats_parse_to_observations():
    v2 = mb.parse_table(V2)
    assert set(v2) == {"resnet50", "bert-fp32", "brax"}
    assert v2["resnet50"][0] == {"batch": 128, "memory_mib": 7257.0, "cpu": 8, "time": 1744818506}
    v1 = mb.parse_table(V1)
    assert [(o["batch"], o["memory_mib"]) for o in v1["bert-fp16"]] == [(1, 4108.75), (2, 475.0), (8, 8614.75)]
    with pytest.raises(ValueError):
        mb.parse_mib("12 GB")


def test_rows_keep_provenance_take_the_largest_observation_and_say_why_a_row_is_left_out():
    table = {"file": "config/scaling/L40S.yaml", "card": "L40S", "set": "calibrate"}
    rows = mb.rows_from_table(table, V2, "56ac1833", {"torch": "2.6.0+cu126"})
    r256 = next(r for r in rows if r["benchmark"] == "resnet50" and r["batch"] == 256)
    assert r256["memory_mib"] == 13301 and r256["observations"] == [13297, 13301]
    assert (r256["file"], r256["commit"], r256["set"], r256["card"]) == ("config/scaling/L40S.yaml", "56ac1833",
                                                                        "calibrate", "L40S")
    assert r256["left_out"] is None
    assert "JAX" in next(r for r in rows if r["benchmark"] == "brax")["left_out"]
    rocm = mb.rows_from_table({"file": "config/scaling/MI325.yaml", "card": "MI325", "set": "excluded"}, V2, "c", {})
    assert all("ROCm" in r["left_out"] for r in rocm)


def test_a_row_below_a_smaller_batch_is_an_outlier_and_is_not_used():
    table = {"file": "config/scaling.yaml", "card": "A100-SXM4-80GB", "set": "calibrate"}
    blame = {("bert-fp16", 1): "1f1bb167", ("bert-fp16", 2): "dbebc7c0", ("bert-fp16", 8): "1f1bb167"}
    rows = mb.rows_from_table(table, V1, "5b4fe167", {"torch": "x"}, blame,
                              lambda sha: {"torch": "2.1.0" if sha == "1f1bb167" else "2.4.0"})
    mb.flag_outliers(rows)
    by_batch = {r["batch"]: r for r in rows}
    assert by_batch[2]["outlier"] and not by_batch[1]["outlier"] and not by_batch[8]["outlier"]
    assert by_batch[2]["added_in"] == "dbebc7c0" and by_batch[2]["libraries"] == {"torch": "2.4.0"}
    assert [r["batch"] for r in mb.select(rows, "calibrate")] == [1, 8]


def test_old_table_rows_get_the_loop_of_their_time():
    new = {"card": "L40S", "benchmark": "resnet50", "batch": 128, "added_in": None}
    old = {"card": "A100-SXM4-80GB", "benchmark": "resnet50", "batch": 128, "added_in": "1f1bb167"}
    assert "channel_last" in mb.script_args(new) and "--legacy-2023" not in mb.script_args(new)
    assert "channel_last" not in mb.script_args(old) and "--legacy-2023" in mb.script_args(old)
    assert mb.capture_name(old) != mb.capture_name({**old, "card": "L40S", "added_in": None})
    h200 = {"card": "H200", "benchmark": "bert-fp32", "batch": 32}
    assert mb.capture_gpu(h200) == "H100" and mb.capture_name(h200) == mb.capture_name({**h200, "card": "H100"})


def _row(card, bench, batch, memory, which="calibrate", torch_version="2.6.0+cu126"):
    return {"card": card, "benchmark": bench, "batch": batch, "memory_mib": memory, "set": which,
            "libraries": {"torch": torch_version, "nvidia-cudnn-cu12": "9.5.1.17"}, "file": "f", "commit": "c"}


def test_terms_come_from_calibrate_rows_only_at_batch_0_and_carry_their_rows():
    nvml = mb.CARDS["L40S"]["nvml_reserved_mib"]
    local = mb.local_bytes("L40S")
    # bert: 600 MiB beside the allocator whatever the batch; t5: 640 at batch 0 and a capture error of
    # -10 MiB per sample; resnet50: 900 at batch 0 and +2 MiB per sample; a check row must change nothing
    rows, results = [], []
    for bench, at0, per_sample in (("bert-fp32", 600, 0), ("t5", 640, -10), ("resnet50", 900, 2)):
        for batch in (8, 16, 32):
            reserved = 1000 + 50 * batch
            rows.append(_row("L40S", bench, batch, reserved + nvml + at0 + per_sample * batch))
            results.append({"reserved_peak_bytes": reserved * MiB})
    rows.append(_row("H100", "bert-fp32", 8, 99999, which="check"))
    results.append({"reserved_peak_bytes": 1})
    rows.append(_row("L40S", "bert-fp32", 64, 45000))      # near the card's total: left out of the lines
    results.append({"reserved_peak_bytes": 1})
    fitted = mb.fit_terms(rows, results)
    (term,) = fitted["terms"]
    assert term["card"] == "L40S" and term["context0_bytes"] == 620 * MiB - local
    assert term["cudnn_bytes"] == 280 * MiB and term["cudnn_rows"] == ["L40S resnet50 (3 rows)"]
    assert term["context_rows"] == ["L40S bert-fp32 (3 rows)", "L40S t5 (3 rows)"]
    assert term["per_benchmark"]["t5"] == {"rows": 3, "at_batch_0_mib": 640, "per_sample_mib": -10.0}
    # another card with the same library version: context0 + its own local memory; cuDNN only where cuDNN runs
    h100_bert = mb.terms_for(_row("H100", "bert-fp32", 8, 0, "check"), fitted)
    h100_cnn = mb.terms_for(_row("H100", "resnet50", 8, 0, "check"), fitted)
    assert h100_bert["context_bytes"] == 620 * MiB - local + mb.local_bytes("H100") and h100_bert["cudnn_bytes"] == 0
    assert h100_cnn["cudnn_bytes"] == 280 * MiB and "L40S" in h100_cnn["from"]
    other_lib = mb.terms_for(_row("H100", "resnet50", 8, 0, "check", torch_version="2.1.0"), fitted)
    assert other_lib["from"].startswith("default")


def test_theil_sen_ignores_one_bad_row():
    points = [(8, 400.0), (16, 400.0), (24, -1000.0), (32, 400.0), (48, 400.0)]
    assert mb.theil_sen(points) == (400.0, 0.0)
    assert mb.theil_sen([(8, 5.0)]) == (5.0, 0.0)


def test_predictions_errors_false_fits_and_the_fit_per_benchmark():
    terms = {"context_bytes": 500 * MiB, "cudnn_bytes": 0, "from": "t"}
    nvml = mb.CARDS["H100"]["nvml_reserved_mib"]
    rows = [_row("H100", "bert-fp32", 8, 10000, "check"), _row("H100", "bert-fp32", 128, 78959, "check")]
    results = [{"reserved_peak_bytes": (10000 - nvml - 500 - 600) * MiB, "completed": True},    # 6% under
               {"reserved_peak_bytes": 81000 * MiB, "completed": True}]                       # does not fit
    out = [{**r, **s, **mb.predict(r, s, terms)} for r, s in zip(rows, results)]
    assert out[0]["error"] == pytest.approx(-0.06) and out[0]["false_fit"] and out[0]["fits"]
    assert not out[1]["fits"] and out[1]["error"] > 0
    s = mb.summarize(out)
    assert s["rows"] == 2 and s["under_5pct"] == 1 and s["false_fits"] == 1
    assert mb.fit_summary(out) == [{"benchmark": "bert-fp32", "real_max_batch": 128, "allocsim_max_batch": 8}]
    text = mb.format_tables(out)
    assert "**check: milabench H100**" in text and "**false fit**" in text and "| bert-fp32 | 128 | 8 |" in text


def test_the_shipped_rows_have_provenance_and_sets():
    data = mb.load()
    sets = {r["set"] for r in data["rows"]}
    assert sets == {"calibrate", "check", "excluded"}
    for r in data["rows"]:
        assert r["file"].startswith("config/") and r["commit"] and r["memory_mib"] > 0 and r["batch"] > 0
        assert (r["card"] in ("L40S", "A100-SXM4-80GB")) == (r["set"] == "calibrate")
        assert (r["card"] in ("H100", "H200")) == (r["set"] == "check")
    assert all(r["left_out"] for r in data["rows"] if r["card"] == "MI325")
    assert all(mb.usable(r) == (r["benchmark"] in mb.BENCHMARKS and not r.get("outlier") and r["set"] != "excluded")
               for r in data["rows"])


def test_the_subcommand_is_registered():
    done = subprocess.run([sys.executable, "-m", "validate", "milabench", "--help"], capture_output=True, text=True,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.returncode == 0 and "--calibrate" in done.stdout


@pytest.mark.full          # one capture of a real benchmark script: seconds
@pytest.mark.skipif(importlib.util.find_spec("torchvision") is None,
                    reason="torchvision is not installed (CI's environment has none); the row needs it")
def test_one_row_end_to_end(tmp_path):
    row = {**_row("L40S", "resnet50", 2, 1700), "added_in": None}
    path, seconds = mb.capture(row, str(tmp_path), sys.executable)
    assert os.path.exists(path) and seconds > 0
    terms = mb.terms_for(row, None)
    result = mb.replay(path, mb.capture_gpu(row), mb.capacity_for(row, terms))
    assert result["completed"] and result["reserved_peak_bytes"] > 200 * MiB   # weights, grads and the batch
    again, seconds = mb.capture(row, str(tmp_path), sys.executable)
    assert again == path and seconds == 0.0
    json.dumps(mb.predict(row, result, terms))


def test_ranges_come_from_calibrate_rows_and_say_what_they_left_out():
    from validate import milabench_ranges as mr

    local = 200 * MiB
    calibration = {"terms": [
        {"card": "L40S", "libraries": "a", "local_bytes": local, "context0_bytes": 190 * MiB, "cudnn_bytes": 20 * MiB,
         "per_benchmark": {"bert-fp32": {"at_batch_0_mib": 400}, "t5": {"at_batch_0_mib": 450},
                           "resnet50": {"at_batch_0_mib": 900}}},
        {"card": "A100-SXM4-80GB", "libraries": "b", "local_bytes": local, "context0_bytes": -5 * MiB,
         "cudnn_bytes": 900 * MiB,
         "per_benchmark": {"bert-fp16": {"at_batch_0_mib": -100}, "bert-fp32": {"at_batch_0_mib": 700}}}]}
    context = mr.context_range(calibration)
    assert (context["low_bytes"], context["high_bytes"]) == (200 * MiB, 500 * MiB)     # the negative one left out
    assert [v["kept"] for v in context["values"] if v["benchmark"] == "bert-fp16"] == [False]

    def result(card, bench, ground, predicted, reserved, which="calibrate"):
        return {"set": which, "card": card, "benchmark": bench, "batch": 8, "libraries": {"torch": "2.6.0+cu126"},
                "ground_bytes": ground * MiB, "predicted_bytes": predicted * MiB, "reserved_peak_bytes": reserved * MiB,
                "error": (predicted - ground) / ground}
    results = [result("L40S", "bert-fp32", 1000, 1010, 500), result("L40S", "resnet50", 1100, 1000, 500),
               result("L40S", "resnet50", 950, 1000, 500), result("H100", "resnet50", 5000, 1000, 500, "check"),
               result("A100-SXM4-80GB", "bert-fp32", 1000, 500, 400), result("A100-SXM4-80GB", "resnet50", 9000, 1000, 400)]
    shares, left_out = mr.cudnn_shares(results)
    assert sorted(s["share"] for s in shares) == [-0.1, 0.2]      # L40S only: the A100 group is not reproduced
    assert len(left_out) == 1 and left_out[0].startswith("A100-SXM4-80GB") and "50.0%" in left_out[0]
    fitted = mr.fit_ranges(calibration, results)
    assert fitted["cudnn_kernels_low_bytes"] == 20 * MiB and fitted["cudnn_kernels_high_bytes"] == 20 * MiB
    assert fitted["cudnn_share_high"] >= 0.2 and fitted["cudnn_share_low"] <= -0.1
    assert not any("H100" in s["row"] for s in fitted["cudnn_shares"])


def test_range_predictions_coverage_and_false_fits_per_model():
    from validate import milabench_ranges as mr

    ranges = {"context0_low_bytes": 100 * MiB, "context0_high_bytes": 900 * MiB, "cudnn_kernels_low_bytes": 0,
              "cudnn_kernels_high_bytes": 50 * MiB, "cudnn_share_low": -0.05, "cudnn_share_high": 0.1}
    terms = {"context_bytes": 500 * MiB, "cudnn_bytes": 20 * MiB, "from": "t"}
    row = _row("H100", "resnet50", 64, 30000, "check")
    res = {"reserved_peak_bytes": 28000 * MiB, "completed": True}
    out = {**row, **res, **mb.predict(row, res, terms, ranges)}
    assert out["low_bytes"] < out["predicted_bytes"] < out["high_bytes"]
    low, point, high = mr.nvml_reserved_range("H100")
    assert out["high_bytes"] - out["predicted_bytes"] == (900 * MiB + mb.local_bytes("H100") - 500 * MiB
                                                         + 30 * MiB + int(0.1 * 28000 * MiB) + high - point)
    plain = {**_row("H100", "bert-fp32", 64, 30000, "check"), **res}
    plain.update(mb.predict(plain, res, terms, ranges))
    assert plain["high_bytes"] - plain["predicted_bytes"] < out["high_bytes"] - out["predicted_bytes"]  # no cuDNN term
    s = mr.range_summary([out, plain])
    assert s["rows"] == 2 and s["inside"] + s["above_high"] + s["below_low"] == 2
    # a row whose truth is above its high end is a card on which allocsim says FITS and the run does not fit
    above = {**out, "ground_bytes": out["high_bytes"] + 2 * (1 << 30)}
    wrong = mr.false_fits_on_models([above])
    assert wrong and all(w["high_bytes"] <= w["gpu_total_bytes"] < w["need_bytes"] for w in wrong)
    assert mr.false_fits_on_models([out]) == [] if out["ground_bytes"] <= out["high_bytes"] else True
    assert "| check | all | 2 |" in mr.format_range_summary([out, plain])
