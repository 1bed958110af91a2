"""NCCL's memory per rank (allocsim.nccl): exact bytes from NCCL's formulas, environment overrides, bounds."""

from __future__ import annotations

import json

import pytest

from allocsim.nccl import (
    Communicator, NcclInputError, NcclJob, job_from_manifest, job_from_manifest_data, nccl_term,
    nccl_version_for_torch,
)

MiB = 1 << 20
LL, LL128, SIMPLE = 8 * 512 * 8 * 16, 120 * 640 * 8 * 8, 4 << 20


def _terms(parts, end="point_bytes"):
    return {p["term"]: p[end] for p in parts}


def _job(gpu="H100", collectives=("all_reduce",), ranks=8, env=None, **kw):
    nodes = kw.pop("nodes", 1)
    return NcclJob(ranks, (Communicator(ranks, frozenset(collectives), nodes=nodes),), gpu=gpu,
                   env={} if env is None else env, **kw)


def test_h100_nvswitch_all_reduce_default_settings_byte_for_byte():
    low, point, high, parts = nccl_term(_job())
    terms = _terms(parts)
    # ring search on 18 NVLinks x 20.6 GB/s: 6 channels at 60 GB/s, doubled twice -> 24 collective
    # channels; p2p channels pow2Up(24) = 32, each initialised with 3 allocations of one 2 MiB granule,
    # plus devCommAndChans and rankToLocalRank.
    assert terms["device_structures"] == (2 + 3 * 32) * 2 * MiB
    # one receive connection (4096 + LL + LL128 + Simple = 9,637,888 B -> 10 MiB) and one send
    # (4096 B -> 2 MiB) per channel
    assert 4096 + LL + LL128 + SIMPLE == 9637888
    assert terms["ring"] == 24 * (10 + 2) * MiB
    # NVLS: 16 channels x 2 x (8 x 128 KiB) x 8 heads = 256 MiB, credits 16 KiB -> 2 MiB, 16 peer tables
    assert terms["nvls"] == (256 + 2 + 16 * 2) * MiB
    assert terms["tree"] == 0                     # lazily connected, single node: not picked
    assert point == (196 + 288 + 290) * MiB == 811597824
    assert low == (196 + 288) * MiB               # NVLS may never be picked (NCCL >= 2.22 connects lazily)
    assert high == point + 2 * 24 * 12 * MiB      # Tree with both neighbours new on every channel


def test_channel_counts_match_nccl_logs():
    # H800 (8 NVLinks): NCCL_DEBUG logged "16 coll channels, 16 p2p channels, 16 p2p channels per peer"
    terms = _terms(nccl_term(_job(gpu="H800", env={"NCCL_NVLS_ENABLE": "0"}))[3])
    assert terms["ring"] == 16 * 12 * MiB
    assert terms["device_structures"] == (2 + 3 * 16) * 2 * MiB
    # A100 (12 NVLinks x 20 GB/s): 6 x 40 GB/s fills the links, doubled twice -> 24; no NVLS before Hopper
    terms = _terms(nccl_term(_job(gpu="A100 80GB"))[3])
    assert terms["ring"] == 24 * 12 * MiB and "nvls" not in terms


def test_a100_reads_the_simple_buffer_from_the_sender_same_total_by_default():
    # sm80 over NVLink uses P2P read: Simple sits after ncclSendMem on the sender (6 MiB + 6 MiB)
    terms = _terms(nccl_term(_job(gpu="A100 80GB", env={"NCCL_BUFFSIZE": str(8 << 20)}))[3])
    recv = 4096 + LL + LL128                       # 5,443,584 -> 6 MiB
    send = 4096 + (8 << 20)                        # -> 10 MiB
    assert terms["ring"] == 24 * (6 + 10) * MiB
    write = _terms(nccl_term(_job(gpu="H100", env={"NCCL_BUFFSIZE": str(8 << 20)}))[3])
    assert write["ring"] == 24 * (14 + 2) * MiB    # 4096 + LL + LL128 + 8 MiB -> 14 MiB, send 2 MiB


