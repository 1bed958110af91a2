"""A Llama-2-70B-shaped decoder (80 layers, hidden 8192, GQA 8 KV heads, SwiGLU 28672) trained one step under ZeRO-3."""
import argparse, torch, torch.nn as nn, torch.nn.functional as F, deepspeed

H, FF, HEADS, KV, LAYERS, VOCAB, SEQ = 8192, 28672, 64, 8, 80, 32000, 4096


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = nn.RMSNorm(H), nn.RMSNorm(H)
        self.q, self.kv = nn.Linear(H, H, bias=False), nn.Linear(H, 2 * KV * (H // HEADS), bias=False)
        self.o = nn.Linear(H, H, bias=False)
        self.gate_up, self.down = nn.Linear(H, 2 * FF, bias=False), nn.Linear(FF, H, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        h = self.norm1(x)
        q = self.q(h).view(b, s, HEADS, -1).transpose(1, 2)
        k, v = self.kv(h).view(b, s, 2, KV, -1).unbind(2)
        k, v = (t.transpose(1, 2).repeat_interleave(HEADS // KV, 1) for t in (k, v))
        x = x + self.o(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, H))
        gate, up = self.gate_up(self.norm2(x)).chunk(2, -1)
        return x + self.down(F.silu(gate) * up)


class Llama(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, H)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm, self.head = nn.RMSNorm(H), nn.Linear(H, VOCAB, bias=False)

    def forward(self, ids):
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


p = argparse.ArgumentParser()
p.add_argument("--local_rank", type=int, default=-1)
p = deepspeed.add_config_arguments(p)
args = p.parse_args()
model = Llama()
engine, *_ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())
ids = torch.randint(0, VOCAB, (1, SEQ), device=engine.device)
logits = engine(ids)
engine.backward(F.cross_entropy(logits.view(-1, VOCAB).float(), ids.view(-1)))
engine.step()
