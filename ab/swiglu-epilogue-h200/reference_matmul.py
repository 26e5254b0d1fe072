"""Feasibility of a SwiGLU fused into its GEMMs' epilogue, at the step's FFN shapes (large, 32 x 1024
tokens): XLA's dots alone, XLA's dots with the SwiGLU elementwise pass, and Mosaic GPU's reference
Hopper matmul (jax.experimental.pallas.ops.gpu.hopper_matmul_mgpu) against XLA's dot."""

import dataclasses
import itertools
import json
import statistics
import sys
import time

import jax
import jax.numpy as jnp


def timed(fn, *args, calls=20, repeats=7):
    out = fn(*args)
    jax.block_until_ready(out)
    t_end = time.perf_counter() + 0.3
    while time.perf_counter() < t_end:
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            out = fn(*args)
        jax.block_until_ready(out)
        times.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(times), min(times), max(times)


M, D, F = 32768, 1280, 5120
k = jax.random.split(jax.random.key(0), 4)
x = jax.random.normal(k[0], (M, D), jnp.bfloat16)
w1 = (jax.random.normal(k[1], (D, F), jnp.float32) * 0.02).astype(jnp.bfloat16)
w3 = (jax.random.normal(k[2], (D, F), jnp.float32) * 0.02).astype(jnp.bfloat16)
w2 = (jax.random.normal(k[3], (F, D), jnp.float32) * 0.02).astype(jnp.bfloat16)
g = jax.random.normal(k[0], (M, F), jnp.bfloat16)
rows = []


def rec(name, t, flops):
    med, lo, hi = t
    rows.append(dict(name=name, us=med, us_min=lo, us_max=hi, tflops=flops / med / 1e6))
    print(json.dumps(rows[-1]), flush=True)


dot = jax.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32).astype(jnp.bfloat16))
two = jax.jit(lambda a, b, c: (dot(a, b), dot(a, c)))
swiglu = jax.jit(lambda a, b, c: jax.nn.silu(dot(a, b).astype(jnp.float32)).astype(jnp.bfloat16) * dot(a, c))
swiglu_keep = jax.jit(
    lambda a, b, c: (
        lambda h1, h3: (h1, h3, (jax.nn.silu(h1.astype(jnp.float32)) * h3.astype(jnp.float32)).astype(jnp.bfloat16))
    )(dot(a, b), dot(a, c))
)
rec("xla dot x@w1", timed(dot, x, w1), 2 * M * D * F)
rec("xla two dots x@w1, x@w3", timed(two, x, w1, w3), 4 * M * D * F)
rec("xla swiglu keeping h1, h3", timed(swiglu_keep, x, w1, w3), 4 * M * D * F)
rec("xla dot g@w2", timed(dot, g, w2), 2 * M * D * F)
try:
    from jax.experimental.pallas.ops.gpu import hopper_matmul_mgpu as hm

    fields = {f.name for f in dataclasses.fields(hm.TuningConfig)}
    print("TuningConfig fields", sorted(fields), flush=True)
    for a, b, name in ((x, w1, "x@w1"), (g, w2, "g@w2")):
        for tn, wgd, minor, width, steps in itertools.product(
            (128,),
            (hm.MatmulDimension.N, hm.MatmulDimension.M),
            (hm.MatmulDimension.M, hm.MatmulDimension.N),
            (8, 16),
            (4,),
        ):
            cfg = dict(
                tile_m=128,
                tile_n=tn,
                tile_k=64,
                max_concurrent_steps=steps,
                epi_tile_n=64,
                epi_tile_m=64,
                grid_minor_dim=minor,
                grid_tile_width=width,
                wg_dimension=wgd,
            )
            cfg = {kk: v for kk, v in cfg.items() if kk in fields}
            try:
                f = jax.jit(lambda a, b, cfg=cfg: hm.matmul(a, b, None, hm.TuningConfig(**cfg)))
                t = timed(f, a, b)
                ok = bool(
                    jnp.allclose(f(a, b).astype(jnp.float32), dot(a, b).astype(jnp.float32), atol=0.05, rtol=0.02)
                )
                rec(f"mosaic {name} wg={wgd} minor={minor} width={width} ok={ok}", t, 2 * M * D * F)
            except Exception as e:  # noqa: BLE001
                print("mosaic", name, cfg, type(e).__name__, str(e)[:200], flush=True)
except Exception as e:  # noqa: BLE001
    print("no reference matmul:", type(e).__name__, e)
json.dump(rows, open(sys.argv[1], "w"), indent=1)
