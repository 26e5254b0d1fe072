"""The step's GEMMs (large, 32 x 1024 tokens, bf16) in torch (cuBLAS's heuristic choice) and in
JAX (XLA's autotuned cuBLASLt choice), same shapes, alternating rounds in one process."""
import os, json, statistics, time
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
import torch, jax, jax.numpy as jnp
from torch.profiler import profile, ProfilerActivity

M = 32768
shapes = [("qkvo", 1280, 1280), ("w1/w3", 1280, 5120), ("w2", 5120, 1280)]
def t_torch(f, calls=30):
    f(); torch.cuda.synchronize()
    t_end = time.perf_counter() + 0.2
    while time.perf_counter() < t_end: f()
    torch.cuda.synchronize(); t0 = time.perf_counter()
    for _ in range(calls): f()
    torch.cuda.synchronize(); return (time.perf_counter() - t0) / calls * 1e6
def t_jax(f, *a, calls=30):
    jax.block_until_ready(f(*a))
    t_end = time.perf_counter() + 0.2
    while time.perf_counter() < t_end: jax.block_until_ready(f(*a))
    t0 = time.perf_counter(); out = None
    for _ in range(calls): out = f(*a)
    jax.block_until_ready(out); return (time.perf_counter() - t0) / calls * 1e6
dot = jax.jit(lambda a, b: jnp.dot(a, b))
rows = []
for name, K, N in shapes:
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16); w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.02
    g = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    ops_t = {"fwd": lambda: x @ w.t(), "dgrad": lambda: g @ w, "wgrad": lambda: g.t() @ x}
    xj, wj, gj = (jnp.asarray(x.float().cpu().numpy()).astype(jnp.bfloat16), jnp.asarray(w.t().float().cpu().numpy()).astype(jnp.bfloat16),
                  jnp.asarray(g.float().cpu().numpy()).astype(jnp.bfloat16))
    ops_j = {"fwd": (dot, xj, wj), "dgrad": (jax.jit(lambda a, b: jnp.dot(a, b.T)), gj, wj), "wgrad": (jax.jit(lambda a, b: jnp.dot(a.T, b)), xj, gj)}
    for op in ops_t:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            ops_t[op](); torch.cuda.synchronize()
        kname = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA][:2]
        tt, tj = [], []
        for r in range(5):
            tt.append(t_torch(ops_t[op])); f, a, b = ops_j[op]; tj.append(t_jax(f, a, b))
        flops = 2 * M * K * N
        row = dict(gemm=name, op=op, torch_us=round(statistics.median(tt), 1), torch_range=[round(min(tt), 1), round(max(tt), 1)],
                   jax_us=round(statistics.median(tj), 1), jax_range=[round(min(tj), 1), round(max(tj), 1)],
                   torch_over_jax=round(statistics.median(tt) / statistics.median(tj), 3),
                   torch_tflops=round(flops / statistics.median(tt) / 1e6), jax_tflops=round(flops / statistics.median(tj) / 1e6),
                   torch_kernel=kname)
        rows.append(row); print(json.dumps(row), flush=True)
print(json.dumps(dict(versions=dict(torch=torch.__version__, jax=jax.__version__), device=torch.cuda.get_device_name())))
