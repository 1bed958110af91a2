"""Distributed scripts captured rank by rank on the CPU: DDP's buckets, FSDP2's buffers, pipeline microbatches, roles.

Every expected byte count follows from the PyTorch source that allocates it (float32 = 4 bytes):

* DDP (torch/csrc/distributed/c10d/reducer.cpp; torch/nn/parallel/distributed.py): at construction
  the parameters are broadcast from rank 0 flattened into one buffer (``_broadcast_coalesced``, up
  to 250 MiB) and, without ``find_unused_parameters``, put in one bucket (limit ``sys.maxsize``);
  after the first iteration the buckets are rebuilt in the order the gradients became ready
  (``Reducer::rebuild_buckets``, ``compute_bucket_assignment_by_size``: a bucket closes once it
  holds at least its limit, the first limit being ``first_bucket_bytes_cap`` -- 1 MiB,
  ``dist._DEFAULT_FIRST_BUCKET_BYTES``, unless ``bucket_cap_mb`` is given -- then ``bucket_cap_mb``),
  after ``sync_bucket_indices`` copies the indices (one int32 per parameter + 1) and the bucket sizes
  (one int32 per bucket) to the device.
* FSDP2 (torch/distributed/fsdp/_fully_shard/_fsdp_param.py, _fsdp_collectives.py): each parameter's
  shard is padded to ``ceil(dim0 / W)`` rows (``_chunk_with_empty``, chunk 0's size); the all-gather
  output is ``W x`` the padded shards of the group, made on the all-gather copy-in stream; the
  reduce-scatter input is the padded unsharded gradients on the compute stream and its output one
  padded shard; optimizer state follows the unpadded shard (the last ranks get fewer rows).
* GPipe (torch/distributed/pipelining/schedules.py ``ScheduleGPipe``: all forwards, then all
  backwards) keeps every microbatch's saved tensors alive: on a stage of two ``Linear`` layers, the
  first layer's output and the stage's output per microbatch; each later stage has one receive buffer
  per microbatch (``_create_act_recv_info``), its shapes sent by the stage before it.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

if os.environ.get("CI"):
    import torch  # noqa: F401  (CI installs it: a missing torch must fail, not skip)
else:
    pytest.importorskip("torch")

from allocsim.torch_capture import session  # noqa: E402
from allocsim.torch_capture.distributed.capture_dir import capture_job  # noqa: E402
from allocsim.torch_capture.distributed.launchers import parse_launch  # noqa: E402
from allocsim.trace import read_trace  # noqa: E402
from allocsim.trace.schema import EventKind  # noqa: E402

pytestmark = pytest.mark.full      # each fixture starts capture children (seconds each)

MIB = 1 << 20
DIST_MEMORY = """
    import os, torch, torch.nn as nn, torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))


    def ddp_default():
        model = nn.Sequential(*[nn.Linear(256, 256) for _ in range(8)]).cuda()
        ddp = DDP(model, device_ids=[int(os.environ["LOCAL_RANK"])])
        for _ in range(2):
            ddp(torch.randn(16, 256, device="cuda")).sum().backward()


    def ddp_capped():
        model = nn.Sequential(*[nn.Linear(256, 256) for _ in range(8)]).cuda()
        ddp = DDP(model, device_ids=[int(os.environ["LOCAL_RANK"])], bucket_cap_mb=2)
        for _ in range(2):
            ddp(torch.randn(16, 256, device="cuda")).sum().backward()


    def fsdp_part():
        mesh = init_device_mesh("cuda", (dist.get_world_size(),))
        model = nn.Sequential(nn.Linear(1000, 300), nn.Linear(300, 1000), nn.Linear(1000, 300), nn.Linear(300, 1000))
        for layer in model:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        opt = torch.optim.AdamW(model.parameters())
        for _ in range(2):
            model(torch.randn(4, 1000, device="cuda")).sum().backward()
            opt.step()
            opt.zero_grad()


    ddp_default()
    ddp_capped()
    fsdp_part()
    """
PIPELINE = """
    import os, torch, torch.nn as nn, torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    D, MB, N = 1024, 8, 4
    stage_layers = nn.Sequential(nn.Linear(D, D), nn.Linear(D, D)).to(dev)
    if rank == world - 1:
        stage_layers.append(nn.Linear(D, 10).to(dev))
    stage = PipelineStage(stage_layers, rank, world, dev)
    schedule = ScheduleGPipe(stage, N, loss_fn=lambda out, target: ((out - target) ** 2).mean())
    x, y = torch.randn(MB * N, D, device=dev), torch.randn(MB * N, 10, device=dev)
    if rank == 0:
        schedule.step(x)
    else:
        schedule.step(target=y)
    """
SPAWN = """
    import os, torch, torch.distributed as dist, torch.multiprocessing as mp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor, Shard, Replicate
    import torch.distributed._functional_collectives as funcol

    def run(rank, world):
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29999", rank=rank, world_size=world)
        objects = [None] * world
        dist.all_gather_object(objects, {"rank": rank})
        assert objects == [{"rank": rank}] * world        # every rank sees what this rank sent
        mesh = init_device_mesh("cuda", (2, 2), mesh_dim_names=("dp", "tp"))
        assert mesh["dp", "tp"]._flatten("dp_tp").size() == 4 and mesh["tp"].size() == 2
        x = distribute_tensor(torch.empty(64, 1024, device="cuda"), mesh["tp"], [Shard(0)])
        full = x.redistribute(mesh["tp"], [Replicate()])          # an all-gather: the full tensor again
        y = funcol.wait_tensor(funcol.all_reduce(torch.empty(256, 256, device="cuda"), "sum", mesh["dp"]))

    if __name__ == "__main__":
        mp.spawn(run, args=(4,), nprocs=4)
    """


def _write(folder: Path, name: str, source: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(source))
    return path


def _stacks(trace) -> dict[int, list[str]]:
    fr, st = trace.frames, trace.stacks
    name = dict(zip(fr.frame_id, fr.name))
    return {int(sid): [name[i] for i in g.sort_values("depth")["frame_id"]] for sid, g in st.groupby("stack_id")}


def _requests(trace, function: str | None = None, category: str | None = None, stream: int | None = None):
    """Sizes of the requests made inside ``function`` (a frame name), of ``category``, on ``stream``, in order."""
    stacks = _stacks(trace)
    ev = trace.events
    out = []
    for r in ev[ev["kind"] == int(EventKind.ALLOC)].itertuples():
        frames = stacks.get(int(r.stack_id), [])
        if function is not None and function not in frames:
            continue
        if category is not None and (not frames or frames[-1] != f"category: {category}"):
            continue
        if stream is not None and r.stream != stream:
            continue
        out.append(int(r.size_bytes))
    return out


def _buckets(sizes_ready_order: list[int], first_limit: int, limit: int) -> list[int]:
    """compute_bucket_assignment_by_size (reducer.cpp): a bucket closes once it holds at least its limit."""
    out, current, limits = [], 0, [first_limit, limit]
    for size in sizes_ready_order:
        current += size
        if current >= limits[min(len(out), 1)]:
            out.append(current)
            current = 0
    return out + ([current] if current else [])


def _linear_stack_ready_order(n: int, features: int) -> list[int]:
    """Gradient bytes in the order they become ready for a chain of n Linear(features, features): last layer first, bias then weight."""
    return [b for _ in range(n) for b in (features * 4, features * features * 4)]


def _fsdp_group_numel(world: int, out_features: int, in_features: int) -> int:
    rows = math.ceil(out_features / world)          # FSDP2 pads every shard to chunk 0's rows
    return rows * in_features + rows


# ------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("dist")


@pytest.fixture(scope="module")
def job8(folder):
    """dist_memory.py under torchrun at 8 ranks: rank 0 learns the job; rank 7's shards are smaller."""
    script = _write(folder, "dist_memory.py", DIST_MEMORY)
    out = folder / "job8"
    launch = parse_launch(["torchrun", "--nproc-per-node", "8", str(script)])
    manifest = capture_job(launch, str(out), workers=2)
    return out, manifest


