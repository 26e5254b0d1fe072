"""Host cost of the JAX split step's optimizer call, N = 1 and 2 devices (experiment, not product).

For the `large` parameters: the update jit (AdamW, donated params and state) timed as
dispatch (call returns), wait (block_until_ready after it), and the sync alone on ready
arrays; with the parameters as an nnx.State and as a pure dict."""
import json
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import jax_impl
from harness.config import get_config

cfg = get_config(sys.argv[1] if len(sys.argv) > 1 else "large")
platform = "gpu" if jax.default_backend() == "gpu" else "cpu"
devices = jax.devices()
model = jax_impl.TransformerLM(cfg, rngs=nnx.Rngs(0))
_, params0 = nnx.split(model, nnx.Param)
tx = jax_impl.adamw()
out = {}


def apply(p, o, g):
    u, o = tx.update(g, o, p)
    return optax.apply_updates(p, u), o


for n in (1, 2):
    if n > len(devices):
        continue
    mesh = Mesh(devices[:n], ("data",))
    rep = NamedSharding(mesh, P())
    for variant in ("nnx", "pure"):
        p = params0 if variant == "nnx" else params0.to_pure_dict()
        # fresh buffers: donation must not delete the arrays params0 holds
        p = jax.jit(lambda t: jax.tree.map(lambda a: a + 0, t), out_shardings=rep)(p)
        o = jax.device_put(tx.init(p), rep)
        g = jax.tree.map(jnp.ones_like, p)
        sh = jax.tree.map(lambda a: a.sharding, (p, o))
        upd = jax.jit(apply, donate_argnums=(0, 1) if platform == "gpu" else (), out_shardings=sh)
        disp, wait, sync = [], [], []
        for i in range(25):
            t0 = time.perf_counter()
            p, o = upd(p, o, g)
            t1 = time.perf_counter()
            jax.block_until_ready(p)
            t2 = time.perf_counter()
            jax.block_until_ready(p)
            t3 = time.perf_counter()
            if i >= 5:
                disp.append((t1 - t0) * 1e3), wait.append((t2 - t1) * 1e3), sync.append((t3 - t2) * 1e3)
        key = f"n{n}-{variant}"
        out[key] = {"leaves_in": len(jax.tree.leaves((p, o, g))), "dispatch_ms": statistics.median(disp),
                    "wait_ms": statistics.median(wait), "sync_ready_ms": statistics.median(sync)}
        print(key, {k: round(v, 3) for k, v in out[key].items()}, flush=True)
        del p, o, g
json.dump(out, sys.stdout if len(sys.argv) < 3 else open(sys.argv[2], "w"), indent=1)
