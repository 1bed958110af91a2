"""Which GPU of its node the captured process uses: ``current()`` for ``x.device``, ``count()`` for ``device_count``.

A capture models one process on one GPU. A single-GPU script sees one device, ``cuda:0``. A rank
of a distributed job sees what its launcher's node has: ``torch.cuda.device_count()`` is the
node's GPUs (``LOCAL_WORLD_SIZE``, as torchrun sets it) and ``torch.cuda.set_device(LOCAL_RANK)``
makes that rank's tensors ``cuda:LOCAL_RANK``, as on the GPU, where DDP, FSDP and device meshes
compare a parameter's device with the rank's own (``DistributedDataParallel(device_ids=[7])`` on
rank 7, ``DeviceMesh("cuda", ...)``'s ``cuda:7``). Every device tensor of the capture is on that
one GPU: ATen keeps them all on ``meta`` and only the index Python sees changes.
"""

from __future__ import annotations

import os

#: Most GPUs one node is taken to have (a bound on the environment's word).
MAX_DEVICES = 1024
_current = [0]


def count() -> int:
    """GPUs on the captured process's node: ``LOCAL_WORLD_SIZE`` for a launched rank, else 1."""
    try:
        value = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    except ValueError:
        return 1
    return value if 1 <= value <= MAX_DEVICES else 1


def current() -> int:
    """The index of the GPU the process uses (``torch.cuda.current_device()``)."""
    return _current[0]


def select(device: object) -> None:
    """``torch.cuda.set_device(device)``: an index, ``"cuda:N"`` or ``torch.device("cuda", N)``; refused as CUDA refuses it."""
    index = _index_of(device)
    if index is None or index < 0:      # set_device(-1) and set_device("cuda") keep the current device
        return
    if index >= count():
        raise RuntimeError("CUDA error: invalid device ordinal\n"
                           f"(allocsim capture: this process sees {count()} GPU(s); set LOCAL_WORLD_SIZE "
                           "or launch with torchrun --nproc-per-node for more)")
    _current[0] = index


def _index_of(device: object) -> int | None:
    if isinstance(device, bool):
        return None
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        try:
            return int(device.rsplit(":", 1)[1]) if ":" in device else None
        except ValueError:
            return None
    index = getattr(device, "index", None)            # a torch.device
    return index if isinstance(index, int) else None
