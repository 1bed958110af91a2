"""Megatron-LM under capture: its fused CUDA kernels answered as the kernels allocate, ``patches()`` on import.

``pretrain_gpt.py`` compiles or imports CUDA extensions a CPU build has not got:

* ``megatron.legacy.fused_kernels.load`` (called by ``initialize._compile_dependencies``) runs
  ``nvcc -V`` to pick architectures; nothing is built there any more (core_v0.13): under capture it
  returns at once.
* the fused softmax kernels ``scaled_upper_triang_masked_softmax_cuda``, ``scaled_masked_softmax_cuda``
  and ``scaled_softmax_cuda`` (built by apex's ``--cuda_ext``, imported by
  megatron/core/fusions/fused_softmax.py, which falls back to ``torch.softmax`` without them). A GPU
  run with them allocates what the kernel allocates, which is not what the fallback does (the
  fallback keeps a float32 copy when ``softmax_in_fp32``): ``fwd_cuda`` makes one output
  ``torch::empty`` of the input's shape and dtype; ``bwd_cuda`` works in place on
  ``output_grads.contiguous()`` and returns it (apex csrc/megatron/scaled_masked_softmax_cuda.cu,
  scaled_upper_triang_masked_softmax_cuda.cu, scaled_softmax_cuda.cu). The stand-ins here do
  exactly that; ``get_batch_per_block`` follows scaled_masked_softmax.h (warp of
  ``min(next_pow2(key_len), 32)`` threads, 128 threads a block, 2 rows a warp up to 128 keys).

Megatron's RNG tracker reads ``torch.cuda.default_generators`` (answered by ``cuda_api``), and a job
with tensor or context parallelism needs ``CUDA_DEVICE_MAX_CONNECTIONS=1`` in its environment, as on
GPUs.
"""

from __future__ import annotations

import sys
import types
from typing import Any

SOFTMAX_MODULES = ("scaled_upper_triang_masked_softmax_cuda", "scaled_masked_softmax_cuda", "scaled_softmax_cuda")


def _forward(inputs: Any, *rest: Any) -> Any:
    """``fwd_cuda``: one output of the input's shape and dtype (``torch::empty``, contiguous)."""
    import torch  # noqa: PLC0415

    return torch.empty(inputs.shape, dtype=inputs.dtype, device=inputs.device)


def _backward(output_grads: Any, softmax_results: Any, scale: Any) -> Any:
    """``bwd_cuda``: in place on ``output_grads.contiguous()``, which it returns."""
    return output_grads.contiguous()


def get_batch_per_block(query_seq_len: int, key_seq_len: int, batches: int, attn_heads: int) -> int:
    """Rows of attention scores one 128-thread block handles (apex scaled_masked_softmax.h ``get_batch_per_block``)."""
    next_power_of_two = 1 << max(0, int(key_seq_len) - 1).bit_length()
    warp_size = min(next_power_of_two, 32)
    batches_per_warp = 2 if next_power_of_two <= 128 else 1
    return (128 // warp_size) * batches_per_warp


def softmax_stand_ins() -> dict[str, types.ModuleType]:
    """The three fused softmax extensions, allocating what their kernels allocate (module doc)."""
    out = {}
    for name in SOFTMAX_MODULES:
        module = types.ModuleType(name, f"allocsim capture's stand-in for apex's {name}: what its kernel allocates")
        module.forward = _forward
        module.backward = _backward
        module.get_batch_per_block = get_batch_per_block
        out[name] = module
    return out


def patches() -> list[tuple[Any, str, Any]]:
    """``fused_kernels.load`` as a no-op, and the fused softmax extensions importable (when Megatron is imported)."""
    from megatron.legacy import fused_kernels  # noqa: PLC0415

    for name, module in softmax_stand_ins().items():
        sys.modules.setdefault(name, module)
    return [(fused_kernels, "load", lambda args: None)]


def parallel_state_patches(hooks: Any) -> list[tuple[Any, str, Any]]:
    """Megatron's pipeline position is a fact for the roles rule (``roles``): ``initialize_model_parallel`` reports it.

    Megatron pipelines with its own schedules (megatron/core/pipeline_parallel/schedules.py), not
    ``torch.distributed.pipelining``: each rank's stage is its rank in the pipeline group
    (``parallel_state.get_pipeline_model_parallel_rank``); with virtual stages it also holds the
    chunks ``rank + k x size``, which follow from the same position.
    """
    import torch.distributed as dist  # noqa: PLC0415
    from megatron.core import parallel_state  # noqa: PLC0415

    original = parallel_state.initialize_model_parallel

    def initialize_model_parallel(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        size = parallel_state.get_pipeline_model_parallel_world_size()
        if size > 1:
            ranks = dist.get_process_group_ranks(parallel_state.get_pipeline_model_parallel_group())
            hooks.facts.stage(parallel_state.get_pipeline_model_parallel_rank(), size, ranks)
        return out

    return [(parallel_state, "initialize_model_parallel", initialize_model_parallel)]
