"""How long per-rank capture of a 3D-parallel job takes, and how much memory: ``python benchmarks/capture_parallel.py``.

Writes a Llama-shaped training script (attention with grouped KV heads, SwiGLU MLP, RMSNorm; the
Llama 3.1 8B / 70B / 405B sizes) that builds its pipeline stage layer by layer on the CPU, moves
each layer to the GPU, shards it with tensor parallel (``parallelize_module``: column-wise q/k/v,
w1/w3, row-wise o/w2) and FSDP2 (``fully_shard`` over the data-parallel dimension), and trains one
step of a 1F1B pipeline schedule (``torch.distributed.pipelining``) over a (pp, dp, tp) device mesh;
then runs ``allocsim capture -o DIR -- torchrun --nnodes N --nproc-per-node 8 ...`` on it and
prints one row per model: parallelism, world size, roles, seconds, the largest RSS of a capture
child (the script's process) and of allocsim's own process, and the limiting rank's peaks
(``allocsim run DIR --gpu H100 --json``). Nothing is computed on a device and no weights are held.

    python benchmarks/capture_parallel.py                 # 8b, 70b and 405b rows
    python benchmarks/capture_parallel.py --model 405b --layers 8    # fewer layers: a quicker look
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import textwrap
import time

#: Llama 3.1 shapes (dim, layers, heads, kv heads, ffn hidden, vocab) and the parallelism of each row.
MODELS = {
    "8b": dict(dim=4096, layers=32, heads=32, kv_heads=8, ffn=14336, vocab=128256, pp=1, dp=8, tp=1, nodes=1),
    "70b": dict(dim=8192, layers=80, heads=64, kv_heads=8, ffn=28672, vocab=128256, pp=1, dp=32, tp=8, nodes=32),
    "405b": dict(dim=16384, layers=126, heads=128, kv_heads=8, ffn=53248, vocab=128256, pp=8, dp=8, tp=8, nodes=64),
}

SCRIPT = '''
import os, torch, torch.nn as nn, torch.nn.functional as F, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy
from torch.distributed.tensor.parallel import parallelize_module, ColwiseParallel, RowwiseParallel
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

C = {config}
dist.init_process_group("nccl")
mesh = init_device_mesh("cuda", (C["pp"], C["dp"], C["tp"]), mesh_dim_names=("pp", "dp", "tp"))
pp_rank = mesh["pp"].get_local_rank()
head_dim = C["dim"] // C["heads"]


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        d, kv = C["dim"], C["kv_heads"] * head_dim
        self.attention_norm = nn.RMSNorm(d)
        self.wq, self.wk, self.wv = nn.Linear(d, d, bias=False), nn.Linear(d, kv, bias=False), nn.Linear(d, kv, bias=False)
        self.wo = nn.Linear(d, d, bias=False)
        self.ffn_norm = nn.RMSNorm(d)
        self.w1, self.w3 = nn.Linear(d, C["ffn"], bias=False), nn.Linear(d, C["ffn"], bias=False)
        self.w2 = nn.Linear(C["ffn"], d, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        h = self.attention_norm(x)
        q = self.wq(h).view(b, s, -1, head_dim).transpose(1, 2)
        k = self.wk(h).view(b, s, -1, head_dim).transpose(1, 2)
        v = self.wv(h).view(b, s, -1, head_dim).transpose(1, 2)
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, -1)
        x = x + self.wo(o)
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Stage(nn.Module):
    def __init__(self, first, last, n_layers):
        super().__init__()
        self.tok = nn.Embedding(C["vocab"], C["dim"]) if first else None
        self.layers = nn.ModuleList()
        self.norm = nn.RMSNorm(C["dim"]) if last else None
        self.out = nn.Linear(C["dim"], C["vocab"], bias=False) if last else None
        self.n_layers = n_layers

    def forward(self, x):
        if self.tok is not None:
            x = self.tok(x)
        for layer in self.layers:
            x = layer(x)
        if self.out is not None:
            x = self.out(self.norm(x))
        return x


per_stage = C["layers"] // C["pp"]
first, last = pp_rank == 0, pp_rank == C["pp"] - 1
stage_module = Stage(first, last, per_stage).cuda()
tp = mesh["tp"]
mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
plan = {"wq": ColwiseParallel(), "wk": ColwiseParallel(), "wv": ColwiseParallel(), "wo": RowwiseParallel(),
        "w1": ColwiseParallel(), "w3": ColwiseParallel(), "w2": RowwiseParallel()}
for _ in range(per_stage):
    block = Block().cuda()                      # one layer at a time on the device, then sharded
    if C["tp"] > 1:
        parallelize_module(block, tp, plan)
    fully_shard(block, mesh=mesh["dp"], mp_policy=mp)
    stage_module.layers.append(block)
fully_shard(stage_module, mesh=mesh["dp"], mp_policy=mp)
opt = torch.optim.AdamW(stage_module.parameters(), lr=1e-4)
mb, seq, n_micro = 1, C["seq"], C["micro"]
if C["pp"] > 1:
    stage = PipelineStage(stage_module, pp_rank, C["pp"], torch.device("cuda"), group=mesh["pp"].get_group())
    schedule = Schedule1F1B(stage, n_micro, loss_fn=lambda out, target: F.cross_entropy(out.flatten(0, 1).float(),
                                                                                         target.flatten()))
    tokens = torch.randint(0, C["vocab"], (mb * n_micro, seq), device="cuda")
    if first:
        schedule.step(tokens)
    elif last:
        schedule.step(target=tokens)
    else:
        schedule.step()
else:
    tokens = torch.randint(0, C["vocab"], (mb, seq), device="cuda")
    out = stage_module(tokens)
    F.cross_entropy(out.flatten(0, 1).float(), tokens.flatten()).backward()
opt.step()
'''


def _row(name: str, layers: int | None, workers: int) -> dict:
    spec = dict(MODELS[name])
    if layers:
        spec["layers"] = layers
    spec.update(seq=2048, micro=spec["pp"] * 2 if spec["pp"] > 1 else 1)
    world = spec["pp"] * spec["dp"] * spec["tp"]
    folder = tempfile.mkdtemp(prefix=f"allocsim-bench-{name}-")
    script = os.path.join(folder, "train.py")
    with open(script, "w") as fh:
        fh.write(textwrap.dedent(SCRIPT.replace("{config}", repr(spec))))
    nodes = spec["nodes"]
    out = os.path.join(folder, "job")
    cmd = [sys.executable, "-m", "allocsim", "capture", "--no-verify", "--workers", str(workers), "--gpu", "H100",
           "-o", out, "--", "torchrun", "--nnodes", str(nodes), "--nproc-per-node", str(world // nodes), script]
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    seconds = time.monotonic() - t0
    if done.returncode != 0:
        raise SystemExit(f"{name}: capture failed ({done.returncode}):\n{done.stderr[-3000:]}")
    child_rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss   # KiB: the largest child so far
    with open(os.path.join(out, "manifest.json")) as fh:
        manifest = json.load(fh)
    run = subprocess.run([sys.executable, "-m", "allocsim", "run", out, "--policy", "pytorch", "--gpu", "H100",
                          "--fast", "--json"], capture_output=True, text=True, check=False)
    data = json.loads(run.stdout)
    limit = next(r for r in data["ranks"] if data["limiting_rank"] in r["ranks"])
    return {"model": name, "layers": spec["layers"], "parallelism": f"pp {spec['pp']} x dp {spec['dp']} x tp {spec['tp']}",
            "world": world, "roles": len(manifest["roles"]), "seconds": round(seconds, 1),
            "largest_process_rss_mib": round(max(child_rss, before) / 1024), "limiting_rank": data["limiting_rank"],
            "peak_reserved_gib": round(limit["peak_reserved_bytes"] / 2**30, 2),
            "predicted_total_gib": round(limit["gpu_estimate"]["total_bytes"] / 2**30, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", choices=sorted(MODELS), help="rows to run (default: all)")
    parser.add_argument("--layers", type=int, help="layers instead of the model's own (a quicker look)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="captures at once")
    args = parser.parse_args()
    print("| model | layers | parallelism | world | roles | capture s | largest process RSS | limiting rank "
          "| its peak reserved | predicted total (H100) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in args.model or list(MODELS):
        r = _row(name, args.layers, args.workers)
        print(f"| {r['model']} | {r['layers']} | {r['parallelism']} | {r['world']} | {r['roles']} | {r['seconds']} | "
              f"{r['largest_process_rss_mib']} MiB | {r['limiting_rank']} | {r['peak_reserved_gib']} GiB | "
              f"{r['predicted_total_gib']} GiB |", flush=True)


if __name__ == "__main__":
    main()
