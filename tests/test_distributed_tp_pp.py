"""Pipeline schedules and tensor parallel under capture, to the byte: one capture of rank 0 of 4 ranks.

**Pipeline schedules** (torch/distributed/pipelining/schedules.py, torch 2.13). The script runs
``Schedule1F1B`` (one stage per rank, 4 stages) and ``ScheduleInterleaved1F1B``, ``ScheduleLoopedBFS``
and ``ScheduleInterleavedZeroBubble`` (two stages per rank, 8 stages: rank 0 holds stages 0 and 4),
8 microbatches of 4 rows, a stage being ``Linear(64, 96) -> Linear(96, 64)``. A forward of one
microbatch on one stage keeps the first layer's output (4 x 96 float32 = 1,536 bytes, saved for the
second layer's weight gradient) until that microbatch's backward on that stage: the full backward
(``B``) of 1F1B, interleaved 1F1B and looped BFS, the weight step (``W``) of zero bubble, whose
input step (``I``) still needs it. Expected, from the schedules' own order of actions for rank 0
(``pipeline_order[0]``, printed by the script, so the test follows the installed torch): the most
forwards not yet matched by their ``B`` / ``W``; cross-checked by hand: 1F1B warms up
``min(n_microbatches, num_stages - stage_index)`` = 4; interleaved 1F1B ``_get_warmup_ops`` =
``(local stages - 1) x microbatches per round + 2 x (pp size - 1 - rank)`` = 4 + 6 = 10 forwards,
then one more forward before each backward: 11; looped BFS runs all 8 microbatches through both
local stages before any backward: 16.

**Tensor parallel.** Then a block ``LayerNorm -> w1 (D->F) -> ReLU -> w2 (F->D) -> out (D->V)``
parallelised with ``parallelize_module``: ``SequenceParallel`` on the norm,
``ColwiseParallel(input_layouts=Shard(1))`` on w1 and on out (logits kept sharded over the
vocabulary), ``RowwiseParallel(output_layouts=Shard(1))`` on w2, one forward and backward of
``cross_entropy`` under ``loss_parallel()``; B, S, D, F, V = 2, 64, 128, 512, 1000, float32:

* ``distribute_tensor`` -> ``Shard._shard_tensor`` (torch/distributed/tensor/placement_types.py): the
  tensor is split into W chunks made contiguous (``_split_tensor(contiguous=True)``: chunks along dim 1
  are copies, along dim 0 views) and this rank's shard is ``torch.empty_like(chunk)`` filled by
  ``mesh_scatter``: w1 ``F/W x D``, w2 ``D x F/W``, out ``V/W x D``;
* Shard(1) -> Replicate of an activation (sequence parallel into a column-wise layer) is
  ``_c10d_functional.all_gather_into_tensor`` (W x the local shard, gathered along dim 0) and a ``cat``
  moving the chunks to dim 1 (``_to_replicate_tensor``); Partial -> Shard(1) (a row-wise layer's output
  back to sequence parallel) a ``cat`` to dim 0 and ``reduce_scatter_tensor`` to ``1/W`` of it
  (``_reduce_shard_tensor``); their backwards swap the two collectives;
* ``loss_parallel`` (torch/distributed/tensor/parallel/loss.py) computes the loss on the vocabulary
  shards with three all-reduces of one float per token (the max and the sum of exponentials of
  ``_log_softmax``, the picked log-probabilities of the nll): nothing of the full logits is requested.

Last, ``fully_shard`` over ``Linear`` layers built under ``with torch.device("meta")``: the forward of one
never materialised is refused with FSDP's own message (``FSDPParamGroup._validate_no_meta_params``), one
materialised with ``to_empty(device="cuda")`` trains (the fixture checks both).
"""

from __future__ import annotations

import json
import os
import textwrap

import pytest

if os.environ.get("CI"):
    import torch  # noqa: F401  (CI installs it: a missing torch must fail, not skip)
else:
    pytest.importorskip("torch")

from allocsim.torch_capture import session  # noqa: E402
from allocsim.torch_capture.distributed.launchers import parse_launch  # noqa: E402
from allocsim.trace import read_trace  # noqa: E402
from allocsim.trace.schema import EventKind  # noqa: E402

pytestmark = pytest.mark.full      # one capture (seconds)

