"""Every device and optimizer path a script can take runs under ``allocsim capture`` as on one CUDA GPU (issue 39).

One script (``PATHS``) walks the paths and prints what it saw (a ``SEEN`` line: files it writes go to
the capture's scratch folder); it is captured twice (A100 80GB: compute capability 8.0; H100: 9.0)
in one module-scoped fixture, and ends with a
deliberate error so the same run also shows the script's traceback. The SDPA choice itself is
checked in this process on meta tensors (``allocsim.torch_capture.sdpa``: no child needed).

Byte counts follow the shapes and PyTorch's CUDA code: float32 = 4 bytes, bfloat16 = 2, bool = 1;
``torch.cuda.memory_allocated`` answers in the caching allocator's blocks (multiples of 512 bytes).
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

if os.environ.get("CI"):
    import torch  # noqa: F401  (CI installs it: a missing torch must fail, not skip)
else:
    pytest.importorskip("torch")

import torch  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from allocsim.torch_capture import datadep, legacy, sdpa, tracebacks  # noqa: E402
from allocsim.trace import read_trace  # noqa: E402
from allocsim.trace.schema import EventKind  # noqa: E402
from allocsim.torch_capture import session  # noqa: E402

PATHS = r'''
import json, sys
import torch
import torch.nn.functional as F

seen = {}
acc = torch.accelerator
seen["accelerator"] = [str(acc.current_accelerator()), str(acc.current_accelerator(check_available=True)),
                       acc.current_device_index(), acc.device_count(), acc.is_available()]
with acc.device_index(0):
    seen["accelerator_stream"] = acc.current_stream() == torch.cuda.current_stream()
acc.synchronize()
seen["accelerator_memory"] = acc.memory_allocated() == torch.cuda.memory_allocated()

# integer and string devices, device contexts, the default device
m = torch.nn.Linear(8, 8).to(0)
seen["devices"] = [m.weight.is_cuda, torch.ones(2).to(0).is_cuda, torch.ones(2, device=0).is_cuda,
                   str(torch.device(0)), torch.ones(2, device="cuda:0").is_cuda, torch.ones(2).cuda(0).is_cuda,
                   torch.ones(2, device="cuda").get_device()]
with torch.cuda.device(0):
    seen["cuda_device_context"] = torch.ones(2, device="cuda").is_cuda
torch.set_default_device("cuda")
seen["default_device"] = [torch.ones(3).is_cuda, torch.nn.Linear(2, 2).weight.is_cuda, str(torch.get_default_device())]
torch.set_default_device(None)
seen["default_device_after"] = [torch.ones(3).is_cuda, str(torch.get_default_device())]

# optimizers: the step's own requests, measured in blocks around step()
def step_bytes(optimizer_cls, **options):
    model = torch.nn.Linear(256, 256).cuda()
    opt = optimizer_cls(model.parameters(), lr=1e-3, **options)
    model(torch.randn(8, 256, device="cuda")).sum().backward()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    opt.step()
    after = torch.cuda.memory_allocated()
    return [after - before, torch.cuda.max_memory_allocated() - before]

seen["adamw_fused"] = step_bytes(torch.optim.AdamW, fused=True)
seen["adamw_foreach"] = step_bytes(torch.optim.AdamW, foreach=True)
seen["adam_capturable"] = step_bytes(torch.optim.Adam, capturable=True)
seen["sgd_fused"] = step_bytes(torch.optim.SGD, momentum=0.9, fused=True)
seen["adagrad_fused"] = step_bytes(torch.optim.Adagrad, fused=True)
try:
    torch.optim.AdamW([torch.zeros(4, dtype=torch.long, device="cuda")], fused=True)
    seen["fused_int_params"] = "built"
except RuntimeError as exc:
    seen["fused_int_params"] = str(exc)

# DataParallel on the one GPU: the input is copied to the device on the copy stream
torch.cuda.memory._record_memory_history(max_entries=10)     # a marker: the trace's DataParallel window
dp = torch.nn.DataParallel(torch.nn.Linear(64, 64)).cuda()
out = dp(torch.randn(32, 64))
seen["dataparallel"] = [out.is_cuda, list(out.shape)]
torch.cuda.memory._record_memory_history(enabled=None)

# legacy tensor types
x = torch.randn(4, 4)
seen["legacy"] = [torch.cuda.FloatTensor(3, 4).is_cuda, list(torch.cuda.FloatTensor(3, 4).shape),
                  str(torch.cuda.LongTensor([1, 2]).dtype), x.type(torch.cuda.FloatTensor).is_cuda,
                  str(x.type("torch.cuda.HalfTensor").dtype), x.cuda().type(),
                  isinstance(x.cuda(), torch.cuda.FloatTensor), isinstance(x, torch.cuda.FloatTensor),
                  x.cuda().type("torch.FloatTensor").is_cuda]

# a CPU tensor meeting a device tensor
d = torch.randn(4, 4, device="cuda")
seen["cpu_scalar"] = (d + torch.tensor(2.0)).is_cuda
seen["cpu_index"] = list(d[torch.tensor([0, 2])].shape)
try:
    d + torch.ones(4, 4)
    seen["cpu_operand"] = "no error"
except RuntimeError as exc:
    seen["cpu_operand"] = str(exc)

# masked attention (bf16, boolean mask) between markers
q, k, v = (torch.randn(2, 4, 128, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
mask = torch.ones(2, 1, 128, 128, dtype=torch.bool, device="cuda")
torch.cuda.memory._record_memory_history(max_entries=20)
y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
torch.cuda.memory._record_memory_history(enabled=None)
y.sum().backward()

# data-dependent shapes: values from the data, upper bounds otherwise
ids = torch.tensor([[5, 7, 0, 0], [1, 2, 3, 0]]).cuda()
keep = ids != 0
h = torch.randn(2, 4, 16, device="cuda")
seen["values"] = [bool(keep.all()), keep.sum().item(), list(h[keep].shape), list(keep.nonzero().shape),
                  list(ids.unique().shape), [list(t.shape) for t in torch.where(keep)],
                  list(torch.repeat_interleave(keep.long().sum(-1)).shape), keep.tolist()]
seen["upper_bound"] = [list((h > 0).nonzero().shape), list(h.masked_select(h > 0).shape), list(h.unique().shape)]
seen["branch"] = "padded" if not keep.all() else "full"

# torch.compile in its forms runs eager
lin = torch.nn.Linear(4, 4).cuda()
a = torch.compile(lin, mode="max-autotune")
@torch.compile
def twice(t):
    return t * 2
@torch.compile(mode="reduce-overhead", fullgraph=True)
def thrice(t):
    return t * 3
lin.compile()
z = torch.ones(2, 4, device="cuda")
seen["compile"] = [a(z).is_cuda, twice(z).is_cuda, thrice(z).is_cuda, lin(z).is_cuda]

print("SEEN " + json.dumps(seen))          # stdout: the capture sends file writes to a scratch folder


def fails_here(t):
    return t.view(7, 3)


fails_here(torch.ones(4, device="cuda"))
'''

BLOCK = 512
W_BYTES, B_BYTES = 256 * 256 * 4, 256 * 4          # Linear(256, 256): weight, bias (float32)
A100 = {"name": "A100 80GB", "major": 8, "minor": 0, "sm_count": 108, "total_bytes": 85899345920}
H100 = {"name": "H100", "major": 9, "minor": 0, "sm_count": 132, "total_bytes": 85018279936}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The script captured on an A100 and an H100: {card: (result, trace, seen, stderr)}."""
    folder = tmp_path_factory.mktemp("paths")
    script = folder / "paths.py"
    script.write_text(PATHS)
    results = {}
    for card, gpu in (("A100", A100), ("H100", H100)):
        out_path, err_path = folder / f"out-{card}.txt", folder / f"err-{card}.txt"
        with open(out_path, "w") as out, open(err_path, "w") as err:
            result, _ = session.capture([sys.executable, str(script)], str(folder / f"{card}.parquet"),
                                        gpu=gpu, stdout=out, stderr=err)
        seen_line = [line for line in out_path.read_text().splitlines() if line.startswith("SEEN ")][-1]
        results[card] = (result, read_trace(str(folder / f"{card}.parquet")), json.loads(seen_line[len("SEEN "):]),
                         err_path.read_text())
    return results


