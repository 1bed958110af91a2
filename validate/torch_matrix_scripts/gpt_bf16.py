"""Two fused-AdamW steps of a small GPT under bfloat16 autocast: causal and masked SDPA, layer norms over
70,400 rows (above 65,536: the two-pass gamma/beta backward of newer releases), and a loss on the last
position's logits (``logits[:, -1, :]``, whose backward differs between releases)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

B, T, D, H, LAYERS, VOCAB = 64, 1100, 64, 4, 2, 512


class Block(nn.Module):
    def __init__(self, masked):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))
        self.masked = masked

    def forward(self, x, mask):
        q, k, v = self.qkv(self.ln1(x)).view(B, T, 3, H, D // H).permute(2, 0, 3, 1, 4)
        if self.masked:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, D))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D)
        self.blocks = nn.ModuleList(Block(masked=i % 2 == 1) for i in range(LAYERS))
        self.ln = nn.LayerNorm(D)
        self.head = nn.Linear(D, VOCAB, bias=False)

    def forward(self, ids, mask):
        x = self.emb(ids)
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.ln(x))


model = GPT().cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
ids = torch.randint(0, VOCAB, (B, T), device="cuda")
target = torch.randint(0, VOCAB, (B,), device="cuda")
mask = torch.ones(T, T, dtype=torch.bool, device="cuda").tril()
for _ in range(2):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(ids, mask)
        loss = F.cross_entropy(logits[:, -1, :].float(), target)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
