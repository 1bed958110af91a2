"""What Python sees of a capture tensor's device: ``cuda:0`` for a device tensor, ``cpu`` for a host one, while ATen keeps both on ``meta``.

A script (and the Python half of PyTorch and its libraries) asks a tensor where it lives and acts
on the answer: Hugging Face's rotary embeddings run ``torch.autocast(device_type=x.device.type,
enabled=False)``, ``torch.utils.checkpoint`` picks the RNG and autocast state of
``x.device.type``, optimizers and ``GradScaler`` group tensors by ``.device``, ``DataParallel``
checks ``p.device == torch.device("cuda", 0)``. Inside a capture the answer is the GPU run's:

* ``x.device`` is ``device(type='cuda', index=0)`` for a device tensor and ``device(type='cpu')``
  for an abstract host tensor (a large CPU tensor the capture keeps on ``meta``); ``x.is_cpu`` and
  ``x.is_meta`` follow (``x.is_cuda`` and ``x.get_device()`` are answered by ``devicemap``);
  ``repr(x)``, ``print(x)`` and ``f"{x}"`` print as a CUDA tensor does (``device='cuda:0'``, values
  where the capture has them, zeros elsewhere);
* the answer is given by the capture's torch-function mode (``devicemap.CudaOnMeta``), so it
  reaches exactly the Python code that runs above ATen: the script, ``torch.nn``, ``torch.optim``,
  ``torch.amp``, ``torch.utils.checkpoint``. ATen and the capture's own dispatch-level code see
  ``meta`` (``tracker.on_meta`` reads the dispatch keys, never ``.device``), and a ``cuda``
  device handed back to a factory or ``.to()`` is mapped to ``meta`` again;
* the backward pass runs under the same mode (``backward``): Python code the autograd engine
  calls (custom ``autograd.Function.backward``, hooks, ``checkpoint``'s recomputation) sees the
  devices and takes the CUDA code path, as the forward did. PyTorch's ``Tensor.backward`` /
  ``torch.autograd.backward`` / ``torch.autograd.grad`` hand themselves to the active mode first
  (``has_torch_function``), which pops it for the call; inside a capture they run the engine with
  the mode in place instead (``autograd_check``). Saved-tensor hooks (``saved_tensors_hooks``:
  ``checkpoint``'s, ``save_on_cpu``) run under the mode both when the forward saves (from inside an
  operator, where the mode is set aside) and when the backward unpacks, so what they record of a
  tensor in one matches what they find in the other (``hooks_init``).

A CPU tensor moved to the GPU keeps its Python object: ``Module._apply`` (``.cuda()``, ``.to()``)
sets ``param.data`` to the moved tensor when ``torch._has_compatible_shallow_copy_type`` says the
two can share one (CPU and CUDA dense tensors can), so optimizers, EMA copies and tied weights built
before the move keep pointing at the parameters the model trains. A real CPU tensor and a ``meta``
one cannot share a ``TensorImpl``, so inside a capture the check says they can (``crosses``) and
``param.data = moved`` swaps the two tensors' implementations (``set_data``): the Parameter object
now holds the moved storage and keeps its ``requires_grad`` and Python attributes. A CPU tensor that
already has a ``.grad`` is left to torch (``Module._apply`` then makes a new Parameter, as before).

Pickling (``torch.save``, ``copy``, ``multiprocessing``) runs ``Tensor.__reduce_ex__`` with the
mode set aside (``reduce_ex``): it saves what the tensor is, a ``meta`` tensor without data (as
before this module), which ``torch.load`` inside a capture brings back as a device tensor.

``x.data_ptr()`` of a capture tensor is an address of its own (``Addresses``): distinct storages have
distinct ones and views point into their base's, as on a GPU, where ``meta`` answers 0 for every
tensor (``nn.RNNBase.flatten_parameters`` and tied-weight checks compare them).

Not answered: a storage's device (``x.untyped_storage().device``) stays ``meta``.
"""

from __future__ import annotations

import inspect
import threading
import weakref
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import _disable_current_modes

from . import local_device

#: Tensor properties whose answer the capture gives, by their getset descriptor (``func.__self__``).
_PROPERTIES = torch._C.TensorBase.__dict__
DEVICE, IS_CPU, IS_META = _PROPERTIES["device"], _PROPERTIES["is_cpu"], _PROPERTIES["is_meta"]
_ANSWERED = frozenset((DEVICE, IS_CPU, IS_META))
_METHOD_WRAPPER = type(DEVICE.__get__)
CPU = torch.device("cpu")
#: Tensor types whose backward needs nothing but the capture's mode (subclasses keep their own handlers).
_PLAIN = (torch.Tensor, torch.nn.Parameter)
_BACKWARD = inspect.signature(torch.Tensor.backward)
_DATA = _PROPERTIES["data"]


def property_of(func: Any) -> Any:
    """The tensor property ``func`` reads (``Tensor.device.__get__`` ...) when the capture answers it, else None."""
    if type(func) is _METHOD_WRAPPER:
        owner = func.__self__
        if owner in _ANSWERED:
            return owner
    return None


def answer(prop: Any, is_host: bool) -> Any:
    """``x.device`` / ``x.is_cpu`` / ``x.is_meta`` of a capture tensor, as on the GPU (``is_host``: a host tensor)."""
    if prop is DEVICE:
        return CPU if is_host else torch.device("cuda", local_device.current())
    if prop is IS_CPU:
        return is_host
    return False                                      # is_meta: a GPU run has no meta tensors


def _zeros_like_for_print(t: torch.Tensor) -> torch.Tensor:
    """Zeros printed as ``t``'s would be, without memory: one element expanded (floats as float32, which prints alike)."""
    dtype = torch.float32 if t.dtype.is_floating_point else t.dtype
    return torch.zeros((), dtype=dtype).expand(t.shape)


