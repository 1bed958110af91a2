"""A decoder-only transformer's training step as a user writes it: built on the CPU, moved to ``cuda``, AdamW.

The shapes are public configurations (``--config``): GPT-3 125M, 1.3B and 2.7B (Brown et al. 2020,
table 2.1), Llama-2 7B and 70B (Touvron et al. 2023; the 70B uses grouped-query attention with 8
key/value heads). ``allocsim capture -- python benchmarks/decoder_train.py --config 70b`` runs it
on a machine without a GPU; on a GPU it runs as written. ``--amp bf16`` trains under
``torch.autocast("cuda", dtype=torch.bfloat16)``.
"""

from __future__ import annotations

import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

CONFIGS = {
    # name: (d_model, layers, heads, kv_heads, d_ff, vocab, gated_mlp)
    "125m": (768, 12, 12, 12, 3072, 50257, False),
    "1.3b": (2048, 24, 16, 16, 8192, 50257, False),
    "2.7b": (2560, 32, 32, 32, 10240, 50257, False),
    "7b": (4096, 32, 32, 32, 11008, 32000, True),
    "70b": (8192, 80, 64, 8, 28672, 32000, True),
}


class RMSNorm(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * self.weight


class Block(nn.Module):
    def __init__(self, d: int, heads: int, kv_heads: int, d_ff: int, gated: bool):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, d // heads
        self.norm1, self.norm2 = RMSNorm(d), RMSNorm(d)
        self.q = nn.Linear(d, d, bias=False)
        self.kv = nn.Linear(d, 2 * kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        self.up = nn.Linear(d, (2 if gated else 1) * d_ff, bias=False)
        self.down = nn.Linear(d_ff, d, bias=False)
        self.gated = gated

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.norm1(x)
        q = self.q(h).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(h).view(b, t, 2, self.kv_heads, self.head_dim).unbind(2)
        k, v = (z.transpose(1, 2).repeat_interleave(self.heads // self.kv_heads, dim=1) for z in (k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, d))
        u = self.up(self.norm2(x))
        if self.gated:
            gate, up = u.chunk(2, dim=-1)
            u = F.silu(gate) * up
        else:
            u = F.gelu(u)
        return x + self.down(u)


class Decoder(nn.Module):
    def __init__(self, d: int, layers: int, heads: int, kv_heads: int, d_ff: int, vocab: int, gated: bool):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, heads, kv_heads, d_ff, gated) for _ in range(layers))
        self.norm = RMSNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=1 / math.sqrt(p.shape[-1]))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", choices=sorted(CONFIGS), default="125m")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--amp", choices=("none", "bf16", "fp16"), default="none")
    args = parser.parse_args()
    device = "cuda"
    model = Decoder(*CONFIGS[args.config]).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    vocab = CONFIGS[args.config][5]
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.amp)
    scaler = torch.amp.GradScaler("cuda", enabled=args.amp == "fp16")
    for _ in range(args.steps):
        tokens = torch.randint(0, vocab, (args.batch, args.seq + 1)).to(device)
        with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
            logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, vocab).float(), tokens[:, 1:].reshape(-1))
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
    print(f"{args.config}: {sum(p.numel() for p in model.parameters()):,} parameters, "
          f"peak allocated {torch.cuda.max_memory_allocated():,} B, peak reserved {torch.cuda.max_memory_reserved():,} B")


if __name__ == "__main__":
    main()