@pytest.mark.full
def test_the_script_ran_to_its_deliberate_error_on_both_cards(runs):
    for result, _trace, _seen, _err in runs.values():
        assert result.status == 3 and "shape '[7, 3]' is invalid" in result.message


@pytest.mark.full
def test_torch_accelerator_is_the_cuda_gpu(runs):
    seen = runs["A100"][2]
    assert seen["accelerator"] == ["cuda", "cuda", 0, 1, True]
    assert seen["accelerator_stream"] is True and seen["accelerator_memory"] is True


@pytest.mark.full
def test_integer_devices_contexts_and_the_default_device(runs):
    seen = runs["A100"][2]
    assert seen["devices"] == [True, True, True, "cuda:0", True, True, 0]
    assert seen["cuda_device_context"] is True
    assert seen["default_device"] == [True, True, "cuda:0"]
    assert seen["default_device_after"] == [False, "cpu"]


@pytest.mark.full
def test_fused_steps_allocate_their_state_and_nothing_else(runs):
    seen = runs["A100"][2]
    state = 2 * (W_BYTES + B_BYTES)                  # exp_avg and exp_avg_sq of weight and bias
    counters = 2 * BLOCK                             # fused/capturable: a 0-dim float32 step per parameter on the device
    # fused AdamW: no temporaries (MultiTensorApply passes the lists as kernel arguments): peak == after
    assert seen["adamw_fused"] == [state + counters, state + counters]
    # foreach AdamW: host step counters, and temporaries freed within the step (peak above the end)
    assert seen["adamw_foreach"][0] == state and seen["adamw_foreach"][1] > state
    assert seen["adam_capturable"][0] == state + counters
    # fused SGD with momentum: the first step's momentum buffers (empty_like(grad)), nothing else
    assert seen["sgd_fused"] == [W_BYTES + B_BYTES, W_BYTES + B_BYTES]
    # fused Adagrad: its state_sum was made at construction; the step adds only nothing
    assert seen["adagrad_fused"] == [0, 0]


