"""AdamW over `large`'s parameters in the forms the fused step could take, timed alone.

The profiled one-array fused step at batch 4 spends 6.6 + 1.75 + 1.75 ms in three
concatenate fusions where the dict step's AdamW took 7.2 ms: the gradients' concatenation
fused into each of the update's outputs. Variants, each a donated jitted call:
  dict      the model's arrays (the reference)
  concat    gradients concatenated inside the program, the update on the one array (as now)
  barrier   the same with the concatenated gradients materialized first
  leafwise  the update per parameter on slices of the one arrays, outputs concatenated
  dus       the update per parameter written into the one arrays in place
  groups-N  the state as arrays of at most N parameters each (`FlatLayout`'s groups)
Prints one JSON line per variant: median and range of call times (host work included),
the entry computation's fusions, and the bandwidth at AdamW's 28 bytes per parameter.
`optbench.jsonl` holds the first five variants, `groupbench.jsonl` the groups beside two.
"""

import json
import math
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import jax_impl
from harness.backends.jax.flat import FlatLayout
from harness.config import get_config

cfg = get_config(__import__("os").environ.get("MODEL", "large"))
model = nnx.eval_shape(lambda: jax_impl.TransformerLM(cfg, rngs=nnx.Rngs(0)))
shapes = nnx.split(model, nnx.Param)[1].to_pure_dict()
_one = FlatLayout.of(jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes), max_leaves=10**6)


class _OneArray:
    """The layout as one array (the layout of the profiled step)."""

    treedef, shapes, size = _one.treedef, _one.shapes, _one.size

    @staticmethod
    def ravel(tree):
        return _one.ravel(tree)[0]

    @staticmethod
    def unravel(flat):
        return _one.unravel((flat,))


layout = _OneArray
n = layout.size
tx = jax_impl.adamw()
key = jax.random.PRNGKey(0)


def leaves_like(scale):
    return [scale * jax.random.normal(jax.random.fold_in(key, i), s, jnp.float32)
            for i, s in enumerate(layout.shapes)]


grad_leaves = leaves_like(1e-3)
grads_tree = layout.treedef.unflatten(grad_leaves)
ends = np.cumsum([math.prod(s) for s in layout.shapes]).tolist()
starts = [0] + ends[:-1]


def upd_dict(p, o, g):
    u, o = tx.update(g, o, p)
    return jax.tree.map(jnp.add, p, u), o


def upd_concat(p, o, g):
    g = layout.ravel(g)
    u, o = tx.update(g, o, p)
    return p + u, o


def upd_barrier(p, o, g):
    g = jax.lax.optimization_barrier(layout.ravel(g))
    u, o = tx.update(g, o, p)
    return p + u, o


def upd_leafwise(p, o, g):
    pt, mt, vt = layout.unravel(p), layout.unravel(o.mu), layout.unravel(o.nu)
    u, o2 = tx.update(g, o._replace(mu=mt, nu=vt), pt)
    pt = jax.tree.map(jnp.add, pt, u)
    return layout.ravel(pt), o2._replace(mu=layout.ravel(o2.mu), nu=layout.ravel(o2.nu))


def upd_dus(p, o, g):
    t = o.count + 1
    mu, nu = o.mu, o.nu
    for a, gl, s in zip(starts, jax.tree.leaves(g), layout.shapes, strict=True):
        size = math.prod(s)
        sl = lambda x, a=a, size=size: jax.lax.dynamic_slice(x, (a,), (size,))  # noqa: E731
        u, st = tx.update(gl.reshape(-1), o._replace(mu=sl(mu), nu=sl(nu)), sl(p))
        p = jax.lax.dynamic_update_slice(p, sl(p) + u, (a,))
        mu = jax.lax.dynamic_update_slice(mu, st.mu, (a,))
        nu = jax.lax.dynamic_update_slice(nu, st.nu, (a,))
    return p, o._replace(count=t, mu=mu, nu=nu)


def grouped(per):
    """The update on the state as arrays of at most `per` parameters each."""
    g_layout = FlatLayout.of(layout.treedef.unflatten([jnp.zeros(s, jnp.float32) for s in layout.shapes]), per)

    def fn(ps, o, g):
        u, o = tx.update(g_layout.ravel(g), o, ps)
        return tuple(p + d for p, d in zip(ps, u, strict=True)), o

    def make():
        ps = g_layout.ravel(layout.treedef.unflatten(leaves_like(0.02)))
        return ps, tx.init(ps)

    return fn, make


def state(flat):
    if callable(flat):
        return flat()
    p = leaves_like(0.02)
    if flat:
        pf = layout.ravel(layout.treedef.unflatten(p))
        return pf, tx.init(pf)
    pt = layout.treedef.unflatten(p)
    return pt, tx.init(pt)


def bench(name, fn, flat, iters=20, warm=3):
    p, o = state(flat)
    f = jax.jit(fn, donate_argnums=(0, 1))
    text = f.lower(p, o, grads_tree).compile().as_text()
    fusions = sum(1 for line in text.splitlines() if line.lstrip().startswith("ROOT") is False
                  and " fusion(" in line and "calls=" in line)
    times = []
    for i in range(warm + iters):
        jax.block_until_ready((p, o))
        t0 = time.perf_counter()
        p, o = f(p, o, grads_tree)
        jax.block_until_ready((p, o))
        if i >= warm:
            times.append(time.perf_counter() - t0)
    ms = [1e3 * x for x in times]
    q = statistics.quantiles(ms, n=10)
    med = statistics.median(ms)
    print(json.dumps({"variant": name, "median_ms": round(med, 3), "p10_ms": round(q[0], 3),
                      "p90_ms": round(q[-1], 3), "fusions": fusions, "params": n,
                      "GBps_at_28B": round(28 * n / med / 1e6, 1),
                      "device": jax.devices()[0].device_kind, "jax": jax.__version__}), flush=True)
    del p, o


variants = {"dict": (upd_dict, False), "concat": (upd_concat, True), "barrier": (upd_barrier, True),
            "leafwise": (upd_leafwise, True), "dus": (upd_dus, True)}
groups = {f"groups-{per}": grouped(per) for per in (32, 64, 96, 128)}
if __name__ == "__main__":
    chosen = sys.argv[2].split(",") if len(sys.argv) > 2 else list(variants)
    for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 2):
        for name in chosen:
            bench(name, *{**variants, **groups}[name])
