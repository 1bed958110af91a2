"""``torch.accelerator``, ``torch.cuda.device`` and the default device answered as one CUDA GPU would: ``shims(cuda_table)``.

A CPU build of PyTorch has no accelerator: ``torch.accelerator.current_accelerator()`` is ``None``
and anything that asks the C++ side for "the current accelerator" (``torch.device(0)``,
``torch.accelerator.current_stream()``, ``with torch.cuda.device(0):``) raises. Scripts written
for a GPU ask exactly these (``pytorch/examples``, Hugging Face ``accelerate`` and ``Trainer``,
``DataParallel``), so inside a capture:

* ``torch.accelerator``: ``current_accelerator()`` is ``device(type='cuda')``,
  ``is_available()``, ``device_count()`` and ``current_device_index``/``current_device_idx`` (``local_device``),
  ``set_device_index``/``set_device_idx``, ``device_index(i)`` (a context that selects nothing:
  there is one GPU), ``current_stream``/``set_stream`` (the capture's streams, ``cuda_api``),
  ``synchronize``, ``get_device_capability``, and the memory functions of
  ``torch.accelerator.memory`` (the same allocator model as ``torch.cuda.memory_*``);
* ``torch.cuda.device(i)`` / ``torch.cuda.device_of(t)``: contexts that select nothing;
* ``torch.get_device_module()`` (no device, or the capture's ``meta``) is ``torch.cuda``;
* ``torch.Stream`` / ``torch.Event`` are the capture's CUDA stream and event.

Integer devices (``module.to(0)``, ``device=0``, ``torch.device(0)``) and the default device
(``torch.set_default_device("cuda")``) are mapped where the script's calls pass through the
capture's function mode (``devicemap``).
"""

from __future__ import annotations

from typing import Any

import torch

from . import local_device
from .signatures import conform, noop, signature_of
from .tracker import CAPTURE_DEVICE


class DeviceIndex:
    """``torch.accelerator.device_index(i)``: selects GPU ``i`` of one, so nothing changes (torch's signature: ``(device, /)``)."""

    def __init__(self, device: Any, /) -> None:
        self.idx = device if isinstance(device, int) else 0
        self.prev_idx = -1

    def __enter__(self) -> None:
        self.prev_idx = 0

    def __exit__(self, *exc_info: object) -> bool:
        return False


class CudaDevice(DeviceIndex):
    """``torch.cuda.device(i)`` (``device=`` may be named, as torch's ``(device)`` allows)."""

    def __init__(self, device: Any) -> None:
        super().__init__(device)


class DeviceOf(DeviceIndex):
    """``torch.cuda.device_of(tensor)``: the tensor's GPU is the only one."""

    def __init__(self, obj: Any) -> None:
        super().__init__(0)


def _supported_dtypes() -> set[torch.dtype]:
    """Every dtype a CUDA tensor can hold (what ``get_device_capability`` reports on a GPU)."""
    return {value for value in vars(torch).values() if isinstance(value, torch.dtype)}


def _device_module(original: Any) -> Any:
    def get_device_module(device: Any = None) -> Any:
        if device is None:
            return torch.cuda
        kind = device.type if isinstance(device, torch.device) else str(device).split(":")[0]
        return torch.cuda if kind in ("cuda", CAPTURE_DEVICE) else original(device)
    return get_device_module


def shims(cuda_table: dict[tuple[Any, str], Any]) -> dict[tuple[Any, str], Any]:
    """``{(owner, attribute): replacement}`` for ``torch.accelerator`` and the device contexts, reusing ``cuda_table``'s answers.

    Every replacement function takes the installed torch's arguments (``signatures.conform``).
    """
    cuda = torch.cuda

    def from_cuda(name: str) -> Any:
        return cuda_table[(cuda, name)]

    def current_stream(device: Any = None, /) -> Any:
        return from_cuda("current_stream")()

    accelerator_answers: dict[str, Any] = {
        "current_accelerator": lambda check_available=False: torch.device("cuda"),
        "is_available": lambda: True,
        "device_count": local_device.count,
        "current_device_index": local_device.current,
        "current_device_idx": local_device.current,
        "set_device_index": local_device.select,
        "set_device_idx": local_device.select,
        "current_stream": current_stream,
        "set_stream": lambda stream: from_cuda("set_stream")(stream),
        "synchronize": noop,
        "get_device_capability": lambda device=None, /: {"supported_dtypes": _supported_dtypes()},
    }
    memory_answers: dict[str, Any] = {
        "empty_cache": lambda: from_cuda("empty_cache")(),
        "empty_host_cache": noop,
        "memory_stats": lambda device_index=None, /: from_cuda("memory_stats")(),
        "memory_allocated": lambda device_index=None, /: from_cuda("memory_allocated")(),
        "max_memory_allocated": lambda device_index=None, /: from_cuda("max_memory_allocated")(),
        "memory_reserved": lambda device_index=None, /: from_cuda("memory_reserved")(),
        "max_memory_reserved": lambda device_index=None, /: from_cuda("max_memory_reserved")(),
        "reset_accumulated_memory_stats": lambda device_index=None, /: from_cuda("reset_accumulated_memory_stats")(),
        "reset_peak_memory_stats": lambda device_index=None, /: from_cuda("reset_peak_memory_stats")(),
        "get_memory_info": lambda device_index=None, /: from_cuda("mem_get_info")(),
    }
    answers: dict[tuple[Any, str], Any] = {}
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None:
        memory = getattr(accelerator, "memory", None)
        for name, fn in accelerator_answers.items():
            answers[(accelerator, name)] = fn
        for name, fn in memory_answers.items():
            answers[(accelerator, name)] = fn
            if memory is not None:
                answers[(memory, name)] = fn
    # On CUDA builds these are torch._C's builtins (_cuda_exchangeDevice), which have no signature to
    # read: the stand-in keeps the Python fallback's (device: int) -> int that CPU builds define.
    exchange = {name: lambda device: 0 for name in ("_exchange_device", "_maybe_exchange_device")}
    if hasattr(torch, "get_device_module"):
        answers[(torch, "get_device_module")] = _device_module(torch.get_device_module)
    table: dict[tuple[Any, str], Any] = {
        (owner, name): conform(getattr(owner, name), fn)
        for (owner, name), fn in answers.items() if hasattr(owner, name)}
    for name, fn in exchange.items():
        if hasattr(cuda, name):
            original = getattr(cuda, name)
            table[(cuda, name)] = conform(original, fn) if signature_of(original) is not None else fn
    # classes: contexts the script enters, a stream and an event it makes
    if accelerator is not None and hasattr(accelerator, "device_index"):
        table[(accelerator, "device_index")] = DeviceIndex
    table[(cuda, "device")] = CudaDevice
    table[(cuda, "device_of")] = DeviceOf
    table[(torch, "Stream")] = from_cuda("Stream")
    table[(torch, "Event")] = from_cuda("Event")
    return table
