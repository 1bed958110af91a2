"""FSDP2's move of a module's states to the GPU, as a capture can make it: ``patches(tracker)``.

``fully_shard`` moves every parameter and buffer of the modules it manages to the GPU in place
(``tensor.data = tensor.to(device)``, ``_move_states_to_device`` in
torch/distributed/fsdp/_fully_shard/_fsdp_init.py) and then shards it. Under the capture a module
built on the CPU holds two kinds of host tensors (``devicemap``): abstract ones on ``meta`` (1 MiB
or more) and small real CPU ones. FSDP skips every ``meta`` tensor (its deferred initialisation),
so the abstract ones would never reach the device, and a real CPU tensor cannot take a ``meta``
tensor's data in place. Here, before FSDP collects the states, each small real CPU parameter or
buffer of the managed modules is replaced by an abstract host tensor of the same shape (its values
are not kept: the capture computes nothing with them), and the move copies every host tensor to
the device, as the GPU run does: the full tensor is a device request, freed once FSDP has made
its shard. FSDP's check that no parameter was left on ``meta`` (deferred initialisation never
materialised) is skipped: every device tensor of a capture is on ``meta``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn


def _abstract(tracker: Any, t: torch.Tensor) -> torch.Tensor:
    with tracker.host():
        out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
    tracker.mark_host(out)
    return out


def _get_managed_states(tracker: Any, original: Any) -> Any:
    # torch 2.6's takes the modules alone; ignored_params came later
    def get_managed_states(modules: list, *ignored_params: Any) -> Any:
        ignored = (ignored_params[0] if ignored_params else None) or set()
        replaced: dict[int, Any] = {}
        for module in modules:
            for name, param in list(module._parameters.items()):
                if param is None or param in ignored or param.device.type != "cpu":
                    continue
                new = replaced.get(id(param))
                if new is None:
                    new = replaced[id(param)] = nn.Parameter(_abstract(tracker, param),
                                                             requires_grad=param.requires_grad)
                module._parameters[name] = new
            for name, buffer in list(module._buffers.items()):
                if buffer is None or buffer.device.type != "cpu":
                    continue
                new = replaced.get(id(buffer))
                if new is None:
                    new = replaced[id(buffer)] = _abstract(tracker, buffer)
                module._buffers[name] = new
        return original(modules, *ignored_params)
    return get_managed_states


def _move_states_to_device(tracker: Any, original: Any) -> Any:
    def move_states_to_device(params: list, buffers: list, device: Any) -> None:
        with torch.no_grad(), tracker.named("parameter"):
            for tensor in [*params, *buffers]:
                if tracker.is_host(tensor):
                    tensor.data = tensor.to("cuda")       # the device copy the GPU run makes
        original(params, buffers, device)
    return move_states_to_device


def patches(tracker: Any) -> list[tuple[Any, str, Any]]:
    """``(owner, name, replacement)`` for FSDP2's state collection and move (``_fsdp_init``)."""
    from torch.distributed.fsdp._fully_shard import _fsdp_init  # noqa: PLC0415

    out = []
    if hasattr(_fsdp_init, "_get_managed_states"):
        out.append((_fsdp_init, "_get_managed_states", _get_managed_states(tracker, _fsdp_init._get_managed_states)))
    if hasattr(_fsdp_init, "_move_states_to_device"):
        out.append((_fsdp_init, "_move_states_to_device",
                    _move_states_to_device(tracker, _fsdp_init._move_states_to_device)))
    return out


def _validate_no_meta_params(tracker: Any, original: Any) -> Any:
    """FSDP's check that no parameter was left on ``meta``, for the script's own meta tensors only.

    Every device tensor of a capture is on ``meta``, so FSDP's own check (``FSDPParamGroup.lazy_init``)
    would refuse them all; a parameter the script built on ``meta`` and never materialised
    (``to_empty``) is refused as on a GPU, with FSDP's message.
    """
    def validate(group: Any) -> None:
        left = [p for p in group.fsdp_params if _script_meta(tracker, p.sharded_param)]
        if left:
            saved = group.fsdp_params
            group.fsdp_params = left
            try:
                original(group)
            finally:
                group.fsdp_params = saved
    return validate