def test_environment_overrides():
    base = _terms(nccl_term(_job())[3])
    small = _terms(nccl_term(_job(env={"NCCL_BUFFSIZE": str(1 << 20), "NCCL_LL128_BUFFSIZE": "0x100000",
                                       "NCCL_NVLS_ENABLE": "0"}))[3])
    assert small["ring"] == 24 * (4 + 2) * MiB and "nvls" not in small     # 4096 + 512K + 1M + 1M -> 4 MiB
    capped = _terms(nccl_term(_job(env={"NCCL_MAX_CTAS": "8"}))[3])
    assert capped["ring"] == 8 * 12 * MiB and capped["device_structures"] == (2 + 3 * 8) * 2 * MiB
    assert capped["nvls"] == (8 * 2 * 1 * 8 + 2 + 8 * 2) * MiB          # NVLS channels capped too
    raised = _terms(nccl_term(_job(env={"NCCL_MIN_NCHANNELS": "32"}))[3])
    assert raised["ring"] == 32 * 12 * MiB
    no_cumem = _terms(nccl_term(_job(env={"NCCL_CUMEM_ENABLE": "0"}))[3])
    assert "nvls" not in no_cumem and no_cumem["device_structures"] < 2 * MiB
    assert no_cumem["ring"] == base["ring"]        # P2P buffers are CUDA_IPC_MIN-aligned either way
    eager = _terms(nccl_term(_job(env={"NCCL_RUNTIME_CONNECT": "0"}))[3])
    assert eager["nvls"] == base["nvls"] and eager["tree"] == 24 * 12 * MiB
    low, _, _, _ = nccl_term(_job(env={"NCCL_RUNTIME_CONNECT": "0"}))
    assert low >= (196 + 288 + 290) * MiB          # everything at init: NVLS is in the low end too


def test_untrusted_environment_values_keep_nccls_defaults_and_say_so():
    default = nccl_term(_job())[:3]
    for value in ("-5", "1" * 400, "lots", str(1 << 50)):
        low, point, high, parts = nccl_term(_job(env={"NCCL_BUFFSIZE": value, "NCCL_MAX_CTAS": value}))
        assert (low, point, high) == default
        assert "NCCL_BUFFSIZE" in parts[-1]["source"] and parts[-1]["term"] == "notes"


def test_versions_change_nvls_and_channels():
    nvls = {v: _terms(nccl_term(_job(nccl_version=v))[3]).get("nvls") for v in ((2, 20, 5), (2, 21, 5), (2, 27, 5))}
    assert nvls[(2, 20, 5)] == (16 * 2 * 6 * 8 + 16 * 2) * MiB      # (NCCL_BUFFSIZE + 2 MiB) per buffer
    assert nvls[(2, 21, 5)] == (16 * 2 * 3 * 8 + 16 * 2) * MiB      # (8 x 128 KiB + 2 MiB) per buffer
    assert nvls[(2, 27, 5)] == (256 + 2 + 32) * MiB
    old = _terms(nccl_term(_job(nccl_version=(2, 21)))[3])
    assert old["tree"] == 24 * 12 * MiB            # connected at init before 2.22
    assert old["device_structures"] == (1 + 3 * 32) * 2 * MiB       # no rankToLocalRank before 2.24
    assert nccl_version_for_torch("2.13.0+cu130") == (2, 29, 7)
    assert nccl_version_for_torch("2.4.1") == (2, 20, 5) and nccl_version_for_torch("9.9") == (2, 30, 7)


def test_all_to_all_and_pipeline_send_recv():
    terms = _terms(nccl_term(_job(collectives=("all_to_all",)))[3])
    # 7 NVLink peers x 32 channels per peer x (10 + 2) MiB
    assert terms["p2p"] == 7 * 32 * 12 * MiB and "ring" not in terms
    pipe = _terms(nccl_term(NcclJob(8, (Communicator(4, frozenset({"send_recv"}), peers=2),), env={}))[3])
    assert pipe["p2p"] == 2 * 32 * 12 * MiB
    # across nodes: the network peers share two buffers of p2pnChannels x 16 x 128 KiB
    cross = _terms(nccl_term(NcclJob(16, (Communicator(2, frozenset({"send_recv"}), nodes=2),), env={}))[3])
    p2p_channels = 16                              # 16 collective channels at the point -> pow2Up
    assert cross["p2p"] == 2 * p2p_channels * 16 * (128 << 10)


def test_pcie_range_covers_shm_and_peer_access():
    low, point, high, parts = nccl_term(_job(gpu="L40S", ranks=4, interconnect="pcie"))
    ring = [p for p in parts if p["term"] == "ring"][0]
    assert ring["low_bytes"] == 0 and ring["point_bytes"] == 2 * 12 * MiB and ring["high_bytes"] == 4 * 12 * MiB
    shm = _terms(nccl_term(_job(gpu="L40S", ranks=4, interconnect="pcie-shm"))[3])
    assert shm["ring"] == 0                        # SHM buffers live in host memory
    assert low <= point <= high


def test_several_communicators_add_up_and_count_multiplies():
    one = nccl_term(_job())[1]
    two = nccl_term(NcclJob(8, (Communicator(8, frozenset({"all_reduce"})),) * 2, env={}))[1]
    counted = nccl_term(NcclJob(8, (Communicator(8, frozenset({"all_reduce"}), count=2),), env={}))[1]
    assert two == counted == 2 * one


