"""milabench's ``torchvision_ddp`` benchmark (``resnet152-ddp-gpus``) as a plain script, for ``allocsim capture``.

    allocsim capture -o DIR --gpu H100 --steps 3 -- python validate/milabench_scripts/torchvision_ddp_bench.py \
        --model resnet152 --batch-size 256 --world-size 8

What it keeps from milabench's ``benchmarks/torchvision_ddp/main.py`` and ``benchmate/dataloader.py``
(mila-iqia/milabench; the same file at @491505f0, @dc0617d1, @56ac1833 and @8d056ae4, the commits of the
A100, H100, L40S and H200 tables), rewritten here, not copied:

* ``main`` starts one process per GPU with ``torch.multiprocessing.spawn`` (world size: the node's
  device count, ``accelerator.device_count()``; ``--world-size`` here, since a capture's process sees
  one GPU); each worker joins the NCCL process group and sets its device;
* the model is ``torchvision.models.<model>()`` (random weights, float32, ``--precision`` is parsed
  and never used by that file), moved to the rank's GPU, then wrapped in
  ``DistributedDataParallel(model, device_ids=[device])`` (default buckets);
* SGD (lr 1e-3, no momentum) built on the model's parameters before the move;
* the ``torch`` loader (``--loader torch`` falls through to benchmate's ``pytorch`` loader):
  ``ImageFolder`` of FakeImageNet with ``RandomResizedCrop(224)``, a ``DistributedSampler``, the
  per-rank ``--batch-size``, pinned host batches; here one host batch of 3x224x224 float32 images
  and int64 labels, copied to the GPU each step as milabench does (``source.to(device)``);
* each step, all inside ``autocast(dtype=torch.bfloat16)``: ``zero_grad()``, forward,
  ``F.cross_entropy``, ``backward()``, ``optimizer.step()``, and the observer's ``loss.detach()``.

milabench stops each run after 60 s and reports the largest NVML ``used`` figure of any GPU; DDP
rebuilds its buckets in the second iteration, so ``--steps 3`` covers the steady state.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
import torchvision
from torch.nn.parallel import DistributedDataParallel as DDP


def worker_main(rank: int, world_size: int, args: argparse.Namespace) -> None:
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = "12355"
    os.environ["ID"] = str(rank)
    torch.distributed.init_process_group(backend="nccl", rank=rank, world_size=world_size)
    torch.cuda.set_device(rank)

    model = getattr(torchvision.models, args.model)()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)

    images = torch.randn((args.batch_size, 3, 224, 224))
    labels = torch.randint(0, 1000, (args.batch_size,))

    device = torch.device("cuda", rank)
    model = model.to(device)
    ddp = DDP(model, device_ids=[device])
    for _ in range(args.steps):
        source = images.to(device)
        targets = labels.to(device)
        with torch.cuda.amp.autocast(dtype=torch.bfloat16):
            optimizer.zero_grad()
            output = ddp(source)
            loss = F.cross_entropy(output, targets)
            loss.backward()
            optimizer.step()
            loss.detach()
    torch.distributed.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="resnet152")
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--world-size", type=int, default=0, help="processes (default: torch.cuda.device_count())")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--precision", default="fp32", help="parsed and unused, as in milabench")
    args = parser.parse_args()
    world_size = args.world_size or torch.cuda.device_count()
    mp.spawn(worker_main, args=(world_size, args), nprocs=world_size, join=True)


if __name__ == "__main__":
    main()
