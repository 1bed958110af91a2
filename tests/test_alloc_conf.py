"""PyTorch's own words: PYTORCH_CUDA_ALLOC_CONF parsed as PyTorch parses it, and what allocsim does with
every key; --alloc-conf / --env-alloc-conf / --policy NAME:SETTINGS on the command line; sizes."""

from __future__ import annotations

import json

import pytest

from allocsim.settings.alloc_conf import (KEYS, format_alloc_conf, parse_alloc_conf, parse_policy_spec, setting_hint,
                                 tokenize)
from allocsim.cli import main as cli_main
from allocsim.settings.divisions import parse_roundup_power2_divisions
from allocsim.policies.registry import accepted_params
from allocsim.trace import write_trace
from allocsim.trace.reading.builder import TraceBuilder
from allocsim.units import GiB, MiB, parse_bytes

EXAMPLE = ("expandable_segments:True,max_split_size_mb:256,garbage_collection_threshold:0.6,"
           "roundup_power2_divisions:[256:1,512:2,>:8]")


def test_the_issue_example_maps_to_the_pytorch_preset():
    conf = parse_alloc_conf(EXAMPLE)
    assert conf.policy == "pytorch" and conf.text == EXAMPLE
    assert conf.params == {"expandable_segments": True, "max_split_size": 256 * MiB,
                           "garbage_collection_threshold": 0.6, "roundup_power2_divisions": "[256:1,512:2,>:8]"}
    # The divisions list means: 1 below and at 256 MB, 2 at 512 MB, 8 above (PyTorch's table of 16 intervals).
    assert parse_roundup_power2_divisions(conf.params["roundup_power2_divisions"]) == (1,) * 9 + (2,) + (8,) * 6
    assert {p.name for p in accepted_params("pytorch")} >= set(conf.params)


def test_tokenizer_and_forms_follow_pytorch():
    assert tokenize(" max_split_size_mb : 128 , expandable_segments:True") == [
        "max_split_size_mb", ":", "128", ",", "expandable_segments", ":", "True"]
    assert parse_alloc_conf("max_split_size_mb:128,").params == {"max_split_size": 128 * MiB}  # trailing ',' ok
    assert parse_alloc_conf("").params == {} and parse_alloc_conf("").policy == "pytorch"
    assert parse_alloc_conf("roundup_power2_divisions:4").params == {"roundup_power2_divisions": "4"}
    assert parse_alloc_conf("max_split_size_mb:64,max_split_size_mb:128").params == {"max_split_size": 128 * MiB}
    assert parse_alloc_conf("per_process_memory_fraction:0.5").params == {"memory_fraction": 0.5}
    assert parse_alloc_conf("per_process_memory_fraction:1.0").params == {"memory_fraction": None}
    assert parse_alloc_conf("max_non_split_rounding_mb:1024").params == {"max_non_split_rounding": 1024 * MiB}
    assert parse_alloc_conf("backend:native,expandable_segments:False").params == {"expandable_segments": False}
    async_conf = parse_alloc_conf("backend:cudaMallocAsync")
    assert async_conf.policy == "cuda-async" and async_conf.params == {}


@pytest.mark.parametrize("text, message", [
    ("expandable_segments:true", "takes True or False (PyTorch's spelling"),
    ("max_split_size_mb:10", "must be >= 20"),
    ("max_split_size_mb:1.5", "whole number of MB (MiB)"),
    ("garbage_collection_threshold:1.0", "must be in (0.0, 1.0)"),
    ("garbage_collection_threshold:0", "must be in (0.0, 1.0)"),
    ("per_process_memory_fraction:1.5", "must be in [0.0, 1.0]"),
    ("roundup_power2_divisions:3", "power of 2"),
    ("roundup_power2_divisions:[300:2]", "not a power of 2"),
    ("roundup_power2_divisions:[256:3]", "must be 0 or a power of 2"),
    ("roundup_power2_divisions:[256:1", "no closing ']'"),
    ("backend:magic", "backend must be one of native, cudaMallocAsync"),
    ("backend:cudaMallocAsync,max_split_size_mb:256", "backend:cudaMallocAsync ignores max_split_size_mb"),
    ("max_split_size:256", "allocsim's max_split_size is PyTorch's max_split_size_mb"),
    ("expandable_segment:True", "did you mean expandable_segments?"),
    ("max_split_size_mb", "expected max_split_size_mb:VALUE"),
    ("max_split_size_mb:256 expandable_segments:True", "expected ','"),
])
def test_what_pytorch_would_refuse_is_refused_in_one_line(text, message):
    with pytest.raises(ValueError) as info:
        parse_alloc_conf(text)
    assert message in str(info.value) and "\n" not in str(info.value)
    assert str(info.value).startswith("--alloc-conf: ")