@pytest.fixture(scope="module")
def rank0_ws2(folder):
    """rank 0 of the same script at 2 ranks, captured alone with the launcher's environment."""
    script = _write(folder, "dist_memory.py", DIST_MEMORY)
    launch = parse_launch(["torchrun", "--nproc-per-node", "2", str(script)])
    result, trace = session.capture(launch.child_command(), str(folder / "ws2.parquet"), env_extra=launch.rank_env(0),
                                    distributed={"spawn_index": 0})
    assert result.status == 0, result.message
    return read_trace(str(folder / "ws2.parquet")), result


# ------------------------------------------------------------------------------------------ DDP
@pytest.mark.parametrize("world", [2, 8])
def test_ddp_buckets_as_reducer_cpp_makes_them(world, job8, rank0_ws2):
    trace = read_trace(str(job8[0] / "rank0.parquet")) if world == 8 else rank0_ws2[0]
    ready = _linear_stack_ready_order(8, 256)
    total = sum(ready)
    n_params = 16
    default = _requests(trace, "ddp_default", "communication")
    rebuilt = _buckets(ready, 1 * MIB, 25 * MIB)          # first bucket 1 MiB (_DEFAULT_FIRST_BUCKET_BYTES), then 25 MiB
    assert rebuilt == [1052672, 1052672]
    assert default == [total, total, (n_params + 1) * 4, len(rebuilt) * 4, *rebuilt]
    capped = _requests(trace, "ddp_capped", "communication")
    assert capped == [total, total, (n_params + 1) * 4, 4, *_buckets(ready, 2 * MIB, 2 * MIB)] == \
        [total, total, 68, 4, total]


