"""``allocsim fit``: the largest value of a script's ``{B}`` that fits each GPU.

The fast tests check the command line (the refusals, one line each, exit 2, before any capture) and
the pieces that need no PyTorch. The ``full`` ones capture: ``allocsim fit`` on the shipped
``traces/fit_example.py`` is checked against ground truth made independently of it -- the script
captured directly at the answer and at the next value for each GPU (``allocsim capture --gpu
CARD``), each replayed with ``allocsim run --gpu CARD`` and the answer's setting: the answer fits, the
next value does not (or lies inside the range fit stated), with PyTorch's defaults and with the best
setting; and a script that fails at a small value is named with its exit status and error line.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import io
import json
import os
import re
import subprocess
import sys
import time
from fractions import Fraction

import pytest

from allocsim.fit import (DEFAULT_GPUS, DEFAULT_STEPS, DEFAULT_VALUES, CaptureRun, FitResult, GpuAnswer,
                          capture_class, group_gpus, knob_of, parse_values, scale_name_for, what_differs,
                          with_value)
from allocsim.gpus import find_gpu

from .conftest import ROOT

EXAMPLE = ROOT / "traces" / "fit_example.py"


# ----------------------------------------------------------------------------------------- fast
def test_the_knob_is_the_one_placeholder():
    assert knob_of(["python", "t.py", "--batch", "{B}"]) == "B"
    assert knob_of(["python", "t.py", "--batch={batch}", "--eval-batch", "{batch}"]) == "batch"   # one knob, twice
    assert knob_of(["python", "t.py", "--config", '{"lr": 1}', "--batch", "{B}"]) == "B"          # JSON is no knob
    assert with_value(["python", "t.py", "--batch={B}", "--out", "b{B}.pt"], "B", 8) == [
        "python", "t.py", "--batch=8", "--out", "b8.pt"]
    with pytest.raises(ValueError, match="no {NAME} placeholder"):
        knob_of(["python", "t.py", "--batch", "8"])
    with pytest.raises(ValueError, match=r"2 placeholders in the command \({B}, {S}\)"):
        knob_of(["python", "t.py", "--batch", "{B}", "--seq", "{S}"])


def test_values_are_two_or_more_distinct_whole_numbers():
    assert parse_values("4,2,4") == [2, 4]
    assert parse_values(" 1, 2 ,8") == [1, 2, 8]
    for bad, why in (("4", "two or more different"), ("4,4", "two or more different"), ("0,2", "'0' is not"),
                     ("2,x", "'x' is not"), ("2,-4", "'-4' is not"), ("2,2.5", "'2.5' is not"), ("", "'' is not")):
        with pytest.raises(ValueError, match=why):
            parse_values(bad)


def test_the_knob_name_picks_the_laws():
    assert scale_name_for("B") == scale_name_for("batch_size") == "batch"
    assert scale_name_for("SEQ") == scale_name_for("ctx_len") == scale_name_for("tokens") == "seq"


def test_gpus_share_a_capture_per_compute_capability_class():
    a4090, a100, h100, h200, t4 = (find_gpu(n) for n in ("RTX 4090", "A100 80GB", "H100", "H200", "T4"))
    assert [capture_class(g) for g in (a4090, a100, h100, t4)] == ["sm 8.x", "sm 8.x", "sm 9.x and newer", "sm 7.x"]
    groups = group_gpus([a4090, a100, h100, h200, t4])
    assert [(rep.name, [g.name for g in members]) for rep, members in groups] == [
        ("RTX 4090", ["RTX 4090", "A100 80GB"]), ("H100", ["H100", "H200"]), ("T4", ["T4"])]
    assert len(group_gpus([a4090, a100, h100], per_gpu=True)) == 3
    assert "128 SMs, not 108" in what_differs(a4090, a100)
    assert what_differs(h100, h200).startswith("the same SM count")
    assert [find_gpu(n).name for n in DEFAULT_GPUS] == list(DEFAULT_GPUS)
    assert DEFAULT_VALUES == (2, 4) and DEFAULT_STEPS == 2


@pytest.mark.parametrize("argv, message", [
    (["--", "python", str(EXAMPLE), "--batch", "8"], "no {NAME} placeholder in the command"),
    (["--", "python", str(EXAMPLE), "--batch", "{B}", "--seq", "{S}"], "2 placeholders in the command"),
    (["--values", "4", "--", "python", str(EXAMPLE), "--batch", "{B}"], "give two or more different values"),
    (["--values", "4,4", "--", "python", str(EXAMPLE), "--batch", "{B}"], "give two or more different values"),
    (["--gpu", "GTX 9090", "--", "python", str(EXAMPLE), "--batch", "{B}"], "unknown GPU 'GTX 9090'"),
    (["--", "python", "no_such_train.py", "--batch", "{B}"], "no script 'no_such_train.py'"),
    ([], "give the script after --"),
    (["--timeout", "0", "--", "python", str(EXAMPLE), "--batch", "{B}"], "--timeout must be"),
    (["--steps", "-1", "--", "python", str(EXAMPLE), "--batch", "{B}"], "--steps must be >= 0"),
    (["-o", "/no/such/folder/x", "--", "python", str(EXAMPLE), "--batch", "{B}"], "folder /no/such/folder does not exist"),
])
def test_bad_input_is_refused_in_one_line_before_any_capture(cli, argv, message):
    code, out, err = cli("fit", *argv)
    assert code == 2 and out == ""
    assert err.startswith("allocsim fit: error: ") and message in err and err.count("\n") == 1, err


def test_a_file_fit_did_not_write_is_never_replaced(cli, tmp_path):
    keep = tmp_path / "out"
    keep.mkdir()
    foreign = keep / "fit_example.B2.rtx-4090.parquet"
    foreign.write_text("not a trace")
    code, _, err = cli("fit", "--gpu", "RTX 4090", "-o", keep, "--", sys.executable, EXAMPLE, "--batch", "{B}")
    assert code == 2 and "exists and is not" in err and foreign.read_text() == "not a trace"


def test_scaled_captures_keep_their_workspaces_and_card():
    """The trace scale predicts from captures says its cuBLAS workspaces are in it (run --gpu and --find-max
    --gpu must not take them off twice) and which card it was captured for."""
    from allocsim.scale import load_input, scale_inputs

    inputs = [load_input(str(ROOT / "traces" / "scales" / f"bert_b{b}_s128.json.gz"), Fraction(b)) for b in (1, 2)]
    plain = scale_inputs(inputs, Fraction(4), "batch").trace.meta.version_hints
    assert "cublas_workspaces" not in plain and "gpu" not in plain          # a CPU Kineto trace: no workspaces
    for item in inputs:
        item.trace.meta.version_hints.update(cublas_workspaces="in trace", gpu={"name": "H100"})
    hints = scale_inputs(inputs, Fraction(4), "batch").trace.meta.version_hints
    assert hints["cublas_workspaces"] == "in trace" and hints["gpu"] == {"name": "H100"}


def test_find_max_on_gpu_does_not_take_off_workspaces_a_trace_holds(cli, tmp_path):
    """``scale --find-max --gpu`` on inputs that hold their cuBLAS workspaces (captures, GPU snapshots) searches
    the memory ``run --gpu`` gives such a trace: the workspaces are not taken off a second time."""
    from allocsim.gpus import allocator_capacity
    from allocsim.trace import read_trace, write_trace

    specs = []
    for b in (1, 2):
        trace = read_trace(str(ROOT / "traces" / "scales" / f"bert_b{b}_s128.json.gz"))
        plain = str(ROOT / "traces" / "scales" / f"bert_b{b}_s128.json.gz") + f"@{b}"
        trace.meta.version_hints["cublas_workspaces"] = "in trace"
        path = tmp_path / f"b{b}.parquet"
        write_trace(trace, str(path))
        specs.append((plain, f"{path}@{b}"))
    gpu = find_gpu("RTX 4090")
    for which, in_trace in ((0, False), (1, True)):
        code, out, err = cli("scale", *(s[which] for s in specs), "--gpu", "RTX 4090", "--find-max", "--no-advise",
                             "--json", "--max-value", "8")
        assert code == 0, err
        # FITS only at the high end of the unknown terms: the search's capacity is the card's at that end
        assert json.loads(out)["find_max"]["capacity_bytes"] == allocator_capacity(gpu, in_trace, end="high")
    assert allocator_capacity(gpu, True) - allocator_capacity(gpu, False) == 20 << 20     # two 10 MiB segments


def _answer(**changes) -> GpuAnswer:
    gpu = find_gpu("RTX 4090")
    estimate = {"total_bytes": 23 << 30, "reserved_peak_bytes": (23 << 30) - (400 << 20), "library_bytes": 0,
                "context_bytes": 400 << 20, "caveat": None}
    base = dict(gpu=gpu, captured_for=gpu.name, capture_note="", capacity_bytes=24 << 30, value=487, at_limit=False,
                setting="max_split_size_mb:64", run_args=["--policy", "pytorch", "--alloc-conf", "max_split_size_mb:64"],
                estimate=estimate, first_failing=488, why_not="no setting of the grid fits", defaults_value=419,
                defaults_estimate=estimate, defaults_why_not="OUT OF MEMORY", range_low=480, range_high=490,
                range_note="open", bound_value=488, extrapolation=121.75, gpu_note=None, find_max={})
    base.update(changes)
    return GpuAnswer(**base)


def test_the_text_says_the_answer_the_setting_the_total_and_the_range():
    run = CaptureRun(2, "RTX 4090", None, None, 3.0, 659, 1 << 20)
    nothing = _answer(gpu=find_gpu("RTX 4060"), captured_for="RTX 4090", capture_note="scratch follows 128 SMs",
                      value=None, first_failing=1, why_not="no allocator setting can fit: peak live 9 GiB > 7 GiB",
                      estimate=None, range_low=None, range_high=None, gpu_note="label note")
    result = FitResult(["python", "train.py", "--batch", "{B}"], "B", "batch", [2, 4], 2, [run, run],
                       [_answer(), nothing], 6.0, 20.0, None, [])
    text = result.format_text()
    assert text.splitlines()[0] == "allocsim fit: python train.py --batch {B}"
    assert "RTX 4090 (23.64 GiB): B = 487 with PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:64" in text
    assert "  predicted total 23.00 GiB of 23.64 GiB: reserved peak 22.61 GiB" in text
    ranged = _answer(estimate={"total_bytes": 23 << 30, "total_low_bytes": 22 << 30, "total_high_bytes": 23 << 30,
                               "reserved_peak_bytes": 22 << 30, "library_bytes": 0, "caveat": None,
                               "unknown_terms": {"context_bytes": {"label": "CUDA context and loaded kernels",
                                                                   "bytes": 1 << 29, "low_bytes": 0,
                                                                   "high_bytes": 1 << 30}}},
                     point_value=500, point_first_failing=501)
    lines = FitResult(["python", "t.py", "{B}"], "B", "batch", [2, 4], 2, [], [ranged], 1.0, 1.0, None,
                      []).format_text().splitlines()
    assert ("  predicted total 23.00 GiB (22.00 GiB to 23.00 GiB) of 23.64 GiB: reserved peak 22.00 GiB (cuBLAS "
            "workspaces included) + libraries 0 B + CUDA context and loaded kernels 512.00 MiB (0 B to 1.00 GiB)") in lines
    assert ("  487 fits with every unknown term at its high end; at their point estimates B = 500 fits with the same "
            "setting (501 does not)") in lines
    assert "  with PyTorch's defaults: B = 419 (predicted total 23.00 GiB)" in text
    assert "  range: 480 to 490 (open)" in text
    assert "RTX 4060 (8.00 GiB, label): nothing fits, not even B = 1: no allocator setting can fit" in text
    assert "  captured for RTX 4090: scratch follows 128 SMs" in text
    assert ("confirm an answer: allocsim capture --gpu 'RTX 4090' --steps 2 -o at.parquet -- python train.py "
            "--batch 487") in text
    assert text.endswith("captures deleted (give -o DIR to keep them)")
    data = json.loads(json.dumps(result.to_dict()))
    assert [a["value"] for a in data["answers"]] == [487, None]
    assert data["answers"][0]["setting_line"] == "PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:64"
    assert result.any_fits


# ----------------------------------------------------------------------------------------- full
def _run_cli(*argv) -> tuple[int, str, str]:
    """``allocsim ARGV`` in this process (module fixtures cannot use capsys)."""
    from allocsim.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """``allocsim fit --json -o DIR`` on the shipped script, default GPUs, default values and steps."""
    folder = tmp_path_factory.mktemp("fit")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "allocsim", "fit", "--json", "-o", str(folder / "captures"), "--",
                           sys.executable, str(EXAMPLE), "--batch", "{B}"], capture_output=True, text=True, env=env,
                          timeout=900, cwd=folder)
    seconds = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), seconds, folder


def _capture_direct(folder, gpu: str, value: int):
    """The script captured directly at ``value`` for ``gpu`` (``allocsim capture --gpu``'s API)."""
    from allocsim.torch_capture.session import capture

    path = folder / f"direct.{gpu.replace(' ', '_')}.B{value}.parquet"
    if not path.exists():
        with open(folder / (path.name + ".log"), "w") as log:
            result, _ = capture([sys.executable, str(EXAMPLE), "--batch", str(value)], str(path),
                                steps=DEFAULT_STEPS, gpu=find_gpu(gpu).capture_properties(), stdout=log, stderr=log)
        assert result.status == 0, result.message
    return path


def _replay(path, gpu: str, run_args: list[str]) -> dict:
    """``allocsim run PATH --gpu GPU`` with the answer's setting: its ``gpu_estimate``."""
    extra = [a for a in run_args if a not in ("--policy", "pytorch")]
    code, out, err = _run_cli("run", path, "--policy", "pytorch", "--gpu", gpu, "--fast", "--json", "--sites", "0",
                              *extra)
    assert code in (0, 3), err
    return json.loads(out)["gpu_estimate"]


@pytest.mark.full
def test_fit_on_the_shipped_script_matches_direct_captures(fitted):
    data, seconds, folder = fitted
    print(f"\nallocsim fit on traces/fit_example.py: {seconds:.1f} s "
          f"(captures {data['capture_seconds']:.1f} s, search {data['search_seconds']:.1f} s)")
    assert [a["gpu"] for a in data["answers"]] == list(DEFAULT_GPUS)
    assert data["values"] == list(DEFAULT_VALUES) and data["steps"] == DEFAULT_STEPS
    # the captures ran in the interpreter given after -- and name its torch (no --torch: nothing to note)
    import torch

    assert data["torch"]["trace_torch"] == torch.__version__ and data["torch"]["note"] is None
    # one capture per value for each compute-capability class: RTX 4090 (8.9) stands for A100 (8.0)
    assert sorted({c["gpu"] for c in data["captures"]}) == ["H100", "RTX 4090"] and len(data["captures"]) == 4
    checks = []
    for a in data["answers"]:
        assert a["value"] is not None and not a["at_limit"], a
        assert a["range_low"] <= a["value"] <= a["range_high"]
        assert a["defaults_value"] is not None and a["defaults_value"] <= a["value"]
        assert a["estimate"]["total_bytes"] <= a["gpu_total_bytes"]
        checks += [(a, a["value"], a["run_args"], "best"), (a, a["value"] + 1, a["run_args"], "best"),
                   (a, a["defaults_value"], ["--policy", "pytorch"], "defaults"),
                   (a, a["defaults_value"] + 1, ["--policy", "pytorch"], "defaults")]
    wanted = sorted({(a["gpu"], value) for a, value, _args, _which in checks})
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:     # captures two at a time
        paths = dict(zip(wanted, pool.map(lambda job: _capture_direct(folder, *job), wanted)))
    truths = [_replay(paths[(a["gpu"], value)], a["gpu"], args) for a, value, args, _which in checks]
    for (a, value, _args, which), truth in zip(checks, truths):
        answer = a["value"] if which == "best" else a["defaults_value"]
        where = f"{a['gpu']} B={value} ({which}: fit said {answer})"
        if value == answer:
            assert truth["fits"] is True, where
            predicted = (a["estimate"] if which == "best" else a["defaults_estimate"])["total_bytes"]
            # the predicted total is the direct capture's, within 0.5% (exact on this script)
            assert abs(predicted - truth["total_bytes"]) <= 0.005 * truth["total_bytes"], (where, predicted, truth)
        else:
            assert truth["fits"] is False or (which == "best" and value <= a["range_high"]), where


@pytest.mark.full
def test_the_answers_the_docs_quote_are_what_fit_answers(fitted):
    """Every answer line README.md and docs/fit.md quote (``GPU (MEMORY): B = N with SETTING``, ``with PyTorch's
    defaults: B = N``) is what this run answers."""
    from allocsim.units import format_bytes

    data, _seconds, _folder = fitted
    heads, defaults = set(), set()
    for a in data["answers"]:
        label = "" if a["gpu_total_verified"] else ", label"
        heads.add(f"{a['gpu']} ({format_bytes(a['gpu_total_bytes'])}{label}): B = {a['value']} with "
                  f"{a['setting_line']}")
        defaults.add(f"with PyTorch's defaults: B = {a['defaults_value']} ")
    quoted = 0
    for page in (ROOT / "README.md", ROOT / "docs" / "fit.md"):
        for line in page.read_text(encoding="utf-8").splitlines():
            line = line.removeprefix("# ").strip()
            if re.fullmatch(r"[\w .]+ \([\d.]+ GiB(, label)?\): B = \d+ with .*", line):
                assert line in heads, (page.name, line, heads)
                quoted += 1
            elif line.startswith("with PyTorch's defaults: B = "):
                assert any(line.startswith(d) for d in defaults), (page.name, line)
                quoted += 1
    assert quoted >= 4


@pytest.mark.full
def test_kept_captures_replay_the_search_with_allocsim_scale(fitted):
    data, _seconds, folder = fitted
    for capture in data["captures"]:
        assert os.path.isfile(capture["path"]) and os.path.isfile(capture["log"])
        with open(capture["log"]) as fh:
            assert fh.readline().startswith("# allocsim fit: output of ") and "step 0: loss" in fh.read()
    first = data["answers"][0]
    assert data["replay"][0].startswith("allocsim scale ") and data["replay"][0].endswith(
        "--name batch --gpu 'RTX 4090' --find-max")
    mine = [f"{c['path']}@{c['value']}" for c in data["captures"] if c["gpu"] == "RTX 4090"]
    assert all(spec in data["replay"][0] for spec in mine)
    code, out, err = _run_cli("scale", *mine, "--gpu", "RTX 4090", "--find-max", "--no-advise", "--json")
    assert code == 0, err
    assert json.loads(out)["find_max"]["recorded"]["value"] == first["defaults_value"]


@pytest.mark.full
def test_advise_on_gpu_gives_a_capture_the_memory_run_gives_it(fitted):
    """``advise --gpu`` on a capture (which holds its cuBLAS workspaces) advises at the capacity ``run --gpu`` uses."""
    from allocsim.gpus import allocator_capacity

    data, _seconds, _folder = fitted
    capture = next(c for c in data["captures"] if c["gpu"] == "RTX 4090")
    code, out, err = _run_cli("advise", capture["path"], "--gpu", "RTX 4090", "--fast", "--json", "--workers", "1")
    assert code == 0, err
    # with the unknown terms at the high end of their ranges, as run --gpu's FITS
    assert json.loads(out)["capacity_bytes"] == allocator_capacity(find_gpu("RTX 4090"), True, end="high",
                                                                   capture=True)


@pytest.mark.full
@pytest.mark.parametrize("body, expected", [
    ("if args.batch > 3:\n    raise ValueError(f'batch {args.batch} is too big for this toy')\n",
     "the capture at B = 4 (for RTX 4090) ended with exit status 3: the script raised ValueError: batch 4 is too big "
     "for this toy"),
    ("import sys\nsys.exit(f'cannot use batch {args.batch}')\n",
     "the capture at B = 2 (for RTX 4090) ended with exit status 3: the script exited with cannot use batch 2"),
])
def test_a_script_that_fails_at_a_small_value_says_so(cli, tmp_path, body, expected):
    script = tmp_path / "toy.py"
    script.write_text("import argparse\nimport torch\np = argparse.ArgumentParser()\np.add_argument('--batch', "
                      "type=int)\nargs = p.parse_args()\nx = torch.zeros(args.batch, 10, device='cuda')\n" + body)
    code, out, err = cli("fit", "--gpu", "RTX 4090", "--", sys.executable, script, "--batch", "{B}")
    assert code == 3 and out == ""
    assert err.startswith("allocsim fit: error: " + expected) and err.count("\n") == 1, err


@pytest.mark.full
def test_an_argument_error_shows_the_scripts_own_line(cli, tmp_path):
    code, _out, err = cli("fit", "--gpu", "H100", "--", sys.executable, EXAMPLE, "--bach", "{B}")
    assert code == 3
    assert "ended with exit status 3: the script exited with 2; the script's last line: " in err
    assert "fit_example.py: error: the following arguments are required: --batch" in err and err.count("\n") == 1
