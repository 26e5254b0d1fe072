"""Which cuBLAS kernels torch-compile's step runs at large's width (2 layers, batch 32, ctx 1024,
bf16, cuDNN attention) under the BLAS settings of the environment, and their time: torch.profiler
over 4 forward+backward steps after 3 warm-up steps. One JSON line."""
import json, os, sys, time, collections
import numpy as np
import torch
from harness.config import ModelConfig
from harness.backends.torch.session import TorchCompileSession

if os.environ.get("NO_BF16_RR") == "1":
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
layers = int(os.environ.get("LAYERS", "2"))
small = os.environ.get("DEV") == "cpu"
cfg = ModelConfig(d_model=128 if small else 1280, d_ff=512 if small else 5120, num_layers=layers, num_heads=4 if small else 20, vocab_size=10000, attention="fused")
tok = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 65) if small else (32, 1025)).astype(np.int64)
s = TorchCompileSession(cfg, tok, device="cpu" if small else "cuda", dtype="bf16", seed=0)
t0 = time.time()
for _ in range(3):
    s.forward(); s.backward(); s.zero_grad()
small or torch.cuda.synchronize()
compile_s = time.time() - t0
steps = 6
t1 = time.time()
for _ in range(steps):
    s.forward(); s.backward(); s.zero_grad()
small or torch.cuda.synchronize()
step_ms = (time.time() - t1) * 1000 / steps
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(4):
        s.forward(); s.backward(); s.zero_grad()
    small or torch.cuda.synchronize()
agg = collections.defaultdict(lambda: [0, 0.0])
for e in prof.events():
    if e.device_type == torch.autograd.DeviceType.CUDA:
        a = agg[e.name]; a[0] += 1; a[1] += e.device_time
gemm = {k: v for k, v in agg.items() if any(p in k for p in ("nvjet", "gemm", "xmma", "cutlass", "splitK"))}
out = dict(setting={k: v for k, v in os.environ.items() if k.startswith(("TORCH_BLAS", "CUBLAS", "NO_BF16", "TORCHINDUCTOR_ENABLE", "TORCHINDUCTOR_MIX"))},
           layers=layers, compile_s=round(compile_s, 1), step_ms=round(step_ms, 3),
           gemm_ms_per_step=round(sum(v[1] for v in gemm.values()) / 4 / 1000, 3),
           all_ms_per_step=round(sum(v[1] for v in agg.values()) / 4 / 1000, 3),
           gemms=sorted([[k[:90], v[0] // 4, round(v[1] / v[0], 1)] for k, v in gemm.items()], key=lambda r: -r[1] * r[2]),
           top=sorted([[k[:90], v[0] // 4, round(v[1] / v[0], 1)] for k, v in agg.items() if k not in gemm], key=lambda r: -r[1] * r[2])[:14])
print(json.dumps(out), flush=True)
