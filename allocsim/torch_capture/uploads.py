"""Small host tensors copied to the device keep their values for a copy back: ``Uploads().dispatch(func, args, kwargs)``.

A capture computes nothing on the device, so reading a device tensor back gives zeros. Library code
in C++ sometimes round-trips host values through the device: DDP's reducer, when it rebuilds its
gradient buckets after the first iteration, copies the bucket indices to the device, broadcasts
them from rank 0 and copies them back (``Reducer::sync_bucket_indices`` in
torch/csrc/distributed/c10d/reducer.cpp); with zeros it would rebuild no buckets at all. Here a
device tensor written by a copy from a host tensor of at most ``MAX_BYTES`` keeps those values
(rank 0's, which is what the broadcast gives every rank) until an operator writes to it again;
a copy back to the host returns them, any other read-back zeros as before. Large uploads are
never kept: the capture's memory stays bounded whatever the script does.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import torch

#: Uploads up to this many bytes keep their values (index and size vectors, flags).
MAX_BYTES = 1 << 16
#: At most this many kept at once (the oldest is dropped first).
MAX_KEPT = 1024
_COPY = torch.ops.aten.copy_.default
_TO_COPY = torch.ops.aten._to_copy.default


def _meta(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == "meta"


def _host(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == "cpu"


class Uploads:
    """The kept values, by device storage (weakly: a freed storage drops its values)."""

    def __init__(self) -> None:
        self._values: dict[int, tuple[weakref.ref, torch.Tensor]] = {}
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        return bool(self._values)

    def _keep(self, device: torch.Tensor, host: torch.Tensor) -> None:
        storage = device.untyped_storage()
        key = id(storage)
        with self._lock:
            self._values.pop(key, None)
            if (host.numel() * host.element_size() > MAX_BYTES or not device.is_contiguous()
                    or device.numel() != host.numel() or device.storage_offset() != 0):
                return
            if len(self._values) >= MAX_KEPT:
                self._values.pop(next(iter(self._values)))
            ref = weakref.ref(storage, lambda _ref, key=key: self._values.pop(key, None))
            self._values[key] = (ref, host.detach().reshape(-1).to(device.dtype).clone())

    def _kept(self, device: torch.Tensor) -> torch.Tensor | None:
        entry = self._values.get(id(device.untyped_storage()))
        if entry is None or entry[0]() is not device.untyped_storage() or entry[1].numel() != device.numel():
            return None
        return entry[1]

    def dispatch(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """The answer to a copy between host and device (NotImplemented: run the operator as usual)."""
        if func is _COPY and len(args) >= 2:
            dst, src = args[0], args[1]
            if _host(dst) and _meta(src):
                kept = self._kept(src)
                with torch.no_grad():
                    if kept is not None and kept.numel() == dst.numel():
                        dst.copy_(kept.reshape(dst.shape).to(dst.dtype))
                    else:
                        dst.zero_()
                return dst
        elif func is _TO_COPY and args and _meta(args[0]) and str(kwargs.get("device", "")) == "cpu":
            src = args[0]
            dtype = kwargs.get("dtype") or src.dtype
            if src.numel() * dtype.itemsize > MAX_BYTES:
                return NotImplemented
            kept = self._kept(src)
            out = torch.zeros(src.shape, dtype=dtype)
            if kept is not None:
                out.copy_(kept.reshape(src.shape).to(dtype))
            return out
        return NotImplemented

    def after(self, func: Any, args: tuple, out: Any) -> None:
        """``func`` ran: keep the values of a host-to-device copy; drop those of a storage it wrote."""
        if func is _COPY and len(args) >= 2 and _meta(args[0]) and _host(args[1]):
            self._keep(args[0], args[1])
            return
        if not self._values:
            return
        for t in out if isinstance(out, (list, tuple)) else (out,):
            if _meta(t):
                with self._lock:
                    self._values.pop(id(t.untyped_storage()), None)
