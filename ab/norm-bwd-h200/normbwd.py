"""The fused norm's backward alone at the step's shape, over launch configurations, on one GPU."""
import itertools, json, os, statistics, sys, time
import jax, jax.numpy as jnp
from pallas_kernels.rmsnorm import NormBlocks, _backward

B = int(sys.argv[1]) if len(sys.argv) > 1 else 48
T, D = 1024, 1280
k = jax.random.split(jax.random.key(0), 5)
h = jax.random.normal(k[0], (B, T, D), jnp.float32)
rstd = 1 + jax.random.uniform(k[1], (B, T), jnp.float32)
w = 1 + 0.1 * jax.random.normal(k[2], (D,), jnp.float32)
dh = jax.random.normal(k[3], (B, T, D), jnp.float32)
dy = jax.random.normal(k[4], (B, T, D), jnp.float32).astype(jnp.bfloat16)
nbytes = B * T * D * (4 + 2 + 4 + 4 + 2)  # h, dy, dh read; dx, ddelta written

def timed(fn, *args, calls=20, repeats=7):
    jax.block_until_ready(fn(*args))
    t_end = time.perf_counter() + 0.2
    while time.perf_counter() < t_end:
        jax.block_until_ready(fn(*args))
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            out = fn(*args)
        jax.block_until_ready(out)
        ts.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(ts), min(ts), max(ts)

rows = []
copy = jax.jit(lambda a, b: (a * 1.0001, b * 1.0001))  # same bytes as two f32 arrays read+written... 
# a pure copy of the backward's bytes: read 2 f32 + 1 bf16, write f32 + bf16
ref = jax.jit(lambda h, dy, dh: ((h + dh) * 0.5, (h * dy.astype(jnp.float32)).astype(jnp.bfloat16)))
med, lo, hi = timed(ref, h, dy, dh)
rows.append(dict(name="xla elementwise, same bytes", us=med, lo=lo, hi=hi, tbs=nbytes / med / 1e6))
print(json.dumps(rows[-1]), flush=True)
base = None
for r, s, nw, st, mp in [(1, 32, 1, 1, 1024)] + list(itertools.product((1, 2), (2, 4, 8, 16, 32), (1, 2, 4), (1, 2), (1,))):
    if nw < r and r > 1:
        continue
    b = NormBlocks(rows_bwd=r, steps_bwd=s, num_warps_bwd=nw, num_stages_bwd=st, min_programs_bwd=mp)
    name = f"r{r}s{s}w{nw}st{st}mp{mp}"
    try:
        fn = jax.jit(lambda h, rstd, w, dy, dh, b=b: (lambda o: (o[0], o[1], jnp.sum(o[2], axis=(0, 1))))(
            _backward(h, rstd, w, dy, dh, ddelta_dtype=jnp.bfloat16, blocks=b, interpret=False)))
        out = fn(h, rstd, w, dy, dh)
        if base is None:
            base = out
            err = 0.0
        else:
            err = max(float(jnp.max(jnp.abs(x.astype(jnp.float32) - y.astype(jnp.float32))) / (1e-30 + float(jnp.max(jnp.abs(y.astype(jnp.float32)))))) for x, y in zip(out, base))
        med, lo, hi = timed(fn, h, rstd, w, dy, dh)
        rows.append(dict(name=name, us=med, lo=lo, hi=hi, tbs=nbytes / med / 1e6, err=err))
    except Exception as e:  # noqa
        rows.append(dict(name=name, error=repr(e)[:300]))
    print(json.dumps(rows[-1]), flush=True)
json.dump({"device": jax.devices()[0].device_kind, "jax": jax.__version__, "shape": [B, T, D], "rows": rows},
          open(os.path.join(os.environ.get("OUT", "."), f"normbwd-b{B}.json"), "w"), indent=1)
