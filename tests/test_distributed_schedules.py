"""Every pipeline schedule keeps the microbatches alive that ``torch/distributed/pipelining/schedules.py`` says.

Rank 0 of a 4-rank pipeline runs, in one capture, ``Schedule1F1B`` (one stage per rank, 4 stages) and
``ScheduleInterleaved1F1B``, ``ScheduleLoopedBFS`` and ``ScheduleInterleavedZeroBubble`` (two stages per
rank, 8 stages: rank 0 holds stages 0 and 4), 8 microbatches of 4 rows each, a stage being
``Linear(64, 96) -> Linear(96, 64)``. A forward of one microbatch on one stage keeps the first
layer's output (4 x 96 float32 = 1,536 bytes, saved for the second layer's weight gradient) until
that microbatch's backward on that stage: the full backward (``B``) of 1F1B, interleaved 1F1B and
looped BFS, the weight step (``W``) of zero bubble, whose input step (``I``) still needs it.

Expected, from the schedules' own order of actions for rank 0 (``pipeline_order[0]``, printed by the
script, so the test follows the installed torch): the most forwards not yet matched by their
``B`` / ``W``. Cross-checked by hand from schedules.py (torch 2.13): 1F1B warms up
``min(n_microbatches, num_stages - stage_index)`` = 4; interleaved 1F1B ``_get_warmup_ops`` =
``(local stages - 1) x microbatches per round + 2 x (pp size - 1 - rank)`` = 4 + 6 = 10 forwards,
then one more forward before each backward: 11; looped BFS runs all 8 microbatches through both
local stages before any backward: 16.
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
from allocsim.torch_capture.distributed.launcher import parse_launch  # noqa: E402
from allocsim.trace import read_trace  # noqa: E402
from allocsim.trace.schema import EventKind  # noqa: E402

pytestmark = pytest.mark.full      # one capture (seconds)

SCRIPT = """
    import json, os, torch, torch.nn as nn, torch.distributed as dist
    from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleInterleaved1F1B,
                                              ScheduleLoopedBFS, ScheduleInterleavedZeroBubble)

    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
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
        torch.cuda.empty_cache()          # the trace's boundary between two schedules
    """
SAVED_BYTES = 4 * 96 * 4            # one microbatch's first-layer output, float32
SCHEDULES = ("1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble")
BY_HAND = {"1F1B": 4, "Interleaved1F1B": 11, "LoopedBFS": 16}


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    folder = tmp_path_factory.mktemp("schedules")
    script = folder / "schedules.py"
    script.write_text(textwrap.dedent(SCRIPT))
    launch = parse_launch(["torchrun", "--nproc-per-node", "4", str(script)])
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
    return read_trace(str(folder / "rank0.parquet")), orders


def _in_flight_by_schedule(trace) -> list[int]:
    """The most first-layer outputs alive at once in each window between two empty_cache calls (forward requests only)."""
    name = dict(zip(trace.frames.frame_id, trace.frames.name))
    backward = {int(sid) for sid, g in trace.stacks.groupby("stack_id")
                if any(name[i].startswith("autograd::engine") for i in g["frame_id"])}
    out, live, most = [], set(), 0
    for r in trace.events.itertuples():
        if r.kind == EventKind.EMPTY_CACHE:
            out.append(most)
            live, most = set(), 0
        elif r.kind == EventKind.ALLOC and r.size_bytes == SAVED_BYTES and int(r.stack_id) not in backward:
            live.add(r.alloc_id)
            most = max(most, len(live))
        elif r.kind == EventKind.FREE_REQUESTED:
            live.discard(r.alloc_id)
    return out


def _in_flight_by_order(actions: list) -> int:
    """What the schedule's own actions keep alive: +1 at a forward (F), -1 at its full backward (B) or weight step (W)."""
    alive = most = 0
    for action in actions:
        kind = action.lstrip("0123456789")[:1] if action else ""
        alive += {"F": 1, "B": -1, "W": -1}.get(kind, 0)
        most = max(most, alive)
    return most


def test_each_schedule_keeps_alive_the_microbatches_its_order_of_actions_says(captured):
    trace, orders = captured
    assert sorted(orders) == sorted(SCHEDULES)
    expected = [_in_flight_by_order(orders[name]) for name in SCHEDULES]
    assert [expected[SCHEDULES.index(n)] for n in BY_HAND] == list(BY_HAND.values())
    assert _in_flight_by_schedule(trace) == expected
