"""Hugging Face ``accelerate launch`` captured per rank: FSDP2 and DeepSpeed configurations, checked against their source.

``accelerate launch`` is read by accelerate's own code (``_validate_launch_command``,
``prepare_multi_gpu_env``, ``prepare_deepspeed_cmd_env``) and the job captured as the torchrun job
it starts, each rank with the variables accelerate sets (``ACCELERATE_USE_FSDP``, ``FSDP_*``,
``ACCELERATE_DEEPSPEED_*``). Expected bytes (two ``Linear`` layers, W ranks, bf16):

* FSDP2 (``--use_fsdp --fsdp_version 2``, no auto-wrap: one group at the root): the all-gather
  output on the copy-in stream is W x the padded shards of every parameter in bf16
  (``foreach_all_gather``, shards of ``ceil(dim0 / W)`` rows: ``_chunk_with_empty``).
* DeepSpeed ZeRO-2 from an accelerate config file (``distributed_type: DEEPSPEED``): the bf16
  parameters flattened and aligned to 2 x W, the fp32 partition, AdamW's two states of it, and the
  gradient bucket at DeepSpeed's default ``reduce_bucket_size`` of 5e8 elements
  (deepspeed/runtime/zero/config.py), which accelerate leaves as it is for a model without a
  ``config.hidden_size``: 1e9 bytes of bf16 on every rank.
"""

from __future__ import annotations

import os
import textwrap

import pytest

if os.environ.get("CI"):
    import accelerate  # noqa: F401  (CI installs it: a missing accelerate must fail, not skip)
else:
    pytest.importorskip("accelerate")
    pytest.importorskip("deepspeed")

from allocsim.trace import read_trace  # noqa: E402
from allocsim.trace.schema import EventKind  # noqa: E402

pytestmark = pytest.mark.full

ACC = """
    import torch, torch.nn as nn
    from torch.utils.data import DataLoader, TensorDataset
    from accelerate import Accelerator


    def train():
        acc = Accelerator()
        model = nn.Sequential(nn.Linear(512, 384), nn.ReLU(), nn.Linear(384, 512))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        data = DataLoader(TensorDataset(torch.randn(8, 512)), batch_size=4)
        model, opt, data = acc.prepare(model, opt, data)
        for (x,) in data:
            acc.backward(model(x).float().sum())
            opt.step()
            opt.zero_grad()


    train()
    """
DS_YAML = """
    compute_environment: LOCAL_MACHINE
    distributed_type: DEEPSPEED
    deepspeed_config:
      zero_stage: 2
      offload_optimizer_device: none
      offload_param_device: none
      gradient_accumulation_steps: 1
    mixed_precision: bf16
    num_machines: 1
    num_processes: 8
    machine_rank: 0
    use_cpu: false
    """
#: (rows, columns) of each weight, then its bias length: Linear(512, 384), Linear(384, 512).
LAYERS = [(384, 512), (512, 384)]


def _requests(trace):
    fr, st = trace.frames, trace.stacks
    name = dict(zip(fr.frame_id, fr.name))
    last = {int(sid): name[g.sort_values("depth")["frame_id"].iloc[-1]] for sid, g in st.groupby("stack_id")}
    ev = trace.events
    return [(int(r.size_bytes), int(r.stream), last.get(int(r.stack_id), "").replace("category: ", ""))
            for r in ev[ev["kind"] == int(EventKind.ALLOC)].itertuples()]


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    from allocsim.torch_capture.distributed.capture_dir import capture_job
    from allocsim.torch_capture.distributed.launchers import parse_launch

    folder = tmp_path_factory.mktemp("hf")
    (folder / "acc.py").write_text(textwrap.dedent(ACC))
    (folder / "ds.yaml").write_text(textwrap.dedent(DS_YAML))
    out = {}
    for key, args in (("fsdp2", ["--num_processes", "2", "--use_fsdp", "--fsdp_version", "2", "--mixed_precision",
                                 "bf16"]),
                      ("zero2", ["--config_file", str(folder / "ds.yaml")])):
        launch = parse_launch(["accelerate", "launch", *args, str(folder / "acc.py")])
        manifest = capture_job(launch, str(folder / key), verify=False, rank0_to_terminal=False)
        assert manifest.status == 0, (folder / key / "rank0.log").read_text()[-3000:]
        out[key] = (manifest, _requests(read_trace(str(folder / key / "rank0.parquet"))))
    return out


def test_accelerate_fsdp2_ranks_gather_the_padded_shards(jobs):
    manifest, requests = jobs["fsdp2"]
    world = 2
    assert manifest.world_size == world and manifest.launcher["launcher"] == "accelerate"
    env = manifest.launcher["environment"]
    assert env["ACCELERATE_USE_FSDP"] == "true" and env["FSDP_VERSION"] == "2"
    assert env["ACCELERATE_MIXED_PRECISION"] == "bf16"
    shard = sum(-(-rows // world) * cols + -(-rows // world) for rows, cols in LAYERS)
    gathers = {size for size, stream, category in requests if stream == 1 and category == "communication"}
    assert world * shard * 2 in gathers                 # the all-gather output, bf16, on the copy-in stream
    # FSDP2's all-gathers and reduce-scatters run on the default group's communicator
    collectives = {c["name"]: c["collectives"] for c in manifest.facts["communicators"]}["default_pg"]
    assert {"all_gather", "reduce_scatter"} <= set(collectives)


def test_accelerate_deepspeed_config_file_zero2_on_8_ranks(jobs):
    manifest, requests = jobs["zero2"]
    world = 8
    assert manifest.world_size == world and manifest.launcher["environment"]["ACCELERATE_USE_DEEPSPEED"] == "true"
    numel = sum(rows * cols + rows for rows, cols in LAYERS)
    flat = -(-numel // (2 * world)) * (2 * world)
    sizes = [size for size, _, _ in requests]
    assert flat * 2 in sizes and flat // world * 4 in sizes
    assert sorted(size for size, _, category in requests if category == "optimizer_state") == [flat // world * 4] * 2
    assert 500_000_000 * 2 in sizes                     # DeepSpeed's default reduce_bucket_size, bf16
