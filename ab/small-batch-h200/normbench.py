"""The fused add+RMSNorm backward at small batches: row groups per program, alone, on one GPU.

At batch 4 the profiled step spent 92 us a call in `add_rms_norm_bwd` (71 calls a step), about
0.9 TB/s, where batch 32's ran near 3.5 TB/s: with 32 row groups a program, batch 4's 4,096
rows make 128 one-warp programs. Times `add_rms_norm` forward and forward+backward at `large`'s
width for each batch in BATCHES (default 4 and 32), XLA's fusion of the reference ("xla"),
the kernels at steps_bwd 1..32 (min_programs_bwd=1, so the steps stay as given), and the
defaults (`NormBlocks()`, which pick the steps from the row count). Microseconds per call:
(median, min, max) of 7 repeats of 20 calls. Writes normbench.json to $OUT (or here).
"""

import json
import os
import statistics
import time

import jax
import jax.numpy as jnp

from pallas_kernels import rmsnorm
from pallas_kernels.rmsnorm import NormBlocks, add_rms_norm

T, D = int(os.environ.get("CTX", 1024)), 1280
BATCHES = [int(b) for b in os.environ.get("BATCHES", "4,32").split(",")]


def inputs(b):
    k = jax.random.split(jax.random.key(0), 5)
    x = jax.random.normal(k[0], (b, T, D), jnp.float32)
    d = jax.random.normal(k[1], (b, T, D), jnp.float32).astype(jnp.bfloat16)
    w = 1 + 0.1 * jax.random.normal(k[2], (D,), jnp.float32)
    ch = jax.random.normal(k[3], (b, T, D), jnp.float32)
    cy = jax.random.normal(k[4], (b, T, D), jnp.float32).astype(jnp.bfloat16)
    return x, d, w, ch, cy


def fns(impl, blocks, ch, cy):
    f = lambda x, d, w: add_rms_norm(x, d, w, eps=1e-5, out_dtype=jnp.bfloat16,  # noqa: E731
                                     implementation=impl, blocks=blocks)

    def fb(x, d, w):
        out, vjp = jax.vjp(f, x, d, w)
        return out, vjp((ch, cy))

    return jax.jit(f), jax.jit(fb)


def bench(fn, args, reps=7, inner=20):
    jax.block_until_ready(fn(*args))
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(inner):
            out = fn(*args)
        jax.block_until_ready(out)
        ts.append((time.perf_counter() - t) / inner * 1e6)
    return statistics.median(ts), min(ts), max(ts)


def rel(a, b):
    a, b = jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)
    return float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))


result = {"device": jax.devices()[0].device_kind, "jax": jax.__version__, "width": D, "ctx": T, "us": {}}
for b in BATCHES:
    x, d, w, ch, cy = inputs(b)
    args = (x, d, w)
    ref_fwd, ref_fb = fns("xla", None, ch, cy)
    _, ref_g = ref_fb(*args)
    res = {"xla": {"fwd": bench(ref_fwd, args), "fb": bench(ref_fb, args)}}
    cands = {f"s{s}": NormBlocks(steps_bwd=s, min_programs_bwd=1) for s in (1, 2, 4, 8, 16, 32)}
    cands |= {f"s{s}st2": NormBlocks(steps_bwd=s, num_stages_bwd=2, min_programs_bwd=1) for s in (4, 32)}
    cands["defaults"] = NormBlocks()
    for name, blocks in cands.items():
        try:
            fwd, fb = fns("pallas", blocks, ch, cy)
            _, g = fb(*args)
            res[name] = {"fb": bench(fb, args), "steps": rmsnorm._bwd_rows(x.shape, blocks)[1],
                         "err": {k: rel(g[i], ref_g[i]) for i, k in enumerate(("dx", "ddelta", "dw"))}}
            if name == "defaults":
                res[name]["fwd"] = bench(fwd, args)
        except Exception as e:  # noqa: BLE001 (a candidate that fails to lower is recorded as such)
            res[name] = {"error": repr(e)[:300]}
        print(b, name, res[name], flush=True)
    result["us"][f"b{b}"] = res
with open(os.path.join(os.environ.get("OUT", "."), "normbench.json"), "w") as f:
    json.dump(result, f, indent=1)