@pytest.mark.full
def test_fused_with_integer_parameters_fails_when_the_optimizer_is_built(runs):
    message = runs["A100"][2]["fused_int_params"]
    assert "`fused=True` requires all the params to be floating point" in message and "built" in message


@pytest.mark.full
def test_dataparallel_on_one_gpu_copies_the_input_on_the_copy_stream(runs):
    _result, trace, seen, _err = runs["A100"]
    assert seen["dataparallel"] == [True, [32, 64]]
    events = trace.events
    copies = events[(events["kind"] == int(EventKind.ALLOC)) & (events["size_bytes"] == 32 * 64 * 4)]
    assert (copies["stream"] != 0).any()            # Scatter's background copy stream, as comm.scatter uses it


@pytest.mark.full
def test_legacy_tensor_types(runs):
    assert runs["A100"][2]["legacy"] == [True, [3, 4], "torch.int64", True, "torch.float16",
                                         "torch.cuda.FloatTensor", True, False, False]


@pytest.mark.full
def test_cpu_scalars_and_indices_pass_and_cpu_operands_raise_cudas_error(runs):
    seen = runs["A100"][2]
    assert seen["cpu_scalar"] is True and seen["cpu_index"] == [2, 4]
    assert seen["cpu_operand"] == ("Expected all tensors to be on the same device, but found at least two "
                                   "devices, cuda:0 and cpu!")


def _requests_between_markers(trace, first: str) -> list[int]:
    """Sizes of the requests made from the marker ``first`` to the next marker."""
    events = trace.events
    sizes, inside = [], False
    for kind, alloc_id, size in zip(events["kind"], events["alloc_id"], events["size_bytes"]):
        if kind == int(EventKind.MARKER):
            if inside:
                return sizes
            inside = trace.labels[int(alloc_id)] == first
        elif inside and kind == int(EventKind.ALLOC):
            sizes.append(int(size))
    return sizes


