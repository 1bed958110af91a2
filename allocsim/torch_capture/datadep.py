"""Values where they are cheap, and data-dependent shapes that never stop a capture: ``ValueMode(tracker)``.

A capture computes no values on the device, so anything whose size or branch depends on values
(``x[mask]``, ``nonzero``, ``masked_select``, ``unique``, ``torch.where(cond)``,
``repeat_interleave(repeats)``, ``bincount``, ``if mask.all():``) would either stop (meta has no
kernel for them) or take the branch zeros take. The answer here, per tensor:

* **values computed where cheap**: a small device tensor (under ``HOST_ABSTRACT_BYTES``) keeps its
  real values on the host when they come from values the capture has: an integer or boolean tensor
  copied from a real CPU tensor (token ids, attention masks, labels, indices from the data), a
  factory that draws no random numbers (``arange``, ``ones``, ``full``), and any operator all of
  whose device inputs have values (``mask.all()``, ``ids != pad``, ``mask.long().sum(-1)``). Floating
  tensors copied from the host (weights, activations) never get values, so model arithmetic is
  never computed. Read-backs (``.item()``, ``bool(t)``, ``.tolist()``) of such a tensor give its
  real values, and data-dependent operators on it get their real output sizes;
* **an upper bound otherwise**: a data-dependent operator on a tensor without values gets the
  largest output it can have (``nonzero``: one row per element; ``masked_select``: every element;
  ``unique``: as many values as elements; ``bincount``: ``minlength`` or the input's length), and the
  trace says so in a note. ``repeat_interleave(repeats)`` has no upper bound: with values it gets its
  real size, without them torch's own error stops the script (pass ``output_size=``).

A CPU tensor meeting a device tensor where CUDA refuses it (a non-scalar CPU operand of an
element-wise operator) raises CUDA's "Expected all tensors to be on the same device, but found at
least two devices, cuda:0 and cpu!" instead of the meta kernel's "Tensor on device cpu is not on
the expected device meta!"; CPU scalars (0-dim) and CPU index tensors pass, as on CUDA.

Boolean-mask indexing (``x[mask]``, ``x[mask] = v``) on CUDA expands the mask with ``nonzero`` on the
device (``expandTensors`` in ``aten/src/ATen/native/IndexingUtils.h``); the mode does the same, so the
trace has that ``nonzero`` output as the GPU run does, with the real or the upper-bound row count.
"""

from __future__ import annotations

import re
import threading
import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_map

from .tracker import CAPTURE_DEVICE, StorageTracker, on_meta

aten = torch.ops.aten
_LOCAL_SCALAR = aten._local_scalar_dense.default
#: Operators whose output size depends on their inputs' values.
_DATA_DEPENDENT = {aten.nonzero.default, aten.masked_select.default, aten._unique2.default,
                   aten.unique_consecutive.default, aten.unique_dim.default, aten.bincount.default}
#: Data-dependent operators with no upper bound: answered only from values.
_VALUES_ONLY = {aten.repeat_interleave.Tensor}
_INDEXING = {aten.index.Tensor, aten.index_put_.default, aten.index_put.default, aten._index_put_impl_.default}


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class Values:
    """Host copies of the values of small device tensors (weakly keyed by the tensor)."""

    def __init__(self, limit_bytes: int):
        self.limit_bytes = limit_bytes
        self._values: dict[int, tuple[weakref.ref, torch.Tensor]] = {}
        self._lock = threading.Lock()

    def get(self, t: Any) -> torch.Tensor | None:
        """The values of ``t``: itself for a real CPU tensor, its host copy for a device tensor that has one."""
        if not isinstance(t, torch.Tensor):
            return None
        if not on_meta(t):
            return t
        with self._lock:
            hit = self._values.get(id(t))
        return hit[1] if hit is not None and hit[0]() is t else None

    def set(self, t: torch.Tensor, value: torch.Tensor) -> None:
        key = id(t)
        with self._lock:
            self._values[key] = (weakref.ref(t, lambda _ref, key=key: self._drop(key)), value)

    def discard(self, t: torch.Tensor) -> None:
        """Forget ``t``'s values (an in-place operator changed them in a way the capture does not compute)."""
        self._drop(id(t))

    def _drop(self, key: int) -> None:
        with self._lock:
            self._values.pop(key, None)


