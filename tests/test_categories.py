"""Memory categories: the split adds up exactly, and it agrees with what the recorded programs did."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from allocsim.cli import main
from allocsim.metrics.categories import CATEGORIES, categorize, trace_categories
from allocsim.metrics.sites.rows import live_at_peak
from allocsim.trace import read_trace

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOTS = ROOT.parent / "shared" / "traces" / "pytorch-snapshots"
FULL_STEP = "kkaitlyn111__memory_ctx128_fullstep.pickle"


def run_cli(capsys, *argv) -> tuple[int, str]:
    code = main([str(a) for a in argv])
    out, _ = capsys.readouterr()
    return code, out


@pytest.fixture(scope="module")
def full_step(shared_dir):
    return read_trace(SNAPSHOTS / FULL_STEP)


@pytest.mark.shared
def test_full_step_adamw_snapshot_agrees_with_the_program(full_step):
    """2.7B-model AdamW step: weights = the start state, Adam's state = 2 x weights, <= 10% unknown."""
    split = trace_categories(full_step)["at_peak"]
    peak = live_at_peak(full_step)
    assert sum(split.values()) == peak.live_bytes
    weights = int(full_step.initial_allocs["size_bytes"].sum())        # alive before the step began
    assert split["parameter"] == weights
    assert abs(split["optimizer_state"] - 2 * weights) <= 0.001 * 2 * weights
    assert abs(split["gradient"] - weights) <= 0.001 * weights
    assert split["unknown"] <= 0.10 * peak.live_bytes
    assert split["activation"] < 0.01 * peak.live_bytes     # the peak is in the optimizer step


@pytest.mark.shared
def test_every_shared_snapshot_splits_exactly(shared_dir):
    """Each snapshot's split at its peak adds up to the live bytes there, to the byte; codes are valid."""
    for path in sorted(SNAPSHOTS.glob("*.pickle")):
        trace = read_trace(path)
        for device in trace.devices:
            one = trace.for_device(device)
            cats = categorize(one)
            assert set(np.unique(cats.codes).tolist()) <= set(range(len(CATEGORIES))), path.name
            peak = live_at_peak(one)
            assert sum(cats.split(peak.alloc_ids, peak.size_bytes).values()) == peak.live_bytes, path.name
            assert sum(r["allocations"] for r in cats.rules) == len(cats.alloc_ids), path.name


@pytest.mark.parametrize("name", ["bert_fp32", "bert_bf16", "bert_recompute", "gpt2_small"])
def test_cpu_captures_find_the_models_gradients(name):
    """zero_grad(set_to_none=True) after each step frees every gradient: the model's parameter bytes per step.

    The captures' ``.meta.json`` count the parameters from the model; the rule finds them plus a few
    scalars the step frees with them (the loss: at most 8 KiB).
    """
    meta = json.loads((ROOT / "traces" / f"{name}.meta.json").read_text())
    trace = read_trace(ROOT / "traces" / f"{name}.json.gz")
    rule = [r for r in categorize(trace).rules if r["category"] == "gradient"]
    assert len(rule) == 1
    per_step = rule[0]["bytes"] / meta["steps"]
    assert meta["resident_before_window"]["param_bytes"] <= per_step <= meta["resident_before_window"]["param_bytes"] + 8192


def test_recompute_capture_peak_holds_every_gradient():
    """With activation recomputation the step's peak is in backward, when every gradient is already made."""
    meta = json.loads((ROOT / "traces" / "bert_recompute.meta.json").read_text())
    split = trace_categories(read_trace(ROOT / "traces" / "bert_recompute.json.gz"))["at_peak"]
    params = meta["resident_before_window"]["param_bytes"]
    assert params <= split["gradient"] <= params + 8192
    assert split["unknown"] == 0


@pytest.mark.shared
def test_run_json_and_text_carry_categories(shared_dir, capsys):
    """``run --json``: splits at the peak and the OOM add up to the live bytes; site rows name a category."""
    code, out = run_cli(capsys, "run", SNAPSHOTS / FULL_STEP, "--policy", "pytorch", "--fast",
                        "--capacity", "40GiB", "--sites", "5", "--json")
    summary = json.loads(out)
    cats = summary["categories"]
    assert code == 3
    assert sum(cats["at_peak"].values()) == summary["peak_requested_bytes"] == cats["moments"]["at_peak"]["bytes"]
    assert sum(cats["at_oom"].values()) == cats["moments"]["at_oom"]["bytes"] > 0
    assert sum(cats["at_oom"].values()) == summary["sites"]["moments"]["at_oom"]["bytes"]
    rows = {r["site"].rsplit("/", 1)[-1]: r for r in summary["sites"]["at_peak"]}
    assert rows["optimizers.py:82 in step"]["category"] == "optimizer_state"
    assert rows["unattributed"]["category"] == "parameter"
    for r in summary["sites"]["at_peak"]:
        assert sum(r["categories"].values()) == r["bytes"]
    code, text = run_cli(capsys, "run", SNAPSHOTS / FULL_STEP, "--policy", "pytorch", "--fast", "--sites", "3")
    assert code == 0
    assert "Memory by category at the peak of requested memory: optimizer state 25.38 GiB (50%)" in text
    assert "optimizers.py:82 in step  (optimizer state)" in text


