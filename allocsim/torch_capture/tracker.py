"""Record the device storages ATen operators create and release; ``StorageTracker(builder)`` as a dispatch mode.

A dispatch mode sees each ATen operator below autograd, where the CUDA backend would run it: a new
storage in an output is a request to the caching allocator of exactly ``storage.nbytes()`` bytes
(the allocator rounds it, the simulator applies that rule). Views share their base's storage and are
not requests; zero-byte storages are never requested (the allocator returns a null pointer). PyTorch
keeps a storage's Python object alive as long as the storage itself, so a weak reference's callback
is the moment the CUDA run would hand the block back to the allocator. A storage that an ``out=``
or ``resize_`` operator grows is a free of the old block followed by a request for the new size, as
the CUDA resize does. Each request carries the Python stack of the script (innermost first) below a
frame naming the operator; operators the autograd engine runs have only that frame.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ..trace.reading.builder import TraceBuilder
from ..trace.reading.frames import FrameTable
from . import cudnn

#: The device the script's ``cuda`` tensors live on during a capture.
CAPTURE_DEVICE = "meta"
#: Python frames kept per stack (innermost first): enough to reach the training loop.
MAX_FRAMES = 24
#: Frames from these folders are PyTorch's or allocsim's own, not the script's.
_SKIP_DIRS = tuple(os.path.dirname(m.__file__) + os.sep for m in (torch,)) + (
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,)
_CONV = torch.ops.aten.convolution.default
_CONV_BACKWARD = torch.ops.aten.convolution_backward.default
#: Synthetic addresses are spaced by the allocator's smallest block so no two live blocks overlap.
_ADDR_STEP = 512


def _on_capture_device(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == CAPTURE_DEVICE


class StorageTracker(TorchDispatchMode):
    """Turn the script's device storages into alloc/free events of ``builder`` (device 0, stream 0)."""

    def __init__(self, builder: TraceBuilder, frames: FrameTable):
        super().__init__()
        self.builder = builder
        self.frames = frames
        self._lock = threading.RLock()
        self._t0 = time.perf_counter_ns()
        self._last_t_ns = 0
        self._record = 0
        self._next_addr = _ADDR_STEP
        # id(storage) -> (weakref, addr, size_bytes); the weakref's callback is the free
        self._live: dict[int, tuple[weakref.ref, int, int]] = {}
        self.active = True
        self.live_bytes = 0
        self.peak_bytes = 0
        self.n_allocs = 0
        self.n_frees = 0
        self.workspace_ratio = cudnn.workspace_ratio()
        #: Bytes a convolution workspace may take beside the live tensors: a larger one does not fit
        #: and PyTorch falls back to an engine that needs none. The capture does not know the target
        #: GPU, so this is the largest memory of a common training card (80 GiB).
        self.workspace_limit_bytes = 80 << 30
        self.n_workspaces = 0

    # ----------------------------------------------------------------- clock and records
    def now_ns(self) -> int:
        # Callbacks come from the autograd engine's threads too: time never goes back in the trace.
        t_ns = max(time.perf_counter_ns() - self._t0, self._last_t_ns)
        self._last_t_ns = t_ns
        return t_ns

    def next_record(self) -> int:
        self._record += 1
        return self._record

    def _stack_id(self, op_name: str) -> int:
        frames: list[dict[str, Any]] = [{"filename": "aten", "line": 0, "name": op_name}]
        frame = sys._getframe(2)
        while frame is not None and len(frames) <= MAX_FRAMES:
            filename = frame.f_code.co_filename
            if not filename.startswith(_SKIP_DIRS):
                frames.append({"filename": filename, "line": frame.f_lineno, "name": frame.f_code.co_name})
            frame = frame.f_back
        return self.frames.stack_id(frames, f"op {op_name}")

    def _alloc(self, storage: Any, size_bytes: int, op_name: str) -> None:
        addr = self._next_addr
        self._next_addr += (size_bytes + _ADDR_STEP - 1) // _ADDR_STEP * _ADDR_STEP
        key = id(storage)
        ref = weakref.ref(storage, lambda _ref, key=key: self._released(key))
        self._live[key] = (ref, addr, size_bytes)
        self.builder.alloc(self.next_record(), self.now_ns(), 0, 0, addr, size_bytes,
                           stack_id=self._stack_id(op_name))
        self.n_allocs += 1
        self.live_bytes += size_bytes
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)

    def _free(self, key: int) -> None:
        entry = self._live.pop(key, None)
        if entry is None:
            return
        _ref, addr, size_bytes = entry
        self.builder.free(self.next_record(), self.now_ns(), 0, 0, addr)
        self.n_frees += 1
        self.live_bytes -= size_bytes

    def _released(self, key: int) -> None:
        with self._lock:
            if self.active:
                self._free(key)

    def _workspace(self, phase: str, x: torch.Tensor, w: torch.Tensor, y: torch.Tensor, groups: int) -> None:
        """A cuDNN workspace of this convolution phase: requested and handed back around the kernel."""
        dtype_bytes = x.element_size()
        size_bytes = cudnn.workspace_bytes(phase, x.shape, w.shape, y.shape, groups, dtype_bytes,
                                           self.workspace_ratio)
        if size_bytes <= 0 or size_bytes > self.workspace_limit_bytes - self.live_bytes:
            return
        addr = self._next_addr
        self._next_addr += (size_bytes + _ADDR_STEP - 1) // _ADDR_STEP * _ADDR_STEP
        frames = [{"filename": "cudnn", "line": 0,
                   "name": cudnn.label(phase, x.shape, w.shape, y.shape, groups, dtype_bytes)}]
        stack_id = self.frames.stack_id(frames, frames[0]["name"])
        self.builder.alloc(self.next_record(), self.now_ns(), 0, 0, addr, size_bytes, stack_id=stack_id)
        self.peak_bytes = max(self.peak_bytes, self.live_bytes + size_bytes)
        self.builder.free(self.next_record(), self.now_ns(), 0, 0, addr)
        self.n_allocs += 1
        self.n_frees += 1
        self.n_workspaces += 1

    # ----------------------------------------------------------------- the dispatch mode
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        with self._lock:
            if self.active:
                # Positional arguments only (how autograd calls them); anything else is recorded plainly.
                if func is _CONV and len(args) == 9 and not kwargs and _on_capture_device(args[0]):
                    self._record_convolution(args, out)
                elif func is _CONV_BACKWARD and len(args) == 11 and not kwargs and _on_capture_device(args[0]):
                    self._record_convolution_backward(args, out)
                else:
                    self._record_outputs(func, out)
        return out

    def _record_convolution(self, args: tuple, out: torch.Tensor) -> None:
        # aten.convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
        # the output is allocated, then the kernel runs with its workspace.
        self._record_outputs(_CONV, out)
        x, w, groups = args[0], args[1], int(args[8])
        if args[6]:                      # transposed: cuDNN runs it as the backward-data of a convolution
            self._workspace("backward data", out, w, x, groups)
        else:
            self._workspace("forward", x, w, out, groups)

    def _record_convolution_backward(self, args: tuple, out: tuple) -> None:
        # aten.convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
        # transposed, output_padding, groups, output_mask) -> (grad_input, grad_weight, grad_bias);
        # cuDNN's backward computes grad_input (with its workspace), then grad_weight (with its own).
        grad_output, x, w, transposed, groups = args[0], args[1], args[2], bool(args[7]), int(args[9])
        grad_input, grad_weight, grad_bias = out
        if grad_input is not None:
            self._record_outputs(_CONV_BACKWARD, grad_input)
            if transposed:               # the data gradient of a transposed convolution is a forward one
                self._workspace("forward", grad_output, w, x, groups)
            else:
                self._workspace("backward data", x, w, grad_output, groups)
        if grad_weight is not None:
            self._record_outputs(_CONV_BACKWARD, grad_weight)
            if transposed:
                self._workspace("backward filter", grad_output, w, x, groups)
            else:
                self._workspace("backward filter", x, w, grad_output, groups)
        self._record_outputs(_CONV_BACKWARD, grad_bias)

    def _record_outputs(self, func: Any, out: Any) -> None:
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or t.device.type != CAPTURE_DEVICE:
                continue
            storage = t.untyped_storage()
            size_bytes = int(storage.nbytes())
            entry = self._live.get(id(storage))
            if entry is not None and entry[0]() is storage:
                if entry[2] == size_bytes:
                    continue
                self._free(id(storage))        # grown by resize_ or out=: the old block goes back
            if size_bytes > 0:
                self._alloc(storage, size_bytes, func.name())

    def marker(self, label: str) -> None:
        """Record ``label`` (a step boundary) at the current time."""
        with self._lock:
            if self.active:
                self.builder.marker(self.next_record(), self.now_ns(), label)

    def empty_cache(self) -> None:
        """Record the script's ``torch.cuda.empty_cache()``."""
        with self._lock:
            if self.active:
                self.builder.empty_cache(self.next_record(), self.now_ns(), 0)

    def stop(self) -> None:
        """Stop recording; storages still alive stay live in the trace (the script ended with them)."""
        with self._lock:
            self.active = False
