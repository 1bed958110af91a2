"""Paddle's FLAGS vocabulary: --flags, --env-flags, --policy paddle:FLAGS..., and advise's export lines."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from allocsim.settings.alloc_conf import parse_policy_spec
from allocsim.cli import main as cli_main
from allocsim.device import SimulatedDevice
from allocsim.settings.paddle_flags import FLAGS, env_flags, format_flags, parse_flags
from allocsim.policies.registry import build_policy

REPO = Path(__file__).resolve().parents[1]
PADDLE_TRACE = REPO / "traces" / "paddle" / "resnet_fp32.json.gz"   # the smaller real Paddle trace
MiB, GiB = 1 << 20, 1 << 30


def run_here(capsys, *args: str) -> tuple[int, str, str]:
    """The command line in this process (no interpreter start-up): exit status, stdout, stderr."""
    code = cli_main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def test_defaults_select_auto_growth_with_no_parameters():
    flags = parse_flags("FLAGS_allocator_strategy=auto_growth")
    assert (flags.policy, flags.params, flags.limit_bytes) == ("paddle", {}, None)


def test_each_modelled_flag_maps_onto_a_preset_parameter():
    flags = parse_flags("FLAGS_auto_growth_chunk_size_in_mb=64,FLAGS_free_idle_chunk=true,"
                        "FLAGS_free_when_no_cache_hit=1 FLAGS_use_stream_safe_cuda_allocator=false")
    assert flags.policy == "paddle"
    assert flags.params == {"chunk_size": 64 * MiB, "free_idle_chunk": True, "free_when_no_cache_hit": True,
                            "stream_safe": False}
    naive = parse_flags("FLAGS_allocator_strategy=naive_best_fit,FLAGS_fraction_of_gpu_memory_to_use=0.5,"
                        "FLAGS_initial_gpu_memory_in_mb=1024,FLAGS_reallocate_gpu_memory_in_mb=256")
    assert naive.policy == "paddle-naive"
    assert naive.params == {"fraction_of_gpu_memory_to_use": 0.5, "initial_gpu_memory": GiB,
                            "reallocate_gpu_memory": 256 * MiB}
    policy = build_policy(naive.policy, device=SimulatedDevice(None), params=naive.params)
    assert policy.initial_gpu_memory_bytes == GiB and policy.fraction_of_gpu_memory_to_use == 0.5


def test_eager_delete_threshold_wraps_the_strategy_in_deferred_gc():
    flags = parse_flags("FLAGS_eager_delete_tensor_gb=0.5,FLAGS_allocator_strategy=naive_best_fit")
    assert flags.policy == "deferred-gc" and flags.params["inner"] == "paddle-naive"
    assert flags.params["threshold"] == GiB // 2          # GetEagerDeletionThreshold: int64(gb * 2**30)
    assert parse_flags("FLAGS_eager_delete_tensor_gb=0").policy == "paddle"


def test_flags_of_the_other_strategy_change_nothing():
    flags = parse_flags("FLAGS_fraction_of_gpu_memory_to_use=0.5")
    assert flags.policy == "paddle" and flags.params == {}
    assert flags.ignored == ("FLAGS_fraction_of_gpu_memory_to_use",)


def test_gpu_memory_limit_is_a_device_cap():
    assert parse_flags("FLAGS_gpu_memory_limit_mb=4096").limit_bytes == 4 * GiB
    spec = parse_policy_spec("paddle:FLAGS_gpu_memory_limit_mb=100,FLAGS_allocator_strategy=naive_best_fit")
    assert (spec.name, spec.limit_bytes) == ("paddle-naive", 100 * MiB)


@pytest.mark.parametrize("text,message", [
    ("FLAGS_allocator_strategy=thread_local", "thread_local is Paddle's strategy but no preset models it"),
    ("FLAGS_allocator_strategy=buddy", "Paddle knows naive_best_fit, auto_growth, thread_local"),
    ("FLAGS_eager_delete_tensor_gb=-1", "disables the garbage collector"),
    ("FLAGS_fast_eager_deletion_mode=false", "DefaultStreamGarbageCollector"),
    ("FLAGS_memory_fraction_of_eager_deletion=0.5", "picks variables by size"),
    ("FLAGS_use_virtual_memory_auto_growth=true", "VirtualMemoryAutoGrowthBestFitAllocator"),
    ("FLAGS_use_cuda_malloc_async_allocator=true", "say --policy cuda-async"),
    ("FLAGS_initial_cpu_memory_in_mb=100", r"host \(CPU or pinned\) memory"),
    ("FLAGS_free_idle_chunks=true", "did you mean FLAGS_free_idle_chunk?"),
    ("FLAGS_auto_growth_chunk_size_in_mb=1.5", "whole number of MB"),
    ("FLAGS_free_idle_chunk=maybe", "takes true or false"),
    ("FLAGS_allocator_strategy", "expected FLAGS_NAME=VALUE"),
])
def test_refused_flags_say_why_in_one_line(text, message):
    with pytest.raises(ValueError, match=message) as info:
        parse_flags(text)
    assert "\n" not in str(info.value) and str(info.value).startswith("--flags: ")


def test_every_refused_flag_has_a_reason():
    assert all(flag.refused or flag.read for flag in FLAGS.values())


def test_env_flags_read_only_the_allocators_variables():
    env = {"FLAGS_allocator_strategy": "naive_best_fit", "FLAGS_cudnn_deterministic": "1", "PATH": "/bin"}
    flags = env_flags(env)
    assert flags.policy == "paddle-naive" and "cudnn" not in flags.text
    assert env_flags({"FLAGS_cudnn_deterministic": "1"}) is None


@pytest.mark.parametrize("policy,params", [
    ("paddle", {"chunk_size": 64 * MiB, "free_idle_chunk": True}),
    ("paddle-naive", {"initial_gpu_memory": 512 * MiB}),
    ("deferred-gc", {"inner": "paddle", "threshold": GiB, "stream_safe": False}),
])
def test_format_flags_says_a_setting_back_in_pads_words(policy, params):
    said = format_flags(policy, params)
    back = parse_flags(",".join(said))
    assert back.policy == policy and back.params == params


def test_policy_spec_keeps_allocsim_names_without_flags():
    assert parse_policy_spec("paddle:chunk_size:64MiB").params == {"chunk_size": "64MiB"}
    spec = parse_policy_spec("paddle:FLAGS_free_idle_chunk=true")
    assert (spec.name, spec.params, spec.text) == ("paddle", {"free_idle_chunk": True},
                                                   "paddle:FLAGS_free_idle_chunk=true")


# ----------------------------------------------------------------------------- the command line, on a real trace
def test_run_flags_equal_the_same_settings_by_name(capsys):
    code_a, out_a, err_a = run_here(capsys, "run", PADDLE_TRACE, "--policy", "paddle", "--flags",
                                    "FLAGS_auto_growth_chunk_size_in_mb=64", "--fast", "--json", "--sites", "0")
    code_b, out_b, err_b = run_here(capsys, "run", PADDLE_TRACE, "--policy", "paddle:chunk_size:64MiB", "--fast",
                                    "--json", "--sites", "0")
    assert code_a == code_b == 0, err_a + err_b
    a, b = json.loads(out_a), json.loads(out_b)
    assert a["peak_reserved_bytes"] == b["peak_reserved_bytes"] and a["params"] == b["params"]


def test_run_env_flags_and_the_memory_limit(capsys, monkeypatch):
    limit_mb = 160           # below the trace's 180 MiB peak live, above its largest request: it must fail
    monkeypatch.setenv("FLAGS_gpu_memory_limit_mb", str(limit_mb))
    monkeypatch.setenv("FLAGS_cudnn_deterministic", "1")        # not the allocator's: left alone
    code, out, _ = run_here(capsys, "run", PADDLE_TRACE, "--policy", "paddle", "--env-flags", "--fast", "--json",
                            "--sites", "0")
    data = json.loads(out)
    assert data["capacity_bytes"] == limit_mb * MiB and data["verdict"]["fits"] is False and code in (1, 3)
    assert data["verdict"]["capacity_note"] == f"FLAGS_gpu_memory_limit_mb={limit_mb}"


@pytest.mark.parametrize("args", [["--flags", "FLAGS_nope=1"], ["--env-flags"],
                                  ["--flags", "FLAGS_free_idle_chunk=true", "--alloc-conf", "expandable_segments:True"]])
def test_bad_flags_exit_2_with_one_line(capsys, monkeypatch, args):
    for name in [n for n in os.environ if n.startswith("FLAGS_")]:
        monkeypatch.delenv(name)
    try:
        code, _out, err = run_here(capsys, "run", PADDLE_TRACE, "--policy", "paddle", *args, "--fast")
    except SystemExit as exc:           # argparse: the two options are mutually exclusive
        code, err = exc.code, capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 or err.startswith("usage:")


@pytest.mark.full
def test_advise_prints_export_lines_and_json_flags(tmp_path, capsys):
    code, out, err = run_here(capsys, "advise", PADDLE_TRACE, "--policy", "paddle", "--capacity", "256MiB", "--fast",
                              "--json", "--workers", "1", "-o", tmp_path / "runs.parquet")
    assert code == 0, err
    data = json.loads(out)
    assert data["recommendations"] and any(rec["flags"] for rec in data["recommendations"])
    for rec in data["recommendations"]:
        assert rec["alloc_conf"] is None and isinstance(rec["flags"], list)
        if rec["flags"]:
            assert rec["line"] == "export " + " ".join(rec["flags"])
            assert "--flags " + ",".join(rec["flags"]) in rec["command"]
    best = data["recommendations"][0]          # the printed command replays the advice
    code, out, _ = run_here(capsys, *best["command"].split()[1:], "--fast", "--json", "--sites", "0")
    assert json.loads(out)["peak_reserved_bytes"] == best["peak_reserved_bytes"]
