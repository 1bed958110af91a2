"""The sizes of what cuDNN's fused RNN asks the caching allocator for: ``reserve_bytes``, ``workspace_bytes``, ``rnn_scratch``.

What PyTorch allocates around cuDNN's RNN is read from ``aten/src/ATen/native/cudnn/RNN.cpp``
(pytorch/pytorch as stored by the code index): ``_cudnn_rnn`` makes ``output``, ``hy``, ``cy`` (and a
weight buffer when the weights are not one flat buffer), then a workspace it frees on return and,
in training, a reserve kept for the backward; ``_cudnn_rnn_backward`` makes ``zeros_like`` gradients
for the outputs the loss did not use, runs ``_cudnn_rnn_backward_input`` (``dx``, ``dhx``, ``dcx``
and a workspace) and ``_cudnn_rnn_backward_weight`` (``dw``, one buffer the size of the weights,
and a workspace); batch-first inputs are made contiguous in each of the three. Those shapes are
exact. Two sizes come from cuDNN itself (``cudnnGetRNNTempSpaceSizes``, or
``cudnnGetRNNWorkspaceSize`` / ``cudnnGetRNNTrainingReserveSize`` before cuDNN 8): no public
formula gives them, and no GPU was available to measure them. They are **modelled**, as stated here:

* reserve (training only): what the standard algorithm's backward pass reads back, per layer,
  direction and (time step, sequence) row: the gate activations and the states, in the RNN's math
  type (``promote_rnn_math_type``: float32 for float16 and bfloat16): LSTM 4 gates + cell + hidden
  = 6 x hidden, GRU 3 gates + hidden + the reset-gated recurrent term = 5 x hidden, plain RNN the
  pre-activation + hidden = 2 x hidden;
* workspace: one layer's input projections for all rows (gates x hidden x directions per row), in
  the math type, the GEMM result the standard algorithm computes before its time loop;
* weights: ``cudnnGetRNNWeightSpaceSize`` is taken as the sum of PyTorch's parameters (cuDNN packs
  each layer's matrices and biases back to back: ``get_parameters`` asserts it within a layer);
* the dropout state (``_cudnn_init_dropout_state``, made once per device on the first training
  call with dropout) is 2 MiB: RNN.cpp's comment says "slightly over 2MB"; its exact size is
  ``cudnnDropoutGetStatesSize``, per GPU.

A public measurement disagrees with the reserve model's proportions: pytorch/pytorch#2895 reports,
on a P100 with cuDNN 6, a reserve of 864,000,000 bytes for a GRU against 736,000,000 for an LSTM of
the same shape (4 layers of 320 from 123 inputs, as the parameter counts given there imply; the
sequence length and batch are not given), where the model makes the LSTM's the larger. The sizes
to measure on a GPU: ``torch.cuda.memory._record_memory_history`` around one ``nn.LSTM`` / ``nn.GRU``
forward and backward; the snapshot's ``_cudnn_rnn`` blocks are the workspace and the reserve.
"""

from __future__ import annotations

from typing import Any, Mapping, NamedTuple, Sequence

#: ``cudnnRNNMode_t`` (cudnn_adv.h): what ``torch.backends.cudnn.rnn.get_cudnn_mode`` returns.
RNN_RELU, RNN_TANH, LSTM, GRU = 0, 1, 2, 3
MODE_OF_NAME = {"RNN_RELU": RNN_RELU, "RNN_TANH": RNN_TANH, "LSTM": LSTM, "GRU": GRU}
#: Gates per cell (``_num_linear_layers(mode) / 2`` in RNN.cpp).
GATES = {RNN_RELU: 1, RNN_TANH: 1, LSTM: 4, GRU: 3}
#: Hidden-sized values per row the reserve model keeps (see the module's text).
_RESERVE_UNITS = {RNN_RELU: 2, RNN_TANH: 2, LSTM: 6, GRU: 5}
#: ``_cudnn_init_dropout_state``'s buffer, modelled (RNN.cpp: "Each state is slightly over 2MB").
DROPOUT_STATE_BYTES = 2 << 20


class RnnShape(NamedTuple):
    """What cuDNN's sizes depend on: rows (time steps x sequences, or the packed rows), layers, directions."""

    mode: int
    seq_length: int
    mini_batch: int
    rows: int
    hidden_size: int
    num_layers: int
    directions: int


