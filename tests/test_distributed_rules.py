"""Per-rank capture without torch: the launcher's options and environment, the roles rule, the manifest's checks.

``allocsim.torch_capture.distributed.launcher`` reads torchrun's options as torch 2.13's
``torch/distributed/run.py`` does and gives each rank the variables its agent sets
(``LocalElasticAgent._start_workers``); ``roles`` groups ranks by pipeline position and shard
shapes; ``manifest`` refuses a folder's manifest that could point a command elsewhere.
"""

from __future__ import annotations

import json
import os

import pytest

from allocsim.torch_capture.distributed.launcher import LaunchError
from allocsim.torch_capture.distributed.launchers import parse_launch
from allocsim.torch_capture.distributed.manifest import MANIFEST, SCHEMA, Manifest, RoleEntry
from allocsim.torch_capture.distributed.roles import JobFacts, assign_roles, ranks_text, verification_rank


# ------------------------------------------------------------------------------------------ launcher
def test_torchrun_options_and_the_environment_of_each_rank(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    launch = parse_launch(["torchrun", "--nproc-per-node", "4", "--nnodes", "2", "--standalone", "train.py",
                           "--batch", "8"])
    assert launch.launcher == "torchrun" and launch.world_size == 8
    assert launch.script == ["train.py", "--batch", "8"]
    env = launch.rank_env(6)
    assert env["RANK"] == "6" and env["LOCAL_RANK"] == "2" and env["GROUP_RANK"] == "1"
    assert env["WORLD_SIZE"] == "8" and env["LOCAL_WORLD_SIZE"] == "4" and env["GROUP_WORLD_SIZE"] == "2"
    assert env["ROLE_RANK"] == "6" and env["ROLE_WORLD_SIZE"] == "8" and env["ROLE_NAME"] == "default"
    assert env["OMP_NUM_THREADS"] == "1"            # torchrun's config_from_args for several ranks per node
    assert env["TORCHELASTIC_RESTART_COUNT"] == "0" and env["TORCHELASTIC_USE_AGENT_STORE"] == "True"
    assert {"MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_MAX_RESTARTS"} <= set(env)


def test_python_m_torch_distributed_run_underscore_spellings_and_module_scripts():
    launch = parse_launch(["python3", "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port", "1234",
                           "-m", "pkg.train", "--lr", "1"])
    assert launch.python == "python3" and launch.script == ["-m", "pkg.train", "--lr", "1"]
    env = launch.rank_env(1)
    assert env["MASTER_PORT"] == "1234" and env["TORCHELASTIC_USE_AGENT_STORE"] == "False"
    assert launch.child_command() == ["python3", "-m", "pkg.train", "--lr", "1"]


def test_pet_environment_variables_give_torchrun_defaults(monkeypatch):
    monkeypatch.setenv("PET_NPROC_PER_NODE", "3")
    assert parse_launch(["torchrun", "train.py"]).world_size == 3


def test_a_plain_script_has_no_launcher():
    launch = parse_launch(["python", "train.py", "--x"])
    assert launch.launcher == "" and launch.rank_env(0) == {} and launch.child_command() == ["python", "train.py", "--x"]


@pytest.mark.parametrize("command, says", [
    (["torchrun", "--nproc-per-node", "gpu", "t.py"], "--nproc-per-node gpu counts the devices"),
    (["torchrun", "--nnodes", "1:4", "t.py"], "elastic range"),
    (["torchrun", "--no-python", "t.sh"], "not a Python script"),
    (["torchrun", "--bogus", "t.py"], "unrecognized arguments: --bogus"),
    (["torchrun"], "required"),
    (["deepspeed", "t.py"], "DeepSpeed"),
    (["python", "-m", "torch.distributed.launch", "t.py"], "deprecated"),
    (["torchrun", "--nproc-per-node", "0", "t.py"], "whole number"),
])
def test_launches_a_capture_cannot_follow_are_refused_with_the_reason(command, says):
    with pytest.raises(LaunchError, match=says):
        parse_launch(command)


# ------------------------------------------------------------------------------------------ roles
def _facts(world: int, **fields) -> JobFacts:
    facts = JobFacts()
    facts.add({"fact": "world", "rank": 0, "world_size": world, "backend": "nccl"})
    for fact in fields.get("facts", []):
        facts.add(fact)
    return facts


def test_data_parallel_ranks_are_one_role_checked_by_the_highest_rank():
    roles, _notes = assign_roles(_facts(8))
    assert [r.ranks for r in roles] == [list(range(8))]
    assert verification_rank(roles) == (0, 7)


def test_pipeline_positions_make_roles_whatever_the_other_dimensions():
    # mesh (pp=2, dp=2, tp=2): the pp groups are {0,4}, {1,5}, {2,6}, {3,7}; every rank created all of them
    groups = [{"fact": "group", "ranks": [i, i + 4], "desc": "pp"} for i in range(4)]
    groups += [{"fact": "group", "ranks": [i, i + 1], "desc": "tp"} for i in range(0, 8, 2)]
    stage = {"fact": "stage", "stage_index": 0, "num_stages": 2, "group_ranks": [0, 4]}
    roles, notes = assign_roles(_facts(8, facts=[*groups, stage]))
    assert [r.ranks for r in roles] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [r.position for r in roles] == [0, 1] and "pipeline group of 2 ranks" in notes[0]


def test_uneven_shards_split_ranks_and_an_unknown_pipeline_position_is_its_own_role():
    shards = {"fact": "shards", "class_of_rank": [0, 0, 0, 1], "layouts": 2}
    roles, notes = assign_roles(_facts(4, facts=[shards]))
    assert [r.ranks for r in roles] == [[0, 1, 2], [3]] and "2 DTensor layouts" in notes[0]
    stage = {"fact": "stage", "stage_index": 0, "num_stages": 2, "group_ranks": [0, 1]}   # {2, 3} never seen
    roles, _ = assign_roles(_facts(4, facts=[stage]))
    assert [r.ranks for r in roles] == [[0], [1], [2], [3]]


def test_malformed_facts_from_the_script_process_are_dropped():
    facts = _facts(4, facts=[{"fact": "group", "ranks": [0, 9]}, {"fact": "shards", "class_of_rank": [0]},
                             {"fact": "world", "rank": 0, "world_size": -1}, {"fact": "nonsense"}, "text"])
    assert facts.bad == 5 and facts.groups == [] and facts.shard_classes is None and facts.world_size == 4


def test_ranks_text():
    assert ranks_text([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11" and ranks_text([5]) == "5"


# ------------------------------------------------------------------------------------------ manifest
def _write_manifest(folder, roles, world=4):
    data = {"schema": SCHEMA, "world_size": world, "roles": roles, "launcher": {}}
    (folder / MANIFEST).write_text(json.dumps(data))


def test_manifest_round_trip(tmp_path):
    entry = RoleEntry(0, [0, 1], 0, "same work", "rank0.parquet", None, 0, "", 1.0, 10, 100, 200, "ab")
    Manifest({"command": ["torchrun"]}, 2, roles=[entry]).write(str(tmp_path))
    back = Manifest.read(str(tmp_path))
    assert back.world_size == 2 and back.roles[0].ranks == [0, 1] and back.roles[0].trace == "rank0.parquet"
    assert back.role_of(1) is back.roles[0]


@pytest.mark.parametrize("roles, says", [
    ([{"ranks": [0, 1], "trace": "../elsewhere.parquet"}], "file name in the folder"),
    ([{"ranks": [0, 1], "trace": "/etc/passwd"}], "file name in the folder"),
    ([{"ranks": [0, 7], "trace": "rank0.parquet"}], "not in a world of 4"),
    ([{"ranks": [0], "trace": "rank0.parquet"}, {"ranks": [0], "trace": "rank1.parquet"}], "in two roles"),
    ([{"ranks": [], "trace": "rank0.parquet"}], "non-empty"),
])
def test_a_manifest_that_points_elsewhere_or_contradicts_itself_is_refused(tmp_path, roles, says):
    _write_manifest(tmp_path, roles)
    with pytest.raises(ValueError, match=says):
        Manifest.read(str(tmp_path))


def test_a_manifest_too_large_or_not_ours_is_refused(tmp_path, monkeypatch):
    (tmp_path / MANIFEST).write_text(json.dumps({"schema": "other", "world_size": 1, "roles": []}))
    with pytest.raises(ValueError, match="schema"):
        Manifest.read(str(tmp_path))
    from allocsim.torch_capture.distributed import manifest

    monkeypatch.setattr(manifest, "MAX_MANIFEST_BYTES", 10)
    with pytest.raises(ValueError, match="more than a manifest may be"):
        Manifest.read(str(tmp_path))
    assert not os.path.exists(tmp_path / "missing" / MANIFEST)
    with pytest.raises(ValueError, match="no manifest.json"):
        Manifest.read(str(tmp_path / "missing"))


def test_a_rank_sees_its_nodes_gpus_and_selects_its_own(monkeypatch):
    from allocsim.torch_capture import local_device

    monkeypatch.setattr(local_device, "_current", [0])
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert local_device.count() == 1                       # a single-GPU script
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        local_device.select(1)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")              # torchrun --nproc-per-node 8
    assert local_device.count() == 8
    local_device.select("cuda:7")
    assert local_device.current() == 7
    local_device.select(-1)                                  # CUDA keeps the device for -1
    assert local_device.current() == 7
    for word in ("0", "-3", "eight", str(local_device.MAX_DEVICES + 1)):
        monkeypatch.setenv("LOCAL_WORLD_SIZE", word)          # an untrusted word is not a node
        assert local_device.count() == 1


def test_the_relay_hands_each_stage_what_the_earlier_stages_sent_and_never_lets_all_wait():
    from allocsim.torch_capture.distributed.relay import Relay, question

    relay = Relay([{"src_stage": 0, "dst_stage": 1, "payload": "from rank 0's capture"}])
    first, second = 1, 2                                   # two captures running at once
    relay.started()
    relay.started()
    assert relay.answer(question(0, 1, 0), first) == {"payload": "from rank 0's capture"}
    assert relay.answer(question(1, 2, 0), second) == {"wait": True}    # the first one runs and may send it
    relay.put(1, 2, "stage 1's outputs")      # it does: the second one runs again (it has its answer)...
    assert relay.answer(question(0, 1, 1), first) == {"wait": True}     # ... so the first may wait for it
    assert relay.answer(question(1, 2, 0), second) == {"payload": "stage 1's outputs"}
    # both wait: no running capture can send, so the last to ask waits no longer
    assert relay.answer(question(1, 2, 1), second) is None
    relay.finished(second)
    assert relay.answer(question(0, 1, 1), first) is None              # the last one running: nobody will send
    assert relay.answer("pipeline_message:x", first) is None