def test_every_known_key_is_modelled_or_refused_with_a_reason():
    documented = {"backend", "max_split_size_mb", "roundup_power2_divisions", "max_non_split_rounding_mb",
                  "garbage_collection_threshold", "expandable_segments", "pinned_use_cuda_host_register",
                  "pinned_num_register_threads", "pinned_use_background_threads", "release_lock_on_cudamalloc",
                  "per_process_memory_fraction", "pinned_reserve_segment_size_mb",
                  "graph_capture_record_stream_reuse"}
    assert documented <= set(KEYS)
    pytorch_params = {p.name for p in accepted_params("pytorch")}
    for name, key in KEYS.items():
        if key.refused:
            with pytest.raises(ValueError, match=f"{name} is not modelled: it .+; remove it to simulate"):
                parse_alloc_conf(f"{name}:True")
        elif name != "backend":
            assert key.param in pytorch_params, name


def test_format_alloc_conf_says_settings_back_in_pytorch_words():
    table = parse_roundup_power2_divisions("[256:1,512:2,1024:4,>:8]")
    text = format_alloc_conf({"max_split_size_bytes": 256 * MiB, "expandable_segments": True,
                              "roundup_power2_divisions": list(table), "memory_fraction": 0.5,
                              "garbage_collection_threshold": 0.6})
    assert text == ("max_split_size_mb:256,expandable_segments:True,roundup_power2_divisions:[256:1,512:2,1024:4,"
                    ">:8],per_process_memory_fraction:0.5,garbage_collection_threshold:0.6")
    back = parse_alloc_conf(text).params
    assert parse_roundup_power2_divisions(back["roundup_power2_divisions"]) == table
    assert format_alloc_conf({"roundup_power2_divisions": [4] * 16}) == "roundup_power2_divisions:4"
    assert format_alloc_conf({"max_split_size_bytes": 256 * MiB + 512}) is None   # not whole MiB


def test_policy_specs():
    spec = parse_policy_spec("pytorch:expandable_segments:True,max_split_size_mb:256")
    assert (spec.name, spec.params) == ("pytorch", {"expandable_segments": True, "max_split_size": 256 * MiB})
    assert spec.text == "pytorch:expandable_segments:True,max_split_size_mb:256"
    assert parse_policy_spec("paddle").params == {}
    other = parse_policy_spec("paddle:chunk_size:64MiB,free_idle_chunk:true")
    assert other.params == {"chunk_size": "64MiB", "free_idle_chunk": "true"}
    for bad in ("pytorch:", "pytorch:backend:cudaMallocAsync", ":x", "paddle:chunk_size"):
        with pytest.raises(ValueError):
            parse_policy_spec(bad)


def test_setting_hints_point_to_allocsim_names():
    assert "--set max_split_size=256MiB" in setting_hint("max_split_size_mb", "256")
    assert "--alloc-conf max_split_size_mb:256" in setting_hint("max_split_size_mb", "256")
    assert "does not model" in setting_hint("pinned_use_cuda_host_register")
    assert setting_hint("max_split_size") == ""


def test_bare_size_prefixes_are_ambiguous():
    for text, word in (("16G", "16GiB"), ("512m", "512MiB"), ("1T", "1TiB"), ("64k", "64KiB")):
        with pytest.raises(ValueError, match=f"ambiguous: say {word}"):
            parse_bytes(text)
    assert parse_bytes("16GiB") == 16 * GiB and parse_bytes("16GB") == 16 * 1000**3 and parse_bytes("512") == 512


