"""Weight-gradient GEMMs of `large` at batch 32 and 4 (ctx 1024): one GEMM against a batched split over tokens."""
import json, os, statistics, sys, time
import numpy as np

which = sys.argv[1]
out = {}
SHAPES = [  # (tokens, d_in, d_out)
    (32768, 1280, 5120), (32768, 5120, 1280), (32768, 1280, 1280),
    (4096, 1280, 5120), (4096, 5120, 1280), (4096, 1280, 1280),
]

def fl(t, i, o):
    return 2 * t * i * o

if which == "jax":
    import jax, jax.numpy as jnp
    def bench(f, *a, n=20, reps=7):
        f(*a).block_until_ready()
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            for _ in range(n):
                r = f(*a)
            r.block_until_ready()
            ts.append((time.perf_counter() - t0) / n)
        return statistics.median(ts)
    for (t, i, o) in SHAPES:
        k1, k2 = jax.random.split(jax.random.key(0))
        x = jax.random.normal(k1, (t, i), jnp.bfloat16)
        dy = jax.random.normal(k2, (t, o), jnp.bfloat16)
        res = {}
        res["plain_bf16"] = bench(jax.jit(lambda dy, x: jnp.einsum("to,ti->oi", dy, x)), dy, x)
        res["plain_f32"] = bench(jax.jit(lambda dy, x: jnp.einsum("to,ti->oi", dy, x, preferred_element_type=jnp.float32)), dy, x)
        for g in (2, 3, 4, 6, 8):
            if t % g: continue
            def split(dy, x, g=g):
                p = jnp.einsum("gto,gti->goi", dy.reshape(g, t // g, o), x.reshape(g, t // g, i), preferred_element_type=jnp.float32)
                return p.sum(0)
            res[f"split{g}_f32"] = bench(jax.jit(split), dy, x)
        out[f"{t}x{i}x{o}"] = {k: (v * 1e6, fl(t, i, o) / v / 1e12) for k, v in res.items()}
        print(t, i, o, {k: f"{v*1e6:.0f}us {fl(t,i,o)/v/1e12:.0f}TF" for k, v in res.items()}, flush=True)
else:
    import torch
    def bench(f, n=20, reps=7):
        f(); torch.cuda.synchronize()
        ts = []
        for _ in range(reps):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(n):
                f()
            e.record(); torch.cuda.synchronize()
            ts.append(s.elapsed_time(e) / 1e3 / n)
        return statistics.median(ts)
    for (t, i, o) in SHAPES:
        x = torch.randn(t, i, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn(t, o, device="cuda", dtype=torch.bfloat16)
        res = {"plain_bf16": bench(lambda: dy.t() @ x)}
        for g in (2, 3, 4, 6, 8):
            if t % g: continue
            dyg, xg = dy.view(g, t // g, o), x.view(g, t // g, i)
            res[f"split{g}_bf16sum"] = bench(lambda: torch.bmm(dyg.transpose(1, 2), xg).float().sum(0))
        out[f"{t}x{i}x{o}"] = {k: (v * 1e6, fl(t, i, o) / v / 1e12) for k, v in res.items()}
        print(t, i, o, {k: f"{v*1e6:.0f}us {fl(t,i,o)/v/1e12:.0f}TF" for k, v in res.items()}, flush=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), f"gemm_dw_{which}.json"), "w"), indent=1)
