"""Fused add+RMSNorm kernels against XLA's fusion of the jnp reference, alone, on one GPU."""
import itertools, json, os, statistics, sys, time
import jax, jax.numpy as jnp, numpy as np
from pallas_kernels.rmsnorm import add_rms_norm, NormBlocks

B, T, D = 32, 1024, 1280
k = jax.random.split(jax.random.key(0), 5)
x = jax.random.normal(k[0], (B, T, D), jnp.float32)
d = jax.random.normal(k[1], (B, T, D), jnp.float32).astype(jnp.bfloat16)
w = 1 + 0.1 * jax.random.normal(k[2], (D,), jnp.float32)
ch = jax.random.normal(k[3], (B, T, D), jnp.float32)
cy = jax.random.normal(k[4], (B, T, D), jnp.float32).astype(jnp.bfloat16)

def fns(impl, blocks):
    f = lambda x, d, w: add_rms_norm(x, d, w, eps=1e-5, out_dtype=jnp.bfloat16, implementation=impl, blocks=blocks)
    fwd = jax.jit(f)
    def fb(x, d, w):
        out, vjp = jax.vjp(f, x, d, w)
        return out, vjp((ch, cy))
    return fwd, jax.jit(fb)

def bench(fn, reps=7, inner=20):
    jax.block_until_ready(fn(x, d, w))
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(inner):
            out = fn(x, d, w)
        jax.block_until_ready(out)
        ts.append((time.perf_counter() - t) / inner * 1e6)
    return statistics.median(ts), min(ts), max(ts)

res = {}
ref_fwd, ref_fb = fns("xla", None)
(ref_h, ref_y), ref_g = ref_fb(x, d, w)
res["xla"] = {"fwd": bench(ref_fwd), "fb": bench(ref_fb)}
print("xla", res["xla"], flush=True)
cands = [NormBlocks(rows_fwd=rf, num_warps_fwd=wf, rows_bwd=r, steps_bwd=st, num_warps_bwd=nw)
         for rf, wf, r, st, nw in [(4, 4, 2, 32, 4), (2, 2, 2, 32, 2), (1, 1, 1, 32, 1), (2, 1, 2, 32, 1), (4, 2, 4, 16, 2),
                                   (1, 2, 1, 32, 2), (8, 2, 2, 64, 2), (4, 1, 4, 16, 1)]]
for b in cands:
    name = f"f{b.rows_fwd}w{b.num_warps_fwd}_b{b.rows_bwd}s{b.steps_bwd}w{b.num_warps_bwd}st{b.num_stages_bwd}"
    try:
        fwd, fb = fns("pallas", b)
        (h, y), g = fb(x, d, w)
        err = {"h": float(jnp.max(jnp.abs(h - ref_h))), "y": float(jnp.max(jnp.abs(y.astype(jnp.float32) - ref_y.astype(jnp.float32)))),
               "dx": float(jnp.max(jnp.abs(g[0] - ref_g[0])) / jnp.max(jnp.abs(ref_g[0]))),
               "dd": float(jnp.max(jnp.abs(g[1].astype(jnp.float32) - ref_g[1].astype(jnp.float32))) / jnp.max(jnp.abs(ref_g[1].astype(jnp.float32)))),
               "dw": float(jnp.max(jnp.abs(g[2] - ref_g[2])) / jnp.max(jnp.abs(ref_g[2])))}
        res[name] = {"fwd": bench(fwd), "fb": bench(fb), "err": err}
    except Exception as e:  # noqa
        res[name] = {"error": repr(e)[:300]}
    print(name, res[name], flush=True)
json.dump({"device": jax.devices()[0].device_kind, "jax": jax.__version__, "shape": [B, T, D], "us": res},
          open(os.path.join(os.environ.get("OUT", "."), "normbench.json"), "w"), indent=1)
