"""``nn.LSTM``, ``nn.GRU`` and ``nn.RNN`` take cuDNN's fused RNN inside a capture, as on a GPU: ``install()``, ``shims()``, ``run()``, ``flatten()``.

On CUDA with cuDNN, ``at::lstm`` / ``gru`` / ``rnn_tanh`` / ``rnn_relu`` (``aten/src/ATen/native/RNN.cpp``)
check ``cudnn_is_acceptable`` and call ``_cudnn_impl`` (``native/cudnn/RNN.cpp``): one
``aten::_cudnn_rnn`` for the whole layer stack and sequence, whose backward is one
``aten::_cudnn_rnn_backward``. On ``meta`` the same call decomposes into a matrix product and
element-wise operators per time step and gate, each with its own saved tensors. Inside a capture:

* ``nn.RNNBase.flatten_parameters`` runs as on a GPU (``torch.backends.cudnn.is_acceptable``,
  ``torch._use_cudnn_rnn_flatten_weight``, ``get_cudnn_mode`` and the parameters' distinct
  ``data_ptr`` answered as there), and ``torch._cudnn_rnn_flatten_weight`` (``flatten``) makes the
  one weight buffer (``copy_weights_to_flat_buf_views``: ``at::zeros(num_weights)``) and sets every
  parameter to its view, so the copies ``.cuda()`` made are released;
* ``torch.lstm`` and the others on device tensors (``run``) do what ``_cudnn_impl`` does:
  ``try_get_weight_buf`` (the flat buffer when the parameters are its views in cuDNN's order, else
  none, and ``_cudnn_rnn`` copies the weights into a new buffer at each call), the dropout state
  made once on the first training call with dropout (``get_dropout_state``: an 8-byte seed and the
  state buffer, kept), then ``_cudnn_rnn``;
* ``_cudnn_rnn`` and ``_cudnn_rnn_backward`` get meta kernels with RNN.cpp's outputs: ``output``,
  ``hy``, ``cy``, the training reserve (kept by autograd for the backward), the weight buffer;
  ``dx``, ``dhx``, ``dcx`` and ``dw``, one buffer whose views are the parameters' gradients. Their
  workspaces and the backward's ``zeros_like`` gradients are ``cuda_scratch`` requests.

The reserve, workspace, weight-buffer and dropout-state sizes cuDNN decides are modelled
(``cudnn_rnn_model``, which states the model and its sources).
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from . import cudnn_rnn_model as model
from .signatures import conform

_FUNCS = {torch.lstm: model.LSTM, torch.gru: model.GRU, torch.rnn_tanh: model.RNN_TANH,
          torch.rnn_relu: model.RNN_RELU}
_library: Any = None
#: The process's dropout state buffer (RNN.cpp caches one per device).
_DROPOUT: dict[str, Any] = {}
_dropout_lock = threading.Lock()


def is_rnn(func: Any) -> bool:
    """Whether ``func`` is ``torch.lstm`` / ``gru`` / ``rnn_tanh`` / ``rnn_relu`` (``_VF``'s, which ``nn.LSTM`` calls)."""
    return func in _FUNCS


# ----------------------------------------------------------------------------- meta kernels

def _num_weights(weights: Any) -> int:
    return sum(int(w.numel()) for w in weights)


def _cudnn_rnn_meta(input, weight, weight_stride0, weight_buf, hx, cx, mode, hidden_size, proj_size, num_layers,
                    batch_first, dropout, train, bidirectional, batch_sizes, dropout_state):
    """``_cudnn_rnn``'s outputs as RNN.cpp makes them: output, hy, cy, the reserve, the weight buffer."""
    batch_sizes = [int(b) for b in batch_sizes]
    shape = model.rnn_shape(int(mode), input.shape, batch_sizes, bool(batch_first), int(hidden_size),
                            int(num_layers), bool(bidirectional))
    out_size = int(proj_size) if proj_size else int(hidden_size)
    if batch_sizes:
        out_shape = [shape.rows, out_size * shape.directions]
    elif batch_first:
        out_shape = [shape.mini_batch, shape.seq_length, out_size * shape.directions]
    else:
        out_shape = [shape.seq_length, shape.mini_batch, out_size * shape.directions]
    output = input.new_empty(out_shape)
    hy = hx.new_empty([shape.num_layers * shape.directions, shape.mini_batch, out_size])
    cy = (cx.new_empty([shape.num_layers * shape.directions, shape.mini_batch, int(hidden_size)])
          if cx is not None else hx.new_empty([0]))
    if weight_buf is None:           # weights not flattened: a new buffer they are copied into
        weight_buf = input.new_empty([_num_weights(weight)])
    else:
        weight_buf = weight_buf.view(weight_buf.shape)
    reserve = input.new_empty([model.reserve_bytes(shape, input.element_size()) if train else 0],
                              dtype=torch.uint8)
    return output, hy, cy, reserve, weight_buf


def _cudnn_rnn_backward_meta(input, weight, weight_stride0, weight_buf, hx, cx, output, grad_output, grad_hy,
                             grad_cy, mode, hidden_size, proj_size, num_layers, batch_first, dropout, train,
                             bidirectional, batch_sizes, dropout_state, reserve, output_mask):
    """``_cudnn_rnn_backward``'s outputs: dx, dhx, dcx, and the weights' gradients as views of one ``dw`` buffer."""
    if grad_output is None and grad_hy is None and grad_cy is None:
        return None, None, None, [None] * len(weight)
    dx = input.new_empty(input.shape)
    dhx = hx.new_empty(hx.shape)
    dcx = cx.new_empty(cx.shape) if cx is not None else None
    grads: list[Any] = []
    if output_mask[3]:
        dw = weight_buf.new_empty(weight_buf.shape)     # at::zeros(weight_buf.sizes())
        offset = 0
        for w in weight:
            grads.append(dw.as_strided(w.shape, w.stride(), offset))
            offset += int(w.numel())
    return dx, dhx, dcx, grads


def _flatten_meta(weight_arr, weight_stride0, input_size, mode, hidden_size, proj_size, num_layers, batch_first,
                  bidirectional):
    """``_cudnn_rnn_flatten_weight``'s buffer: ``at::zeros(num_weights)`` of the weights' dtype."""
    return weight_arr[0].new_empty([_num_weights(weight_arr)])


def _dropout_state_meta(dropout, train, dropout_seed, *, dtype=None, layout=None, device=None, pin_memory=False):
    """``_cudnn_init_dropout_state``'s buffer (``cudnnDropoutGetStatesSize`` bytes, modelled)."""
    return torch.empty(model.DROPOUT_STATE_BYTES, dtype=torch.uint8, device="meta")


def install() -> None:
    """Register the meta kernels (once per process; ``_cudnn_rnn``'s replaces torch's, whose reserve is empty)."""
    global _library
    if _library is not None:
        return
    _library = torch.library.Library("aten", "IMPL")
    for name, kernel in (("_cudnn_rnn", _cudnn_rnn_meta), ("_cudnn_rnn_backward", _cudnn_rnn_backward_meta),
                         ("_cudnn_rnn_flatten_weight", _flatten_meta),
                         ("_cudnn_init_dropout_state", _dropout_state_meta)):
        override_meta(_library, name, kernel)


def override_meta(library: Any, name: str, kernel: Any) -> None:
    """``library.impl(name, kernel, "Meta")`` over a Meta kernel torch registered from Python.

    ``Library.impl`` overrides one by default from the release that gave it ``allow_override``; before
    (torch 2.6's refuses: "there's already a kernel registered from python overriding _cudnn_rnn's
    behavior for Meta") the key is taken off torch's list of Python registrations first, which is what
    that flag skips: the dispatcher then takes the newer kernel, as it does in later releases.
    """
    import inspect                                              # noqa: PLC0415
    if "allow_override" not in inspect.signature(torch.library.Library.impl).parameters:
        getattr(torch.library, "_impls", set()).discard(f"{library.ns}/{name}/Meta")
    library.impl(name, kernel, "Meta")


# ----------------------------------------------------------------------------- flatten_parameters

def shims(is_device: Any) -> dict[tuple[Any, str], Any]:
    """What ``nn.RNNBase.flatten_parameters`` asks before it flattens, answered as with CUDA and cuDNN."""
    import torch.backends.cudnn as cudnn              # noqa: PLC0415
    import torch.backends.cudnn.rnn as cudnn_rnn      # noqa: PLC0415

    def is_acceptable(tensor: Any) -> bool:
        # torch/backends/cudnn/__init__.py is_acceptable, with the capture's device tensors as CUDA's
        return bool(torch._C._get_cudnn_enabled() and is_device(tensor)
                    and tensor.dtype in cudnn.CUDNN_TENSOR_DTYPES)

    table = {(cudnn, "is_acceptable"): conform(cudnn.is_acceptable, is_acceptable),
             (cudnn_rnn, "get_cudnn_mode"): conform(cudnn_rnn.get_cudnn_mode, lambda mode: model.MODE_OF_NAME[mode])}
    if hasattr(torch, "_use_cudnn_rnn_flatten_weight"):
        table[(torch, "_use_cudnn_rnn_flatten_weight")] = lambda: True     # a CUDA build with cuDNN, not MIOpen
    return table


def flatten(args: tuple, kwargs: dict) -> torch.Tensor:
    """``torch._cudnn_rnn_flatten_weight``: the flat buffer, and every weight set to its view there (in place)."""
    weights = list(args[0] if args else kwargs["weight_arr"])
    buf = torch.ops.aten._cudnn_rnn_flatten_weight.default(*args, **kwargs)
    storage = buf.untyped_storage()
    offset = 0
    with torch.no_grad():
        for w in weights:
            w.set_(storage, offset, w.shape, _contiguous_strides(w.shape))
            offset += int(w.numel())
    return buf


def _contiguous_strides(shape: Any) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(list(shape)):
        strides.append(step)
        step *= max(int(size), 1)
    return tuple(reversed(strides))


# ----------------------------------------------------------------------------- the RNN call

def _weight_buf(params: list[torch.Tensor]) -> torch.Tensor | None:
    """``try_get_weight_buf``: the flat buffer when the weights are its views, back to back in order, else None."""
    storage = params[0].untyped_storage()
    offset = 0
    for p in params:
        if p.untyped_storage()._cdata != storage._cdata:
            return None
        if p.storage_offset() != offset or not p.is_contiguous():
            return None
        offset += int(p.numel())
    return params[0].new_empty(0).set_(storage, 0, (offset,), (1,))


def _dropout_state(dropout: float, train: bool) -> torch.Tensor | None:
    """``get_dropout_state``: made on the first training call with dropout (an 8-byte seed drawn on the device), then kept."""
    if not (train and dropout > 0):
        return _DROPOUT.get("buffer")
    with _dropout_lock:
        if "buffer" not in _DROPOUT:
            seed = torch.empty((), dtype=torch.long, device="meta")       # at::empty({}, kLong).random_(gen)
            del seed
            _DROPOUT["buffer"] = torch.ops.aten._cudnn_init_dropout_state.default(
                float(dropout), True, 0, dtype=torch.uint8, device="meta")
        return _DROPOUT["buffer"]


def acceptable(func: Any, args: tuple, is_device: Any) -> bool:
    """``cudnn_is_acceptable(input)`` (TensorProperties.cpp): cuDNN enabled, a CUDA input with elements."""
    inp = args[0] if args else None
    return (isinstance(inp, torch.Tensor) and is_device(inp) and inp.numel() > 0
            and bool(torch._C._get_cudnn_enabled()))


def run(func: Any, args: tuple, kwargs: dict) -> Any:
    """``torch.lstm(...)`` (and ``gru``, ``rnn_tanh``, ``rnn_relu``, padded or packed) as ``_cudnn_impl`` runs it."""
    mode = _FUNCS[func]
    packed = _is_packed_call(args)
    if packed:
        names = ("data", "batch_sizes", "hx", "params", "has_biases", "num_layers", "dropout", "train", "bidirectional")
    else:
        names = ("input", "hx", "params", "has_biases", "num_layers", "dropout", "train", "bidirectional",
                 "batch_first")
    given = dict(zip(names, args)) | kwargs
    inp = given["data"] if packed else given["input"]
    hidden = given["hx"]
    hx, cx = (hidden[0], hidden[1]) if mode == model.LSTM else (hidden, None)
    params = list(given["params"])
    hidden_size, proj_size = int(hx.size(2)), 0
    if cx is not None and cx.size(2) != hx.size(2):          # LSTM with projections
        hidden_size, proj_size = int(cx.size(2)), int(hx.size(2))
    num_params = (4 if given["has_biases"] else 2) + (1 if proj_size else 0)
    batch_sizes = [int(b) for b in given["batch_sizes"].tolist()] if packed else []
    dropout, train = float(given["dropout"]), bool(given["train"])
    out = torch.ops.aten._cudnn_rnn.default(
        inp, params, num_params, _weight_buf(params), hx, cx, mode, hidden_size, proj_size,
        int(given["num_layers"]), False if packed else bool(given["batch_first"]), dropout, train,
        bool(given["bidirectional"]), batch_sizes, _dropout_state(dropout, train))
    if mode == model.LSTM:
        return out[0], out[1], out[2]
    return out[0], out[1]


def _is_packed_call(args: tuple) -> bool:
    """The ``data`` overload: ``(data, batch_sizes, hx, params, ...)``, its hidden state third."""
    return len(args) > 3 and isinstance(args[3], (list, tuple))
