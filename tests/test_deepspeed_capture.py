"""DeepSpeed ZeRO 1, 2, 3 and ZeRO-Offload captured per rank on the CPU, each rank's requests checked against DeepSpeed's source.

One script (``ZERO``) trains the same three-``Linear`` model under each configuration, each in its
own function so that its requests are found by their stack. It is launched as users launch it:
``deepspeed --num_gpus 8 zero.py --deepspeed --deepspeed_config zero3.json`` and, at 2 ranks,
``torchrun --nproc-per-node 2 zero.py ...`` (``deepspeed.initialize`` from a torchrun script). With
N the model's parameter count, W the world size and P_i = ceil(N_i / W) (DeepSpeed 0.19):

* ZeRO 1/2 (runtime/zero/stage_1_and_2.py): the bit16 parameters are flattened into one buffer of
  N aligned to ``nccl_start_alignment_factor`` (2) x W elements (``flatten_dense_tensors_aligned``);
  this rank's fp32 master partition is that / W elements, float32 (``single_partition_of_fp32_groups``);
  AdamW keeps ``exp_avg`` and ``exp_avg_sq`` of the partition (FusedAdam, ops/adam/fused_adam.py);
  with ``contiguous_gradients`` the gradients go through ``reduce_bucket_size``-element buffers of the
  gradient dtype, two with ``overlap_comm`` (``buf_0``, ``buf_1``), made at each backward.
* ZeRO-Offload (``offload_optimizer: cpu``): the fp32 partition and AdamW's states live on the host
  (DeepSpeedCPUAdam): no optimizer state on the card.
* ZeRO 3 (runtime/zero/partition_parameters.py, stage3.py): each parameter keeps a partition of P_i
  elements (``ds_tensor``); the gradients of this rank go to one flat buffer of sum(P_i)
  (``grad_partitions_flat_buffer``) through a ``reduce_bucket_size`` IPG buffer; the fp32 master
  partition is sum(P_i) float32, and AdamW's two states too; a module's parameters are all-gathered
  into one flat buffer of W x sum(P of its parameters) on DeepSpeed's all-gather stream
  (``_all_gather_dtype``); with ``stage3_prefetch_bucket_size`` > 0, from the second step (a
  complete trace) parameters of the next modules are gathered ahead in the same buffer.
"""

from __future__ import annotations

import json
import os
import textwrap

import pytest

if os.environ.get("CI"):
    import deepspeed  # noqa: F401  (CI installs it: a missing DeepSpeed must fail, not skip)
else:
    pytest.importorskip("deepspeed")

from allocsim.trace import read_trace  # noqa: E402
from allocsim.trace.schema import EventKind  # noqa: E402

pytestmark = pytest.mark.full      # each fixture starts capture children (seconds each)

ZERO = """
    import argparse, torch, torch.nn as nn, deepspeed

    p = argparse.ArgumentParser()
    p.add_argument("--local_rank", type=int, default=-1)
    p = deepspeed.add_config_arguments(p)
    args = p.parse_args()
    deepspeed.init_distributed()
    BASE = {"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}


    def train(config=None, dtype=torch.bfloat16):
        net = nn.Sequential(nn.Linear(512, 384), nn.Linear(384, 512), nn.Linear(512, 384))
        kwargs = {"config": config} if config is not None else {"args": args}
        engine, *_ = deepspeed.initialize(model=net, model_parameters=net.parameters(), **kwargs)
        for _ in range(2):
            engine.backward(engine(torch.randn(4, 512, device=engine.device, dtype=dtype)).float().sum())
            engine.step()
        engine.destroy()


    def zero1():
        train(dict(BASE, bf16={"enabled": True}, zero_optimization={
            "stage": 1, "reduce_bucket_size": 60000, "allgather_bucket_size": 80000}))


    def zero2_fp16():
        train(dict(BASE, fp16={"enabled": True, "loss_scale": 0, "initial_scale_power": 8}, zero_optimization={
            "stage": 2, "reduce_bucket_size": 70000, "allgather_bucket_size": 90000, "overlap_comm": True,
            "contiguous_gradients": True}), torch.half)


    def zero2_offload():
        train(dict(BASE, bf16={"enabled": True}, zero_optimization={
            "stage": 2, "reduce_bucket_size": 50000, "offload_optimizer": {"device": "cpu"}}))


    def zero3_no_prefetch():
        train(dict(BASE, bf16={"enabled": True}, zero_optimization={
            "stage": 3, "reduce_bucket_size": 40000, "stage3_prefetch_bucket_size": 0,
            "stage3_param_persistence_threshold": 0}))


    def zero3():                     # the configuration file given on the command line
        train()


    zero1(); zero2_fp16(); zero2_offload(); zero3_no_prefetch(); zero3()
    """
