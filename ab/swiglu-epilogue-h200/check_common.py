"""Helpers shared by check.py and variant.py."""

import json
import statistics
import time

import jax
import jax.numpy as jnp


def timed(fn, *args, calls=20, repeats=7):
    jax.block_until_ready(fn(*args))
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
    return dict(us=round(statistics.median(times), 1), us_min=round(min(times), 1), us_max=round(max(times), 1))


def emit(**kw):
    print(json.dumps(kw), flush=True)


def err(a, b):
    a, b = a.astype(jnp.float32), b.astype(jnp.float32)
    return float(jnp.max(jnp.abs(a - b)) / (jnp.max(jnp.abs(b)) + 1e-30))


def inputs(M, D, F, seed=0):
    k = jax.random.split(jax.random.key(seed), 5)
    x = jax.random.normal(k[0], (M, D), jnp.float32).astype(jnp.bfloat16)
    w1 = (jax.random.normal(k[1], (F, D)) / D**0.5).astype(jnp.bfloat16)
    w3 = (jax.random.normal(k[2], (F, D)) / D**0.5).astype(jnp.bfloat16)
    w2 = (jax.random.normal(k[3], (D, F)) / F**0.5).astype(jnp.bfloat16)
    dy = jax.random.normal(k[4], (M, D), jnp.float32).astype(jnp.bfloat16)
    return x, w1, w2, w3, dy


lin = lambda a, w: jnp.einsum("...i,oi->...o", a, w)


def xla_up(x, w1, w3):
    a, b = lin(x, w1), lin(x, w3)
    return a, b, jax.nn.silu(a) * b


def xla_down(dy, w2, h1, h3):
    dg = jnp.einsum("md,df->mf", dy, w2)
    _, vjp = jax.vjp(lambda a, b: jax.nn.silu(a) * b, h1, h3)
    return (*vjp(dg), jax.nn.silu(h1) * h3)


def plain_ffn(x, w1, w2, w3):
    f = lambda x, w1, w2, w3: lin(jax.nn.silu(lin(x, w1)) * lin(x, w3), w2)
    return jax.checkpoint(f, policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable)(x, w1, w2, w3)


def step(ffn):
    # The output too, as a training step needs it (without it XLA drops the forward's last GEMM).
    def run(x, w1, w2, w3, dy):
        y, vjp = jax.vjp(ffn, x, w1, w2, w3)
        return (y, *vjp(dy))

    return jax.jit(run)
