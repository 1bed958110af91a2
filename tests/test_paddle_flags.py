"""Paddle's FLAGS vocabulary: --flags, --env-flags, --policy paddle:FLAGS..., and advise's export lines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from allocsim.alloc_conf import parse_policy_spec
from allocsim.device import SimulatedDevice
from allocsim.paddle_flags import FLAGS, env_flags, format_flags, parse_flags
from allocsim.policies.registry import build_policy

REPO = Path(__file__).resolve().parents[1]
PADDLE_TRACE = REPO / "traces" / "paddle" / "ernie_fp32.json.gz"
MiB, GiB = 1 << 20, 1 << 30


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "allocsim", *map(str, args)], capture_output=True, text=True,
                          timeout=600, env={**os.environ, **(env or {})})


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
def test_run_flags_equal_the_same_settings_by_name():
    by_flags = cli("run", PADDLE_TRACE, "--policy", "paddle", "--flags",
                   "FLAGS_auto_growth_chunk_size_in_mb=64", "--fast", "--json", "--sites", "0")
    by_name = cli("run", PADDLE_TRACE, "--policy", "paddle:chunk_size:64MiB", "--fast", "--json", "--sites", "0")
    assert by_flags.returncode == by_name.returncode == 0, by_flags.stderr + by_name.stderr
    a, b = json.loads(by_flags.stdout), json.loads(by_name.stdout)
    assert a["peak_reserved_bytes"] == b["peak_reserved_bytes"] and a["params"] == b["params"]


def test_run_env_flags_and_the_memory_limit():
    limit_mb = 2048          # below the trace's 2.79 GiB peak: the cap must make the run fail
    out = cli("run", PADDLE_TRACE, "--policy", "paddle", "--env-flags", "--fast", "--json", "--sites", "0",
              env={"FLAGS_gpu_memory_limit_mb": str(limit_mb), "FLAGS_cudnn_deterministic": "1"})
    data = json.loads(out.stdout)
    assert data["capacity_bytes"] == limit_mb * MiB and data["verdict"]["fits"] is False and out.returncode in (1, 3)
    assert data["verdict"]["capacity_note"] == f"FLAGS_gpu_memory_limit_mb={limit_mb}"


@pytest.mark.parametrize("args", [["--flags", "FLAGS_nope=1"], ["--env-flags"],
                                  ["--flags", "FLAGS_free_idle_chunk=true", "--alloc-conf", "expandable_segments:True"]])
def test_bad_flags_exit_2_with_one_line(args):
    out = cli("run", PADDLE_TRACE, "--policy", "paddle", *args, "--fast")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 or out.stderr.startswith("usage:")


def test_advise_prints_export_lines_and_json_flags(tmp_path):
    out = cli("advise", PADDLE_TRACE, "--policy", "paddle", "--capacity", "3GiB", "--fast", "--json",
              "--workers", "1", "-o", tmp_path / "runs.parquet")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["recommendations"]
    for rec in data["recommendations"]:
        assert rec["alloc_conf"] is None and isinstance(rec["flags"], list)
        if rec["flags"]:
            assert rec["line"] == "export " + " ".join(rec["flags"])
            assert "--flags " + ",".join(rec["flags"]) in rec["command"]
        replay = cli(*rec["command"].split()[1:], "--fast", "--json", "--sites", "0")
        assert json.loads(replay.stdout)["peak_reserved_bytes"] == rec["peak_reserved_bytes"]
