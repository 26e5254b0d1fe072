"""SwiGLU (silu(a) * b) forward, and its gradient with respect to the stacked input, for the
gate and value laid out in one [T, 2f] array: as halves, in pairs, or in blocks of 64 or 128.
Median of 20 timed calls after one untimed; writes {layout: [us, TB/s]} to argv[1]."""
import time, json, sys
import jax, jax.numpy as jnp
T, f = 32768, 5120
res = {}
def tm(name, fn, *args, n=20, nbytes=0):
    j = jax.jit(fn); jax.block_until_ready(j(*args))
    ts = []
    for _ in range(n):
        t0 = time.perf_counter(); jax.block_until_ready(j(*args)); ts.append(time.perf_counter() - t0)
    ts.sort(); s = ts[n // 2]; res[name] = (s * 1e6, nbytes / s / 1e12)
    print(f"{name:40s} {s*1e6:8.1f} us {nbytes/s/1e12:6.2f} TB/s", flush=True)
k = jax.random.PRNGKey(0)
h = jax.random.normal(k, (T, 2 * f), jnp.bfloat16); dy = jax.random.normal(k, (T, f), jnp.bfloat16)
E = T * f * 2  # bytes of one [T, f] bf16 array
def split(h, layout):
    if layout == "halves": return h[:, :f], h[:, f:]
    if layout == "pairs": r = h.reshape(T, f, 2); return r[..., 0], r[..., 1]
    b = int(layout[5:]); r = h.reshape(T, f // b, 2, b); return r[:, :, 0].reshape(T, f), r[:, :, 1].reshape(T, f)
for layout in ("halves", "pairs", "block64", "block128"):
    fwd = lambda h, layout=layout: (lambda a, b: jax.nn.silu(a) * b)(*split(h, layout))
    tm(f"fwd {layout}", fwd, h, nbytes=3 * E)
    bwd = lambda h, dy, fwd=fwd: jax.vjp(fwd, h)[1](dy)[0]
    tm(f"fwd+bwd grad {layout}", bwd, h, dy, nbytes=5 * E)
json.dump(res, open(sys.argv[1], "w"), indent=1)
