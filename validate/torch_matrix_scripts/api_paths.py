"""The device and optimizer paths of tests/test_capture_paths.py, written to run under torch 2.4 to 2.15
(what a release lacks, such as torch.accelerator before 2.6, is skipped as a script for that release would)."""
import json, sys
import torch
import torch.nn.functional as F

seen = {}
if hasattr(torch, "accelerator"):
    acc = torch.accelerator
    seen["accelerator"] = [str(acc.current_accelerator()), str(acc.current_accelerator(check_available=True)),
                           acc.current_device_index(), acc.device_count(), acc.is_available()]
    if hasattr(acc, "device_index"):
        with acc.device_index(0):
            seen["accelerator_stream"] = acc.current_stream() == torch.cuda.current_stream()
    acc.synchronize()
    if hasattr(acc, "memory_allocated"):
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
seen["default_device_after"] = [torch.ones(3).is_cuda]

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

print(json.dumps(seen))