@pytest.mark.full
def test_masked_bf16_attention_takes_the_memory_efficient_kernel_on_an_a100(runs):
    mask, mask_bf16 = 2 * 128 * 128, 2 * 128 * 128 * 2
    out, lse = 2 * 4 * 128 * 64 * 2, 2 * 4 * 128 * 4      # lse rows rounded up to 32 (128 already is)
    sizes = _requests_between_markers(runs["A100"][1], "memory_history start max_entries=20")
    # convert_boolean_attn_mask: the device zero (scalar_tensor on the mask's device), logical_not(mask),
    # -inf as a device scalar (where.ScalarSelf wraps it on the other operand's device), where(...) in
    # bf16; then the kernel's output and log-sum-exp. The mask is aligned: no pad_bias copy.
    assert sizes[:6] == [2, mask, 2, mask_bf16, out, lse]


@pytest.mark.full
def test_masked_bf16_attention_takes_cudnn_on_an_h100(runs):
    mask, mask_bf16 = 2 * 128 * 128, 2 * 128 * 128 * 2
    out, stats = 2 * 4 * 128 * 64 * 2, 2 * 4 * 128 * 1 * 4
    sizes = _requests_between_markers(runs["H100"][1], "memory_history start max_entries=20")
    # convert_boolean_attn_mask_cudnn's zero is a CPU scalar: no device request for it
    assert sizes[:4] == [mask, mask_bf16, out, stats]
    assert any("cudnn_attention" in note for note in runs["H100"][1].meta.notes)


@pytest.mark.full
def test_data_dependent_shapes_use_values_from_the_data_and_upper_bounds_otherwise(runs):
    _result, trace, seen, _err = runs["A100"]
    assert seen["values"] == [False, 5, [5, 16], [5, 2], [6], [[5], [5]], [5],
                              [[True, True, False, False], [True, True, True, False]]]
    assert seen["upper_bound"] == [[128, 3], [128], [128]]    # h: 2 x 4 x 16, every element
    assert seen["branch"] == "padded"
    assert any("upper bound" in note and "aten::nonzero" in note for note in trace.meta.notes)


@pytest.mark.full
def test_torch_compile_in_every_form_runs_eager(runs):
    _result, trace, seen, _err = runs["A100"]
    assert seen["compile"] == [True, True, True, True]
    assert any("torch.compile ran eager" in note for note in trace.meta.notes)


@pytest.mark.full
def test_the_traceback_starts_and_ends_with_the_scripts_frames(runs):
    err = runs["A100"][3]
    block = err[err.index("Traceback (most recent call last):"):].splitlines()
    files = [line.strip() for line in block if line.strip().startswith("File ")]
    assert files and all("paths.py" in line for line in files), files
    assert "child.py" not in err and "runpy" not in err
    assert "RuntimeError: shape '[7, 3]' is invalid for input of size 4" in err


# ----------------------------------------------------------------------------- in this process


def _qkv(b=2, h=4, s=128, d=64, dtype=torch.bfloat16, grad=True, kv_heads=None):
    q = torch.empty(b, h, s, d, dtype=dtype, device="meta", requires_grad=grad)
    k = torch.empty(b, kv_heads or h, s, d, dtype=dtype, device="meta", requires_grad=grad)
    v = torch.empty(b, kv_heads or h, s, d, dtype=dtype, device="meta", requires_grad=grad)
    return q, k, v


def _choice(capability, version=(2, 13), mask=None, dropout=0.0, causal=False, gqa=False, **shape):
    q, k, v = _qkv(**shape)
    params = sdpa.Params(q, k, v, mask, dropout, causal, gqa, capability, q.requires_grad)
    return sdpa.select_backend(params, sdpa.rules_for(version))


def test_sdpa_choice_without_a_mask_follows_the_gpu_and_dropout():
    assert _choice((8, 0), causal=True) == sdpa.FLASH
    assert _choice((9, 0), causal=True) == sdpa.CUDNN                   # torch 2.13's cuDNN 9.20 is past the gate
    assert _choice((9, 0), causal=True, dropout=0.1) == sdpa.FLASH      # cuDNN dropout comes in steps of 1/16
    assert _choice((9, 0), causal=True, version=(2, 10)) == sdpa.FLASH  # 2.10 wheels carry cuDNN 9.10
    assert _choice((9, 0), causal=True, version=(2, 11)) == sdpa.CUDNN
    assert _choice((8, 6), causal=True) == sdpa.FLASH
    assert _choice((7, 5), causal=True, dtype=torch.float16) == sdpa.EFFICIENT   # flash needs sm80