def tensor_repr(t: torch.Tensor, known: torch.Tensor | None, mode: Any, tensor_contents: Any = None) -> str | None:
    """``repr(t)`` as a CUDA (or CPU) tensor prints: ``known`` values or zeros; None for layouts left to torch."""
    if t.layout != torch.strided or t.is_nested:
        return None
    if tensor_contents is None:
        prefix = "tensor(" if type(t) in _PLAIN else f"{type(t).__name__}("
        with torch.no_grad(), _disable_current_modes():
            host = known if known is not None else _zeros_like_for_print(t)
            tensor_contents = "[]" if t.numel() == 0 else torch._tensor_str._tensor_str(host, len(prefix))
    with mode:                       # the suffixes read t.device and t.is_meta as the script does
        return torch._tensor_str._str(t, tensor_contents=tensor_contents)


def tensor_format(t: torch.Tensor, spec: str, known_item: Callable[[], Any], mode: Any) -> str:
    """``format(t, spec)`` as ``Tensor.__format__`` does on a GPU: a 0-dim tensor formats its value, others their repr."""
    if t.dim() == 0 and type(t) is torch.Tensor:
        return format(known_item(), spec)
    with mode:
        return object.__format__(t, spec)


def backward(mode: Any, args: tuple, kwargs: dict) -> None:
    """``Tensor.backward(...)`` with the autograd engine running under ``mode`` (Python in the backward sees the GPU)."""
    bound = _BACKWARD.bind(*args, **kwargs)
    bound.apply_defaults()
    given = bound.arguments
    with mode:
        torch.autograd.backward(given["self"], given["gradient"], given["retain_graph"], given["create_graph"],
                                inputs=given["inputs"])


def autograd_check(original: Callable[[Any], bool], mode_type: type) -> Callable[[Any], bool]:
    """``has_torch_function`` for ``torch.autograd``: False when the only handler would be the capture's mode.

    ``torch.autograd.backward`` and ``grad`` call it on their tensors; answering True hands the
    call to the mode, which runs it with itself popped, so the engine (and every Python hook and
    ``autograd.Function`` it calls) would run without the capture's mapping.
    """
    def has_torch_function(relevant_args: Any) -> bool:
        if isinstance(torch.overrides._get_current_function_mode(), mode_type) and all(
                type(a) in _PLAIN for a in relevant_args if isinstance(a, torch.Tensor)):
            return False
        return original(relevant_args)
    return has_torch_function


def _under(hook: Callable[[Any], Any], mode_of_thread: Callable[[], Any]) -> Callable[[Any], Any]:
    def run(value: Any) -> Any:
        mode = mode_of_thread()
        if mode is None or isinstance(torch.overrides._get_current_function_mode(), type(mode)):
            return hook(value)
        with mode:
            return hook(value)
    return run


def hooks_init(original: Callable[..., None], mode_of_thread: Callable[[], Any]) -> Callable[..., None]:
    """``saved_tensors_hooks.__init__`` whose pack and unpack hooks run under the calling thread's capture mode."""
    def __init__(self: Any, pack_hook: Callable[[Any], Any], unpack_hook: Callable[[Any], Any]) -> None:
        original(self, _under(pack_hook, mode_of_thread), _under(unpack_hook, mode_of_thread))
    return __init__


def reduce_ex(original: Callable[[Any, int], Any], mode_type: type) -> Callable[[Any, int], Any]:
    """``Tensor.__reduce_ex__`` run with the capture's mode set aside: pickling reads the tensor's real (meta) device."""
    def __reduce_ex__(self: torch.Tensor, proto: int) -> Any:
        if isinstance(torch.overrides._get_current_function_mode(), mode_type):
            with torch.overrides._pop_mode_temporarily():
                return original(self, proto)
        return original(self, proto)
    return __reduce_ex__


def is_data_set(func: Any) -> bool:
    """Whether ``func`` is ``x.data = y``'s setter, as the torch-function mode receives it."""
    return type(func) is _METHOD_WRAPPER and func.__self__ is _DATA and func.__name__ == "__set__"


def _meta(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and torch._C._dispatch_keys(t).has(torch._C.DispatchKey.Meta)


def crosses(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` are a dense real CPU tensor without a gradient and a dense capture (meta) tensor, either way round."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return False
    if a.layout != torch.strided or b.layout != torch.strided or _meta(a) == _meta(b):
        return False
    cpu = b if _meta(a) else a
    return cpu.device.type == "cpu" and cpu.grad is None


def set_data(t: torch.Tensor, value: torch.Tensor) -> None:
    """``t.data = value`` across the CPU/capture line: ``t`` (the same Python object) now holds ``value``'s storage."""
    moved = value.detach()
    moved.requires_grad_(t.requires_grad)
    torch._C._swap_tensor_impl(t, moved)


class Addresses:
    """Synthetic device addresses for capture storages: ``data_ptr(t)`` as a GPU gives it (512-byte aligned, never shared)."""

    _FIRST = 0x7F00_0000_0000

    def __init__(self) -> None:
        self._next = self._FIRST
        self._of: dict[int, tuple[weakref.ref, int]] = {}
        self._lock = threading.Lock()

    def data_ptr(self, t: torch.Tensor) -> int:
        storage = t.untyped_storage()
        key = id(storage)
        with self._lock:
            hit = self._of.get(key)
            if hit is None or hit[0]() is not storage:
                base = self._next
                self._next += (int(storage.nbytes()) + 1023) // 512 * 512
                self._of[key] = (weakref.ref(storage, lambda _ref, key=key: self._of.pop(key, None)), base)
            else:
                base = hit[1]
        return base + int(t.storage_offset()) * t.element_size() if t.numel() else 0
