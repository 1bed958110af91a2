"""``nn.DataParallel`` on the capture's one GPU runs as on a 1-GPU machine: ``shims(tracker)``.

With one visible device ``DataParallel`` (``torch/nn/parallel/data_parallel.py``) moves the module
to ``cuda:0``, checks at each forward that every parameter and buffer is there, scatters the inputs
(``Scatter`` -> ``comm.scatter`` -> ``torch._C._scatter``, CUDA-only C++) and calls the module once.
Its device check compares each parameter's ``.device`` with ``cuda:0``, which a capture's device
tensors report (``identity``), so it runs as torch wrote it; a parameter left on the host reports
``cpu`` and gets DataParallel's own error. The scatter cannot run on a CPU build with ``cuda`` on
``meta``, so inside a capture ``comm.scatter`` does what ``torch/csrc/cuda/comm.cpp: scatter`` does
for one device: the input's chunk stays as it is when it is already on the GPU, and a host chunk is
copied to it (``.to(device, non_blocking=True)``) on the copy stream ``Scatter`` chose
(``_get_stream``), so the trace has that device request on that stream as the GPU run does.
"""

from __future__ import annotations

import functools
from typing import Any

import torch


def _scatter(original: Any, is_device: Any) -> Any:
    @functools.wraps(original)
    def scatter(tensor: torch.Tensor, devices: Any = None, chunk_sizes: Any = None, dim: int = 0,
                streams: Any = None, *, out: Any = None) -> tuple[torch.Tensor, ...]:
        if out is not None or devices is None or len(list(devices)) != 1:
            return original(tensor, devices, chunk_sizes, dim, streams, out=out)
        chunks = tensor.split(list(chunk_sizes), dim) if chunk_sizes else tensor.chunk(1, dim)
        moved = []
        for i, chunk in enumerate(chunks):
            if is_device(chunk):
                moved.append(chunk)
                continue
            stream = streams[i] if streams else None
            with torch.cuda.stream(stream):
                moved.append(chunk.to("cuda", non_blocking=True))
        return tuple(moved)
    return scatter


def shims(is_device: Any) -> dict[tuple[Any, str], Any]:
    """``{(owner, attribute): replacement}`` for DataParallel's scatter."""
    import torch.nn.parallel.comm as comm  # noqa: PLC0415

    # Scatter.forward calls record_stream with the capture's stream inside autograd.Function, where the
    # function mode does not see it: a no-op there too (one timeline: nothing to keep alive longer)
    return {(comm, "scatter"): _scatter(comm.scatter, is_device),
            (torch.Tensor, "record_stream"): lambda self, stream: None}
