"""Meta kernels that older torch releases lack, with the outputs the CUDA kernels allocate: ``install()``.

The capture runs every operator on ``meta``. torch 2.4 registers the forward kernels of
scaled-dot-product attention for ``FakeTensor`` only (``torch/_subclasses/fake_impls.py``), not as
``Meta`` kernels, so on a meta tensor they raise ``NotImplementedError`` where 2.5 and later run
their meta registration. ``install()`` registers, for each such operator this torch has without a
``Meta`` kernel, one that returns what the CUDA kernel returns (shapes, dtypes and layout: the
storage each output takes on the GPU), and leaves every operator that has one alone:

* ``_scaled_dot_product_flash_attention``: ``attention.cu``'s CUDA kernel runs flash on
  ``query.transpose(1, 2)`` (batch, length, heads, head size) and returns the output transposed back,
  so its storage is that layout; the log-sum-exp is float32 (batch, heads, length); the debug mask is
  empty unless asked for;
* ``_scaled_dot_product_efficient_attention``: the output in the same layout, the log-sum-exp float32
  (batch, heads, length rounded up to 32) when gradients are needed, else (batch, heads, 0);
* ``_scaled_dot_product_cudnn_attention`` (2.4's schema: no mask): the output in the query's layout,
  float32 statistics (batch, heads, length, 1); its backward's gradients are shaped as q, k and v.

The philox seed and offset these kernels return are host tensors on CUDA unless a CUDA graph is being
captured (``at::empty({}, at::dtype(at::kLong))`` in ``flash_api.cpp`` / ``attention_backward.cu``):
host tensors here too, so no device request stands for them.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

_library: Any = None


def _bind(overload: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The call's arguments by schema name, defaults filled in."""
    bound: dict[str, Any] = {}
    for i, arg in enumerate(overload._schema.arguments):
        if i < len(args):
            bound[arg.name] = args[i]
        elif arg.name in kwargs:
            bound[arg.name] = kwargs[arg.name]
        elif arg.has_default_value():
            bound[arg.name] = arg.default_value
    return bound


def _host_long() -> torch.Tensor:
    return torch.empty((), dtype=torch.long, device="cpu")


def _blhd_like(query: torch.Tensor, head_size_v: int) -> torch.Tensor:
    """A (batch, heads, length, head size) output stored as (batch, length, heads, head size)."""
    b, h, length = query.size(0), query.size(1), query.size(2)
    return torch.empty((b, length, h, head_size_v), dtype=query.dtype, device=query.device).transpose(1, 2)


def _flash(overload: Any) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        a = _bind(overload, args, kwargs)
        q, k = a["query"], a["key"]
        b, h, l_q, l_k = q.size(0), q.size(1), q.size(2), k.size(2)
        out = _blhd_like(q, a["value"].size(-1))
        lse = torch.empty((b, h, l_q), dtype=torch.float32, device=q.device)
        if a.get("return_debug_mask"):
            cols = 128 if l_k <= 128 else 256 if l_k <= 256 else math.ceil(l_q / (128 if q.size(3) > 64 else 256))
            debug = torch.empty((b, h, l_q, cols), dtype=q.dtype, device=q.device)
        else:
            debug = torch.empty(0, dtype=q.dtype, device=q.device)
        return out, lse, None, None, l_q, l_k, _host_long(), _host_long(), debug
    return kernel


def _efficient(overload: Any) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        a = _bind(overload, args, kwargs)
        q = a["query"]
        rows = math.ceil(q.size(2) / 32) * 32 if a.get("compute_log_sumexp") else 0
        out = _blhd_like(q, a["value"].size(-1))
        lse = torch.empty((q.size(0), q.size(1), rows), dtype=torch.float32, device=q.device)
        return out, lse, _host_long(), _host_long()
    return kernel


def _cudnn(overload: Any) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        a = _bind(overload, args, kwargs)
        q, k, v = a["query"], a["key"], a["value"]
        b, h, l_q = q.size(0), q.size(1), q.size(2)
        out = torch.empty_like(q) if v.size(-1) == q.size(-1) else \
            torch.empty((b, h, l_q, v.size(-1)), dtype=q.dtype, device=q.device)
        stats = torch.empty((b, h, l_q, 1), dtype=torch.float32, device=q.device)
        return out, stats, None, None, l_q, k.size(2), _host_long(), _host_long(), None
    return kernel


def _cudnn_backward(overload: Any) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        a = _bind(overload, args, kwargs)
        return tuple(torch.empty_like(a[name]) for name in ("query", "key", "value"))
    return kernel


#: Operator -> the maker of its CUDA-shaped meta kernel.
KERNELS = {
    "_scaled_dot_product_flash_attention.default": _flash,
    "_scaled_dot_product_efficient_attention.default": _efficient,
    "_scaled_dot_product_cudnn_attention.default": _cudnn,
    "_scaled_dot_product_cudnn_attention_backward.default": _cudnn_backward,
}


def _overload(name: str) -> Any:
    op_name, _, overload = name.partition(".")
    packet = getattr(torch.ops.aten, op_name, None)
    return getattr(packet, overload, None) if packet is not None else None


def missing() -> list[str]:
    """The operators of ``KERNELS`` this torch has without a ``Meta`` kernel."""
    out = []
    for name in KERNELS:
        overload = _overload(name)
        if overload is not None and not torch._C._dispatch_has_kernel_for_dispatch_key(overload.name(), "Meta"):
            out.append(name)
    return out


def install() -> list[str]:
    """Register the missing meta kernels (once per process); the operators registered."""
    global _library
    added = missing()
    for name in added:
        if _library is None:
            _library = torch.library.Library("aten", "IMPL")
        # the default overload is registered by the bare name
        _library.impl(name.removesuffix(".default"), KERNELS[name](_overload(name)), "Meta")
    return added