def rnn_shape(mode: int, input_shape: Sequence[int], batch_sizes: Sequence[int], batch_first: bool,
              hidden_size: int, num_layers: int, bidirectional: bool) -> RnnShape:
    """``TensorDescriptorListParams.set`` (RNN.cpp): packed inputs have ``len(batch_sizes)`` steps of ``batch_sizes[0]``."""
    if batch_sizes:
        seq_length, mini_batch, rows = len(batch_sizes), int(batch_sizes[0]), int(input_shape[0])
    else:
        seq_length = int(input_shape[1] if batch_first else input_shape[0])
        mini_batch = int(input_shape[0] if batch_first else input_shape[1])
        rows = seq_length * mini_batch
    return RnnShape(mode, seq_length, mini_batch, rows, int(hidden_size), int(num_layers), 2 if bidirectional else 1)


def math_bytes(elem_bytes: int) -> int:
    """``promote_rnn_math_type``: half and bfloat16 RNNs compute in float32; float32 and float64 in themselves."""
    return max(4, int(elem_bytes))


def reserve_bytes(shape: RnnShape, elem_bytes: int) -> int:
    """The training reserve, modelled: gate activations and states of every layer, direction and row."""
    per_row = _RESERVE_UNITS[shape.mode] * shape.hidden_size * shape.num_layers * shape.directions
    return shape.rows * per_row * math_bytes(elem_bytes)


def workspace_bytes(shape: RnnShape, elem_bytes: int) -> int:
    """The workspace of one forward or backward call, modelled: one layer's input projections for every row."""
    return shape.rows * GATES[shape.mode] * shape.hidden_size * shape.directions * math_bytes(elem_bytes)


class RnnScratch(NamedTuple):
    """One request ``_cudnn_rnn`` / ``_cudnn_rnn_backward`` makes beside its outputs (``lifetime`` as in ``cuda_scratch``)."""

    size_bytes: int
    label: str
    lifetime: str
    launch: int


def _nbytes(t: Any) -> int:
    return int(t.nbytes) if t is not None else 0


def rnn_scratch(op_base: str, a: Mapping[str, Any], itemsize: Any) -> list[RnnScratch]:
    """The requests beside the outputs of ``_cudnn_rnn`` or ``_cudnn_rnn_backward`` (``a``: schema names to ``TensorMeta``)."""
    inp = a.get("input")
    if inp is None or not hasattr(inp, "shape"):
        return []
    batch_sizes = tuple(int(b) for b in (a.get("batch_sizes") or ()))
    batch_first = bool(a.get("batch_first", False)) and not batch_sizes
    shape = rnn_shape(int(a.get("mode", LSTM)), inp.shape, batch_sizes, batch_first, int(a.get("hidden_size", 0)),
                      int(a.get("num_layers", 1)), bool(a.get("bidirectional", False)))
    elem = itemsize(inp.dtype)
    workspace = workspace_bytes(shape, elem)
    # x = input.contiguous() after input.transpose(0, 1) for batch-first inputs: a seq-major copy
    copy = inp.nbytes if batch_first else 0
    out: list[RnnScratch] = []
    if op_base == "_cudnn_rnn":
        if copy:
            out.append(RnnScratch(copy, "cudnn rnn: input.contiguous() (batch_first)", "op", 0))
        out.append(RnnScratch(workspace, "cudnn rnn forward workspace (modelled)", "op", 0))
        return [r for r in out if r.size_bytes > 0]
    # _cudnn_rnn_backward: zeros_like for the gradients the loss did not reach, then backward data and weights
    if a.get("grad_output") is None and a.get("output") is not None:
        out.append(RnnScratch(_nbytes(a.get("output")), "cudnn rnn backward: zeros_like(output)", "op", 0))
    if a.get("grad_hy") is None:
        out.append(RnnScratch(_nbytes(a.get("hx")), "cudnn rnn backward: zeros_like(hx)", "op", 0))
    if a.get("cx") is not None and a.get("grad_cy") is None:
        out.append(RnnScratch(_nbytes(a.get("cx")), "cudnn rnn backward: zeros_like(cx)", "op", 0))
    grad_output = a.get("grad_output")
    if grad_output is not None and batch_first:
        copy += grad_output.nbytes        # dy = grad_output.transpose(0, 1).contiguous()
    if copy:
        out.append(RnnScratch(copy, "cudnn rnn backward data: contiguous inputs (batch_first)", "kernel", 1))
    out.append(RnnScratch(workspace, "cudnn rnn backward data workspace (modelled)", "kernel", 1))
    mask = tuple(a.get("output_mask") or (True, True, True, True))
    if len(mask) > 3 and mask[3]:
        if batch_first:
            out.append(RnnScratch(inp.nbytes, "cudnn rnn backward weights: input.contiguous() (batch_first)",
                                  "kernel", 2))
        out.append(RnnScratch(workspace, "cudnn rnn backward weights workspace (modelled)", "kernel", 2))
    return [r for r in out if r.size_bytes > 0]
