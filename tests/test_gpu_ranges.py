"""The unknown terms' ranges (``allocsim.gpu_ranges``) and the --gpu verdicts that bet on their high end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from allocsim import gpu_ranges
from allocsim.errors import AllocsimError
from allocsim.gpus import GPUS, allocator_capacity, find_gpu, gpu_estimate, terms_of
from allocsim.torch_capture import cudnn
from allocsim.trace import write_trace
from allocsim.trace.reading.builder import TraceBuilder
from allocsim.trace.reading.frames import FrameTable
from allocsim.trace.schema import FRAME_DTYPES, STACK_DTYPES, frame_from_columns

REPO = Path(__file__).resolve().parents[1]
MiB = 1 << 20
GiB = 1 << 30


def _capture_like(tmp_path, sizes, *, conv=False, name="t.parquet", benchmark=False):
    """A trace that says it is an allocsim capture; ``conv``: its first request is a cuDNN workspace."""
    builder = TraceBuilder(name, "test")
    frames = FrameTable(name)
    for i, size in enumerate(sizes):
        index = builder.next_event_index
        builder.alloc(i, i, 0, 0, 0x1000 + i * (1 << 34), size)
        if conv and i == 0:
            label = cudnn.label("forward", [8, 64, 56, 56], [64, 64, 3, 3], [8, 64, 56, 56], 1, 4)
            builder.set_stack_id(index, frames.stack_id([{"filename": "allocsim-capture", "line": 0,
                                                          "name": label}], "r"))
    builder.meta.version_hints.update({"capture": "cuda on meta", "cublas_workspaces": "in trace",
                                       "cudnn_flags": {"benchmark": benchmark, "allow_tf32": True}})
    trace = builder.finish()
    tables = frames.tables()
    trace.frames = frame_from_columns(tables["frames"], FRAME_DTYPES)
    trace.stacks = frame_from_columns(tables["stacks"], STACK_DTYPES)
    path = tmp_path / name
    write_trace(trace, str(path))
    return str(path)


def test_an_ambiguous_name_is_refused_with_the_choices_by_every_command(tmp_path, cli):
    with pytest.raises(AllocsimError, match=r"'A100' is ambiguous: .*--gpu \"A100 40GB\" or --gpu \"A100 80GB\""):
        find_gpu("A100")
    with pytest.raises(AllocsimError, match="V100 16GB"):
        find_gpu("nvidia v100")
    assert find_gpu("A100 80GB").name == "A100 80GB" and find_gpu("a100-40gb").name == "A100 40GB"
    path = _capture_like(tmp_path, [1 << 20])
    for argv in (("run", path, "--gpu", "A100"), ("advise", path, "--gpu", "A100", "--fast"),
                 ("scale", f"{path}@1", f"{path}@2", "--gpu", "A100", "--find-max")):
        code, _out, err = cli(*argv)
        assert code == 2 and "is ambiguous" in err, (argv, err)


def test_the_common_cards_are_known_each_with_a_source():
    names = {g.name for g in GPUS}
    assert {"RTX 3080", "RTX 3090", "RTX A6000", "L4", "A10", "A10G", "RTX 4090", "T4", "A40", "L40",
            "H100 PCIe", "H100 NVL", "H20", "B200"} <= names
    assert find_gpu("A6000").name == "RTX A6000" and find_gpu("a10g").name == "A10G"
    for name in ("RTX 3080", "RTX 3090", "RTX A6000", "A40", "H100 NVL"):
        gpu = find_gpu(name)
        assert gpu.verified and str(gpu.total_bytes) in gpu.total_source.replace(",", ""), name
    for name in ("A10G", "L40", "H100 PCIe", "H20", "B200"):     # no printout with its repository: the label
        assert not find_gpu(name).verified and "unverified" in find_gpu(name).total_source


def test_each_end_leaves_the_allocator_less_the_higher_the_terms():
    for gpu in (find_gpu("RTX 4090"), find_gpu("H100")):
        for conv in (False, True):
            low, point, high = (allocator_capacity(gpu, True, end=e, cudnn=conv) for e in ("low", "point", "high"))
            assert low >= point >= high > 0
    with pytest.raises(ValueError, match="end must be one of"):
        allocator_capacity(find_gpu("H100"), end="middle")


def test_the_estimate_carries_a_range_and_each_unknown_term_its_own():
    gpu = find_gpu("H100")
    est = gpu_estimate(gpu, 10 * GiB, workspaces_in_trace=True, cudnn=True)
    assert set(est["unknown_terms"]) == {"context_bytes", "cudnn_bytes"}
    terms = est["unknown_terms"].values()
    assert est["total_low_bytes"] == 10 * GiB + sum(t["low_bytes"] for t in terms)
    assert est["total_high_bytes"] == 10 * GiB + sum(t["high_bytes"] for t in terms)
    assert est["total_bytes"] == 10 * GiB + sum(t["bytes"] for t in terms)
    assert est["total_low_bytes"] <= est["total_bytes"] <= est["total_high_bytes"]
    assert all(t["low_bytes"] <= t["bytes"] <= t["high_bytes"] and t["source"] for t in terms)
    plain = gpu_estimate(gpu, 10 * GiB, workspaces_in_trace=True)
    assert set(plain["unknown_terms"]) == {"context_bytes"} and plain["cudnn_bytes"] == 0


def test_the_verdict_bets_on_the_high_end_and_names_the_term_that_decides():
    gpu = find_gpu("H100")
    terms = terms_of(gpu, 0)
    context = terms[0]
    spread = context.high_bytes - context.bytes
    assert spread > 0 and context.bytes - context.low_bytes >= 0
    card = gpu.total_bytes
    fits = gpu_ranges.judge(card, card - context.high_bytes, terms)
    assert fits["verdict"] == "fits" and fits["deciding_terms"] == []
    between = gpu_ranges.judge(card, card - context.high_bytes + 1, terms)
    assert between["verdict"] == "fits_unless"
    (decides,) = between["deciding_terms"]
    assert decides["key"] == "context_bytes" and decides["at_most_bytes"] == context.high_bytes - 1
    words = gpu_ranges.verdict_words(between, terms)
    assert words.startswith("FITS UNLESS the CUDA context and loaded kernels take more than")
    nope = gpu_ranges.judge(card, card - context.low_bytes + 1, terms)
    assert nope["verdict"] == "does_not_fit" and gpu_ranges.verdict_words(nope, terms) == "DOES NOT FIT"
    # a replay that fits at an end's capacity decides over the sums (the allocator frees its cache)
    assert gpu_ranges.judge(card, card, terms, fits_high=True)["verdict"] == "fits"


def test_run_gpu_takes_pytorch_for_a_capture_and_says_so(tmp_path, cli):
    path = _capture_like(tmp_path, [1 << 30])
    code, out, err = cli("run", path, "--gpu", "RTX 4090", "--fast", "--sites", "0")
    assert code == 0 and "--policy pytorch (the trace is an allocsim capture" in err
    assert out.strip().splitlines()[-1].startswith("FITS on RTX 4090")
    builder = TraceBuilder("plain.parquet", "test")
    builder.alloc(0, 0, 0, 0, 0x1000, 1 << 20)
    plain = tmp_path / "plain.parquet"
    write_trace(builder.finish(), str(plain))
    code, _out, err = cli("run", str(plain), "--gpu", "RTX 4090", "--fast")
    assert code == 2 and "give --policy NAME" in err and len(err.strip().splitlines()) == 1


def test_a_run_that_does_not_fit_says_what_it_needs_not_what_it_held_at_the_oom(tmp_path, cli):
    gpu = find_gpu("RTX 3060")
    big = 8 * GiB
    path = _capture_like(tmp_path, [big, big])            # 16 GiB live on a 12 GiB card: out of memory at the 2nd
    code, out, _ = cli("run", path, "--gpu", "RTX 3060", "--fast", "--sites", "0", "--json")
    est = json.loads(out)["gpu_estimate"]
    assert code == 3 and est["verdict"] == "does_not_fit"
    assert est["reserved_peak_bytes"] == 2 * big            # what the run needs, not the 8 GiB held at the OOM
    assert est["total_bytes"] == 2 * big + gpu.context_bytes
    code, out, _ = cli("run", path, "--gpu", "RTX 3060", "--fast", "--sites", "0")
    line = out.strip().splitlines()[-1]
    assert line.startswith("DOES NOT FIT on RTX 3060") and "reserved peak 16.00 GiB" in line


def test_a_run_between_the_ends_says_fits_unless_and_exits_3(tmp_path, cli):
    gpu = find_gpu("RTX 4090")
    context = terms_of(gpu, 0)[0]
    size = (gpu.total_bytes - context.bytes) >> 21 << 21  # fits at the point, not with the context's high end
    assert size + context.high_bytes > gpu.total_bytes >= size + context.bytes
    path = _capture_like(tmp_path, [size])
    code, out, _ = cli("run", path, "--gpu", "RTX 4090", "--fast", "--sites", "0", "--json")
    est = json.loads(out)["gpu_estimate"]
    assert code == 3 and est["verdict"] == "fits_unless" and est["fits"] is False and est["fits_point"] is True
    # the context's range crosses the card's memory (and a capture's placement term, 0.2% high, here too)
    assert "context_bytes" in [d["key"] for d in est["deciding_terms"]]
    assert set(est["unknown_terms"]) == {"context_bytes", "placement_bytes"}
    code, out, _ = cli("run", path, "--gpu", "RTX 4090", "--fast", "--sites", "0")
    assert code == 3 and out.strip().splitlines()[-1].startswith(
        "FITS UNLESS the CUDA context and loaded kernels take more than")


def test_a_capture_that_runs_cudnn_gets_the_cudnn_term_and_benchmark_a_caveat(tmp_path, cli):
    from allocsim.trace import read_trace

    conv = _capture_like(tmp_path, [1 << 20], conv=True, name="c.parquet")
    plain = read_trace(_capture_like(tmp_path, [1 << 20], name="p.parquet"))
    assert gpu_ranges.runs_cudnn(read_trace(conv)) and not gpu_ranges.runs_cudnn(plain)
    code, out, _ = cli("run", conv, "--gpu", "H100", "--fast", "--sites", "0", "--json")
    est = json.loads(out)["gpu_estimate"]
    assert set(est["unknown_terms"]) == {"context_bytes", "cudnn_bytes"} and "cudnn_benchmark_note" not in est
    timed = _capture_like(tmp_path, [1 << 20], conv=True, name="b.parquet", benchmark=True)
    code, out, _ = cli("run", timed, "--gpu", "H100", "--fast", "--sites", "0")
    assert "cudnn.benchmark is on" in out.strip().splitlines()[-1]


def test_the_ranges_are_the_calibration_files():
    ranges = json.loads((REPO / "validate" / "milabench_calibration.json").read_text())["ranges"]
    assert gpu_ranges.CONTEXT0_LOW_BYTES == ranges["context0_low_bytes"]
    assert gpu_ranges.CONTEXT0_HIGH_BYTES == ranges["context0_high_bytes"]
    assert gpu_ranges.CUDNN_SHARE_LOW == ranges["cudnn_share_low"]
    assert gpu_ranges.CUDNN_SHARE_HIGH == ranges["cudnn_share_high"]
    assert gpu_ranges.PLACEMENT_SHARE_LOW == ranges["placement_share_low"]
    assert gpu_ranges.PLACEMENT_SHARE_HIGH == ranges["placement_share_high"]
    assert gpu_ranges.CUDNN_KERNELS_LOW_BYTES == ranges["cudnn_kernels_low_bytes"]
    assert gpu_ranges.CUDNN_KERNELS_HIGH_BYTES == ranges["cudnn_kernels_high_bytes"]
    # the points are the L40S group's fitted terms (torch 2.6 / cuDNN 9.5, the library version of the check tables)
    from allocsim.gpus import CONTEXT0_BYTES_FITTED

    terms = json.loads((REPO / "validate" / "milabench_calibration.json").read_text())["terms"]
    (l40s,) = [t for t in terms if t["card"] == "L40S"]
    assert (CONTEXT0_BYTES_FITTED, gpu_ranges.CUDNN_BYTES_FITTED) == (l40s["context0_bytes"], l40s["cudnn_bytes"])
    assert gpu_ranges.CONTEXT0_LOW_BYTES <= 192937984 <= gpu_ranges.CONTEXT0_HIGH_BYTES   # the point inside
    # learned on calibrate rows only: no check card's row among what they came from
    used = ([v["group"] for v in ranges["context_values"]] + [s["row"] for s in ranges["cudnn_shares"]]
            + [s["row"] for s in ranges["placement_shares"]])
    assert used and not any(card in text for text in used for card in ("H100", "H200"))


def test_advise_on_a_gpu_advises_at_the_high_end_and_says_so(tmp_path, cli):
    path = _capture_like(tmp_path, [1 << 30])
    code, out, _ = cli("advise", path, "--gpu", "RTX 4090", "--fast", "--workers", "1", "--json")
    data = json.loads(out)
    assert code == 0 and data["capacity_bytes"] == allocator_capacity(find_gpu("RTX 4090"), True, end="high",
                                                                      capture=True)
    assert "high end of its range" in data["gpu_capacity_note"]