# ------------------------------------------------------------------------------------------ FSDP2
@pytest.mark.parametrize("world", [2, 8])
def test_fsdp2_all_gather_and_reduce_scatter_buffers_are_the_padded_shards(world, job8, rank0_ws2):
    trace = read_trace(str(job8[0] / "rank0.parquet")) if world == 8 else rank0_ws2[0]
    groups = {_fsdp_group_numel(world, 300, 1000), _fsdp_group_numel(world, 1000, 300)}
    gathers = _requests(trace, "fsdp_part", "communication", stream=1)
    assert gathers and set(gathers) == {world * n * 4 for n in groups}
    # every all-gather output is on the copy-in stream; the reduce-scatter outputs (sharded gradients) on their own
    ev = trace.events
    streams = set(ev[(ev["kind"] == int(EventKind.ALLOC))]["stream"].tolist())
    assert {0, 1, 3} <= streams
    assert set(_requests(trace, None, "gradient", stream=3)) == {n * 4 for n in groups}
    state = set(_requests(trace, "fsdp_part", "optimizer_state"))
    rows = math.ceil(300 / world)
    assert rows * 1000 * 4 in state and 125 * 300 * 4 * (8 // world) in state


def test_uneven_shards_make_rank_7_its_own_role_and_the_others_verified(job8):
    out, manifest = job8
    assert manifest.status == 0 and manifest.world_size == 8
    assert [r.ranks for r in manifest.roles] == [list(range(7)), [7]]
    check = manifest.roles[0].verified_by
    assert check == {"rank": 6, "fingerprint": manifest.roles[0].fingerprint, "equal": True, "trace": "rank6.parquet"}
    last = read_trace(str(out / "rank7.parquet"))
    # 300 rows over 8 ranks: 38 each, 300 - 7 x 38 = 34 for rank 7 (its Adam state follows the unpadded shard)
    assert 34 * 1000 * 4 in _requests(last, "fsdp_part", "optimizer_state")
    assert 34 * 1000 * 4 not in _requests(read_trace(str(out / "rank0.parquet")), "fsdp_part", "optimizer_state")
    saved = json.loads((out / "manifest.json").read_text())
    assert saved["schema"] == "allocsim-capture-dir/1" and saved["roles"][1]["ranks_text"] == "7"
    assert saved["launcher"]["nproc_per_node"] == 8


def test_run_answers_per_rank_and_names_the_limiting_rank(job8):
    out, _manifest = job8
    cmd = [sys.executable, "-m", "allocsim", "run", str(out), "--policy", "pytorch", "--gpu", "H100"]
    done = subprocess.run([*cmd, "--json"], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert [r["ranks"] for r in data["ranks"]] == [list(range(7)), [7]]
    for r in data["ranks"]:
        assert r["peak_reserved_bytes"] >= r["peak_allocated_bytes"] > 0
        assert r["gpu_estimate"]["total_bytes"] > r["peak_reserved_bytes"]
        assert r["categories"]["communication"] > 0
    assert data["limiting_rank"] in (0, 7) and data["fits"] is True
    text = subprocess.run(cmd, capture_output=True, text=True, check=False).stdout.splitlines()
    assert text[1].startswith("  ranks 0-6 (7 ranks, rank0.parquet): peak allocated")
    assert text[-1].startswith(f"limiting rank {data['limiting_rank']} ") and "FITS on H100" in text[-1]
    tight = subprocess.run([sys.executable, "-m", "allocsim", "run", str(out), "--policy", "pytorch", "--capacity",
                            "20MiB", "--json"], capture_output=True, text=True, check=False)
    assert tight.returncode == 3 and json.loads(tight.stdout)["fits"] is False
    # as the README writes it, without --policy: a folder of captures implies pytorch (was a traceback)
    bare = subprocess.run([sys.executable, "-m", "allocsim", "run", str(out), "--gpu", "H100", "--json"],
                          capture_output=True, text=True, check=False)
    assert bare.returncode == 0 and "--policy pytorch" in bare.stderr and "Traceback" not in bare.stderr
    assert json.loads(bare.stdout)["limiting_rank"] == data["limiting_rank"]


# ------------------------------------------------------------------------------------------ pipeline
def test_gpipe_keeps_every_microbatch_alive_and_the_next_stage_one_receive_buffer_each(folder):
    script = _write(folder, "pipeline.py", PIPELINE)
    out = folder / "pipe"
    # three stages, the last two captured at once: the third gets the second's shapes through the relay
    manifest = capture_job(parse_launch(["torchrun", "--nproc-per-node", "3", str(script)]), str(out), workers=2)
    assert manifest.status == 0 and [r.ranks for r in manifest.roles] == [[0], [1], [2]]
    microbatch = 8 * 1024 * 4
    first, second, third = (read_trace(str(out / f"rank{r}.parquet")) for r in (0, 1, 2))
    # one receive buffer per microbatch for the activations (_create_act_recv_info), and in the middle
    # stage one more for the gradients the last stage sends back (_create_grad_recv_info), same shape
    assert _requests(third, None, "communication").count(microbatch) == 4
    assert _requests(second, None, "communication").count(microbatch) == 4 + 4
    assert not any("stand in" in note for note in third.meta.notes)          # stage 1's own shapes, not a guess
    live, peak = {}, 0
    stacks = _stacks(first)
    for r in first.events.itertuples():
        if r.kind == int(EventKind.ALLOC) and stacks.get(int(r.stack_id), [""])[-1] == "category: activation" \
                and r.size_bytes == microbatch:
            live[r.alloc_id] = r.size_bytes
        elif r.kind == int(EventKind.FREE_COMPLETED):
            live.pop(r.alloc_id, None)
        peak = max(peak, len(live))
    assert peak == 4 * 2            # 4 microbatches x (first Linear's output, the stage's output)


# ------------------------------------------------------------------------------------------ spawn, record_stream
def test_a_script_that_spawns_its_ranks_is_captured_rank_by_rank(folder):
    script = _write(folder, "spawn_ranks.py", SPAWN)
    out = folder / "spawned"
    manifest = capture_job(parse_launch([sys.executable, str(script)]), str(out), verify=False)
    assert manifest.status == 0, manifest.roles[0].message
    assert manifest.world_size == 4 and manifest.facts["spawn"]["nprocs"] == 4
    assert manifest.roles[0].ranks == [0, 1, 2, 3]
    ev = read_trace(str(out / "rank0.parquet")).events
    # distribute_tensor: the full tensor, then this rank's shard; the redistribution's all-gather output;
    # the all-reduce's input and output (wait_tensor and the async wrapper hold no block of their own)
    full, shard, square = 64 * 1024 * 4, 32 * 1024 * 4, 256 * 256 * 4
    assert ev[ev["kind"] == int(EventKind.ALLOC)]["size_bytes"].tolist() == [full, shard, full, square, square]


SPAWN_SET_DEVICE = """
    import torch, torch.distributed as dist, torch.multiprocessing as mp

    def run(rank, world):
        dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29998", rank=rank, world_size=world)
        torch.cuda.set_device(rank)                          # milabench's torchvision_ddp ddp_setup
        x = torch.empty(1024, device=torch.device("cuda", rank))
        assert x.device == torch.device("cuda", rank)

    if __name__ == "__main__":
        mp.spawn(run, args=(3,), nprocs=3)
    """


def test_a_spawned_rank_sees_one_gpu_per_process_the_script_started(folder, monkeypatch):
    # rank 2's capture (the check of the role) calls set_device(2): its node has the 3 GPUs the script
    # started processes for, as on the machine, not the single GPU of a plain script
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    script = _write(folder, "spawn_set_device.py", SPAWN_SET_DEVICE)
    out = folder / "spawned_set_device"
    manifest = capture_job(parse_launch([sys.executable, str(script)]), str(out), verify=True)
    assert manifest.status == 0, [(r.ranks, r.message) for r in manifest.roles]
    assert manifest.world_size == 3 and not manifest.notes, manifest.notes
    assert manifest.roles[0].ranks == [0, 1, 2] and manifest.roles[0].verified_by["equal"] is True


def test_record_stream_holds_the_block_until_the_host_knows_the_other_stream_is_done(folder):
    script = _write(folder, "record.py", """
        import torch
        side = torch.cuda.Stream()
        x = torch.empty(1 << 20, device="cuda")
        with torch.cuda.stream(side):
            y = x * 2
        x.record_stream(side)
        del x
        z = torch.empty(1 << 20, device="cuda")
        torch.cuda.current_stream().wait_stream(side)
        w = y.sum().item()
        a = torch.empty(1 << 20, device="cuda")
        """)
    result, _ = session.capture([sys.executable, str(script)], str(folder / "record.parquet"))
    assert result.status == 0
    ev = read_trace(str(folder / "record.parquet")).events
    rows = [(int(k), int(a)) for k, a in zip(ev["kind"], ev["alloc_id"]) if k in (1, 2, 3)]
    x_requested = rows.index((int(EventKind.FREE_REQUESTED), 0))
    x_completed = rows.index((int(EventKind.FREE_COMPLETED), 0))
    z_alloc = next(i for i, (k, a) in enumerate(rows) if k == 1 and a == 2)
    last_alloc = max(i for i, (k, _a) in enumerate(rows) if k == 1)
    # requested at `del x`, completed only after the read-back on the stream that waited for `side`
    assert x_requested < z_alloc < x_completed < last_alloc


# ------------------------------------------------------------------------------------------ advise, report, fit
def test_advise_searches_the_limiting_rank_and_checks_every_role(job8):
    out, _manifest = job8
    done = subprocess.run([sys.executable, "-m", "allocsim", "advise", str(out), "--gpu", "RTX 3060", "--fast",
                           "--workers", "1", "--json", "-o", str(out.parent / "advise.parquet")],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["limiting_rank"] in (0, 7) and data["job_setting"] is not None
    assert data["checked"][-1]["fits_every_role"] is True and len(data["ranks"]) == 2


def test_report_writes_one_page_per_role(job8, tmp_path):
    out, _manifest = job8
    done = subprocess.run([sys.executable, "-m", "allocsim", "report", str(out), "-o", str(tmp_path / "report.html")],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.rank0.html", "report.rank7.html"]
    assert "ranks 0-6: pytorch" in done.stdout and "ranks 7: pytorch" in done.stdout


def test_fit_on_a_torchrun_job_answers_per_role_with_the_limiting_rank(folder):
    script = _write(folder, "fit_job.py", """
        import sys, torch, torch.nn as nn, torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        batch = int(sys.argv[sys.argv.index("--batch") + 1])
        dist.init_process_group("nccl")
        model = DDP(nn.Sequential(nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 4096)).cuda())
        opt = torch.optim.AdamW(model.parameters())
        for _ in range(2):
            model(torch.randn(batch, 512, 4096, device="cuda")).sum().backward()
            opt.step()
            opt.zero_grad()
        """)
    done = subprocess.run([sys.executable, "-m", "allocsim", "fit", "--gpu", "RTX 4090", "--no-advise", "--workers",
                           "1", "--json", "--", "torchrun", "--nproc-per-node", "2", str(script), "--batch", "{B}"],
                          capture_output=True, text=True, check=False, cwd=folder)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)["answers"][0]
    assert answer["limiting_rank"] == 0 and answer["per_role"] == [
        {"ranks": [0, 1], "ranks_text": "0-1", "value": answer["value"], "range_low": answer["range_low"],
         "range_high": answer["range_high"]}]
    assert answer["value"] and answer["value"] >= 2
    assert answer["estimate"]["total_bytes"] <= answer["gpu_total_bytes"]


def _started(index, ran):
    ran.append(index)


def test_processes_the_script_starts_run_here_only_for_the_rank_captured():
    import multiprocessing
    import types

    import torch.multiprocessing as tmp

    from allocsim.torch_capture.distributed.rank import RankHooks

    sent = []
    tracker = types.SimpleNamespace(channel=types.SimpleNamespace(send=sent.append), note=lambda text: None)
    ran = []
    with RankHooks(tracker, {"spawn_index": 1}).installed():
        processes = [multiprocessing.Process(target=_started, args=(i, ran)) for i in range(3)]
        for p in processes:
            p.start()
        for p in processes:
            p.join()
        assert [p.exitcode for p in processes] == [0, 0, 0] and not any(p.is_alive() for p in processes)
    assert ran == [1]
    ran.clear()
    with RankHooks(tracker, {"spawn_index": 2}).installed():
        assert tmp.spawn(_started, args=(ran,), nprocs=3) is None
    assert ran == [2]
    spawned = [m[1] for m in sent if m[1]["fact"] == "spawn"]
    assert [f["nprocs"] for f in spawned] == [1, 2, 3, 3]      # ranks started so far; spawn's nprocs


META_INIT_RANDOM = """
    import os, torch, torch.nn as nn, torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(1024, 1024, bias=False), nn.Linear(1024, 32, bias=False))
    fully_shard(model)
    model.to_empty(device="cuda")
    nn.init.kaiming_uniform_(model[0].weight)       # random initialisers on sharded parameters (DTensors)
    nn.init.normal_(model[1].weight)
    opt = torch.optim.AdamW(model.parameters())
    for _ in range(2):
        model(torch.randn(8, 1024, device="cuda")).sum().backward()
        opt.step()
        opt.zero_grad()
    """


def test_random_initialisers_on_fsdp2_shards_built_on_meta_run(folder):
    """``nn.init.*_`` on parameters sharded by ``fully_shard`` after ``to_empty`` (torchtune's LoRA, torchtitan).

    Regression: DTensor's sharding propagation built its fake tensors on the mesh's ``cuda``
    (``_rebuild_tensor_from_dtensor_meta``) and its RNG tracker moved the generator state to ``cuda``
    inside its dispatch; both stopped the capture before the first step.
    """
    script = _write(folder, "meta_init_random.py", META_INIT_RANDOM)
    out = folder / "meta_init_random"
    manifest = capture_job(parse_launch(["torchrun", "--nproc-per-node", "2", str(script)]), str(out), workers=1)
    assert manifest.status == 0
    trace = read_trace(str(out / "rank0.parquet"))
    shard = (1024 * 1024 + 32 * 1024) * 4 // 2
    cats: dict[str, list[int]] = {}
    stacks = _stacks(trace)
    for r in trace.events[trace.events["kind"] == int(EventKind.ALLOC)].itertuples():
        cats.setdefault(stacks.get(int(r.stack_id), [""])[-1], []).append(int(r.size_bytes))
    shards = [1024 * 1024 * 4 // 2, 32 * 1024 * 4 // 2]       # each weight's shard at 2 ranks, float32
    assert cats["category: parameter"][:2] == shards          # to_empty makes the shards on the device
    assert sorted(cats["category: optimizer_state"]) == sorted(shards * 2)    # AdamW: exp_avg, exp_avg_sq


DTENSOR_CPU = """
    import torch, torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor
    dist.init_process_group("nccl")
    mesh = init_device_mesh("cuda", (2,))
    for rows in (1024, 8):                # a 2 MiB shard (its host copy abstract in a capture) and a small one
        d = distribute_tensor(torch.ones(rows, 1024, device="cuda"), mesh, [Shard(0)])
        h = d.cpu()
        p = torch.nn.Parameter(d.to("cpu"))
        print("CPU_DTENSOR", rows, type(h).__name__, h.device, h.to_local().device, tuple(h.to_local().shape),
              h.placements == d.placements, type(p.data).__name__, flush=True)
    """


def test_a_dtensor_moved_to_the_cpu_stays_a_dtensor_with_a_host_shard(folder):
    """``dtensor.cpu()`` / ``.to("cpu")`` is a DTensor on the same mesh whose shard is on the host, as DTensor's
    dispatch makes it on a GPU (torchtune's ``fsdp_cpu_offload`` loads its shards so). Regression: the capture
    returned a plain host tensor, and ``load_state_dict(assign=True)`` failed in FSDP2's ``reset_sharded_param``."""
    script = _write(folder, "dtensor_cpu.py", DTENSOR_CPU)
    log = folder / "dtensor_cpu.txt"
    launch = parse_launch(["torchrun", "--nproc-per-node", "2", str(script)])
    with open(log, "w", encoding="utf-8") as fh:
        result, _trace = session.capture(launch.child_command(), str(folder / "dtensor_cpu.parquet"),
                                         env_extra=launch.rank_env(0), distributed={"spawn_index": 0},
                                         stdout=fh, stderr=fh)
    text = log.read_text()
    assert result.status == 0, result.message + text[-2000:]
    lines = [line for line in text.splitlines() if line.startswith("CPU_DTENSOR")]
    assert lines == ["CPU_DTENSOR 1024 DTensor cpu cpu (512, 1024) True DTensor",
                     "CPU_DTENSOR 8 DTensor cpu cpu (4, 1024) True DTensor"]

