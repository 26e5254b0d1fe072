"""A plain torch.compile training loop (not through the harness): Inductor's kernel names.

A small Llama-style LM (RMSNorm, causal softmax attention, SwiGLU) compiled with
`torch.compile`, bf16 autocast, fused AdamW; NVTX ranges per phase, each phase ended
by a synchronization; the first two steps run inside a `warmup` range.

    nsys profile -o compiled_loop --trace=cuda,nvtx --sample=none --cpuctxsw=none \
        python tests/data/user_loops/scripts/compiled_loop.py
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

WARMUP, STEPS = 2, 3
VOCAB, DIM, HEADS, LAYERS, CTX, BATCH = 512, 256, 4, 2, 128, 8


class RMSNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype) * self.weight


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.n1, self.n2 = RMSNorm(DIM), RMSNorm(DIM)
        self.qkv = nn.Linear(DIM, 3 * DIM, bias=False)
        self.o = nn.Linear(DIM, DIM, bias=False)
        self.w1, self.w3 = nn.Linear(DIM, 4 * DIM, bias=False), nn.Linear(DIM, 4 * DIM, bias=False)
        self.w2 = nn.Linear(4 * DIM, DIM, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.n1(x)).view(b, t, 3, HEADS, d // HEADS).unbind(2)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        s = (q @ k.transpose(-2, -1)) * (d // HEADS) ** -0.5
        s = s.masked_fill(torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1), float("-inf"))
        x = x + self.o((s.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d))
        h = self.n2(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = RMSNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, idx, targets):
        x = self.emb(idx)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def phase(name, fn):
    torch.cuda.nvtx.range_push(name)
    out = fn()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    return out


def main():
    torch.manual_seed(0)
    model = LM().cuda()
    loss_fn = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    data = torch.randint(0, VOCAB, (BATCH, CTX + 1), device="cuda")
    x, y = data[:, :-1], data[:, 1:]
    for step in range(WARMUP + STEPS):
        torch.cuda.nvtx.range_push("warmup" if step < WARMUP else "step")
        with torch.autocast("cuda", torch.bfloat16):
            loss = phase("forward", lambda: loss_fn(x, y))
        phase("backward", loss.backward)
        phase("optimizer", lambda: (opt.step(), opt.zero_grad(set_to_none=True)))
        torch.cuda.nvtx.range_pop()
        print(f"step {step} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