@pytest.mark.parametrize("bad", [
    dict(world_size=0), dict(world_size=True), dict(world_size=1 << 30), dict(interconnect="carrier pigeon"),
    dict(communicators=(Communicator(9),)), dict(communicators=(Communicator(8, count=10**9),)),
    dict(communicators=(Communicator(8, frozenset({"gossip"})),)), dict(communicators=(Communicator(8, nodes=9),)),
    dict(communicators=(Communicator(4, peers=4),)), dict(communicators=(Communicator(8),) * 5000),
    dict(nccl_version=(3, 0)), dict(nccl_version=("2", "x")),
])
def test_jobs_out_of_bounds_are_refused(bad):
    fields = dict(world_size=8, communicators=(Communicator(8),), env={})
    fields.update(bad)
    with pytest.raises(NcclInputError):
        nccl_term(NcclJob(**fields))


def test_job_from_manifest(tmp_path):
    manifest = {"schema": "allocsim-capture-dir/1", "world_size": 16, "gpu": "H100", "torch": "2.7.1",
                "launcher": {"nproc_per_node": 8, "nnodes": 2},
                "facts": {"groups": 6, "group_sizes": [2, 8, 16], "stages": [{"group_ranks": [0, 8]}]}}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    job = job_from_manifest(str(tmp_path), env={})
    assert job.nccl_version == (2, 26, 2) and job.world_size == 16
    by_name = {c.name: c for c in job.communicators}
    assert by_name["world"].nodes == 2 and by_name["group of 8"].nodes == 1
    assert by_name["group of 2"].collectives == frozenset({"send_recv"})
    assert nccl_term(job)[1] > 0
    listed = dict(manifest, facts={"communicators": [{"ranks": 8, "collectives": ["all_gather"], "count": 2}]})
    job = job_from_manifest_data(listed, env={})
    assert [(c.ranks, c.count, c.nodes) for c in job.communicators] == [(8, 2, 1)]


def test_a_spawned_job_is_one_node_and_the_gpu_run_s_torch_picks_nccl():
    # a script that started its 8 ranks itself (milabench's torchvision_ddp: torch.multiprocessing.spawn)
    # runs them on its own node; the manifest's launcher is null and its nproc_per_node 1
    manifest = {"schema": "allocsim-capture-dir/1", "world_size": 8, "gpu": "H100", "torch": "2.14.1+cu130",
                "launcher": {"launcher": None, "nproc_per_node": 1, "nnodes": 1},
                "facts": {"spawn": {"nprocs": 8, "index": 0, "how": "torch.multiprocessing.spawn"}}}
    job = job_from_manifest_data(manifest, env={})
    assert [(c.ranks, c.nodes) for c in job.communicators] == [(8, 1)]
    assert "nvls" in {p["term"] for p in nccl_term(job)[3]}          # NVSwitch on one node: NVLS
    # run --torch 2.6.0: the GPU run's NCCL (2.21.5), not the capture's
    assert job_from_manifest_data(manifest, env={}, torch_version="2.6.0+cu126").nccl_version == (2, 21, 5)
    assert job.nccl_version != (2, 21, 5)


@pytest.mark.parametrize("data", [
    [], {"world_size": -1}, {"world_size": 8, "launcher": {"nproc_per_node": 0}},
    {"world_size": 8, "facts": {"group_sizes": [9]}}, {"world_size": 8, "facts": {"group_sizes": "8"}},
    {"world_size": 8, "facts": {"communicators": [{"ranks": 8, "count": 10**12}]}},
    {"world_size": 8, "facts": {"communicators": [{"ranks": 8}] * 5000}},
    {"world_size": 8, "facts": {"communicators": ["eight"]}},
])
def test_bad_manifests_are_refused(data):
    with pytest.raises(NcclInputError):
        job = job_from_manifest_data(data, env={})
        nccl_term(job)


def test_missing_or_huge_manifest(tmp_path):
    with pytest.raises(NcclInputError, match="no manifest.json"):
        job_from_manifest(str(tmp_path))
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(NcclInputError, match="not readable JSON"):
        job_from_manifest(str(tmp_path))


def test_env_none_reads_the_process_environment(monkeypatch):
    for name in [k for k in __import__("os").environ if k.startswith("NCCL_")]:
        monkeypatch.delenv(name)
    job = NcclJob(8, (Communicator(8, frozenset({"all_reduce"})),))
    assert nccl_term(job)[1] == 774 * MiB
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
    assert nccl_term(job)[1] == (196 + 288) * MiB


def test_gpu_aliases_and_unknown_cards():
    assert nccl_term(_job(gpu="H100 SXM"))[1] == nccl_term(_job(gpu="H100"))[1]
    with pytest.raises(NcclInputError, match="unknown GPU"):
        nccl_term(_job(gpu="Voodoo 2"))
    parts = nccl_term(_job(gpu="L40S"))[3]
    assert "no NVSwitch board" in parts[-1]["source"]