W, B, S, D, F, V = 4, 2, 64, 128, 512, 1000
SCRIPT = f"""
    import json, os, torch, torch.nn as nn, torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleInterleaved1F1B,
                                              ScheduleLoopedBFS, ScheduleInterleavedZeroBubble)
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.distributed.tensor.parallel import (parallelize_module, ColwiseParallel, RowwiseParallel,
                                                   SequenceParallel, loss_parallel)

    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", int(os.environ["LOCAL_RANK"]))

    # ---- pipeline schedules: one window each
    D, H, MB, N = 64, 96, 4, 8
    for name, cls, per_rank in (("1F1B", Schedule1F1B, 1), ("Interleaved1F1B", ScheduleInterleaved1F1B, 2),
                                ("LoopedBFS", ScheduleLoopedBFS, 2),
                                ("InterleavedZeroBubble", ScheduleInterleavedZeroBubble, 2)):
        stages = [PipelineStage(nn.Sequential(nn.Linear(D, H), nn.Linear(H, D)).to(dev), rank + i * world,
                                world * per_rank, dev) for i in range(per_rank)]
        schedule = cls(stages[0] if per_rank == 1 else stages, N, loss_fn=lambda out, y: ((out - y) ** 2).mean())
        print("ORDER", name, json.dumps([a and str(a) for a in schedule.pipeline_order[rank]]), flush=True)
        x, y = torch.randn(MB * N, D, device=dev), torch.randn(MB * N, D, device=dev)
        if rank == 0:
            schedule.step(x)
        else:
            schedule.step(target=y)
        del schedule, stages, x, y
        torch.cuda.empty_cache()          # the trace's boundary between two windows

    # ---- tensor parallel: the model on the device, parallelised, one step
    mesh = init_device_mesh("cuda", (world,))
    B, S, D, F, V = {B}, {S}, {D}, {F}, {V}


    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(D)
            self.w1 = nn.Linear(D, F, bias=False)
            self.w2 = nn.Linear(F, D, bias=False)
            self.out = nn.Linear(D, V, bias=False)

        def forward(self, x):
            return self.out(self.w2(torch.relu(self.w1(self.norm(x)))))


    model = Block().cuda()
    torch.cuda.empty_cache()
    parallelize_module(model, mesh, {{
        "norm": SequenceParallel(),
        "w1": ColwiseParallel(input_layouts=Shard(1)),
        "w2": RowwiseParallel(output_layouts=Shard(1)),
        "out": ColwiseParallel(input_layouts=Shard(1), use_local_output=False),
    }})
    x = distribute_tensor(torch.randn(B, S, D, device="cuda"), mesh, [Shard(1)])
    y = torch.randint(0, V, (B, S), device="cuda")
    torch.cuda.empty_cache()
    logits = model(x)
    with loss_parallel():
        nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten()).backward()
    torch.cuda.empty_cache()

    # ---- FSDP2 over a model built on meta: refused until materialised, as on a GPU
    from torch.distributed.fsdp import fully_shard
    with torch.device("meta"):
        forgotten, lazy = nn.Linear(64, 64), nn.Linear(64, 64)
    fully_shard(forgotten, mesh=mesh)
    try:
        forgotten(torch.randn(2, 64, device="cuda"))
        print("META_REFUSED False", flush=True)
    except RuntimeError as exc:
        print("META_REFUSED", "should be materialized from meta device" in str(exc), flush=True)
    fully_shard(lazy, mesh=mesh)
    lazy.to_empty(device="cuda")
    lazy(torch.randn(2, 64, device="cuda")).sum().backward()
    print("META_TRAINED", flush=True)
    """
SCHEDULES = ("1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble")
SAVED_BYTES = 4 * 96 * 4            # one microbatch's first-layer output, float32
BY_HAND = {"1F1B": 4, "Interleaved1F1B": 11, "LoopedBFS": 16}
TP_PARALLELISED, TP_STEP = len(SCHEDULES) + 1, len(SCHEDULES) + 2      # windows of the tensor-parallel part


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    """Each window's requests (size, alloc id, first frame, autograd?, category) and each schedule's order."""
    folder = tmp_path_factory.mktemp("tp_pp")
    script = folder / "tp_pp.py"
    script.write_text(textwrap.dedent(SCRIPT))
    launch = parse_launch(["torchrun", "--nproc-per-node", str(W), str(script)])
    log = folder / "out.txt"
    with open(log, "w", encoding="utf-8") as fh:
        result, _trace = session.capture(launch.child_command(), str(folder / "rank0.parquet"),
                                         env_extra=launch.rank_env(0), distributed={"spawn_index": 0},
                                         stdout=fh, stderr=fh)
    assert result.status == 0, result.message + log.read_text()[-2000:]
    orders = {}
    for line in log.read_text().splitlines():
        if line.startswith("ORDER "):
            _, name, actions = line.split(" ", 2)
            orders[name] = json.loads(actions)
    trace = read_trace(str(folder / "rank0.parquet"))
    name = dict(zip(trace.frames.frame_id, trace.frames.name))
    stacks = {int(s): [name[i] for i in g.sort_values("depth")["frame_id"]]
              for s, g in trace.stacks.groupby("stack_id")}
    windows: list[list[tuple]] = [[]]
    for r in trace.events.itertuples():
        if r.kind == EventKind.EMPTY_CACHE:
            windows.append([])
        elif r.kind in (EventKind.ALLOC, EventKind.FREE_REQUESTED):
            frames = stacks.get(int(r.stack_id), [""]) if r.kind == EventKind.ALLOC else [""]
            backward = any(f.startswith("autograd::engine") for f in frames)
            windows[-1].append((int(r.kind), int(r.size_bytes), int(r.alloc_id), frames[0], backward,
                                frames[-1].removeprefix("category: ")))
    assert len(windows) == TP_STEP + 2
    assert "META_REFUSED True" in log.read_text() and "META_TRAINED" in log.read_text()
    return windows, orders


