"""The gate's backward alone at the step's shape (batch 32 x 1024 tokens, d_ff 5120, bf16):
the Pallas kernel under a few GateBlocks against XLA's autodiff of the split (its fusion and
the concatenation of the halves). Medians of 20 timed calls after 5 untimed, in microseconds,
one JSON line each. Run on the GPU: python ab/swiglu-stacked-h200/blocks.py"""
import functools
import json
import statistics
import time

import jax
import jax.numpy as jnp

from pallas_kernels.reference import gated_silu_reference
from pallas_kernels.swiglu import GateBlocks, gated_silu

T, F = 32 * 1024, 5120
h = jax.random.normal(jax.random.key(0), (T, 2 * F), jnp.float32).astype(jnp.bfloat16)
dp = jax.random.normal(jax.random.key(1), (T, F), jnp.float32).astype(jnp.bfloat16)


def timed(fn):
    grad = jax.jit(lambda h, dp: jax.vjp(fn, h)[1](dp)[0])
    for _ in range(5):
        grad(h, dp).block_until_ready()
    times = []
    for _ in range(20):
        t0 = time.perf_counter()
        grad(h, dp).block_until_ready()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


print(json.dumps({"impl": "xla", "us": timed(gated_silu_reference)}))
for rows, cols, warps in [(4, 1024, 4), (1, 1024, 4), (8, 512, 4), (2, 2048, 8), (16, 256, 4), (4, 1024, 8)]:
    fn = functools.partial(gated_silu, implementation="pallas", blocks=GateBlocks(rows, cols, warps))
    print(json.dumps({"impl": "pallas", "rows": rows, "cols": cols, "warps": warps, "us": timed(fn)}))