def test_sdpa_choice_with_masks_dtypes_and_head_sizes():
    bool_mask = torch.empty(2, 1, 128, 128, dtype=torch.bool, device="meta")
    assert _choice((8, 0), mask=bool_mask) == sdpa.EFFICIENT
    assert _choice((9, 0), mask=bool_mask) == sdpa.CUDNN
    assert _choice((8, 0), dtype=torch.float32) == sdpa.EFFICIENT        # flash and cuDNN take half types only
    assert _choice((8, 0), d=320) == sdpa.EFFICIENT                      # flash: head size <= 256
    assert _choice((8, 0), d=60) == sdpa.FLASH                           # attention.cpp pads it to 64
    assert _choice((8, 0), d=60, mask=bool_mask) == sdpa.MATH            # mem-efficient bf16: head size % 8
    assert _choice((8, 0), dtype=torch.float32, d=60, mask=bool_mask) == sdpa.EFFICIENT  # fp32 needs % 4
    assert _choice((8, 0), gqa=True, kv_heads=2, causal=True) == sdpa.FLASH
    assert _choice((8, 0), kv_heads=2) == sdpa.MATH                      # different heads without enable_gqa


def test_sdpa_choice_respects_the_scripts_backend_settings():
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
        assert _choice((9, 0), causal=True) == sdpa.EFFICIENT
    with sdpa_kernel([SDPBackend.MATH]):
        assert _choice((8, 0), causal=True) == sdpa.MATH
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        with pytest.raises(RuntimeError, match="No available kernel"):
            _choice((8, 0), mask=torch.empty(128, 128, dtype=torch.bool, device="meta"))


def test_sdpa_mask_preprocessing_pads_unaligned_masks_to_eight():
    q, k, _v = _qkv(s=100)
    mask = torch.empty(2, 1, 100, 100, device="meta", dtype=torch.bfloat16)
    padded = sdpa._preprocess_mask(mask, q, k)
    assert padded.shape == (2, 4, 100, 100) and padded.untyped_storage().nbytes() == 2 * 100 * 104 * 2
    aligned = torch.empty(2, 1, 128, 128, device="meta", dtype=torch.bfloat16)
    assert sdpa._preprocess_mask(aligned, *_qkv()[:2]).untyped_storage().nbytes() == 2 * 128 * 128 * 2


def test_legacy_type_names_parse_to_dtype_and_device():
    assert legacy.parse_type("torch.cuda.HalfTensor") == (torch.float16, True)
    assert legacy.parse_type("torch.LongTensor") == (torch.int64, False)
    assert legacy.parse_type(torch.cuda.FloatTensor) == (torch.float32, True)
    assert legacy.parse_type("numpy.float32") is None


def test_upper_bounds_of_data_dependent_operators():
    x = torch.empty(3, 5)
    assert datadep._upper_bound(torch.ops.aten.nonzero.default, (x,), {}).shape == (15, 2)
    out = datadep._upper_bound(torch.ops.aten._unique2.default, (x, True, True, False), {})
    assert [tuple(t.shape) for t in out] == [(15,), (3, 5), (0,)]
    assert datadep.cuda_device_error("Tensor on device cpu is not on the expected device meta!") == (
        "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!")


def test_tracebacks_leave_out_the_capture_frames():
    code = textwrap.dedent("""
        def inner():
            raise ValueError("boom")
        inner()
        """)
    try:
        exec(compile(code, "train.py", "exec"), {})
    except ValueError as exc:
        text = tracebacks.script_traceback(exc)
    assert text.startswith("Traceback (most recent call last):")
    assert 'File "train.py", line 4' in text and "test_capture_paths.py" in text
    assert text.rstrip().endswith("ValueError: boom")
