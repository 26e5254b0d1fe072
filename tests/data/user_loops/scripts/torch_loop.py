"""A plain PyTorch training loop, written the way users write one (not through the harness).

A small pre-norm Transformer LM, torch.optim.AdamW, NVTX ranges from torch.cuda.nvtx
around each step and its phases, no warm-up range and no synchronization at the end of
a phase: what `harness.report` meets on profiles of programs it did not write.

    nsys profile -o torch_loop --trace=cuda,nvtx --sample=none --cpuctxsw=none \
        python tests/data/user_loops/scripts/torch_loop.py
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

STEPS = 6
VOCAB, DIM, HEADS, LAYERS, CTX, BATCH = 512, 256, 4, 2, 128, 8


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.proj = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.fc1, self.fc2 = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, HEADS, d // HEADS).unbind(2)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / (d // HEADS) ** 0.5
        att = att.masked_fill(torch.ones(t, t, device=x.device, dtype=torch.bool).triu(1), float("-inf"))
        y = (att.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, idx):
        x = self.emb(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def main():
    torch.manual_seed(0)
    model = LM().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    data = torch.randint(0, VOCAB, (BATCH, CTX + 1), device="cuda")
    x, y = data[:, :-1], data[:, 1:]
    for step in range(STEPS):
        torch.cuda.nvtx.range_push("train_step")
        torch.cuda.nvtx.range_push("forward")
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        torch.cuda.nvtx.range_pop()
        torch.cuda.nvtx.range_push("backward")
        loss.backward()
        torch.cuda.nvtx.range_pop()
        torch.cuda.nvtx.range_push("optimizer")
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.nvtx.range_pop()
        torch.cuda.nvtx.range_pop()
        print(f"step {step} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
