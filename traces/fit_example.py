"""A small training script for ``allocsim fit``: a tiny transformer language model trained with AdamW.

    allocsim fit -- python traces/fit_example.py --batch {B}

It runs as any training script would on a GPU (``device = "cuda"``); under ``allocsim capture`` /
``allocsim fit`` it runs on the CPU with cuda mapped to the meta device, so nothing is computed
and any batch size takes the same few seconds. It needs torch only. Random token ids stand in for
data; the shapes are what matter to memory.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention (scaled_dot_product_attention) and an MLP."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class TinyLM(nn.Module):
    def __init__(self, vocab: int, dim: int, heads: int, layers: int, seq: int):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, required=True, help="sequences per step")
    parser.add_argument("--seq", type=int, default=256, help="tokens per sequence (default 256)")
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps (default 3)")
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    args = parser.parse_args()
    if args.batch < 1:
        raise SystemExit(f"--batch must be >= 1, got {args.batch}")

    device = "cuda"
    model = TinyLM(args.vocab, args.dim, args.heads, args.layers, args.seq).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    for step in range(args.steps):
        ids = torch.randint(0, args.vocab, (args.batch, args.seq + 1), device=device)
        logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, args.vocab), ids[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        print(f"step {step}: loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
