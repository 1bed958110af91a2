"""milabench's ``torchvision`` benchmark as a plain script, for ``allocsim capture``.

    python validate/milabench_scripts/torchvision_bench.py --model resnet50 --batch-size 128 \
        --precision tf32-fp16 --optim channel_last --loader pytorch --steps 2

What it keeps from milabench's ``benchmarks/torchvision/main.py`` and ``benchmate/dataloader.py``
(mila-iqia/milabench @21b96e79, the code the 2025 L40S, H100 and H200 tables were measured with),
rewritten here, not copied:

* the model is ``torchvision.models.<model>()`` (random weights), moved to ``cuda``, put in train
  mode, and with ``--optim channel_last`` converted to ``torch.channels_last`` (resnet50 since
  milabench @60843ba2);
* SGD (lr 0.01, no momentum), ``CrossEntropyLoss``;
* ``--precision``: ``tf32`` in it allows TF32 matmuls and cuDNN convolutions (no memory effect);
  ``fp16`` in it makes the input float16, runs the step under ``torch.cuda.amp.autocast(float16)``
  and enables ``GradScaler``; otherwise the input stays float32, the same autocast block is entered
  with float32 (milabench always enters it) and the scaler is disabled;
* ``--loader pytorch``: a host batch of 3x224x224 images (milabench decodes FakeImageNet JPEGs with
  ``RandomResizedCrop(224)`` in DataLoader workers) copied to the GPU each step with the step's dtype
  and memory format; ``--loader synthetic_fixed`` (``resnet50-noio``): the batch is made as milabench
  makes it, ``randn(B, 3, 244, 244)`` on the GPU and a target ``rand_like(model(x))`` from one
  forward *with* autograd (its graph freed at once), then that one batch every step, with a
  soft (probability) target;
* each step: input ``.to(device, dtype, memory_format)``, ``zero_grad()``, then inside the
  autocast block forward, loss, ``scaler.scale(loss).backward()``, ``scaler.step``, ``scaler.update``.

milabench measures the whole GPU (NVML) through 60 or more steps; the caching allocator's
reserved memory peaks within the first two, so ``--steps 2`` is enough for a capture.
"""

from __future__ import annotations

import argparse
import contextlib

import torch
import torchvision


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--precision", default="fp32", choices=("fp16", "fp32", "tf32", "tf32-fp16"))
    parser.add_argument("--optim", default="", choices=("", "channel_last"))
    parser.add_argument("--loader", default="pytorch", choices=("pytorch", "synthetic_fixed"))
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--legacy-2023", action="store_true",
                        help="the loop of milabench @c62e4834 (2023-11, torch 2.1): float32 input, autocast (float16) "
                             "around forward and loss only and GradScaler only with fp16 in --precision, "
                             "loss.item() each step, synthetic batches of 224x224")
    args = parser.parse_args()
    if args.legacy_2023:
        legacy(args)
        return

    torch.manual_seed(1234)
    tf32 = "tf32" in args.precision
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    half = "fp16" in args.precision
    dtype = torch.float16 if half else torch.float32
    device = torch.device("cuda")

    model = getattr(torchvision.models, args.model)()
    model.to(device)
    model.train()
    channels_last = args.optim == "channel_last"
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    criterion = torch.nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(model.parameters(), args.lr)

    if args.loader == "synthetic_fixed":
        inputs = torch.randn((args.batch_size, 3, 244, 244), device=device)
        target = torch.rand_like(model(inputs))
        batches = [(inputs, target)] * args.steps
    else:
        images = torch.randn((args.batch_size, 3, 224, 224))
        labels = torch.randint(0, 1000, (args.batch_size,))
        batches = [(images, labels)] * args.steps

    scaler = torch.cuda.amp.GradScaler(enabled=half)
    move = {"device": device, "dtype": dtype}
    if channels_last:
        move["memory_format"] = torch.channels_last
    for inputs, target in batches:
        inputs = inputs.to(**move)
        target = target.to(device)
        optimizer.zero_grad()
        with torch.cuda.amp.autocast(dtype=dtype):
            output = model(inputs)
            loss = criterion(output, target)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()


def legacy(args: argparse.Namespace) -> None:
    """milabench's torchvision loop as of @c62e4834 (the old scaling.yaml rows blamed on @1f1bb167)."""
    torch.manual_seed(1234)
    tf32 = "tf32" in args.precision
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    half = "fp16" in args.precision
    device = torch.device("cuda")
    model = getattr(torchvision.models, args.model)()
    model.to(device)
    criterion = torch.nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(model.parameters(), args.lr)
    if args.loader == "synthetic_fixed":
        inputs = torch.randn((args.batch_size, 3, 224, 224)).to(device)
        target = torch.rand_like(model(inputs))
    else:
        inputs = torch.randn((args.batch_size, 3, 224, 224))
        target = torch.randint(0, 1000, (args.batch_size,))
    scaler = torch.cuda.amp.GradScaler() if half else None
    model.train()
    for _ in range(args.steps):
        x, y = inputs.to(device), target.to(device)
        optimizer.zero_grad()
        with torch.cuda.amp.autocast() if scaler is not None else contextlib.nullcontext():
            output = model(x)
            loss = criterion(output, y)
            loss.item()
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()


if __name__ == "__main__":
    main()