def test_a_decimal_capacity_is_rounded_down_to_whole_bytes_and_the_note_says_so():
    """``--capacity 11.7GiB`` was refused ("not a whole number of bytes"): a device's size rounds down to whole bytes."""
    from allocsim.units import bytes_rounding_note

    assert parse_bytes("11.7GiB", round_down=True) == 12_562_779_340 and parse_bytes("2.5", round_down=True) == 2
    assert parse_bytes("0.0001KiB", round_down=True) == 0 and parse_bytes("1.5GiB", round_down=True) == 3 * 2**29
    with pytest.raises(ValueError, match="'11.7GiB' is not a whole number of bytes"):
        parse_bytes("11.7GiB")          # a setting (--set chunk_size=...) stays exact or refused
    assert bytes_rounding_note("11.7GiB") == ("11.7GiB is 12,562,779,340.8 bytes: rounded down to a whole number "
                                              "of bytes, 12,562,779,340")
    assert bytes_rounding_note(" 0.0001KiB ") == "0.0001KiB is 0.1024 bytes: rounded down to a whole number of bytes, 0"
    for exact in ("1.5GiB", "0.5KB", "4096", 4096, "80GiB"):
        assert bytes_rounding_note(exact) is None


# ----------------------------------------------------------------------------- on the command line
@pytest.fixture
def small_trace(tmp_path):
    b = TraceBuilder("t", "test")
    for i in range(4):
        b.alloc(i, 1000 * (i + 1), 0, 0, 0x1000 * (i + 1), (3 + 5 * i) * MiB)
    path = tmp_path / "t.parquet"
    write_trace(b.finish(), path)
    return path


def cli(capsys, *argv):
    code = cli_main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_alloc_conf_env_and_spec_give_the_same_run(small_trace, capsys, monkeypatch):
    runs = {}
    for name, argv in (("set", ["--policy", "pytorch", "--set", "expandable_segments=true",
                                "--set", "max_split_size=256MiB"]),
                       ("conf", ["--policy", "pytorch", "--alloc-conf", "expandable_segments:True,max_split_size_mb:256"]),
                       ("spec", ["--policy", "pytorch:expandable_segments:True,max_split_size_mb:256"]),
                       ("env", ["--policy", "pytorch", "--env-alloc-conf"])):
        monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True, max_split_size_mb:256")
        code, out, err = cli(capsys, "run", small_trace, *argv, "--fast", "--json")
        assert code == 0, (name, err)
        data = json.loads(out)
        runs[name] = (data["params"], data["peak_reserved_bytes"], data["device_maps"])
    assert len(set(map(json.dumps, runs.values()))) == 1
    assert runs["conf"][0]["expandable_segments"] is True and runs["conf"][0]["max_split_size_bytes"] == 256 * MiB
    assert runs["conf"][2] > 0


@pytest.mark.parametrize("argv, message", [
    (["--policy", "pytorch", "--set", "max_split_size_mb=256"], "say --set max_split_size=256MiB"),
    (["--policy", "pytorch", "--alloc-conf", "pinned_use_cuda_host_register:True"], "is not modelled"),
    (["--policy", "pytorch", "--alloc-conf", "backend:cudaMallocAsync"], "say --policy cuda-async"),
    (["--policy", "paddle", "--alloc-conf", "expandable_segments:True"], "not paddle"),
    (["--policy", "pytorch:expandable_segments:True", "--alloc-conf", "expandable_segments:False"],
     "expandable_segments is set twice"),
    (["--policy", "pytorch", "--env-alloc-conf"], "PYTORCH_CUDA_ALLOC_CONF is not set"),
    (["--policy", "pytorch", "--set", "max_split_size=abc"], "parameter max_split_size='abc'"),
    (["--policy", "paddle", "--set", "chunk_size=1.5"], "parameter chunk_size='1.5'"),
    (["--policy", "pytorch", "--set", "memory_fraction=lots"], "parameter memory_fraction='lots'"),
    (["--policy", "pytorch", "--set", "roundup_power2_divisions=x"], "parameter roundup_power2_divisions='x'"),
    (["--policy", "bestfit", "--set", "stream_bound=maybe"], "parameter stream_bound='maybe'"),
])
def test_bad_settings_exit_2_with_one_line(small_trace, capsys, monkeypatch, argv, message):
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    code, _, err = cli(capsys, "run", small_trace, *argv, "--fast")
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_cuda_async_backend_runs_the_cuda_async_preset(small_trace, capsys):
    code, out, err = cli(capsys, "run", small_trace, "--policy", "cuda-async", "--alloc-conf",
                         "backend:cudaMallocAsync", "--fast", "--json")
    assert code == 0, err
    assert json.loads(out)["policy"] == "cuda-async"