def _script_meta(tracker: Any, param: Any) -> bool:
    local = getattr(param, "_local_tensor", param)          # a DTensor's shard holds the storage
    return tracker.is_script_meta(local)


def group_patches(tracker: Any) -> list[tuple[Any, str, Any]]:
    """``(owner, name, replacement)`` for ``FSDPParamGroup`` (``_fsdp_param_group``)."""
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup  # noqa: PLC0415

    out = []
    if hasattr(FSDPParamGroup, "_validate_no_meta_params"):
        out.append((FSDPParamGroup, "_validate_no_meta_params",
                    _validate_no_meta_params(tracker, FSDPParamGroup._validate_no_meta_params)))
    return out


def _rebuild_tensor_from_dtensor_meta(original: Any) -> Any:
    """DTensor's fake tensor for sharding propagation, on ``meta`` where its mesh is a CUDA one.

    DTensor derives an operator's output shape by running it on fake tensors it builds on
    ``arg.mesh.device_type`` (``_rebuild_tensor_from_dtensor_meta``, torch/distributed/tensor/_op_schema.py).
    A random initialiser on a sharded parameter (``nn.init.kaiming_uniform_`` after ``fully_shard``, as
    torchtune's LoRA adapters and torchtitan's ``init_weights`` do) decomposes to a ``prims`` factory
    on that fake tensor's device, which on a CPU build or without a driver cannot be CUDA. Only the
    shape, strides and dtype are read back (``TensorMeta``), so the fake tensor is made on ``meta``
    -- the script's own kind of meta tensor, which records nothing.
    """
    def rebuild(arg: Any) -> Any:
        mesh = getattr(arg, "mesh", None)
        meta = getattr(arg, "tensor_meta", None)
        if meta is None or getattr(mesh, "device_type", None) != "cuda":
            return original(arg)
        return torch.empty_strided(meta.shape, meta.stride, dtype=meta.dtype, device="meta")
    return rebuild


def op_schema_patches() -> list[tuple[Any, str, Any]]:
    """``(owner, name, replacement)`` for DTensor's sharding propagation (``_op_schema``)."""
    from torch.distributed.tensor import _op_schema  # noqa: PLC0415

    if not hasattr(_op_schema, "_rebuild_tensor_from_dtensor_meta"):
        return []
    return [(_op_schema, "_rebuild_tensor_from_dtensor_meta",
             _rebuild_tensor_from_dtensor_meta(_op_schema._rebuild_tensor_from_dtensor_meta))]


def random_patches() -> list[tuple[Any, str, Any]]:
    """DTensor's RNG tracker (``OffsetBasedRNGTracker``, torch/distributed/tensor/_random.py) with its state on the CPU.

    The tracker, made by the first random operator on a DTensor, reads the generator's state
    (``torch.cuda.get_rng_state()``, a CPU tensor the capture answers) and moves it to
    ``self._device`` to broadcast it from rank 0, inside DTensor's dispatch where no ``cuda`` argument
    is mapped to the capture's device, so the move asks a CUDA kernel the CPU run has not. Every
    rank's capture state is the same (``cuda_api``), so the broadcast is kept on the CPU state; the
    GPU run's 16-byte device copy of the state is not recorded.
    """
    from torch.distributed.tensor import _random  # noqa: PLC0415

    tracker_cls = getattr(_random, "OffsetBasedRNGTracker", None)
    if tracker_cls is None or not hasattr(tracker_cls, "_get_device_state"):
        return []
    original = tracker_cls._get_device_state

    def get_device_state(self: Any) -> torch.Tensor:
        if getattr(getattr(self, "_device", None), "type", None) != "cuda":
            return original(self)
        return self._device_handle.get_rng_state()
    return [(tracker_cls, "_get_device_state", get_device_state)]
