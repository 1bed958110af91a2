"""``nn.LSTM`` / ``nn.GRU`` / ``nn.RNN`` take cuDNN's fused RNN under ``allocsim capture`` (issue 39, F7).

Exact, from ``aten/src/ATen/native/cudnn/RNN.cpp``: one flat weight buffer made by
``flatten_parameters`` (the ``.cuda()`` copies released), one ``aten::_cudnn_rnn`` per call (output,
hy, cy, the training reserve), one ``aten::_cudnn_rnn_backward`` (dx, dhx, dcx, and one ``dw`` buffer
whose views are the gradients), ``zeros_like`` for the gradients the loss did not reach, the
dropout state once. Modelled (``cudnn_rnn_model``): the reserve and workspace sizes, checked here
against the model's own formula so that it cannot drift unnoticed.

One capture (module-scoped) of ``SCRIPT``; the model's unit tests need no torch child.
"""

from __future__ import annotations

import os
import sys

import pytest

from allocsim.torch_capture import cudnn_rnn_model as model
from allocsim.torch_capture.cuda_scratch import TensorMeta, scratch_events, scratch_requests

F32 = 4
# nn.LSTM(200, 200, 2): per layer w_ih 800 x in, w_hh 800 x 200, b_ih 800, b_hh 800
LSTM_PARAMS = (800 * 200 + 800 * 200 + 800 + 800) * 2
SEQ, BATCH, HIDDEN = 35, 20, 200

SCRIPT = r'''
import torch
torch.cuda.memory._record_memory_history(max_entries=1000)          # marker: the module moved
lstm = torch.nn.LSTM(200, 200, 2).cuda()
torch.cuda.memory._record_memory_history(enabled=None)
x = torch.randn(35, 20, 200, device="cuda")
h0 = torch.zeros(2, 20, 200, device="cuda")
c0 = torch.zeros(2, 20, 200, device="cuda")
torch.cuda.memory._record_memory_history(max_entries=1000)          # marker: a training step
out, (hn, cn) = lstm(x, (h0, c0))
out.sum().backward()
torch.cuda.memory._record_memory_history(enabled=None)
assert len({p.data_ptr() for p in lstm.parameters()}) == 8
assert all(p.grad is not None for p in lstm.parameters())
torch.cuda.memory._record_memory_history(max_entries=1000)          # marker: dropout, then eval
gru = torch.nn.GRU(16, 32, 2, dropout=0.5).cuda()
gru(torch.randn(5, 3, 16, device="cuda"))[0].sum().backward()
gru(torch.randn(5, 3, 16, device="cuda"))[0].sum().backward()
gru.eval()
with torch.no_grad():
    gru(torch.randn(5, 3, 16, device="cuda"))
torch.cuda.memory._record_memory_history(enabled=None)
'''


def _windows(trace):
    """Allocations (size, first frame) between each start marker and the next marker."""
    from allocsim.trace.schema import EventKind
    ev = trace.events
    windows, current = [], None
    for kind, alloc_id, size, stack_id in zip(ev["kind"], ev["alloc_id"], ev["size_bytes"], ev["stack_id"]):
        if kind == int(EventKind.MARKER):
            if current is not None:
                windows.append(current)
            current = [] if trace.labels[int(alloc_id)].startswith("memory_history start") else None
        elif current is not None and kind == int(EventKind.ALLOC):
            current.append((int(size), trace.stack(int(stack_id))[0][2]))
    return windows


@pytest.fixture(scope="module")
def windows(tmp_path_factory):
    if os.environ.get("CI"):
        import torch  # noqa: F401  (CI installs it: a missing torch must fail, not skip)
    else:
        pytest.importorskip("torch")
    from allocsim.torch_capture import session
    from allocsim.trace import read_trace
    folder = tmp_path_factory.mktemp("rnn")
    script = folder / "rnn.py"
    script.write_text(SCRIPT)
    result, _ = session.capture([sys.executable, str(script)], str(folder / "rnn.parquet"))
    assert result.status == 0, result.message
    return _windows(read_trace(str(folder / "rnn.parquet")))


@pytest.mark.full
def test_flatten_parameters_makes_one_weight_buffer(windows):
    moved = windows[0]
    # eight .cuda() copies, then _cudnn_rnn_flatten_weight's at::zeros(num_weights)
    assert [op for _size, op in moved] == ["aten::_to_copy"] * 8 + ["aten::_cudnn_rnn_flatten_weight"]
    assert moved[-1][0] == LSTM_PARAMS * F32


