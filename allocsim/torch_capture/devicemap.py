"""Run a script written for ``cuda`` on the ``meta`` device along the CUDA code path: ``with cuda_on_meta(tracker, gpu):``.

Why ``meta`` and not the CPU: a meta tensor has the shape, dtype and storage size the CUDA tensor
would have and costs nothing to compute, so a full-size model trains in seconds on any machine, and
no CPU-only allocation (oneDNN reorders and scratch) can enter the trace. ``FakeTensorMode`` with
fake CUDA tensors was tried first: on a CUDA build without a driver the autograd engine asks the
driver for a primary context and fails, and a CPU-only build refuses ``cuda`` tensors altogether.

What the mapping does, each because the CUDA run does it:

* every ``device`` argument that names ``cuda`` (a string, a ``torch.device``, an integer index,
  ``Tensor.cuda()``, ``Module.cuda()``, ``Module.to(0)``, the default device set by
  ``torch.set_default_device("cuda")``) names ``meta`` instead; ``torch.device(0)`` is ``cuda:0``;
* large CPU tensors are never materialised: a factory without a device (``torch.empty/zeros/randn``,
  so every ``nn.Module`` built on the CPU) whose result would take ``HOST_ABSTRACT_BYTES`` or more
  makes an abstract *host* tensor on ``meta`` (no memory, no trace record), and ``.to("cuda")`` of
  it is a device copy; smaller ones are real CPU tensors, so indices, masks and samplers keep their
  values. The capture's own memory and time therefore do not grow with the model's size;
* ``.cpu()`` of a device tensor is a host tensor (abstract when large, zeros when small);
* reading a value back (``item()``, ``float()``, ``tolist()``, ``numpy()``, printing it with a
  format) gives the tensor's values when they are cheap (small tensors from the data, ``datadep``)
  and zeros otherwise: the model's numbers are not computed, only its memory;
* optimizers take their CUDA steps (``optimizers``), ``DataParallel`` runs on its one GPU
  (``dataparallel``), the legacy ``torch.cuda.*Tensor`` types work (``legacy``), ``torch.accelerator``
  is the GPU (``accelerator``);
* ``F.dropout`` in training is ``native_dropout``, CUDA's fused kernel with a one-byte mask;
* ``F.scaled_dot_product_attention`` runs the backend CUDA selects for the GPU and torch version
  (``sdpa``), with the mask conversion and padding of ``attention.cpp``;
* ``torch.cuda`` answers as the capture's GPU would (``cuda_api``); ``torch.autocast("cuda")``
  casts as CUDA's autocast does (``autocast``); pinned memory is ordinary host memory;
  ``Tensor.record_stream`` is recorded (the block goes back as ``stream_clock`` says);
  ``Tensor.is_cuda`` is True for device tensors;
* ``torch.compile`` returns the model or function unchanged: the capture runs eager;
* ``x.device`` of a device tensor is ``cuda:0`` and of a host one ``cpu`` (``x.is_cpu``, ``x.is_meta``,
  ``repr(x)`` follow), and the backward pass runs under the same mapping (``identity``);
* a tensor the script makes on ``meta`` itself -- under ``with torch.device("meta"):`` or
  ``torch.set_default_device("meta")``, or with ``device="meta"`` written as a string, as models
  built without memory are (torchtitan's) -- is the script's own meta tensor: it holds no memory on a
  GPU either, so it is never recorded (the tracker's *script meta* storages), nor is anything computed
  from it alone; ``module.to_empty(device="cuda")`` and any operator given ``device="cuda"`` make
  device tensors from it. A ``torch.device("meta")`` object passed as ``device=`` is taken for the
  capture's device (``device=x.device`` of a CUDA tensor names ``meta`` during a capture).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import Any, Iterator

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils import _device as torch_device_module
from torch.utils._pytree import tree_map

from . import (accelerator, cuda_api, cudnn_rnn, dataparallel, datadep, identity, legacy, local_device,
               meta_kernels, optimizers, safetensors_save, sdpa, triton_driver)
from .autocast import CudaAutocast
from .distributed.lazy import Patches
from .signatures import conform
from .tracker import CAPTURE_DEVICE, Recorder, StorageTracker, on_meta

_META = torch.device(CAPTURE_DEVICE)
#: A CPU factory result of at least this many bytes stays abstract (an abstract host tensor on meta).
HOST_ABSTRACT_BYTES = 1 << 20
#: Tensor methods whose answer is a host value: zeros stand in for the numbers never computed.
_READBACK = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__float__, torch.Tensor.__int__,
             torch.Tensor.__bool__, torch.Tensor.__index__, torch.Tensor.numpy, torch.Tensor.__array__}
_PARSE_TO = torch._C._nn._parse_to
#: Tensors of no subclass but a Parameter (a wrapper subclass reads back through its own dispatch).
_PLAIN = (torch.Tensor, torch.nn.Parameter)
_UINT64 = getattr(torch, "uint64", None)
#: Functions that make a tensor from a size, on ``device`` (or the CPU when none is given).
_FACTORIES = {getattr(torch, name) for name in (
    "empty", "zeros", "ones", "full", "rand", "randn", "randint", "randperm", "arange", "range", "linspace",
    "logspace", "eye", "empty_strided", "tril_indices", "triu_indices", "bartlett_window",
    "hann_window", "hamming_window", "blackman_window", "kaiser_window") if hasattr(torch, name)}


def _is_index(value: Any) -> bool:
    """A bare device index (``module.to(0)``, ``device=0``): the current accelerator's device ``value``."""
    return isinstance(value, int) and not isinstance(value, bool)


