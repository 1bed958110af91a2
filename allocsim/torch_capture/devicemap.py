"""Run a script written for ``cuda`` on the ``meta`` device along the CUDA code path; ``with cuda_on_meta(tracker):``.

Why ``meta`` and not the CPU: a meta tensor has the shape, dtype and storage size the CUDA tensor
would have and costs nothing to compute, so a full-size model trains in seconds on any machine, and
no CPU-only allocation (oneDNN reorders and scratch) can enter the trace. ``FakeTensorMode`` with
fake CUDA tensors was tried first: on a CUDA build without a driver the autograd engine asks the
driver for a primary context and fails, and a CPU-only build refuses ``cuda`` tensors altogether.

What the mapping does, each because the CUDA run does it:

* every ``device`` argument that names ``cuda`` (a string, a ``torch.device``, ``Tensor.cuda()``,
  ``Module.cuda()``) names ``meta`` instead;
* optimizers take their CUDA default, the multi-tensor ``foreach`` kernels (PyTorch picks them for
  CUDA parameters and the for-loop for others);
* ``F.dropout`` in training is ``native_dropout``, CUDA's fused kernel with a one-byte mask, where
  the generic path would keep a mask of the input's dtype;
* ``F.scaled_dot_product_attention`` is the kernel PyTorch picks on an Ampere-or-newer GPU: flash
  attention for half precision without a mask, memory-efficient attention for float32 or a float
  mask (no L x L matrix is kept); a boolean mask, ``enable_gqa`` or a head size over 256 keep the
  generic path;
* reading a value back (``item()``, ``float()``, ``tolist()``, ``.cpu()``, printing it with a format)
  gives zeros: the run's numbers are not computed, only its memory;
* ``torch.cuda`` answers as one GPU would (``is_available()`` is true, ``synchronize()`` returns,
  ``memory_allocated()`` is what the capture holds, ``empty_cache()`` is recorded); pinned memory is
  ordinary host memory.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from .tracker import CAPTURE_DEVICE, StorageTracker

_META = torch.device(CAPTURE_DEVICE)
#: Tensor methods whose answer is a host value: zeros stand in for the numbers never computed.
_READBACK = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__float__, torch.Tensor.__int__,
             torch.Tensor.__bool__, torch.Tensor.__index__, torch.Tensor.numpy, torch.Tensor.__format__}


def _is_cuda(value: Any) -> bool:
    if isinstance(value, torch.device):
        return value.type == "cuda"
    return isinstance(value, str) and (value == "cuda" or value.startswith("cuda:"))


def _map(value: Any) -> Any:
    return _META if _is_cuda(value) else value


def _host_zeros(t: torch.Tensor) -> torch.Tensor:
    return torch.zeros(t.shape, dtype=t.dtype)


def _readback(func: Any, t: torch.Tensor, args: tuple, kwargs: dict) -> Any:
    host = _host_zeros(t)
    if func is torch.Tensor.__format__:
        return format(host.item() if host.dim() == 0 else host, *args[1:])
    return func(host, *args[1:], **kwargs)


class CudaOnMeta(TorchFunctionMode):
    """The torch-function half of the mapping: device arguments, CUDA kernels' choices, read-backs."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if "device" in kwargs:
            kwargs["device"] = _map(kwargs["device"])
        self_t = args[0] if args and isinstance(args[0], torch.Tensor) else None
        on_meta = self_t is not None and self_t.device.type == CAPTURE_DEVICE
        if func is torch.Tensor.cuda:
            return self_t.to(_META, **{k: v for k, v in kwargs.items() if k == "non_blocking"})
        if on_meta and func in _READBACK:
            return _readback(func, self_t, args, kwargs)
        if on_meta and (func is torch.Tensor.cpu or (func is torch.Tensor.to and _to_host(args, kwargs))):
            return _host_zeros(self_t)
        if func is F.dropout and args and _dropout_fused(args, kwargs):
            return _native_dropout(args, kwargs)
        if func is F.scaled_dot_product_attention:
            fused = _fused_attention(args, kwargs)
            if fused is not None:
                return fused
        args = tuple(_map(a) for a in args)
        return func(*args, **kwargs)


def _to_host(args: tuple, kwargs: dict) -> bool:
    target = kwargs.get("device", args[1] if len(args) > 1 else None)
    if isinstance(target, torch.Tensor):
        target = target.device
    if isinstance(target, str):
        target = torch.device(target)
    return isinstance(target, torch.device) and target.type == "cpu"