@pytest.mark.full
def test_one_cudnn_call_forward_and_one_backward(windows):
    step = windows[1]
    ops = [op for _size, op in step]
    assert not any(op in ops for op in ("aten::mm", "aten::addmm", "aten::sigmoid", "aten::mul.Tensor"))
    shape = model.rnn_shape(model.LSTM, (SEQ, BATCH, 200), (), False, HIDDEN, 2, False)
    forward = [size for size, op in step if op == "aten::_cudnn_rnn"]
    # output, hy, cy, the reserve (weight_buf is the flat buffer: no request)
    assert forward == [SEQ * BATCH * HIDDEN * F32, 2 * BATCH * HIDDEN * F32, 2 * BATCH * HIDDEN * F32,
                       model.reserve_bytes(shape, F32)]
    backward = [size for size, op in step if op == "aten::_cudnn_rnn_backward"]
    # dx, dhx, dcx, and one dw buffer whose views are the eight gradients
    assert backward == [SEQ * BATCH * 200 * F32, 2 * BATCH * HIDDEN * F32, 2 * BATCH * HIDDEN * F32,
                        LSTM_PARAMS * F32]
    labels = [op for _size, op in step]
    assert labels.count("cudnn rnn forward workspace (modelled)") == 1
    assert "cudnn rnn backward: zeros_like(hx)" in labels and "cudnn rnn backward: zeros_like(cx)" in labels


@pytest.mark.full
def test_dropout_state_once_and_no_reserve_in_eval(windows):
    window = windows[2]
    assert [size for size, op in window if op == "aten::_cudnn_init_dropout_state"] == [model.DROPOUT_STATE_BYTES]
    reserves = [size for size, op in window if op == "aten::_cudnn_rnn" and size > 5 * 3 * 32 * F32]
    assert len(reserves) == 2                          # two training calls; the eval call keeps none


def test_reserve_and_workspace_follow_the_stated_model():
    lstm = model.rnn_shape(model.LSTM, (35, 20, 200), (), False, 200, 2, False)
    assert lstm.rows == 700
    assert model.reserve_bytes(lstm, 4) == 700 * 6 * 200 * 2 * 4
    assert model.workspace_bytes(lstm, 4) == 700 * 4 * 200 * 4
    gru = model.rnn_shape(model.GRU, (20, 35, 16), (), True, 32, 1, True)   # batch-first, bidirectional
    assert (gru.seq_length, gru.mini_batch, gru.directions) == (35, 20, 2)
    assert model.reserve_bytes(gru, 2) == 700 * 5 * 32 * 2 * 4              # float16 computes in float32
    packed = model.rnn_shape(model.RNN_TANH, (25, 16), (10, 8, 5, 2), False, 32, 1, False)
    assert (packed.seq_length, packed.mini_batch, packed.rows) == (4, 10, 25)


def test_backward_scratch_order_and_lifetimes():
    x = TensorMeta.contiguous((8, 35, 16), "float32")            # batch-first input
    hx = TensorMeta.contiguous((1, 8, 32), "float32")
    out = TensorMeta.contiguous((8, 35, 32), "float32")
    reqs = scratch_requests("aten::_cudnn_rnn_backward", {
        "input": x, "hx": hx, "cx": hx, "output": out, "grad_output": out, "grad_hy": None, "grad_cy": None,
        "mode": model.LSTM, "hidden_size": 32, "num_layers": 1, "batch_first": True, "bidirectional": False,
        "batch_sizes": [], "output_mask": [True, True, True, True]}, "H100")
    labels = [r.label for r in reqs]
    assert labels == ["cudnn rnn backward: zeros_like(hx)", "cudnn rnn backward: zeros_like(cx)",
                      "cudnn rnn backward data: contiguous inputs (batch_first)",
                      "cudnn rnn backward data workspace (modelled)",
                      "cudnn rnn backward weights: input.contiguous() (batch_first)",
                      "cudnn rnn backward weights workspace (modelled)"]
    assert reqs[2].size_bytes == x.nbytes + out.nbytes
    # each workspace is handed back before the next phase; the zeros live to the end of the operator
    assert scratch_events(reqs) == [("alloc", 0), ("alloc", 1), ("alloc", 2), ("alloc", 3), ("free", 3),
                                    ("free", 2), ("alloc", 4), ("alloc", 5), ("free", 5), ("free", 4),
                                    ("free", 1), ("free", 0)]
