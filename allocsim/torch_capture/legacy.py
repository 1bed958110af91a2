"""The legacy tensor types (``torch.cuda.FloatTensor``, ``x.type('torch.cuda.HalfTensor')``) inside a capture: ``shims(tracker)``.

Older scripts name devices through tensor types. A CPU build has the ``torch.cuda.*Tensor`` type
objects but refuses to make or cast to them ("type torch.cuda.FloatTensor not available", "Cannot
initialize CUDA without ATen_cuda library"). Inside a capture:

* ``torch.cuda.FloatTensor(3, 4)`` / ``torch.cuda.LongTensor([1, 2])`` / ``torch.cuda.FloatTensor()``
  make a device tensor of that dtype (sizes: uninitialised; data: copied to the device, as the
  legacy constructor does on a GPU); ``isinstance(x, torch.cuda.FloatTensor)`` is true for device
  float32 tensors;
* ``x.type(torch.cuda.FloatTensor)``, ``x.type('torch.cuda.HalfTensor')``: the device copy in that
  dtype (the same tensor when it already is one, as ``Tensor.type`` promises); ``x.type('torch.FloatTensor')``
  brings a device tensor back to the host; ``x.type()`` of a device tensor is ``'torch.cuda.FloatTensor'``;
* ``torch.set_default_tensor_type(torch.cuda.FloatTensor)`` sets the default dtype and makes
  ``cuda`` the default device.

The mapping of names to dtypes is torch's own: each ``torch.cuda`` type object carries its ``dtype``.
"""

from __future__ import annotations

from typing import Any

import torch

from .signatures import conform

#: The legacy type names torch defines for CUDA (``torch.cuda.FloatTensor`` ...), each with its dtype.
LEGACY_NAMES = ("FloatTensor", "DoubleTensor", "HalfTensor", "BFloat16Tensor", "ByteTensor", "CharTensor",
                "ShortTensor", "IntTensor", "LongTensor", "BoolTensor")


def _dtype_of(name: str) -> torch.dtype | None:
    owner = getattr(torch.cuda, name, None)
    return getattr(owner, "dtype", None)


def parse_type(value: Any) -> tuple[torch.dtype, bool] | None:
    """``(dtype, on_device)`` for a legacy type given as a string or a type object, None for anything else."""
    if isinstance(value, str):
        prefix, _, name = value.rpartition(".")
        if prefix not in ("torch", "torch.cuda"):
            return None
        dtype = getattr(getattr(torch, name, None), "dtype", None) or _dtype_of(name)
        return (dtype, prefix == "torch.cuda") if isinstance(dtype, torch.dtype) else None
    dtype = getattr(value, "dtype", None)
    if isinstance(dtype, torch.dtype) and isinstance(getattr(value, "is_cuda", None), bool):
        return dtype, bool(value.is_cuda)
    return None


def type_name(t: torch.Tensor, on_device: bool) -> str:
    """What ``x.type()`` says: ``'torch.cuda.FloatTensor'`` for a device float32 tensor, ``'torch.FloatTensor'`` on the host."""
    host_name = torch.empty(0, dtype=t.dtype, device="cpu").type()
    return "torch.cuda." + host_name.split(".")[-1] if on_device else host_name


class _LegacyMeta(type):
    def __instancecheck__(cls, obj: Any) -> bool:
        return (isinstance(obj, torch.Tensor) and obj.dtype == cls.dtype
                and cls._is_device(obj))


def _legacy_class(name: str, dtype: torch.dtype, is_device: Any) -> type:
    def new(cls: type, *args: Any, **kwargs: Any) -> torch.Tensor:
        device = kwargs.pop("device", None)
        if device is not None and str(device).split(":")[0] not in ("cuda",):
            raise RuntimeError(f"legacy constructor expects device type: cuda but device type: {device} was passed")
        if not args or all(isinstance(a, int) and not isinstance(a, bool) for a in args):
            return torch.empty(args if args else (0,), dtype=dtype, device="cuda")
        if len(args) == 1 and isinstance(args[0], torch.Size):
            return torch.empty(args[0], dtype=dtype, device="cuda")
        if len(args) == 1:
            # data: made on the host, then copied to the device (one device request of its size)
            return torch.tensor(args[0], dtype=dtype).to("cuda")
        raise TypeError(f"torch.cuda.{name}: sizes or one sequence of data expected, got {args!r}")

    return _LegacyMeta(name, (), {"__new__": new, "dtype": dtype, "is_cuda": True, "__module__": "torch.cuda",
                                  "_is_device": staticmethod(is_device)})


def _set_default_tensor_type(original: Any) -> Any:
    def set_default_tensor_type(t: Any) -> None:
        parsed = parse_type(t)
        if parsed is None or not parsed[1]:
            original(t)
            return
        torch.set_default_dtype(parsed[0])
        torch.set_default_device("cuda")
    return conform(original, set_default_tensor_type)


def shims(is_device: Any) -> dict[tuple[Any, str], Any]:
    """``{(owner, attribute): replacement}``: the ``torch.cuda.*Tensor`` classes and ``torch.set_default_tensor_type``."""
    table: dict[tuple[Any, str], Any] = {}
    for name in LEGACY_NAMES:
        dtype = _dtype_of(name)
        if dtype is not None:
            table[(torch.cuda, name)] = _legacy_class(name, dtype, is_device)
    table[(torch, "set_default_tensor_type")] = _set_default_tensor_type(torch.set_default_tensor_type)
    return table
