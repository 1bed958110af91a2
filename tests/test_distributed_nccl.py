"""NCCL's memory in a distributed job's ``run --gpu``: the communicators a capture records, priced by ``allocsim.nccl``.

What is recorded follows PyTorch's ProcessGroupNCCL: one communicator per process group at its first
collective (``getNCCLComm``), batched point-to-point (``batch_isend_irecv``) on the group's
communicator, an unbatched ``send`` / ``recv`` on a 2-rank communicator of the pair
(``pointToPoint``, ``getKeySendRecv``), DTensor's redistributions (functional collectives) on their
mesh dimension's group; a group never used has no communicator. The bytes each costs are
``allocsim.nccl``'s (docs/nccl.md), so the expectations here are built with ``nccl_term`` from the
communicators the source says the rank holds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from allocsim.gpus import find_gpu, gpu_estimate
from allocsim.nccl import Communicator, NcclJob, nccl_term
from allocsim.nccl_estimate import add_nccl_term, interconnect_of
from allocsim.torch_capture.distributed.manifest import Manifest, RoleEntry
from allocsim.torch_capture.distributed.roles import JobFacts

MiB = 1 << 20
GiB = 1 << 30


@pytest.fixture(autouse=True)
def _no_nccl_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith("NCCL_"):
            monkeypatch.delenv(name)


def _role(communicators=None) -> RoleEntry:
    return RoleEntry(index=0, ranks=list(range(8)), representative=0, why="", trace="rank0.parquet", log=None,
                     status=0, message="", seconds=0.0, allocs=1, peak_allocated_bytes=0, peak_reserved_bytes=0,
                     fingerprint="", communicators=communicators)


def _manifest(communicators) -> Manifest:
    return Manifest(launcher={"nproc_per_node": 8, "nnodes": 1}, world_size=8, gpu="H100", torch="2.13.0+cpu",
                    facts={"communicators": communicators})


def _summary(gpu, reserved_bytes: int) -> dict:
    from allocsim.gpu_ranges import verdict_words

    estimate = gpu_estimate(gpu, reserved_bytes, workspaces_in_trace=True)
    return {"gpu_estimate": estimate, "verdict": {"fits": True, "line": f"{verdict_words(estimate, [])} on H100: needs ..."}}


def test_run_gpu_adds_the_roles_communicators_point_and_range():
    gpu = find_gpu("H100")
    summary = _summary(gpu, 10 * GiB)
    before = summary["gpu_estimate"]["total_bytes"]
    world = [{"name": "world", "ranks": 8, "nodes": 1, "collectives": ["all_reduce"], "count": 1}]
    add_nccl_term(summary, _manifest(world), _role(), gpu)
    estimate = summary["gpu_estimate"]
    # docs/nccl.md's worked example: an 8 x H100 NVSwitch world all-reducing, NCCL 2.29 defaults
    assert (estimate["nccl_low_bytes"], estimate["nccl_bytes"], estimate["nccl_high_bytes"]) == \
        (484 * MiB, 774 * MiB, 1350 * MiB)
    assert estimate["total_bytes"] == before + 774 * MiB
    assert {p["term"] for p in estimate["sources"]["nccl_bytes"]} == {"device_structures", "ring", "tree", "nvls"}
    assert estimate["fits"] is True and "NCCL's communicators add 774.00 MiB" in summary["verdict"]["line"]


def test_a_roles_own_communicators_win_over_the_manifests_and_unused_groups_cost_nothing():
    gpu = find_gpu("H100")
    pipeline = [{"name": "pp", "ranks": 2, "nodes": 1, "collectives": ["send_recv"], "count": 1, "peers": 1}]
    summary = _summary(gpu, GiB)
    add_nccl_term(summary, _manifest([{"ranks": 8, "collectives": ["all_reduce"]}]), _role(pipeline), gpu)
    expected = nccl_term(NcclJob(8, (Communicator(2, frozenset({"send_recv"}), peers=1, name="pp"),), gpu="H100",
                                 env={}))
    assert summary["gpu_estimate"]["nccl_bytes"] == expected[1] > 0
    empty = _summary(gpu, GiB)
    add_nccl_term(empty, _manifest([]), _role([]), gpu)
    assert empty["gpu_estimate"]["nccl_bytes"] == 0


def test_nccl_can_turn_a_fit_into_does_not_fit():
    gpu = find_gpu("H100")
    high_without_peak = gpu_estimate(gpu, 0, workspaces_in_trace=True)["total_high_bytes"]
    summary = _summary(gpu, gpu.total_bytes - high_without_peak - 100 * MiB)   # fits by 100 MiB at the high end
    assert summary["gpu_estimate"]["fits"] is True
    add_nccl_term(summary, _manifest([{"ranks": 8, "collectives": ["all_reduce"]}]), _role(), gpu)
    estimate = summary["gpu_estimate"]
    assert estimate["fits"] is False and estimate["verdict"] in ("fits_unless", "does_not_fit")
    assert estimate["total_high_bytes"] > gpu.total_bytes and "nccl_bytes" in estimate["unknown_terms"]
    assert not summary["verdict"]["line"].startswith("FITS on")
    if estimate["verdict"] == "fits_unless":
        assert summary["verdict"]["line"].startswith("FITS UNLESS")


def test_pcie_cards_are_priced_as_pcie():
    assert interconnect_of("H100") == "nvswitch" and interconnect_of("L40S") == "pcie"


def test_the_communicators_fact_is_checked():
    facts = JobFacts()
    facts.add({"fact": "world", "rank": 0, "world_size": 4})
    facts.add({"fact": "communicators", "communicators": [
        {"name": "dp", "ranks": 4, "group_ranks": [0, 1, 2, 3], "nodes": 1, "collectives": ["all_reduce"],
         "count": 1}]})
    assert facts.to_dict()["communicators"][0]["group_ranks"] == [0, 1, 2, 3]
    for bad in ([{"ranks": 5}], [{"ranks": 2, "collectives": ["gossip"]}], [{"ranks": 2, "peers": 2}], "all"):
        before = facts.bad
        facts.add({"fact": "communicators", "communicators": bad})
        assert facts.bad == before + 1


# ------------------------------------------------------------------------------------------ captured
COMMS = """
    import os, torch, torch.nn as nn, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor, Shard, Replicate
    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    world, rank = dist.get_world_size(), dist.get_rank()
    mesh = init_device_mesh("cuda", (2, world // 2), mesh_dim_names=("dp", "tp"))
    unused = dist.new_group(list(range(world)))                 # never used: no communicator
    model = nn.Linear(64, 64).cuda()
    ddp = DDP(model, process_group=mesh["dp"].get_group())     # broadcast at construction, all-reduce in backward
    ddp(torch.randn(4, 64, device="cuda")).sum().backward()
    x = distribute_tensor(torch.empty(64, 64, device="cuda"), mesh["tp"], [Shard(0)])
    x.redistribute(mesh["tp"], [Replicate()])                  # a functional all-gather on the tp group
    peer = rank ^ 1                                            # batched send/recv with one neighbour
    ops = [dist.P2POp(dist.isend, torch.empty(8, device="cuda"), peer),
           dist.P2POp(dist.irecv, torch.empty(8, device="cuda"), peer)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    dist.send(torch.empty(8, device="cuda"), (rank + 2) % world)   # unbatched: a 2-rank communicator
    """


@pytest.fixture(scope="module")
def job4(tmp_path_factory):
    pytest.importorskip("torch") if not os.environ.get("CI") else None
    from allocsim.torch_capture.distributed.capture_dir import capture_job
    from allocsim.torch_capture.distributed.launchers import parse_launch

    folder = tmp_path_factory.mktemp("nccl")
    script = folder / "comms.py"
    script.write_text(textwrap.dedent(COMMS))
    out = folder / "job"
    manifest = capture_job(parse_launch(["torchrun", "--nproc-per-node", "4", str(script)]), str(out),
                           rank0_to_terminal=False)
    return out, manifest


@pytest.mark.full
def test_the_capture_records_each_used_group_with_its_collectives(job4):
    out, manifest = job4
    assert manifest.status == 0, [r.message for r in manifest.roles]
    comms = {c["name"]: c for c in manifest.facts["communicators"]}
    # rank 0 of a (dp 2, tp 2) mesh: dp group [0, 2], tp group [0, 1]; the world is used by send/recv only
    assert comms["mesh_dp"]["group_ranks"] == [0, 2] and comms["mesh_dp"]["collectives"] == ["all_reduce",
                                                                                             "broadcast"]
    # distribute_tensor scatters from rank 0 (DTensor's mesh_scatter; ProcessGroupNCCL::scatter: the root
    # sends to every rank of the group), then the redistribution all-gathers
    assert comms["mesh_tp"]["group_ranks"] == [0, 1] and comms["mesh_tp"]["collectives"] == ["all_gather",
                                                                                             "all_to_all"]
    world = [c for c in manifest.facts["communicators"] if c.get("group_ranks") == [0, 1, 2, 3]]
    assert world == [{"name": world[0]["name"], "ranks": 4, "group_ranks": [0, 1, 2, 3], "nodes": 1,
                      "collectives": ["send_recv"], "count": 1, "peers": 1}]      # batched: the group's own
    assert comms["send/recv pair"] == {"name": "send/recv pair", "ranks": 2, "nodes": 1,
                                       "collectives": ["send_recv"], "count": 1, "peers": 1}
    assert len(manifest.facts["communicators"]) == 4          # the unused group made none
    assert all(r.communicators for r in manifest.roles)


@pytest.mark.full
def test_run_gpu_counts_nccl_per_role_in_text_and_json(job4):
    out, manifest = job4
    cmd = [sys.executable, "-m", "allocsim", "run", str(out), "--policy", "pytorch", "--gpu", "H100"]
    data = json.loads(subprocess.run([*cmd, "--json"], capture_output=True, text=True, check=True).stdout)
    for entry, role in zip(data["ranks"], manifest.roles):
        estimate = entry["gpu_estimate"]
        comms = tuple(Communicator(c["ranks"], frozenset(c["collectives"]), nodes=c["nodes"], count=c["count"],
                                   peers=c.get("peers"), name=c["name"]) for c in role.communicators)
        low, point, high, _ = nccl_term(NcclJob(4, comms, gpu="H100", env={}))
        assert (estimate["nccl_low_bytes"], estimate["nccl_bytes"], estimate["nccl_high_bytes"]) == (low, point, high)
        assert estimate["total_bytes"] == (estimate["reserved_peak_bytes"] + estimate["workspace_bytes"]
                                           + estimate["library_bytes"] + estimate["context_bytes"] + point)
    text = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    assert " with NCCL " in text and "NCCL's communicators add" in text.splitlines()[-1]
