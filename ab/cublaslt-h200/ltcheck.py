"""lt_mm against torch's matmul at the step's GEMMs (large, 32 x 1024 tokens, bf16): the same
numbers, and the time of each after lt_mm's timed choice; then a 2-layer compiled step."""
import json, statistics, time
import numpy as np
import torch
from harness.backends.torch import gemm

M = 32768
def timed(f, calls=30):
    f(); torch.cuda.synchronize()
    t_end = time.perf_counter() + 0.2
    while time.perf_counter() < t_end: f()
    torch.cuda.synchronize(); t0 = time.perf_counter()
    for _ in range(calls): f()
    torch.cuda.synchronize(); return (time.perf_counter() - t0) / calls * 1e6
ok = True
for name, K, N in [("qkvo", 1280, 1280), ("w1/w3", 1280, 5120), ("w2", 5120, 1280), ("lm_head", 1280, 10000)]:
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16); w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.02
    g = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    for op, (a, b) in {"fwd": (x, w.t()), "dgrad": (g, w), "wgrad": (g.t(), x)}.items():
        ref = (a.float() @ b.float())
        got = gemm.lt_mm(a, b).float(); base = (a @ b).float()
        err_lt = ((got - ref).abs().max() / ref.abs().max()).item(); err_t = ((base - ref).abs().max() / ref.abs().max()).item()
        tt, tl = [], []
        for _ in range(5):
            tt.append(timed(lambda: a @ b)); tl.append(timed(lambda: gemm.lt_mm(a, b)))
        row = dict(gemm=name, op=op, torch_us=round(statistics.median(tt), 1), lt_us=round(statistics.median(tl), 1),
                   speedup=round(statistics.median(tt) / statistics.median(tl), 3), err_lt=err_lt, err_torch=err_t)
        ok &= err_lt <= 2 * err_t + 1e-3
        print(json.dumps(row), flush=True)
print(json.dumps(dict(plans=gemm.plans())))
from harness.config import ModelConfig
from harness.backends.torch.session import TorchCompileSession
from harness.backends.weights import init_model
cfg = ModelConfig(d_model=1280, d_ff=5120, num_layers=2, num_heads=20, vocab_size=10000, attention="fused")
tok = np.random.default_rng(0).integers(0, cfg.vocab_size, (4, 1025)).astype(np.int64)
losses = {}
for tuned in (True, False):
    s = TorchCompileSession(cfg, tok, device="cuda", dtype="bf16", seed=0, weights=init_model(cfg, 0))
    if not tuned:
        for m in s.model.modules():
            if type(m) is gemm.TunedLinear: m.__class__ = gemm.Linear
    torch._dynamo.reset()
    l = s.forward(); s.backward()
    gn = sum(p.grad.float().norm() ** 2 for p in s.model.parameters()).sqrt().item()
    losses[tuned] = (l.item(), gn)
print(json.dumps(dict(compiled_2layer=losses)))
print("CHECK", "ok" if ok else "FAILED")
