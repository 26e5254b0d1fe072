"""dW-shaped GEMMs of `large` at b32 (K = 32768 tokens): plain, split-K by hand, merged, max-autotune; torch and JAX."""
import sys, time, json
import torch
T, d, f = 32768, 1280, 5120
res = {}
def bench(name, fn, flops, n=20):
    for _ in range(3): fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(n):
        a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b))
    ts.sort(); ms = ts[n // 2]
    res[name] = (ms, flops / ms / 1e9); print(f"{name:55s} {ms*1e3:8.1f} us {flops/ms/1e9:7.1f} TF/s", flush=True)
bf = torch.bfloat16; dev = "cuda"
X = torch.randn(T, d, device=dev, dtype=bf); dA = torch.randn(T, f, device=dev, dtype=bf); dA2 = torch.randn(T, f, device=dev, dtype=bf)
H = torch.randn(T, f, device=dev, dtype=bf); dY = torch.randn(T, d, device=dev, dtype=bf)
Xd = torch.randn(T, d, device=dev, dtype=bf); dQ = torch.randn(T, d, device=dev, dtype=bf)
W1 = torch.randn(f, d, device=dev, dtype=bf); W13 = torch.randn(2 * f, d, device=dev, dtype=bf)
Wq = torch.randn(d, d, device=dev, dtype=bf); Wqkv = torch.randn(3 * d, d, device=dev, dtype=bf)
F1 = 2 * T * d * f; F0 = 2 * T * d * d
bench("torch dW w1 [f,d] = dA^T X", lambda: dA.t() @ X, F1)
bench("torch dW w2 [d,f] = dY^T H", lambda: dY.t() @ H, F1)
bench("torch dW w1 split-K 2 (bmm + sum)", lambda: torch.bmm(dA.view(2, T // 2, f).transpose(1, 2), X.view(2, T // 2, d)).sum(0), F1)
bench("torch dW w1 split-K 4 (bmm + sum)", lambda: torch.bmm(dA.view(4, T // 4, f).transpose(1, 2), X.view(4, T // 4, d)).sum(0), F1)
dA13 = torch.cat([dA, dA2], 1)
bench("torch dW w1|w3 merged [2f,d]", lambda: dA13.t() @ X, 2 * F1)
bench("torch dW q [d,d] = dQ^T X", lambda: dQ.t() @ Xd, F0)
dQKV = torch.randn(T, 3 * d, device=dev, dtype=bf)
bench("torch dW qkv merged [3d,d]", lambda: dQKV.t() @ Xd, 3 * F0)
bench("torch fwd w1 X W1^T", lambda: X @ W1.t(), F1)
bench("torch fwd w1|w3 merged", lambda: X @ W13.t(), 2 * F1)
bench("torch dX w1 dA W1", lambda: dA @ W1, F1)
bench("torch dX w1|w3 merged dA13 W13", lambda: dA13 @ W13, 2 * F1)
bench("torch fwd q", lambda: Xd @ Wq.t(), F0)
bench("torch fwd qkv merged", lambda: Xd @ Wqkv.t(), 3 * F0)
try:
    import torch._inductor.config as ic
    mm = torch.compile(lambda a, b: a.t() @ b, mode="max-autotune-no-cudagraphs")
    t0 = time.time(); mm(dA, X); print("max-autotune compile s", round(time.time() - t0, 1), flush=True)
    bench("torch max-autotune dW w1", lambda: mm(dA, X), F1)
    bench("torch max-autotune dW w2", lambda: mm(dY, H), F1)
    bench("torch max-autotune dW q", lambda: mm(dQ, Xd), F0)
except Exception as e:
    print("max-autotune failed", repr(e)[:300])
del dA13
import jax, jax.numpy as jnp
import numpy as np
def jbench(name, fn, args, flops, n=20):
    f_ = jax.jit(fn); out = f_(*args); jax.block_until_ready(out)
    ts = []
    for _ in range(n):
        t0 = time.perf_counter(); jax.block_until_ready(f_(*args)); ts.append((time.perf_counter() - t0) * 1e3)
    ts.sort(); ms = ts[n // 2]; res[name] = (ms, flops / ms / 1e9)
    print(f"{name:55s} {ms*1e3:8.1f} us {flops/ms/1e9:7.1f} TF/s (host-timed)", flush=True)
k = jax.random.PRNGKey(0)
jX = jax.random.normal(k, (T, d), jnp.bfloat16); jdA = jax.random.normal(k, (T, f), jnp.bfloat16)
jdQ = jax.random.normal(k, (T, d), jnp.bfloat16)
jbench("jax dW w1 einsum to f32", lambda a, x: jnp.einsum("to,ti->oi", a, x, preferred_element_type=jnp.float32), (jdA, jX), F1)
jbench("jax dW w1 einsum bf16", lambda a, x: jnp.einsum("to,ti->oi", a, x), (jdA, jX), F1)
jbench("jax dW w1 split-K 2", lambda a, x: jnp.einsum("kto,kti->oi", a.reshape(2, T // 2, f), x.reshape(2, T // 2, d), preferred_element_type=jnp.float32), (jdA, jX), F1)
jbench("jax dW w1 split-K 2 batched+sum", lambda a, x: jnp.einsum("kto,kti->koi", a.reshape(2, T // 2, f), x.reshape(2, T // 2, d), preferred_element_type=jnp.float32).sum(0), (jdA, jX), F1)
jbench("jax dW q", lambda a, x: jnp.einsum("to,ti->oi", a, x), (jdQ, jX), F0)
jbench("jax dW q split-K 4 batched+sum", lambda a, x: jnp.einsum("kto,kti->koi", a.reshape(4, T // 4, d), x.reshape(4, T // 4, d), preferred_element_type=jnp.float32).sum(0), (jdQ, jX), F0)
json.dump(res, open(sys.argv[1], "w"), indent=1)
