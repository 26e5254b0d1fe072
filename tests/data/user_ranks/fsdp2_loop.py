"""A user's FSDP2 training loop, written the way users write one, traced per rank by torch.profiler.

A GPT-2-small-shaped LM (LayerNorm, causal SDPA, GELU MLP), each block `fully_shard`-ed and
then the whole model, compiled with `torch.compile`; bf16 autocast, fused AdamW, two
micro-batches per step, `record_function` phases. Three steps compile and warm up; the
profiler then records three steps on every rank and writes one Chrome trace per rank.

    torchrun --nproc_per_node 2 fsdp2_loop.py traces/
"""

import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard
from torch.profiler import ProfilerActivity, profile, record_function, schedule

VOCAB, DIM, HEADS, LAYERS, CTX, BATCH, MICRO = 50304, 768, 12, 6, 512, 4, 2


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.proj = nn.Linear(DIM, DIM)
        self.fc = nn.Linear(DIM, 4 * DIM)
        self.out = nn.Linear(4 * DIM, DIM)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, HEADS, d // HEADS).transpose(1, 3).unbind(2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, DIM), nn.Embedding(CTX, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def main():
    out = sys.argv[1]
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    torch.manual_seed(0)
    model = GPT().cuda()
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    model = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    gen = torch.Generator(device="cuda").manual_seed(rank)
    data = torch.randint(0, VOCAB, (MICRO, BATCH, CTX + 1), device="cuda", generator=gen)

    def train_step():
        for micro in range(MICRO):
            x, y = data[micro, :, :-1], data[micro, :, 1:]
            with record_function("forward"):
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = F.cross_entropy(model(x).flatten(0, 1).float(), y.flatten()) / MICRO
            with record_function("backward"):
                loss.backward()
        with record_function("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(3):
        train_step()
    torch.cuda.synchronize()

    def save(prof):
        prof.export_chrome_trace(os.path.join(out, f"rank{rank}.json.gz"))

    with profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
        schedule=schedule(wait=0, warmup=1, active=3, repeat=1),
        on_trace_ready=save,
    ) as prof:
        for _ in range(4):
            loss = train_step()
            prof.step()
    if rank == 0:
        print(f"loss {loss.item() * MICRO:.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
