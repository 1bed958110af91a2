"""A model the script builds on ``meta`` itself holds no device memory until ``to_empty(device="cuda")``.

torchtitan builds every model under ``with torch.device("meta"):``, parallelises it, then calls
``model.to_empty(device="cuda")`` and ``init_weights()``. On a GPU the meta tensors hold nothing;
``to_empty`` makes one device tensor per parameter and buffer (``torch.empty_like(t, device=device)``
in ``Module.to_empty``, torch/nn/modules/module.py); ``Module.to("cuda")`` of a meta model is
refused (``Cannot copy out of meta tensor; no data!``). And the forward a non-reentrant checkpoint
recomputes in the backward (torch/utils/checkpoint.py) takes the same CUDA kernels as the forward
did: here scaled_dot_product_attention's memory-efficient kernel on an A100 (fp32, head size 32),
whose log-sum-exp of ``batch x heads x ceil(L / 32) * 32`` float32 is requested once in the
forward and once in the recomputation, whether the backward is ``loss.backward()`` or
``torch.autograd.backward(loss)`` (as ``torch.distributed.pipelining`` calls it).
"""

from __future__ import annotations

import os
import sys

import pytest

if os.environ.get("CI"):
    import torch  # noqa: F401  (CI installs it: a missing torch must fail, not skip)
else:
    pytest.importorskip("torch")

from allocsim.trace import read_trace  # noqa: E402
from allocsim.trace.schema import EventKind  # noqa: E402
from allocsim.torch_capture import session  # noqa: E402

pytestmark = pytest.mark.full      # one capture (seconds)

SCRIPT = '''
import torch, torch.nn as nn, torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

with torch.device("meta"):
    model = nn.Sequential(nn.Linear(1024, 1024), nn.Linear(1024, 1024))
    big = torch.zeros(4096, 300)
other = nn.Linear(512, 512, device="meta")
scaled = torch.empty(1024, 1024, device="meta") * 2
nn.init.normal_(scaled)
assert torch.cuda.memory_allocated() == 0, torch.cuda.memory_allocated()
assert model[0].weight.is_meta and big.is_meta
try:
    other.to("cuda")
    raise SystemExit("a meta module was copied to the device")
except NotImplementedError as exc:
    assert "Cannot copy out of meta tensor" in str(exc), exc
model.to_empty(device="cuda")
assert torch.cuda.memory_allocated() == 2 * (1024 * 1024 * 4 + 1024 * 4), torch.cuda.memory_allocated()
with torch.no_grad():
    for p in model.parameters():
        p.normal_()

B, H, L, D = 2, 4, 80, 32
proj = nn.Linear(H * D, 3 * H * D, device="cuda")


def attention(x):
    q, k, v = proj(x).view(B, L, 3, H, D).permute(2, 0, 3, 1, 4)
    return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, L, H * D)


x = torch.randn(B, L, H * D, device="cuda", requires_grad=True)
checkpoint(attention, x, use_reentrant=False).sum().backward()
torch.autograd.backward(checkpoint(attention, x, use_reentrant=False).sum())     # as pipeline stages call it
'''
LSE_BYTES = 2 * 4 * 96 * 4          # batch x heads x ceil(80 / 32) * 32 rows, float32


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    folder = tmp_path_factory.mktemp("meta")
    script = folder / "meta_model.py"
    script.write_text(SCRIPT)
    result, _trace = session.capture([sys.executable, str(script)], str(folder / "t.parquet"),
                                     gpu={"name": "A100 80GB", "total_bytes": 80 << 30, "major": 8, "minor": 0,
                                          "sm_count": 108})
    assert result.status == 0, result.message
    return read_trace(str(folder / "t.parquet"))


def _alloc_sizes(trace) -> list[int]:
    ev = trace.events
    return [int(s) for s in ev[ev["kind"] == int(EventKind.ALLOC)]["size_bytes"]]


def test_meta_tensors_are_never_requested_and_to_empty_makes_each_parameter(captured):
    sizes = _alloc_sizes(captured)
    # nothing made on meta (the model, the 4 MiB buffer, the Linear given device="meta", arithmetic on
    # meta) is a request: the first four are to_empty's, weight then bias of each layer in module order
    assert sizes[:4] == [1024 * 1024 * 4, 1024 * 4, 1024 * 1024 * 4, 1024 * 4]
    assert 4096 * 300 * 4 not in sizes and 512 * 512 * 4 not in sizes


def test_a_checkpointed_forward_is_recomputed_on_the_kernel_the_forward_took(captured):
    assert _alloc_sizes(captured).count(LSE_BYTES) == 2 * 2        # two steps: forward + recomputation each
