"""Optimizers take their CUDA code paths inside a capture (``foreach``, ``fused``, ``capturable``): ``shims()`` and ``install()``.

``torch.optim`` picks a step implementation from the parameters' device type: the multi-tensor
``foreach`` kernels by default on CUDA, the ``fused`` kernels when asked (``AdamW(fused=True)``:
nanoGPT, Hugging Face ``Trainer``'s default ``adamw_torch_fused``), ``capturable`` steps that keep
``step`` on the device. A capture's device tensors are on ``meta``, which none of those lists
names, so the device lists (``torch/optim/optimizer.py``: ``_get_foreach_kernels_supported_devices``,
``_get_fused_kernels_supported_devices``, ``_get_capturable_supported_devices``, the latter
imported by name into each optimizer's module) count ``meta`` as the GPU it stands for.

What the CUDA kernels allocate: nothing beyond what the Python step makes. The fused kernels
(``FusedAdamKernel.cu``, ``FusedAdamWKernel.cu``, ``FusedSgdKernel.cu``, ``FusedAdagradKernel.cu``)
launch ``multi_tensor_apply_for_fused_optimizer`` / ``multi_tensor_apply`` (``ATen/native/cuda/
MultiTensorApply.cuh``, the installed 2.13 header), which pass the tensor lists' addresses as kernel
arguments (4 KiB, or 32 KiB on CUDA >= 12.1) and take no memory from the caching allocator; a tensor
``lr`` on the CPU is read as a number. The step's tensors are the Python step's own, made on the
device and so recorded: fused and capturable ``step`` counters (one 0-dim float32 device tensor per
parameter, ``_get_scalar_dtype(is_fused=True)``), SGD's momentum buffers (``torch.empty_like(grad)``
on the first step), GradScaler's ``found_inf`` sum.

Several fused in-place ops have no meta kernel in torch 2.13 (``_fused_sgd_``, ``_fused_adagrad_``,
the tensor-``lr`` overloads of ``_fused_adam_`` / ``_fused_adamw_``): ``install()`` registers ones
that do what the CUDA kernel does to memory, which is nothing (they update their inputs in place).

Fail fast: an optimizer built with ``fused=True`` or ``capturable=True`` is checked when it is
constructed, with the checks torch makes at its first ``step()`` (floating-point parameters on a
supported device; a fused kernel this torch can run on the capture's tensors), so a script that
would fail there fails before the capture has spent minutes on a forward and backward.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

import torch

from .signatures import conform
from .tracker import CAPTURE_DEVICE

#: Fused in-place optimizer ops whose CUDA kernels update their inputs and allocate nothing.
FUSED_OPS = ("_fused_adam_", "_fused_adamw_", "_fused_sgd_", "_fused_adagrad_")
#: The fused op each optimizer's ``fused=True`` step runs (torch/optim/*.py: ``_fused_*``).
FUSED_OP_OF = {"Adam": ("_fused_adam_", "_fused_adamw_"), "AdamW": ("_fused_adam_", "_fused_adamw_"),
               "SGD": ("_fused_sgd_",), "Adagrad": ("_fused_adagrad_",)}

_library: Any = None


def _overloads(name: str) -> list[Any]:
    packet = getattr(torch.ops.aten, name, None)
    return [getattr(packet, o) for o in packet.overloads()] if packet is not None else []


def _has_meta_kernel(overload: Any) -> bool:
    return bool(torch._C._dispatch_has_kernel_for_dispatch_key(overload.name(), "Meta"))


def _no_op(*_args: Any, **_kwargs: Any) -> None:
    return None


def install() -> list[str]:
    """Register meta kernels for the fused optimizer ops that lack one (once per process); the names registered."""
    global _library
    added: list[str] = []
    for name in FUSED_OPS:
        for overload in _overloads(name):
            if overload._schema.returns or _has_meta_kernel(overload):
                continue          # functional variants return tensors; torch's own meta kernels stay
            if _library is None:
                _library = torch.library.Library("aten", "IMPL")
            _library.impl(overload.name().split("::", 1)[1], _no_op, "Meta")
            added.append(overload.name())
    return added


def _with_meta(original: Any) -> Any:
    def supported(*args: Any, **kwargs: Any) -> list[str]:
        return list(original(*args, **kwargs)) + [CAPTURE_DEVICE]
    return conform(original, supported)


def _optimizer_modules() -> list[Any]:
    modules = []
    for info in pkgutil.iter_modules(torch.optim.__path__):
        try:
            modules.append(importlib.import_module(f"torch.optim.{info.name}"))
        except ImportError:       # an optional optimizer module this torch cannot import
            continue
    return modules


def _fused_kernel_missing(optimizer: Any) -> str | None:
    """The fused op this optimizer's step would run that has no kernel on the capture's tensors, if any."""
    for cls in type(optimizer).__mro__:
        for name in FUSED_OP_OF.get(cls.__name__, ()):
            for overload in _overloads(name):
                if not overload._schema.returns and not _has_meta_kernel(overload):
                    return overload.name()
    return None


def check_at_construction(optimizer: Any, is_device: Any) -> None:
    """Raise now what torch would raise at this optimizer's first ``step()`` on the GPU (fused, capturable)."""
    for group in optimizer.param_groups:
        fused, capturable = group.get("fused"), group.get("capturable")
        if not fused and not capturable:
            continue
        for p in group["params"]:
            if not isinstance(p, torch.Tensor):
                continue
            device = "cuda" if is_device(p) else "cpu"
            if fused and not torch.is_floating_point(p):
                raise RuntimeError("`fused=True` requires all the params to be floating point Tensors of "
                                   f"supported devices but {p.dtype} and {device} (allocsim capture: raised when "
                                   "the optimizer was built; a GPU raises it at the first step)")
            if capturable and device != "cuda":
                raise AssertionError("If capturable=True, params and state_steps must be on supported devices "
                                     "(allocsim capture: a parameter is on the cpu; raised when the optimizer was "
                                     "built, a GPU raises it at the first step)")
        if fused:
            missing = _fused_kernel_missing(optimizer)
            if missing is not None:
                raise NotImplementedError(
                    f"allocsim capture: {type(optimizer).__name__}(fused=True) runs {missing}, which torch "
                    f"{torch.__version__} cannot run on the capture's meta tensors; use fused=False (the "
                    "foreach step allocates more: see docs/capture.md) or another torch")


