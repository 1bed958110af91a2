"""A capture's tensors say where the GPU run's would be, and keep their Python objects when moved (issue 39: F3, F8, F9, F10, F13).

One script is captured once (module-scoped): ``IDENTITY`` asks tensors where they live in every way
Python code does (``x.device``, ``repr``, ``autocast(x.device.type)``, checkpointing, custom
backward functions, pickling, ``copy=True``) and writes what it saw; its last part (after a marker)
builds a model and its optimizer on the CPU before moving the model (accelerate, Fabric), with
BatchNorm buffers and a tied embedding, and the categories of that part of the trace are compared
with the model's arithmetic.

Bytes: float32 = 4; Linear(8, 8): weight 256 B, bias 32 B; BatchNorm1d(8): weight, bias,
running_mean, running_var 32 B each, num_batches_tracked 8 B (int64); Embedding(65, 384): 99,840 B.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

if os.environ.get("CI"):
    import torch  # noqa: F401  (CI installs it: a missing torch must fail, not skip)
else:
    pytest.importorskip("torch")

from allocsim.metrics.categories import categorize  # noqa: E402
from allocsim.torch_capture import session  # noqa: E402
from allocsim.trace import read_trace  # noqa: E402
from allocsim.trace.schema import EventKind  # noqa: E402

IDENTITY = r'''
import copy, io, json, pickle, sys
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

seen = {}
x = torch.randn(2, 4, device="cuda")
seen["device"] = [x.device.type, str(x.device), x.device.index, x.is_cuda, x.get_device(), x.is_cpu, x.is_meta,
                  x.device == torch.device("cuda", 0), str(pickle.loads(pickle.dumps(x.device)))]
with torch.autocast(device_type=x.device.type, enabled=False):     # transformers' rotary embeddings
    y = x * 2
with torch.autocast(x.device.type, dtype=torch.bfloat16):
    seen["autocast"] = [str((x @ x.t()).dtype), str(torch.get_autocast_dtype(x.device.type))]
big = torch.empty(512, 1024)                      # 2 MiB: an abstract host tensor
small = torch.zeros(3)                            # a real CPU tensor
seen["host"] = [str(big.device), big.is_cpu, big.is_cuda, big.get_device(), big.is_meta, str(small.device)]
seen["data_ptr"] = [x.data_ptr() != 0, x[1].data_ptr() - x.data_ptr(), x.data_ptr() != y.data_ptr(),
                    big.data_ptr() != x.data_ptr()]
seen["from_device"] = [str(torch.empty(3, device=x.device).device), str(x.new_zeros(2).device),
                       str(big.to(x.device).device), str(torch.zeros_like(x, device="cpu").device)]
ids = torch.tensor([1, 2, 3]).cuda()
seen["repr"] = [repr(y), repr(ids), repr(ids.cpu()), f"{(x * 0).sum():.3f}", str(x.sum()),
                repr(nn.Parameter(torch.zeros(2, device="cuda")))]

# copy=True copies, a plain .to() of a device tensor does not (GradScaler's per-device scale)
before = torch.cuda.memory_allocated()
c = x.to(x.device, copy=True)
seen["copy"] = [torch.cuda.memory_allocated() - before, x.to(x.device) is x, x.to("cuda", torch.float32) is x]
conv = nn.Conv2d(3, 8, 3).cuda().to(memory_format=torch.channels_last)
seen["channels_last"] = conv.weight.is_contiguous(memory_format=torch.channels_last)

# the backward runs under the capture: custom functions, hooks and checkpoint's recomputation see the GPU
class Twice(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t):
        return t * 2
    @staticmethod
    def backward(ctx, g):
        seen["custom_backward"] = [str(g.device), torch.zeros(2, device=g.device).is_cuda]
        return g * 2

lin = nn.Linear(64, 64).cuda()
inp = torch.randn(8, 64, device="cuda", requires_grad=True)
hooked = []
lin.weight.register_hook(lambda g: hooked.append(str(g.device)))
Twice.apply(lin(inp)).sum().backward()
torch.cuda.memory._record_memory_history(max_entries=1000)     # marker: the checkpointed window
for reentrant in (False, True):
    out = checkpoint(lambda t: nn.functional.dropout(lin(t), 0.1), inp, use_reentrant=reentrant)
    out.sum().backward()
torch.cuda.memory._record_memory_history(enabled=None)
# F14: non-reentrant checkpointing around SDPA saves the same tensors in the forward and the recomputation
proj = nn.Linear(64, 64).cuda().to(torch.bfloat16)
def attention_block(t):
    h = proj(t).view(2, 16, 4, 16).transpose(1, 2)
    return nn.functional.scaled_dot_product_attention(h, h, h, is_causal=True).transpose(1, 2).reshape(2, 16, 64)
xa = torch.randn(2, 16, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
checkpoint(attention_block, xa, use_reentrant=False).sum().backward()
seen["checkpoint_sdpa"] = str(xa.grad.dtype)
(g,) = torch.autograd.grad((lin.weight * 2).sum(), lin.weight)
seen["backward"] = [hooked[0], str(g.device), str(inp.grad.device)]

# pickling: a state dict round trip in memory, a deep copy
buf = io.BytesIO()
torch.save(lin.state_dict(), buf)
buf.seek(0)
seen["pickle"] = [str(torch.load(buf)["weight"].device), str(copy.deepcopy(lin).weight.device)]

# DataParallel's own device check: a parameter left on the host is refused with torch's message
dp = nn.DataParallel(nn.Linear(4, 4)).cuda()
dp.module.extra = nn.Parameter(torch.empty(512, 1024))
try:
    dp(torch.randn(2, 4, device="cuda"))
    seen["dataparallel"] = "ran"
except RuntimeError as exc:
    seen["dataparallel"] = str(exc)

# --- moves (F9, F10, F13): from this marker to the end, the categories are the model's arithmetic
torch.cuda.memory._record_memory_history(max_entries=7)
model = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8))     # small: real CPU tensors until moved
w = model[0].weight
opt = torch.optim.AdamW(model.parameters())                   # built before the move (accelerate, Fabric)
model.cuda()
emb = nn.Embedding(65, 384)
head = nn.Linear(384, 65, bias=False)
head.weight = emb.weight                                      # tied (nanoGPT's wte and lm_head)
before = torch.cuda.memory_allocated()
tied = nn.ModuleList([emb, head]).to("cuda")
moved_bytes = torch.cuda.memory_allocated() - before
loss = model(torch.randn(4, 8, device="cuda")).sum() + head(emb(torch.tensor([[1, 2]], device="cuda"))).sum()
loss.backward()
opt.step()
seen["moves"] = {"same_object": model[0].weight is w, "still_tied": head.weight is emb.weight,
                 "tied_bytes": moved_bytes, "state": [str(v["exp_avg"].device) for v in opt.state.values()]}
print("SEEN " + json.dumps(seen))          # stdout: the capture sends file writes to a scratch folder
'''




def seen_in(stdout_text: str) -> dict:
    """What the script printed on its ``SEEN`` line (a file it wrote would go to the capture's scratch folder)."""
    line = [text for text in stdout_text.splitlines() if text.startswith("SEEN ")][-1]
    return json.loads(line[len("SEEN "):])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The script captured once: {"identity": (result, trace, seen)}."""
    folder = tmp_path_factory.mktemp("identity")
    script, out_path = folder / "identity.py", folder / "stdout.txt"
    script.write_text(IDENTITY)
    with open(out_path, "w") as out:
        result, _ = session.capture([sys.executable, str(script)], str(folder / "identity.parquet"), stdout=out)
    assert result.status == 0, result.message
    return {"identity": (result, read_trace(str(folder / "identity.parquet")), seen_in(out_path.read_text()))}


@pytest.mark.full
def test_device_tensors_say_cuda_0_and_host_tensors_cpu(runs):
    seen = runs["identity"][2]
    assert seen["device"] == ["cuda", "cuda:0", 0, True, 0, False, False, True, "cuda:0"]
    assert seen["autocast"] == ["torch.bfloat16", "torch.bfloat16"]
    assert seen["host"] == ["cpu", True, False, -1, False, "cpu"]          # F8: a 2 MiB CPU tensor says cpu
    assert seen["from_device"] == ["cuda:0", "cuda:0", "cuda:0", "cpu"]
    assert seen["data_ptr"] == [True, 4 * 4, True, True]      # distinct storages; a row of 4 float32 further


@pytest.mark.full
def test_tensors_print_as_cuda_tensors(runs):
    y, ids, ids_cpu, formatted, summed, param = runs["identity"][2]["repr"]
    assert y == "tensor([[0., 0., 0., 0.],\n        [0., 0., 0., 0.]], device='cuda:0')"
    assert ids == "tensor([1, 2, 3], device='cuda:0')"          # values from the data
    assert ids_cpu == "tensor([1, 2, 3])"                         # .cpu() keeps them
    assert formatted == "0.000" and summed == "tensor(0., device='cuda:0')"
    assert param == "Parameter containing:\ntensor([0., 0.], device='cuda:0', requires_grad=True)"


@pytest.mark.full
def test_to_follows_tensor_to_on_the_device(runs):
    seen = runs["identity"][2]
    assert seen["copy"] == [512, True, True]      # one copy of 2 x 4 float32 (32 B) in a 512-byte block
    assert seen["channels_last"] is True


@pytest.mark.full
def test_the_backward_runs_under_the_capture(runs):
    _result, trace, seen = runs["identity"]
    assert seen["custom_backward"] == ["cuda:0", True]
    assert seen["checkpoint_sdpa"] == "torch.bfloat16"
    assert seen["backward"] == ["cuda:0", "cuda:0", "cuda:0"]
    # checkpoint's recomputation runs CUDA's fused dropout as the forward did: its output and one-byte
    # mask in each forward and each recomputation (2 x 2 calls), no unfused bernoulli
    ev = trace.events
    ops, inside = [], False
    for kind, alloc_id, stack_id in zip(ev["kind"], ev["alloc_id"], ev["stack_id"]):
        if kind == int(EventKind.MARKER):
            inside = trace.labels[int(alloc_id)].startswith("memory_history start")
        elif inside and kind == int(EventKind.ALLOC):
            ops.append(trace.stack(int(stack_id))[0][2])
    assert ops.count("aten::native_dropout") == 8, ops
    assert not any("bernoulli" in op for op in ops)


@pytest.mark.full
def test_pickling_and_dataparallel(runs):
    seen = runs["identity"][2]
    assert seen["pickle"] == ["cuda:0", "cuda:0"]
    assert seen["dataparallel"] == ("module must have its parameters and buffers on device cuda:0 (device_ids[0]) "
                                    "but found one of them on device: cpu")


@pytest.mark.full
def test_moved_modules_keep_their_parameters_buffers_and_ties(runs):
    _result, trace, seen = runs["identity"]
    moves = seen["moves"]
    assert moves["same_object"] is True and moves["still_tied"] is True           # F13
    assert moves["tied_bytes"] == 65 * 384 * 4                                    # F10: one copy
    assert moves["state"] == ["cuda:0"] * 4
    ev = trace.events
    start = next(i for i, (kind, alloc_id) in enumerate(zip(ev["kind"], ev["alloc_id"]))
                 if kind == int(EventKind.MARKER) and trace.labels[int(alloc_id)] == "memory_history start max_entries=7")
    window = ev.iloc[start:]
    allocs = window[window["kind"] == int(EventKind.ALLOC)]
    by = categorize(trace).split(allocs["alloc_id"].to_numpy(), allocs["size_bytes"].to_numpy())
    linear, bn_params, bn_buffers, embedding = 256 + 32, 2 * 32, 2 * 32 + 8, 65 * 384 * 4
    assert by["parameter"] == linear + bn_params + bn_buffers + embedding         # F9: buffers are parameters
    assert by["gradient"] == linear + bn_params + embedding
    assert by["optimizer_state"] == 2 * (linear + bn_params)                      # exp_avg, exp_avg_sq
