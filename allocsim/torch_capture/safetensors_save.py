"""Save a capture's tensors with ``safetensors.torch.save_file`` as a GPU run would: ``patches(tracker)``.

safetensors copies each tensor to the host and hands its Rust writer the copy's ``data_ptr()``. In a
capture a host copy of a device tensor of 1 MiB or more is abstract (``devicemap``: no bytes behind
it), so the writer read an unmapped address (``SafetensorError: ... Bad address``) and the script
stopped at its first checkpoint (accelerate's ``save_state``, Hugging Face ``save_pretrained``).

Here a dictionary holding any capture tensor is written in safetensors' own format (an 8-byte
little-endian header length, the JSON header with each tensor's dtype, shape and data offsets,
padded with spaces to 8 bytes, then the data), so ``safetensors.torch.load_file`` reads it back:
small tensors with the values the capture knows (their host copy is real), abstract ones as zeros
left as a hole in the file (no memory, no disk blocks). The file goes where every write of the
script goes (``writeguard``: the scratch folder). A dictionary of ordinary CPU tensors, and a dtype
safetensors' table here does not name, take safetensors' own ``save_file``.
"""

from __future__ import annotations

import json
import struct
from typing import Any, Callable

import torch

from .tracker import StorageTracker, on_meta

#: safetensors' dtype names (``Dtype`` in safetensors' Rust crate, ``_TYPES`` in safetensors/torch.py).
_CODES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
          torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
          torch.bool: "BOOL", torch.complex64: "C64"}
_CODES.update({getattr(torch, name): code for name, code in (
    ("float8_e4m3fn", "F8_E4M3"), ("float8_e5m2", "F8_E5M2"), ("uint16", "U16"), ("uint32", "U32"),
    ("uint64", "U64")) if hasattr(torch, name)})


def _writable(tensors: Any) -> bool:
    """Whether ``tensors`` is a dictionary this writer takes: tensors only, one at least a capture's."""
    if not isinstance(tensors, dict) or not tensors:
        return False
    if not all(isinstance(k, str) and isinstance(v, torch.Tensor) and v.dtype in _CODES for k, v in tensors.items()):
        return False
    return any(on_meta(v) for v in tensors.values())


def _write(tensors: dict[str, torch.Tensor], filename: Any, metadata: dict[str, str] | None,
           tracker: StorageTracker) -> None:
    header: dict[str, Any] = {}
    if metadata is not None:
        if not (isinstance(metadata, dict) and all(isinstance(k, str) and isinstance(v, str)
                                                    for k, v in metadata.items())):
            raise TypeError("safetensors metadata must be a dict of str to str")
        header["__metadata__"] = metadata
    offset = 0
    order = sorted(tensors)           # the order of the data; offsets in the header say where each is
    for name in order:
        t = tensors[name]
        if not t.is_contiguous():
            raise ValueError(f"You are trying to save a non contiguous tensor: `{name}` which is not allowed.")
        size_bytes = t.numel() * t.element_size()
        header[name] = {"dtype": _CODES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + size_bytes]}
        offset += size_bytes
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(filename, "wb") as fh:        # the script's own path, redirected by the write guard
        fh.write(struct.pack("<Q", len(text)))
        fh.write(text)
        start = fh.tell()
        for name in order:
            t = tensors[name]
            host = t.cpu() if tracker.is_device(t) else t      # a GPU run copies to the host first
            if on_meta(host) or host.numel() == 0:
                fh.seek(host.numel() * host.element_size(), 1)  # abstract: zeros, a hole in the file
            else:
                fh.write(host.reshape(-1).view(torch.uint8).numpy().tobytes())
        fh.truncate(start + offset)


def patches(tracker: StorageTracker) -> list[tuple[Any, str, Any]]:
    """``(safetensors.torch, "save_file", replacement)`` for ``Patches.when_imported("safetensors.torch", ...)``."""
    import safetensors.torch as st  # noqa: PLC0415  (imported by the script, or by the write guard)

    original: Callable[..., Any] = st.save_file

    def save_file(tensors: Any, filename: Any, metadata: Any = None) -> None:
        if not _writable(tensors):
            return original(tensors, filename, metadata=metadata)
        _write(tensors, filename, metadata, tracker)
        return None

    save_file.__doc__ = original.__doc__
    save_file.__wrapped__ = original          # type: ignore[attr-defined]
    return [(st, "save_file", save_file)]