def _checked_init(original: Any, is_device: Any) -> Any:
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        check_at_construction(self, is_device)
    return conform(original, init)


def shims(is_device: Any) -> dict[tuple[Any, str], Any]:
    """``{(owner, attribute): replacement}``: the device lists with ``meta``, the graph-capture checks, the construction check."""
    import torch.optim.optimizer as optimizer_mod  # noqa: PLC0415

    table: dict[tuple[Any, str], Any] = {}
    for name in ("_get_foreach_kernels_supported_devices", "_get_fused_kernels_supported_devices",
                 "_get_capturable_supported_devices"):
        original = getattr(optimizer_mod, name, None)
        if original is None:
            continue
        patched = _with_meta(original)
        table[(optimizer_mod, name)] = patched
        for module in _optimizer_modules():
            if getattr(module, name, None) is original:
                table[(module, name)] = patched
    import torch.utils._foreach_utils as foreach_utils  # noqa: PLC0415

    # clip_grad_norm_(foreach=True) and the other torch.nn.utils helpers ask torch.utils._foreach_utils
    original = getattr(foreach_utils, "_get_foreach_kernels_supported_devices", None)
    if original is not None:
        table[(foreach_utils, "_get_foreach_kernels_supported_devices")] = _with_meta(original)
    for name in ("_accelerator_graph_capture_health_check", "_cuda_graph_capture_health_check"):
        if hasattr(torch.optim.Optimizer, name):   # asks the driver whether a graph is being captured
            table[(torch.optim.Optimizer, name)] = lambda self: None
    table[(torch.optim.Optimizer, "__init__")] = _checked_init(torch.optim.Optimizer.__init__, is_device)
    return table