def _requests(window: list[tuple]) -> list[tuple[int, str, bool, str]]:
    return [(size, op, bw, category) for kind, size, _id, op, bw, category in window if kind == EventKind.ALLOC]


# ------------------------------------------------------------------------------------------ pipeline schedules
def _in_flight_in(window: list[tuple]) -> int:
    """The most first-layer outputs alive at once (forward requests only: a gradient has the same size)."""
    live: set[int] = set()
    most = 0
    for kind, size, alloc_id, _op, backward, _category in window:
        if kind == EventKind.ALLOC and size == SAVED_BYTES and not backward:
            live.add(alloc_id)
            most = max(most, len(live))
        elif kind == EventKind.FREE_REQUESTED:
            live.discard(alloc_id)
    return most


def _in_flight_by_order(actions: list) -> int:
    """What the schedule's own actions keep alive: +1 at a forward (F), -1 at its full backward (B) or weight step (W)."""
    alive = most = 0
    for action in actions:
        kind = action.lstrip("0123456789")[:1] if action else ""
        alive += {"F": 1, "B": -1, "W": -1}.get(kind, 0)
        most = max(most, alive)
    return most


def test_each_schedule_keeps_alive_the_microbatches_its_order_of_actions_says(captured):
    windows, orders = captured
    assert sorted(orders) == sorted(SCHEDULES)
    expected = [_in_flight_by_order(orders[name]) for name in SCHEDULES]
    assert [expected[SCHEDULES.index(n)] for n in BY_HAND] == list(BY_HAND.values())
    assert [_in_flight_in(windows[i]) for i in range(len(SCHEDULES))] == expected


# ------------------------------------------------------------------------------------------ tensor parallel
def test_parameters_are_sharded_by_distribute_tensor(captured):
    requests = _requests(captured[0][TP_PARALLELISED])
    assert [size for size, _op, _bw, category in requests if category == "parameter"] == [
        F // W * D * 4, D * F // W * 4, V // W * D * 4]
    # chunks along dim 1 are made contiguous, one copy per rank, before the scatter: w2's, then the input's
    assert [size for size, op, _bw, _c in requests if op == "aten::clone"] == ([D * F // W * 4] * W
                                                                               + [B * S // W * D * 4] * W)


def test_sequence_parallel_redistributions_are_all_gathers_and_reduce_scatters(captured):
    requests = _requests(captured[0][TP_STEP])

    def collectives(backward: bool) -> list[tuple[str, int]]:
        return [(op.split("::")[1], size) for size, op, bw, _c in requests
                if op.startswith("_c10d_functional::") and bw == backward]

    full, shard = B * S * D * 4, B * S // W * D * 4
    assert collectives(False) == [("all_gather_into_tensor", full), ("reduce_scatter_tensor", shard),
                                  ("all_gather_into_tensor", full)] + [("all_reduce", B * S * 4)] * 3
    assert collectives(True) == [("reduce_scatter_tensor", shard), ("all_gather_into_tensor", full),
                                 ("reduce_scatter_tensor", shard)]


def test_loss_parallel_never_gathers_the_vocabulary(captured):
    sizes = [size for size, _op, _bw, category in _requests(captured[0][TP_STEP]) if category != "workspace"]
    assert B * S * V // W * 4 in sizes                  # the local logits
    assert max(sizes) < B * S * V * 4                   # nothing the size of the full logits (cuBLAS's own aside)