ZERO3_JSON = {"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
              "bf16": {"enabled": True},
              "zero_optimization": {"stage": 3, "reduce_bucket_size": 30000, "stage3_prefetch_bucket_size": 200000,
                                    "stage3_max_live_parameters": 300000, "stage3_param_persistence_threshold": 0,
                                    "overlap_comm": True, "contiguous_gradients": True}}
#: The parameters in order: (weight, bias) of Linear(512, 384), Linear(384, 512), Linear(512, 384).
NUMELS = [512 * 384, 384, 384 * 512, 512, 512 * 384, 384]
MODULES = [(0, 1), (2, 3), (4, 5)]
STEPS = 2


def _align(n: int, k: int) -> int:
    return -(-n // k) * k


def _partitions(world: int) -> list[int]:
    """ZeRO-3's partition of each parameter (``_aligned_size`` / W: padded to a multiple of W)."""
    return [_align(n, world) // world for n in NUMELS]


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    from allocsim.torch_capture.distributed.capture_dir import capture_job
    from allocsim.torch_capture.distributed.launchers import parse_launch

    folder = tmp_path_factory.mktemp("ds")
    (folder / "zero.py").write_text(textwrap.dedent(ZERO))
    (folder / "zero3.json").write_text(json.dumps(ZERO3_JSON))
    script, config = str(folder / "zero.py"), str(folder / "zero3.json")
    out = {}
    for world, command in ((8, ["deepspeed", "--num_gpus", "8", script, "--deepspeed", "--deepspeed_config", config]),
                           (2, ["torchrun", "--nproc-per-node", "2", script, "--deepspeed", "--deepspeed_config",
                                config])):
        manifest = capture_job(parse_launch(command), str(folder / f"w{world}"), verify=False,
                               rank0_to_terminal=False)
        log = (folder / f"w{world}" / "rank0.log").read_text()[-3000:]
        assert manifest.status == 0, log
        out[world] = (folder / f"w{world}", manifest, read_trace(str(folder / f"w{world}" / "rank0.parquet")))
    return out


def _by_function(trace) -> dict[str, list[tuple[int, int, str, list[str]]]]:
    """Each stage's requests (size, stream, category, frames), by the script's function they were made in."""
    fr, st = trace.frames, trace.stacks
    name = dict(zip(fr.frame_id, fr.name))
    stacks = {int(sid): [name[i] for i in g.sort_values("depth")["frame_id"]] for sid, g in st.groupby("stack_id")}
    ev = trace.events
    out: dict[str, list] = {}
    current = None
    for r in ev[ev["kind"] == int(EventKind.ALLOC)].itertuples():
        frames = stacks.get(int(r.stack_id), [])
        for function in ("zero1", "zero2_fp16", "zero2_offload", "zero3_no_prefetch", "zero3"):
            if function in frames:
                current = function
                break
        category = frames[-1].replace("category: ", "") if frames else ""
        # the backward pass's requests carry no script frame: they belong to the stage running
        out.setdefault(current, []).append((int(r.size_bytes), int(r.stream), category, frames))
    return out


@pytest.mark.parametrize("world", [2, 8])
def test_zero1_and_2_flat_buffers_fp32_partition_and_gradient_buckets(jobs, world):
    requests = _by_function(jobs[world][2])
    flat = _align(sum(NUMELS), 2 * world)
    for stage, element, bucket, buffers in (("zero1", 2, 60000, 1), ("zero2_fp16", 2, 70000, 2)):
        sizes = [size for size, _, _, _ in requests[stage]]
        assert flat * element in sizes                                       # bit16_groups_flat
        master = flat // world * 4
        assert master in sizes                                               # single_partition_of_fp32_groups
        states = sorted(size for size, _, category, _ in requests[stage] if category == "optimizer_state")
        assert states == [master, master]                                    # exp_avg, exp_avg_sq
        assert sizes.count(bucket * element) == buffers * STEPS              # ipg buffers, made at each backward


@pytest.mark.parametrize("world", [2, 8])
def test_zero_offload_keeps_the_optimizer_off_the_card(jobs, world):
    requests = _by_function(jobs[world][2])["zero2_offload"]
    assert not [size for size, _, category, _ in requests if category == "optimizer_state"]
    master = _align(sum(NUMELS), 2 * world) // world * 4
    on_card = [size for size, _, _, frames in requests if "initialize" in frames]
    if master != _align(sum(NUMELS), 2 * world) * 2:                     # at W = 2 the two sizes coincide
        assert master not in on_card                                       # the fp32 partition is on the host
    assert [size for size, _, _, _ in requests].count(50000 * 2) == STEPS


@pytest.mark.parametrize("world", [2, 8])
def test_zero3_partitions_gathers_and_prefetch(jobs, world):
    parts = _partitions(world)
    by = _by_function(jobs[world][2])
    for stage, bucket in (("zero3_no_prefetch", 40000), ("zero3", 30000)):
        requests = by[stage]
        init = [size for size, _, _, frames in requests if "initialize" in frames]
        for p in parts:
            assert p * 2 in init                                             # each parameter's ds_tensor
        assert sum(parts) * 2 in init                                        # grad_partitions_flat_buffer
        assert sum(parts) * 4 in init                                        # fp32_partitioned_groups_flat
        assert bucket * 2 in init                                            # the IPG bucket
        states = sorted(size for size, _, category, _ in requests if category == "optimizer_state")
        assert states == [sum(parts) * 4] * 2
        gathers = {size for size, stream, _, frames in requests
                   if stream != 0 and "_pre_forward_module_hook" in frames}
        per_module = {world * sum(parts[i] for i in module) * 2 for module in MODULES}
        full = {n * 2 for n in NUMELS}                                       # each gathered parameter's tensor
        if stage == "zero3_no_prefetch":
            assert gathers == per_module | full
        else:
            assert per_module <= gathers and max(gathers) > max(per_module)  # a prefetch gathers ahead


def test_the_job_runs_per_rank_with_nccl_counted(jobs):
    import subprocess
    import sys

    out, manifest, _ = jobs[8]
    assert manifest.launcher["launcher"] == "deepspeed" and manifest.world_size == 8
    comms = {c["name"] for c in manifest.facts["communicators"]}
    assert comms                                                          # ZeRO's collectives were recorded
    data = json.loads(subprocess.run([sys.executable, "-m", "allocsim", "run", str(out), "--policy", "pytorch",
                                      "--gpu", "H100", "--json"], capture_output=True, text=True, check=True).stdout)
    assert data["ranks"][0]["ranks"] == list(range(8)) and data["ranks"][0]["gpu_estimate"]["nccl_bytes"] > 0



KNOB = """
    import argparse, torch, torch.nn as nn, deepspeed

    p = argparse.ArgumentParser()
    p.add_argument("--local_rank", type=int, default=-1)
    p = deepspeed.add_config_arguments(p)
    args = p.parse_args()
    model = nn.Sequential(*[nn.Linear(2048, 2048) for _ in range(8)])
    engine, *_ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())
    for _ in range(2):
        engine.backward(engine(torch.randn(8, 2048, device=engine.device, dtype=torch.bfloat16)).float().sum())
        engine.step()
    """


def test_advise_framework_finds_the_smallest_zero_stage_that_fits(tmp_path):
    """ZeRO-1 on 4 ranks needs more than 250 MiB; stage 2 too; stage 3 more (its gathered parameters and
    prefetch buckets outweigh the partitioned 64 MiB of bf16 weights at this size); stage 2 with the optimizer
    offloaded to the CPU moves AdamW's fp32 states and master weights off the card and fits."""
    import subprocess
    import sys

    from allocsim.torch_capture.distributed.capture_dir import capture_job
    from allocsim.torch_capture.distributed.launchers import parse_launch

    (tmp_path / "big.py").write_text(textwrap.dedent(KNOB))
    (tmp_path / "z1.json").write_text(json.dumps({
        "train_micro_batch_size_per_gpu": 8, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
        "bf16": {"enabled": True}, "zero_optimization": {"stage": 1, "reduce_bucket_size": 1000000}}))
    command = ["deepspeed", "--num_gpus", "4", str(tmp_path / "big.py"), "--deepspeed", "--deepspeed_config",
               str(tmp_path / "z1.json")]
    manifest = capture_job(parse_launch(command), str(tmp_path / "job"), verify=False, rank0_to_terminal=False)
    assert manifest.status == 0
    done = subprocess.run([sys.executable, "-m", "allocsim", "advise", str(tmp_path / "job"), "--capacity", "250MiB",
                           "--framework", "--json"], capture_output=True, text=True, check=False)
    data = json.loads(done.stdout)
    assert done.returncode == 0, done.stderr
    assert [t["change"] for t in data["tried"]] == ["ZeRO stage 2", "ZeRO stage 3",
                                                    "ZeRO stage 2 with the optimizer on the CPU"]
    assert [t["fits"] for t in data["tried"]] == [False, False, True]
    assert data["answer"]["paste"] == '"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}'
    assert data["answer"]["limiting_rank"] == 0
    assert json.loads((tmp_path / "z1.json").read_text())["zero_optimization"]["stage"] == 1   # untouched