def _cuda_index(value: Any) -> Any:
    """An integer device as the GPU run reads it (``cuda:N``); anything else unchanged."""
    return torch.device("cuda", value) if _is_index(value) else value


def _default_is_cuda() -> bool:
    """Whether ``torch.set_default_device("cuda")`` or ``with torch.device("cuda"):`` is in force."""
    current = torch_device_module.CURRENT_DEVICE
    return current is not None and current.type == "cuda"


def _default_is_meta() -> bool:
    """Whether ``torch.set_default_device("meta")`` is in force below the capture's mode (the script's meta)."""
    current = torch_device_module.CURRENT_DEVICE
    return current is not None and current.type == CAPTURE_DEVICE


def _meta_context(tracker: StorageTracker) -> Any:
    """``DeviceContext.__torch_function__`` whose factories on ``meta`` are the script's meta tensors.

    ``with torch.device("meta"):`` entered inside the capture pushes torch's ``DeviceContext`` above
    the capture's mode: it hands each factory without a device ``device=torch.device("meta")`` before
    the capture sees it, where a device object on ``meta`` is a CUDA tensor's. Its factories run with
    the tracker's ``script_meta`` flag instead.
    """
    original = torch_device_module.DeviceContext.__torch_function__

    def __torch_function__(self: Any, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        if (self.device.type == CAPTURE_DEVICE and (kwargs or {}).get("device") is None
                and func in torch_device_module._device_constructors()):
            with tracker.script_meta():
                return original(self, func, types, args, kwargs)
        return original(self, func, types, args, kwargs)
    return __torch_function__


#: Code that names the capture's device by its string: a device mesh's ``device_type`` is ``"meta"``
#: inside a capture (``distributed.rank._mesh_on_meta``), so its ``device=mesh.device_type`` is CUDA's.
# torch's own code that writes "meta" for a tensor it did not make on the script's meta device: a mesh's
# device type, and the pickling paths (torch.save / torch.load / copy.deepcopy rebuild a capture's device
# tensors from storages whose location reads "meta" here, "cuda:N" on a GPU)
_LIBRARY_MODULES = ("torch.distributed", "torch.nn.parallel", "torch.serialization", "torch._utils", "torch.storage",
                    "torch._tensor", "torch.multiprocessing")


def _is_dtensor(t: Any) -> bool:
    """Whether ``t`` is a DTensor (without importing torch.distributed: only a script that made one has it)."""
    dtensor = sys.modules.get("torch.distributed.tensor._api")
    return dtensor is not None and isinstance(t, dtensor.DTensor)


def _names_script_meta(value: Any) -> bool:
    """``device="meta"`` written as a string by the script's own code: its own meta device.

    A device object may be a CUDA tensor's (``device=x.device``), and torch.distributed names a
    mesh's device by its type string, ``"meta"`` in a capture: both stand for the GPU.
    """
    if not (isinstance(value, str) and (value == CAPTURE_DEVICE or value.startswith(CAPTURE_DEVICE + ":"))):
        return False
    caller = sys._getframe(2)         # the code that called the torch function (past __torch_function__)
    return not str(caller.f_globals.get("__name__", "")).startswith(_LIBRARY_MODULES)


def _is_cuda(value: Any) -> bool:
    if isinstance(value, torch.device):
        return value.type == "cuda"
    return isinstance(value, str) and (value == "cuda" or value.startswith("cuda:"))


def _is_cpu(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, torch.device):
        return value.type == "cpu"
    return isinstance(value, str) and (value == "cpu" or value.startswith("cpu:"))


def _map(value: Any) -> Any:
    return _META if _is_cuda(value) else value


def _host_zeros(t: torch.Tensor) -> torch.Tensor:
    return torch.zeros(t.shape, dtype=t.dtype)


def _readback(func: Any, t: torch.Tensor, args: tuple, kwargs: dict, values: datadep.Values) -> Any:
    known = values.get(t)
    host = known if known is not None else _host_zeros(t)
    return _host_readback(func, host, *args[1:], **kwargs)


def _host_readback(func: Any, host: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    """A read-back of a real host tensor, whose ``uint64`` values above 2**63 - 1 torch 2.6 cannot pass through a mode.

    Below a Python dispatch mode (the capture's) ``aten._local_scalar_dense`` returns a Python number
    that torch converts back to a C++ scalar, and torch 2.6 converts a ``uint64`` as an ``int64``:
    ``RuntimeError: value cannot be converted to type int64_t without overflow``, which its GPU run,
    under no mode, does not raise (torchtitan's ``set_determinism`` reads torch's random 64-bit CPU
    seed as ``seed_tensor.view(torch.uint64).item()``: half the runs). A ``uint64`` tensor is read as
    its ``int64`` view and the numbers are taken modulo 2**64, so any dispatch mode still sees the read.
    """
    if host.dtype != _UINT64 or func in (torch.Tensor.numpy, torch.Tensor.__array__, torch.Tensor.__bool__):
        return func(host, *args, **kwargs)
    signed = host.view(torch.int64)
    if func is torch.Tensor.__float__:
        return float(signed.item() % 2**64)
    return _unsigned(func(signed, *args, **kwargs))


def _unsigned(value: Any) -> Any:
    if isinstance(value, list):
        return [_unsigned(v) for v in value]
    return value % 2**64 if isinstance(value, int) else value


def _nbytes(t: Any) -> int:
    return t.untyped_storage().nbytes() if isinstance(t, torch.Tensor) else 0


class CudaOnMeta(TorchFunctionMode):
    """The torch-function half of the mapping: device arguments, host tensors, CUDA kernels' choices, read-backs."""

    def __init__(self, tracker: StorageTracker, values: datadep.Values, addresses: identity.Addresses | None = None):
        super().__init__()
        self.tracker = tracker
        self.values = values
        self.capability = (int(tracker.gpu.get("major", 8)), int(tracker.gpu.get("minor", 0)))
        self.addresses = addresses if addresses is not None else identity.Addresses()
        self.sdpa_backends: set[str] = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        tracker = self.tracker
        if _is_index(kwargs.get("device")):
            kwargs["device"] = _cuda_index(kwargs["device"])
        self_t = args[0] if args and isinstance(args[0], torch.Tensor) else None
        # the script's own meta tensors are meta on a GPU too: torch answers for them as it would there
        self_on_meta = self_t is not None and on_meta(self_t) and not tracker.is_script_meta(self_t)
        if self_t is not None:
            prop = identity.property_of(func)
            if prop is not None:
                # x.device, x.is_cpu, x.is_meta: what the GPU run's Python sees (identity)
                return identity.answer(prop, tracker.is_host(self_t)) if self_on_meta else func(*args, **kwargs)
            if func is torch.Tensor.to:
                target = self._to_target(args, kwargs)
                if _is_cuda(target):
                    return self._to_device(self_t, _to_options(args, kwargs))
                if self_on_meta and target is not None and _is_cpu(target):
                    if _is_dtensor(self_t):
                        return self._dtensor_to_host(self_t, _to_options(args, kwargs))
                    return self_t if tracker.is_host(self_t) else self._to_host(self_t, _to_options(args, kwargs))
                if _names_script_meta(target):
                    with tracker.script_meta():           # x.to("meta"): the script's own meta tensor
                        return func(*args, **kwargs)
            elif func is torch.Tensor.cuda:
                return self._to_device(self_t, _cuda_options(args, kwargs))
            elif self_on_meta and func is torch.Tensor.cpu:
                if _is_dtensor(self_t):
                    return self._dtensor_to_host(self_t, {})
                return self_t if tracker.is_host(self_t) else self._to_host(self_t, {})
            elif self_on_meta and func in _READBACK:
                tracker.host_waits()
                return _readback(func, self_t, args, kwargs, self.values)
            elif func in _READBACK and type(self_t) in _PLAIN and self_t.device.type == "cpu":
                return _host_readback(func, *args, **kwargs)     # a real CPU tensor's (uint64: _host_readback)
            elif self_on_meta and func is torch.Tensor.__repr__:
                text = identity.tensor_repr(self_t, self.values.get(self_t), self, kwargs.get("tensor_contents"))
                if text is not None:
                    return text
            elif self_on_meta and func is torch.Tensor.__format__:
                return identity.tensor_format(self_t, args[1] if len(args) > 1 else kwargs.get("format_spec", ""),
                                              lambda: _readback(torch.Tensor.item, self_t, (self_t,), {}, self.values),
                                              self)
            elif func is torch.Tensor.backward:
                return identity.backward(self, args, kwargs)
            elif func is torch.Tensor.type:
                return self._legacy_type(self_t, args, kwargs)
            elif self_on_meta and func is torch.Tensor.get_device:
                return -1 if tracker.is_host(self_t) else local_device.current()
            elif self_on_meta and func is torch.Tensor.data_ptr:
                return self.addresses.data_ptr(self_t)
            elif identity.is_data_set(func) and identity.crosses(self_t, args[1]):
                return identity.set_data(self_t, args[1])
        if func is torch._has_compatible_shallow_copy_type and len(args) == 2 and identity.crosses(*args):
            return True      # a CPU tensor and a capture tensor, as CPU and CUDA (Module._apply keeps the Parameter)
        if func is torch.device:
            # torch.device(0) names the current accelerator's device 0; a device object stays "cuda"
            return func(*((_cuda_index(args[0]),) + tuple(args[1:]) if args else args), **kwargs)
        if func is _PARSE_TO:
            # Module.to(0): the integer is a device; Module.to moves through Tensor.to above
            return func(*((_cuda_index(args[0]),) + tuple(args[1:]) if args else args), **kwargs)
        device_arg = kwargs.get("device")
        if device_arg is None and func in torch_device_module._device_constructors():
            if _default_is_cuda():
                device_arg = kwargs["device"] = "cuda"      # torch.set_default_device("cuda")
            elif _default_is_meta():
                device_arg = kwargs["device"] = CAPTURE_DEVICE      # with torch.device("meta"): the script's meta
        if func in _FACTORIES and _is_cpu(device_arg):
            return self._host_factory(func, args, kwargs)
        if func is torch.tensor and args and isinstance(args[0], (list, tuple)) and _has_device_tensor(args[0]):
            # torch.tensor([x.norm(), ...]) reads every device scalar back (Tensor::item), as on a GPU
            args = (_host_copies(args[0], self._to_host),) + tuple(args[1:])
        if func is torch.tensor and _is_cuda(device_arg) and not kwargs.get("requires_grad"):
            # CUDA makes the tensor on the host and copies it: the copy keeps integer data's values
            # (``torch.tensor(len(lst), device="cuda")`` that DeepSpeed broadcasts and reads back)
            host = func(*args, **dict(kwargs, device="cpu", pin_memory=False))
            if _nbytes(host) < HOST_ABSTRACT_BYTES:
                return self._to_device(host, {})
        kind = None
        if device_arg is not None:
            # ``device=x.device`` of a CUDA tensor names ``meta`` here: a device object on ``meta`` is a CUDA one
            kwargs["device"] = _map(device_arg)
            if _is_cuda(device_arg):
                kind = tracker.to_device          # empty_like(meta_or_host, device="cuda"): a device tensor
            elif _names_script_meta(device_arg):
                kind = tracker.script_meta
        if func is F.dropout and args and _dropout_fused(args, kwargs):
            return _native_dropout(args, kwargs)
        if cudnn_rnn.is_rnn(func) and cudnn_rnn.acceptable(func, args, tracker.is_device):
            return cudnn_rnn.run(func, args, kwargs)     # nn.LSTM / GRU / RNN: cuDNN's fused RNN, as CUDA runs it
        if func is torch._cudnn_rnn_flatten_weight and args and args[0] and tracker.is_device(args[0][0]):
            return cudnn_rnn.flatten(args, kwargs)
        if func is F.scaled_dot_product_attention:
            chosen = sdpa.attention(args, kwargs, tracker.is_device, self.capability, tracker.torch_version)
            if chosen is not None:
                out, backend = chosen
                if backend not in self.sdpa_backends:
                    self.sdpa_backends.add(backend)
                    tracker.note(f"scaled_dot_product_attention ran the {backend} kernel, as CUDA picks it for "
                                 f"compute capability {self.capability[0]}.{self.capability[1]} with torch "
                                 f"{torch.__version__.split('+')[0]} (allocsim.torch_capture.sdpa)")
                return out
        args = tuple(_map(a) for a in args)
        if kind is not None:
            with kind():
                return func(*args, **kwargs)
        return func(*args, **kwargs)

    def _legacy_type(self, t: torch.Tensor, args: tuple, kwargs: dict) -> Any:
        """``Tensor.type()`` / ``Tensor.type(torch.cuda.HalfTensor)`` with the legacy names meaning what they do on a GPU."""
        wanted = args[1] if len(args) > 1 else kwargs.get("dtype")
        on_device = self.tracker.is_device(t)
        if wanted is None:
            return legacy.type_name(t, on_device)
        options = {"non_blocking": bool(args[2] if len(args) > 2 else kwargs.get("non_blocking", False))}
        if isinstance(wanted, torch.dtype):
            return t if wanted == t.dtype else t.to(wanted, **options)
        parsed = legacy.parse_type(wanted)
        if parsed is None:
            return torch.Tensor.type(*args, **kwargs)
        dtype, to_device = parsed
        if to_device:
            return self._to_device(t, dict(options, dtype=dtype))
        if on_device:
            return self._to_host(t, {"dtype": dtype})
        return t if dtype == t.dtype else t.to(dtype)

    def _to_target(self, args: tuple, kwargs: dict) -> Any:
        """Where ``Tensor.to(...)`` sends the tensor (None: it stays where it is)."""
        target = kwargs.get("device", kwargs.get("other"))
        if target is None and len(args) > 1 and not isinstance(args[1], (torch.dtype, bool)):
            target = args[1]
        target = _cuda_index(target)
        if isinstance(target, torch.Tensor):
            if target.device.type != CAPTURE_DEVICE:
                return target.device
            return "cpu" if self.tracker.is_host(target) else "cuda"
        return target

    def _host_factory(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """A CPU factory: abstract on meta when large, a real CPU tensor when small."""
        meta_kwargs = dict(kwargs, device=_META)
        meta_kwargs.pop("pin_memory", None)
        with self.tracker.host():
            out = func(*args, **meta_kwargs)
        if isinstance(out, torch.Tensor) and _nbytes(out) < HOST_ABSTRACT_BYTES:
            return func(*args, **kwargs)
        return out

    def _to_device(self, t: torch.Tensor, options: dict) -> torch.Tensor:
        """``t`` sent to the device: a host tensor (abstract or real) is copied there; a device tensor follows ``Tensor.to``.

        A device tensor stays itself unless the call changes its dtype or memory format or asks
        for ``copy=True`` (``GradScaler`` copies its scale per device that way), as on the GPU.
        """
        if self.tracker.is_script_meta(t):
            # as on a GPU (aten's copy from meta); Module.to adds its hint to use to_empty()
            raise NotImplementedError("Cannot copy out of meta tensor; no data!")
        if t.device.type == CAPTURE_DEVICE and not self.tracker.is_host(t):
            return torch.Tensor.to(t, _META, dtype=options.get("dtype"),
                                   non_blocking=bool(options.get("non_blocking", False)),
                                   copy=bool(options.get("copy", False)),
                                   memory_format=options.get("memory_format", torch.preserve_format))
        with self.tracker.to_device():
            return torch.ops.aten._to_copy.default(
                t, dtype=options.get("dtype"), device=_META, non_blocking=bool(options.get("non_blocking", False)),
                memory_format=options.get("memory_format", torch.preserve_format))

    def _dtensor_to_host(self, t: torch.Tensor, options: dict) -> torch.Tensor:
        """``dtensor.cpu()``: a DTensor whose shard is the host copy, on the same mesh and placements, as
        DTensor's dispatch of ``aten._to_copy`` makes it on a GPU (torchtune's CPU offload keeps such shards)."""
        local = t._local_tensor
        host = local if self.tracker.is_host(local) or not on_meta(local) else self._to_host(local, options)
        return type(t)(host, t._spec, requires_grad=t.requires_grad)

    def _to_host(self, t: torch.Tensor, options: dict) -> torch.Tensor:
        """A device tensor brought to the CPU: its values when the capture has them, else abstract when large, zeros when small."""
        self.tracker.host_waits()
        dtype = options.get("dtype") or t.dtype
        if t.numel() * dtype.itemsize < HOST_ABSTRACT_BYTES:
            known = self.values.get(t)
            return known.to(dtype, copy=True) if known is not None else torch.zeros(t.shape, dtype=dtype)
        with self.tracker.host():
            return torch.empty_strided(t.shape, t.stride(), dtype=dtype, device=_META)


#: Elements of nested lists looked at for device tensors in ``torch.tensor(data)`` (past this: left as they are).
_MAX_DATA_ITEMS = 1 << 16


def _has_device_tensor(data: Any) -> bool:
    stack, seen = [data], 0
    while stack and seen < _MAX_DATA_ITEMS:
        item = stack.pop()
        seen += 1
        if isinstance(item, torch.Tensor):
            if item.device.type == CAPTURE_DEVICE:
                return True
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return False


def _host_copies(data: Any, to_host: Any) -> Any:
    """``data`` (nested lists) with each device tensor replaced by what reading it back gives."""
    if isinstance(data, torch.Tensor):
        return to_host(data, {}) if data.device.type == CAPTURE_DEVICE else data
    if isinstance(data, (list, tuple)):
        return type(data)(_host_copies(item, to_host) for item in data)
    return data


def _to_options(args: tuple, kwargs: dict) -> dict:
    """``dtype``, ``non_blocking``, ``copy``, ``memory_format`` of a ``Tensor.to`` call (its three forms)."""
    options = {k: kwargs[k] for k in ("dtype", "non_blocking", "copy", "memory_format") if k in kwargs}
    flags = iter(("non_blocking", "copy"))        # positional booleans, in the signature's order
    for value in args[1:]:
        if isinstance(value, torch.dtype):
            options.setdefault("dtype", value)
        elif isinstance(value, torch.Tensor):
            options.setdefault("dtype", value.dtype)
        elif isinstance(value, bool):
            name = next(flags, None)
            if name is not None:
                options.setdefault(name, value)
    return options


def _cuda_options(args: tuple, kwargs: dict) -> dict:
    """``non_blocking`` and ``memory_format`` of ``Tensor.cuda(device=None, non_blocking=False, memory_format=...)``."""
    given = dict(zip(("self", "device", "non_blocking", "memory_format"), args)) | kwargs
    return {k: given[k] for k in ("non_blocking", "memory_format") if k in given}


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


@contextlib.contextmanager
def _patched(owner: Any, name: str, value: Any) -> Iterator[None]:
    missing = object()
    old = owner.__dict__.get(name, missing) if isinstance(owner, type) else getattr(owner, name, missing)
    setattr(owner, name, value)
    try:
        yield
    finally:
        if old is missing:
            delattr(owner, name)
        else:
            setattr(owner, name, old)


class ThreadModes:
    """The modes a thread runs the script under: the function mode, the recorder, and autocast's key."""

    def __init__(self, tracker: StorageTracker, autocast: CudaAutocast):
        self.tracker = tracker
        self.autocast = autocast
        self.values = datadep.Values(HOST_ABSTRACT_BYTES)
        self.addresses = identity.Addresses()
        self._of_thread = threading.local()

    @contextlib.contextmanager
    def entered(self) -> Iterator[None]:
        """Enter the capture in the calling thread (the main thread, or a thread the script started)."""
        self.autocast.enable_thread()
        mode = CudaOnMeta(self.tracker, self.values, self.addresses)
        before = getattr(self._of_thread, "mode", None)
        self._of_thread.mode = mode
        before_global = getattr(_THREAD_MODE, "mode", None)
        _THREAD_MODE.mode = mode
        try:
            with Recorder(self.tracker), datadep.ValueMode(self.tracker, self.values), mode:
                yield
        finally:
            self._of_thread.mode = before
            _THREAD_MODE.mode = before_global

    def function_mode(self) -> CudaOnMeta | None:
        """The calling thread's function mode (None outside the capture)."""
        return getattr(self._of_thread, "mode", None)


def _parameters_abstract(tracker: StorageTracker, original: Any) -> Any:
    """``nn.Parameter(data)`` of a small real CPU floating tensor holds an abstract host tensor instead.

    On a GPU ``model.to("cuda")`` sets ``param.data`` and the ``Parameter`` objects stay the same, so an
    optimizer (or DeepSpeed's ``param_names``) built before the move still holds the model's
    parameters. Here a device tensor is on ``meta``, and ``set_data`` refuses to put a ``meta`` tensor
    into a real CPU parameter, so ``Module._apply`` would make new ``Parameter`` objects and the
    optimizer would keep the CPU ones. A parameter made abstract (``meta``, no memory, as every host
    tensor of 1 MiB or more already is) moves like the large ones: same object, and the device copy
    is recorded. Its values were never used: a capture computes no floating arithmetic.
    """
    def __new__(cls: Any, data: Any = None, requires_grad: bool = True) -> Any:
        if (isinstance(data, torch.Tensor) and type(data) is torch.Tensor and data.device.type == "cpu"
                and data.is_floating_point()):
            with tracker.host():
                data = torch.empty_strided(data.shape, data.stride(), dtype=data.dtype, device=_META)
        return original(cls, data, requires_grad)
    return staticmethod(__new__)


#: The ``CudaOnMeta`` of each thread under capture (``distributed.rank`` reads a device tensor's values through it).
_THREAD_MODE = threading.local()




def _threads_captured(modes: ThreadModes) -> Any:
    """``Thread._bootstrap_inner`` that runs every new thread under the capture (a GPU sees every thread's work)."""
    original = threading.Thread._bootstrap_inner

    def bootstrap_inner(self: threading.Thread) -> None:
        with modes.entered():
            original(self)
    return bootstrap_inner


def _wants_cuda(location: Any) -> bool:
    if isinstance(location, dict):
        return any(_is_cuda(v) for v in location.values())
    return _is_cuda(location)


def _load_to_device(original_load: Any) -> Any:
    """``torch.load`` for a capture: storages load memory-mapped on the host, the ones bound for ``cuda`` are copied there.

    A checkpoint saved from CUDA tensors (or loaded with ``map_location="cuda"``) would ask a
    CPU-only torch for CUDA storages; here every storage is restored on the host, memory-mapped
    when the file allows it (so the bytes are never read), and the tensors the GPU run would hold on
    the device are copied to it (device requests in the trace), as ``torch.load`` does on a GPU.
    """
    def load(f: Any, map_location: Any, *args: Any, **kwargs: Any) -> Any:
        """Called with ``torch.load``'s arguments bound (``signatures.conform``): ``mmap`` is always given, None by default."""
        if callable(map_location) and not isinstance(map_location, (str, torch.device, dict)):
            return original_load(f, map_location, *args, **kwargs)      # the script's own rule
        to_device: set[int] = set()

        def restore(storage: Any, location: str) -> Any:
            target = map_location.get(location, location) if isinstance(map_location, dict) else (
                map_location if map_location is not None else location)
            if _wants_cuda(target) or (isinstance(target, str) and target.startswith(CAPTURE_DEVICE)):
                to_device.add(id(storage))
            return storage

        if isinstance(f, (str, os.PathLike)) and kwargs.get("mmap") is None:
            try:
                loaded = original_load(f, restore, *args, **dict(kwargs, mmap=True))
            except (RuntimeError, ValueError):       # not a zip checkpoint: read it as it is
                loaded = original_load(f, restore, *args, **kwargs)
        else:
            loaded = original_load(f, restore, *args, **kwargs)
        if isinstance(loaded, torch.nn.Module):
            return loaded.to("cuda") if to_device else loaded

        def move(value: Any) -> Any:
            if isinstance(value, torch.Tensor) and id(value.untyped_storage()) in to_device:
                return value.to("cuda")
            return value
        return tree_map(move, loaded)

    return load


def _resize_recorded(tracker: StorageTracker) -> Any:
    """``UntypedStorage.resize_`` that tells the tracker (it reaches no ATen operator the recorder sees)."""
    resize = torch._C.StorageBase.resize_

    def resize_(self: Any, size: int) -> Any:
        out = resize(self, size)
        tracker.storage_resized(self, int(size))
        return out
    return resize_


def _compile_eager(tracker: StorageTracker) -> Any:
    """``torch.compile`` that returns the model or function unchanged: a capture runs eager (noted in the trace)."""
    def compile(model: Any = None, *args: Any, **kwargs: Any) -> Any:
        tracker.note("torch.compile ran eager under the capture: compiled kernels' fused buffers are not modelled")
        if model is None:                   # @torch.compile(mode=...) used as a decorator factory
            return lambda fn: fn
        return model
    return compile


def _default_device(original: Any) -> Any:
    """``torch.get_default_device()`` saying ``cuda:0`` (not the capture's ``meta``) under ``set_default_device("cuda")``."""
    def get_default_device() -> torch.device:
        if _default_is_cuda():
            current = torch_device_module.CURRENT_DEVICE
            return torch.device("cuda", current.index or 0)
        return original()
    return get_default_device


def shim_table(tracker: StorageTracker, gpu: dict[str, Any], autocast: CudaAutocast,
               modes: ThreadModes) -> dict[tuple[Any, str], Any]:
    """Every ``(owner, attribute)`` the capture replaces, with its replacement (functions take torch's own arguments)."""
    clear_autocast_cache = torch.clear_autocast_cache

    def clear_both() -> None:
        clear_autocast_cache()
        autocast.clear_cache()

    cuda_table = cuda_api.shims(tracker, gpu)
    # torch.accelerator is what the DataLoader, accelerate and newer scripts ask instead of torch.cuda
    table = {**cuda_table, **accelerator.shims(cuda_table), **legacy.shims(tracker.is_device),
             **optimizers.shims(tracker.is_device), **dataparallel.shims(tracker.is_device),
             **cudnn_rnn.shims(tracker.is_device)}
    hooks = torch.autograd.graph.saved_tensors_hooks
    table.update({
        (torch, "get_default_device"): _default_device(torch.get_default_device),
        (torch, "clear_autocast_cache"): clear_both,
        # the accelerator torch.distributed picks its default device mesh for (FSDP2's _init_default_mesh)
        (torch._C, "_get_accelerator"): lambda check=False: torch.device("cuda"),
        (torch.UntypedStorage, "resize_"): _resize_recorded(tracker),
        # torch's own record_stream refuses the capture's Stream objects before any mode sees the call
        (torch.Tensor, "record_stream"): lambda self, stream: tracker.record_stream(self, cuda_api.stream_number(stream)),
        (torch, "load"): conform(torch.load, _load_to_device(torch.load)),
        (torch, "compile"): conform(torch.compile, _compile_eager(tracker)),
        (torch.Tensor, "pin_memory"): lambda self, *a, **k: self,
        (torch.Tensor, "is_pinned"): lambda self, *a, **k: False,
        (torch.Tensor, "is_cuda"): property(tracker.is_device),
        # the backward pass runs under the capture's mode, as the forward does (identity.autograd_check)
        (torch.autograd, "has_torch_function"): identity.autograd_check(torch.autograd.has_torch_function, CudaOnMeta),
        (torch.Tensor, "__reduce_ex__"): identity.reduce_ex(torch.Tensor.__reduce_ex__, CudaOnMeta),
        (hooks, "__init__"): identity.hooks_init(hooks.__init__, modes.function_mode),
        (threading.Thread, "_bootstrap_inner"): _threads_captured(modes),
        (torch.Tensor, "_make_wrapper_subclass"): staticmethod(_wrapper_on_meta(torch.Tensor._make_wrapper_subclass)),
        (torch.utils, "swap_tensors"): conform(torch.utils.swap_tensors,
                                               _swap_forgetting(torch.utils.swap_tensors, modes, autocast)),
    })
    return table


def _wrapper_on_meta(original: Any) -> Any:
    """``Tensor._make_wrapper_subclass`` with a ``cuda`` device made on ``meta``, where the device tensors are.

    A wrapper subclass written in Python passes ``device=inner.device`` (torch 2.6's ``DTensor.__new__``,
    torchao's ``Float8Tensor``), which the capture's mode answers ``cuda:N``: ATen would then hold a CUDA
    wrapper around a ``meta`` tensor, and the autograd engine refuses its gradient for a ``meta`` parameter
    ("attempting to assign a gradient with device type 'cuda' to a tensor with device type 'meta'").
    torch 2.13's ``DTensor.__new__`` is C++ and reads the inner tensor's own device (``meta``).
    """
    def make_wrapper_subclass(cls: Any, *args: Any, **kwargs: Any) -> Any:
        device = kwargs.get("device")
        if device is not None and torch.device(device).type == "cuda":
            kwargs["device"] = torch.device(CAPTURE_DEVICE)
        return original(cls, *args, **kwargs)
    return make_wrapper_subclass


def _swap_forgetting(original: Any, modes: ThreadModes, autocast: CudaAutocast) -> Any:
    """``torch.utils.swap_tensors`` with the capture's own weak references to the two tensors let go first.

    torch refuses to swap a tensor that has a weak reference ("Cannot swap t1 because it has weakref
    associated with it"); ``nn.Module._apply`` swaps every DTensor parameter (FSDP2's ``to_empty``,
    torch 2.6), and the capture holds one where it keeps a small tensor's values (``datadep.Values``)
    or an autocast cast. A swap changes both tensors' contents, so both are forgotten, as the GPU run
    has no such entries to keep.
    """
    import weakref  # noqa: PLC0415

    def swap_tensors(t1: Any, t2: Any) -> Any:
        for t in (t1, t2):
            if isinstance(t, torch.Tensor):
                modes.values.discard(t)
        if any(weakref.getweakrefs(t) for t in (t1, t2)):
            autocast.clear_cache()
        return original(t1, t2)
    return swap_tensors


@contextlib.contextmanager
def cuda_on_meta(tracker: StorageTracker, gpu: dict[str, Any] | None = None) -> Iterator[CudaAutocast]:
    """Map ``cuda`` to ``meta`` and answer ``torch.cuda`` as ``gpu`` would, inside the block (this thread and those it starts)."""
    autocast = CudaAutocast(tracker.is_device)
    autocast.install()
    modes = ThreadModes(tracker, autocast)
    table = shim_table(tracker, dict(gpu or {}), autocast, modes)
    optimizers.install()
    cudnn_rnn.install()
    for name in meta_kernels.install():
        tracker.note(f"torch {torch.__version__} has no meta kernel for aten::{name}: allocsim's, shaped as "
                     "CUDA's outputs (allocsim.torch_capture.meta_kernels)")
    with contextlib.ExitStack() as stack:
        for (owner, name), fn in table.items():
            stack.enter_context(_patched(owner, name, fn))
        # small CPU parameters abstract: model.to("cuda") keeps the Parameter objects, as on a GPU
        stack.enter_context(_patched(torch.nn.Parameter, "__new__",
                                     _parameters_abstract(tracker, torch.nn.Parameter.__new__)))
        stack.enter_context(_patched(torch_device_module.DeviceContext, "__torch_function__", _meta_context(tracker)))
        # modules the script may import: patched when it does (triton's driver: triton_driver; safetensors'
        # save_file of capture tensors, whose Rust writer reads host copies' bytes: safetensors_save)
        lazy = Patches()
        stack.callback(lazy.undo)
        lazy.when_imported(triton_driver.MODULE, triton_driver.patches)
        lazy.when_imported("safetensors.torch", lambda: safetensors_save.patches(tracker))
        stack.enter_context(modes.entered())
        yield autocast