def _dropout_fused(args: tuple, kwargs: dict) -> bool:
    names = ("input", "p", "training", "inplace")
    given = dict(zip(names, args)) | kwargs
    x, p = given["input"], given.get("p", 0.5)
    return (isinstance(x, torch.Tensor) and x.device.type == CAPTURE_DEVICE and given.get("training", True)
            and 0 < p < 1 and x.numel() > 0)


def _native_dropout(args: tuple, kwargs: dict) -> torch.Tensor:
    names = ("input", "p", "training", "inplace")
    given = dict(zip(names, args)) | kwargs
    out = torch.native_dropout(given["input"], given.get("p", 0.5), True)[0]
    if given.get("inplace", False):
        return given["input"].copy_(out)
    return out


_SDPA_NAMES = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


def _fused_attention(args: tuple, kwargs: dict) -> Any:
    """The flash or memory-efficient kernel's output for a meta ``scaled_dot_product_attention``, else None."""
    given = dict(zip(_SDPA_NAMES, args)) | kwargs
    q, k, v = given.get("query"), given.get("key"), given.get("value")
    mask = given.get("attn_mask")
    if not all(isinstance(t, torch.Tensor) and t.device.type == CAPTURE_DEVICE for t in (q, k, v)):
        return None
    if given.get("enable_gqa") or q.dim() != 4 or q.shape[-1] > 256 or k.shape[1] != q.shape[1]:
        return None
    dropout_p, is_causal, scale = given.get("dropout_p", 0.0), given.get("is_causal", False), given.get("scale")
    aten = torch.ops.aten
    if mask is None and q.dtype in (torch.float16, torch.bfloat16):
        return aten._scaled_dot_product_flash_attention(q, k, v, dropout_p, is_causal, False, scale=scale)[0]
    if mask is None or (isinstance(mask, torch.Tensor) and mask.dtype == q.dtype):
        needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
        return aten._scaled_dot_product_efficient_attention(q, k, v, mask, needs_grad, dropout_p, is_causal,
                                                            scale=scale)[0]
    return None


@contextlib.contextmanager
def _patched(owner: Any, name: str, value: Any) -> Iterator[None]:
    old = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, old)


def _foreach_devices_with_meta(original):
    def supported(*args, **kwargs):
        return list(original(*args, **kwargs)) + [CAPTURE_DEVICE]
    return supported


@contextlib.contextmanager
def cuda_on_meta(tracker: StorageTracker, total_bytes: int = 80 << 30) -> Iterator[None]:
    """Map ``cuda`` to ``meta`` and answer ``torch.cuda`` as one GPU of ``total_bytes`` would, inside the block."""
    import torch.optim.optimizer as optimizer_mod   # noqa: PLC0415

    cuda = torch.cuda
    shims = {
        "is_available": lambda: True,
        "device_count": lambda: 1,
        "current_device": lambda: 0,
        "set_device": lambda device: None,
        "synchronize": lambda device=None: None,
        "empty_cache": tracker.empty_cache,
        "memory_allocated": lambda device=None: tracker.live_bytes,
        "max_memory_allocated": lambda device=None: tracker.peak_bytes,
        "reset_peak_memory_stats": lambda device=None: setattr(tracker, "peak_bytes", tracker.live_bytes),
        "mem_get_info": lambda device=None: (total_bytes - tracker.live_bytes, total_bytes),
        "get_device_name": lambda device=None: "allocsim capture (cuda on meta)",
        "manual_seed": lambda seed: None,
        "manual_seed_all": lambda seed: None,
    }
    # torch.accelerator is what the DataLoader's pin-memory thread and newer code ask instead
    accelerator_shims = {"is_available": lambda: True, "device_count": lambda: 1,
                         "current_device_index": lambda: 0, "set_device_index": lambda device: None,
                         "synchronize": lambda device=None: None}
    accelerator = getattr(torch, "accelerator", None)
    with contextlib.ExitStack() as stack:
        for name, fn in shims.items():
            stack.enter_context(_patched(cuda, name, fn))
        for name, fn in accelerator_shims.items():
            if accelerator is not None and hasattr(accelerator, name):
                stack.enter_context(_patched(accelerator, name, fn))
        stack.enter_context(_patched(torch.Tensor, "pin_memory", lambda self, *a, **k: self))
        stack.enter_context(_patched(optimizer_mod, "_get_foreach_kernels_supported_devices",
                                     _foreach_devices_with_meta(optimizer_mod._get_foreach_kernels_supported_devices)))
        for name in ("_accelerator_graph_capture_health_check", "_cuda_graph_capture_health_check"):
            if hasattr(torch.optim.Optimizer, name):   # asks the driver whether a graph is being captured
                stack.enter_context(_patched(torch.optim.Optimizer, name, lambda self: None))
        stack.enter_context(tracker)
        stack.enter_context(CudaOnMeta())
        yield