def test_info_prints_categories_and_their_evidence(capsys):
    code, out = run_cli(capsys, "info", ROOT / "traces" / "bert_fp32.json.gz", "--sites", "0")
    assert code == 0
    assert "Memory by category at the peak of live bytes: activations" in out
    assert "freed by the run of frees that ends a step (zero_grad)" in out
    code, out = run_cli(capsys, "info", ROOT / "traces" / "bert_fp32.json.gz", "--json")
    cats = json.loads(out)["categories"]
    assert sum(cats["at_peak"].values()) == cats["moments"]["at_peak"]["bytes"] > 0


def test_category_timeline_adds_up_and_keeps_the_peak():
    """Over time: per bucket the categories add up to the live bytes there, and the peak bucket is the peak."""
    from allocsim.metrics.categories import category_timeline
    from allocsim.trace.inference.stats import live_bytes_series

    trace = read_trace(ROOT / "traces" / "bert_recompute.json.gz")
    tl = category_timeline(trace, categorize(trace), columns=300)
    _, total = live_bytes_series(trace)
    sums = [sum(tl["bytes"][c][i] for c in CATEGORIES) for i in range(len(tl["x"]))]
    assert sums == [int(total[e]) for e in tl["event_index"]]
    assert max(sums) == int(total.max()) and len(tl["x"]) == 300
    assert max(tl["bytes"]["gradient"]) > 0 and max(tl["bytes"]["activation"]) > 0


@pytest.mark.shared
def test_inference_kineto_trace_has_no_gradients(shared_dir):
    """Qwen chat inference on an H100 (operators recorded, no backward): nothing is a gradient or optimizer
    state, though the step ends by freeing its outputs in one run."""
    trace = read_trace(shared_dir / "traces" / "kineto-gpu" / "AMD-AGI_TraceLens_h100_qwen1.5-0.5b.json.gz")
    one = trace.for_device(0)
    cats = categorize(one)
    assert not np.isin(cats.codes, [CATEGORIES.index("gradient"), CATEGORIES.index("optimizer_state")]).any()
    split = trace_categories(one)["at_peak"]
    assert split["unknown"] == 0 and split["parameter"] > 0


# ----------------------------------------------------------------------------- an inference engine's KV cache
def write_inference_window(path: Path, function: str) -> Path:
    """A Kineto inference window inside ``function`` (a Python frame), after 8 GiB were allocated before it."""
    def mem(ts: float, addr: int, nbytes: int, total: int) -> dict:
        return {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": ts,
                "args": {"Addr": addr, "Bytes": nbytes, "Total Allocated": total, "Device Type": 1, "Device Id": 0}}

    before = 8 << 30
    events = [{"ph": "X", "cat": "python_function", "name": f"vllm/v1/engine/core.py(279): {function}", "pid": 1,
               "tid": 1, "ts": 1, "dur": 100},
              {"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": 1, "tid": 1, "ts": 10, "dur": 10},
              mem(11, 0x1000, 1 << 20, before + (1 << 20)),
              {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 30, "dur": 10},
              mem(31, 0x200000, 2 << 20, before + (3 << 20)),
              mem(50, 0x1000, -(1 << 20), before + (2 << 20)),
              mem(60, 0x200000, -(2 << 20), before)]
    path.write_text(json.dumps({"traceEvents": events}), encoding="utf-8")
    return path


def test_memory_from_before_an_inference_window_with_a_kv_cache_is_not_called_parameters(tmp_path):
    """vLLM allocates its KV cache before the window beside the weights: the trace cannot split them."""
    kv = trace_categories(read_trace(write_inference_window(tmp_path / "kv.json", "_initialize_kv_caches")))
    assert kv["at_peak"]["preallocated"] == 8 << 30 and kv["at_peak"]["parameter"] == 0
    [rule] = [r for r in kv["rules"] if r["category"] == "preallocated"]
    assert rule["bytes"] == 8 << 30 and "KV cache" in rule["rule"]
    plain = trace_categories(read_trace(write_inference_window(tmp_path / "plain.json", "_initialize_model")))
    assert plain["at_peak"]["parameter"] == 8 << 30 and plain["at_peak"]["preallocated"] == 0


@pytest.mark.shared
def test_vllm_preallocated_kv_cache_is_not_called_parameters(shared_dir, capsys):
    """vLLM's CUDA-graph capture on an MI300X: 178.45 GiB alive before the window (weights and KV cache)."""
    path = shared_dir / "traces" / "kineto-gpu" / "AMD-AGI_TraceLens_vllm_piecewise_graph_capture.json.gz"
    split = trace_categories(read_trace(path).for_device(0))["at_peak"]
    assert split["preallocated"] == 191_610_968_064 and split["parameter"] == 0
    code, out = run_cli(capsys, "info", path, "--device", "0", "--sites", "0")
    assert code == 0 and "Memory by category at the peak of live bytes: preallocated before the window 178.45 GiB" in out
    assert "parameters" not in out
