"""A plain DistributedDataParallel training loop, written the way users write one.

A small GPT-style LM (LayerNorm, causal SDPA attention, GELU MLP), bf16 autocast, fused AdamW,
one process per GPU under torchrun. NVTX ranges through torch.cuda.nvtx: `step{i}` around
each iteration with `forward`, `backward` and `optimizer` inside, and no synchronization at
the phase ends (the usual loop only syncs when it prints the loss).

    nsys profile -o ddp_loop --trace=cuda,nvtx --sample=none --cpuctxsw=none \
        torchrun --nproc_per_node 2 ddp_loop.py
    torchrun --nproc_per_node 2 ddp_loop.py --torch-profiler traces/   # one Chrome trace per rank

With --torch-profiler the loop runs under torch.profiler with schedule(wait=1, warmup=1,
active=3): ProfilerStep#2-#4 are recorded, `record_function` marks the phases.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = 8
VOCAB, DIM, HEADS, LAYERS, CTX, BATCH = 8192, 512, 8, 6, 256, 8


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
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Embedding(CTX, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, idx, targets):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return F.cross_entropy(self.head(self.ln(x)).flatten(0, 1).float(), targets.flatten())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--torch-profiler", metavar="DIR")
    args = parser.parse_args()
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    torch.manual_seed(0)
    model = DDP(GPT().cuda())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    gen = torch.Generator(device="cuda").manual_seed(rank)
    data = torch.randint(0, VOCAB, (BATCH, CTX + 1), device="cuda", generator=gen)
    x, y = data[:, :-1], data[:, 1:]

    prof = None
    if args.torch_profiler:
        prof = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA],
            schedule=torch.profiler.schedule(wait=1, warmup=1, active=3),
            on_trace_ready=lambda p: p.export_chrome_trace(os.path.join(args.torch_profiler, f"rank{rank}.json")),
        )
        prof.start()
    nvtx = torch.cuda.nvtx
    for step in range(STEPS):
        nvtx.range_push(f"step{step}")
        with torch.profiler.record_function("forward"):
            nvtx.range_push("forward")
            with torch.autocast("cuda", torch.bfloat16):
                loss = model(x, y)
            nvtx.range_pop()
        with torch.profiler.record_function("backward"):
            nvtx.range_push("backward")
            loss.backward()
            nvtx.range_pop()
        with torch.profiler.record_function("optimizer"):
            nvtx.range_push("optimizer")
            opt.step()
            opt.zero_grad(set_to_none=True)
            nvtx.range_pop()
        nvtx.range_pop()
        if prof is not None:
            prof.step()
        if rank == 0 and step % 4 == 3:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    if prof is not None:
        prof.stop()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