class ValueMode(TorchDispatchMode):
    """The dispatch mode (above the recorder) that keeps cheap values and answers data-dependent operators."""

    def __init__(self, tracker: StorageTracker, values: Values):
        super().__init__()
        self.tracker = tracker
        self.values = values

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if torch._C._is_torch_function_mode_enabled():
            # The backward pass runs under the capture's function mode (``identity``), where
            # ``t.device`` says ``cuda:0``: below it, this mode and the recorder see ATen's meta.
            with torch._C.DisableTorchFunction():
                return self._dispatch(func, args, kwargs or {})
        return self._dispatch(func, args, kwargs or {})

    def _dispatch(self, func: Any, args: tuple, kwargs: dict) -> Any:
        tracker = self.tracker
        if func is _LOCAL_SCALAR and args and isinstance(args[0], torch.Tensor):
            known = self.values.get(args[0])
            if known is not None and known is not args[0]:
                return known.item()
        if func in _INDEXING and _has_device_mask(args, tracker):
            args = (args[0], self._expanded(args[1]), *args[2:])
        if func in _DATA_DEPENDENT and any(tracker.is_device(t) for t in _tensors(args, kwargs)):
            return self._data_dependent(func, args, kwargs)
        if func in _VALUES_ONLY and kwargs.get("output_size") is None:
            host_args, host_kwargs = self._host(args), self._host(kwargs)
            if host_args is not None and host_kwargs is not None and any(
                    tracker.is_device(t) for t in _tensors(args, kwargs)):
                with _disable_current_modes():
                    host_out = func(*host_args, **host_kwargs)
                return self._device_like(func, args, kwargs, host_out, keep_values=True)
        try:
            out = func(*args, **kwargs)
        except RuntimeError as exc:
            cuda_message = cuda_device_error(str(exc))
            if cuda_message is None:
                raise
            raise RuntimeError(cuda_message) from None
        self._keep_values(func, args, kwargs, out)
        return out

    # ----------------------------------------------------------------- values
    def _keep_values(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        device_outs = [t for t in outs if self.tracker.is_device(t)]
        if not device_outs:
            return
        if not self._computed(func, args, kwargs, outs):
            for t in device_outs:      # an in-place result whose new values are not computed
                self.values.discard(t)

    def _computed(self, func: Any, args: tuple, kwargs: dict, outs: list[torch.Tensor]) -> bool:
        """Compute ``func`` on the inputs' values and keep the outputs' values; False when that is not cheap or possible."""
        if sum(_nbytes(t) for t in outs if self.tracker.is_device(t)) >= self.values.limit_bytes:
            return False
        inputs = _tensors(args, kwargs)
        if func is aten._to_copy.default and inputs and inputs[0].device.type != CAPTURE_DEVICE:
            if inputs[0].is_floating_point() or inputs[0].is_complex():
                return False     # weights and activations: their arithmetic is never computed
        elif not inputs and torch.Tag.nondeterministic_seeded in func.tags:
            return False
        host_args = self._host(args)
        host_kwargs = self._host(kwargs)
        if host_args is None or host_kwargs is None:
            return False
        try:
            with _disable_current_modes():
                host_out = func(*host_args, **host_kwargs)
        except Exception:       # noqa: BLE001  (a value is a bonus: the capture goes on without it)
            return False
        host_outs = [v for v in tree_flatten(host_out)[0] if isinstance(v, torch.Tensor)]
        for t, value in zip(outs, host_outs):
            if self.tracker.is_device(t) and value.shape == t.shape and value.dtype == t.dtype:
                self.values.set(t, value)
        return True

    def _host(self, tree: Any) -> Any:
        """``tree`` with each meta tensor replaced by its values; None when one has none (or is a host tensor)."""
        missing = []

        def swap(value: Any) -> Any:
            if isinstance(value, torch.Tensor) and value.device.type == CAPTURE_DEVICE:
                known = self.values.get(value) if self.tracker.is_device(value) else None
                if known is None:
                    missing.append(value)
                return known
            if isinstance(value, torch.device) and value.type == CAPTURE_DEVICE:
                return torch.device("cpu")
            return value
        swapped = tree_map(swap, tree)
        return None if missing else swapped

    # ----------------------------------------------------------------- data-dependent operators
    def _data_dependent(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """Real output sizes from the inputs' values, else the upper bound (noted in the trace)."""
        host_args, host_kwargs = self._host(args), self._host(kwargs)
        if host_args is not None and host_kwargs is not None:
            with _disable_current_modes():
                host_out = func(*host_args, **host_kwargs)
            return self._device_like(func, args, kwargs, host_out, keep_values=True)
        bound = _upper_bound(func, args, kwargs)
        self.tracker.note(f"{func.name()} of a tensor whose values the capture does not compute: its output "
                          "is the upper bound (every element selected, every value distinct), so the trace "
                          "holds at least what the GPU run does there (allocsim.torch_capture.datadep)")
        return self._device_like(func, args, kwargs, bound, keep_values=False)

    def _device_like(self, func: Any, args: tuple, kwargs: dict, host_out: Any, keep_values: bool) -> Any:
        """Empty device tensors shaped like ``host_out``, recorded as ``func``'s outputs."""
        with _disable_current_modes():
            out = tree_map(lambda v: torch.empty(v.shape, dtype=v.dtype, device=CAPTURE_DEVICE)
                           if isinstance(v, torch.Tensor) else v, host_out)
        self.tracker.on_operator(func, args, kwargs, out)
        if keep_values:
            for t, value in zip(tree_flatten(out)[0], tree_flatten(host_out)[0]):
                if isinstance(t, torch.Tensor) and _nbytes(t) < self.values.limit_bytes:
                    self.values.set(t, value)
        return out

    def _expanded(self, indices: Any) -> list[Any]:
        """Boolean device masks among ``indices`` replaced by the long indices of their ``nonzero``, as CUDA's ``expandTensors``."""
        expanded: list[Any] = []
        for index in indices:
            if isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8) \
                    and self.tracker.is_device(index):
                rows = self._data_dependent(aten.nonzero.default, (index,), {})
                expanded.extend(aten.unbind.int(rows, 1))
            else:
                expanded.append(index)
        return expanded


_META_DEVICE_ERROR = re.compile(r"Tensor on device (\S+) is not on the expected device (\S+)!")


def _cuda_name(device: str) -> str:
    return "cuda:0" if device == CAPTURE_DEVICE else device


def cuda_device_error(message: str) -> str | None:
    """The error CUDA's TensorIterator raises where a meta kernel says "Tensor on device cpu is not on the expected device meta!"."""
    match = _META_DEVICE_ERROR.search(message)
    if match is None:
        return None
    found, expected = (_cuda_name(d) for d in match.groups())
    return f"Expected all tensors to be on the same device, but found at least two devices, {expected} and {found}!"


def _tensors(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    return [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]


def _has_device_mask(args: tuple, tracker: StorageTracker) -> bool:
    indices = args[1] if len(args) > 1 else None
    return isinstance(indices, (list, tuple)) and any(
        isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) and tracker.is_device(i) for i in indices)


def _upper_bound(func: Any, args: tuple, kwargs: dict) -> Any:
    """Host tensors (never filled) of the largest outputs ``func`` can give for these inputs."""
    x = args[0]
    empty = torch.empty
    if func is aten.nonzero.default:
        return empty((x.numel(), x.dim()), dtype=torch.long)
    if func is aten.masked_select.default:
        return empty((torch.broadcast_shapes(x.shape, args[1].shape).numel(),), dtype=x.dtype)
    if func is aten.bincount.default:
        minlength = int(kwargs.get("minlength", args[2] if len(args) > 2 else 0))
        weights = kwargs.get("weights", args[1] if len(args) > 1 else None)
        dtype = weights.dtype if isinstance(weights, torch.Tensor) else torch.long
        return empty((max(minlength, x.numel()),), dtype=dtype)
    if func is aten.unique_dim.default:
        dim = int(args[1] if len(args) > 1 else kwargs.get("dim", 0))
        inverse = args[3] if len(args) > 3 else kwargs.get("return_inverse", False)
        counts = args[4] if len(args) > 4 else kwargs.get("return_counts", False)
        return (empty(x.shape, dtype=x.dtype), empty((x.size(dim),) if inverse else (0,), dtype=torch.long),
                empty((x.size(dim),) if counts else (0,), dtype=torch.long))
    # _unique2(self, sorted, return_inverse, return_counts), unique_consecutive(self, return_inverse, return_counts, dim)
    names = ("sorted", "return_inverse", "return_counts") if func is aten._unique2.default else \
        ("return_inverse", "return_counts", "dim")
    given = dict(zip(names, args[1:])) | kwargs
    return (empty((x.numel(),), dtype=x.dtype),
            empty(x.shape if given.get("return_inverse") else (0,), dtype=torch.long),
            empty((x.numel(),) if given.get("return_counts") else (0,), dtype=torch.long))
