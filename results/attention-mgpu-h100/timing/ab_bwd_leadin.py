"""Hopper backward A/B of block-size variants, interleaved rounds in one process.
usage: ab_bwd.py 'name:field=v,field=v;name2:...' d:seq:c|n ...   (default always included)"""
import dataclasses, math, os, sys
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
import jax, jax.numpy as jnp
from harness import bench_attention as bench
from pallas_kernels import flash_attention_mgpu as mgpu

def parse(v):
    return {"true": True, "false": False}[v.lower()] if v.lower() in ("true", "false") else int(v)

VARIANTS = {"default": {}}
for spec in sys.argv[1].split(";"):
    name, fields = spec.split(":")
    VARIANTS[name] = {f.split("=")[0]: parse(f.split("=")[1]) for f in fields.split(",")}
cells = [(int(d), int(s), c == "c") for d, s, c in (x.split(":") for x in sys.argv[2:])]
for d, seq, causal in cells:
    shape = (16384 // seq, seq, 2048 // d, d)
    ks = jax.random.split(jax.random.key(0), 4)
    q, k, v, do = (jax.random.normal(kk, shape, jnp.float32).astype(jnp.bfloat16) for kk in ks)
    kw = dict(causal=causal, sm_scale=1 / math.sqrt(d))
    base_blocks = mgpu.MosaicBlockSizes.get_default(d, seq)
    o, lse = jax.jit(lambda q, k, v: mgpu.mosaic_forward(q, k, v, block_sizes=base_blocks, **kw))(q, k, v)
    entries, outs = {}, {}
    for name, ch in VARIANTS.items():
        try:
            blocks = dataclasses.replace(base_blocks, **ch)
            f = jax.jit(lambda o, lse, blocks=blocks: mgpu.mosaic_backward(q, k, v, o, lse, do, block_sizes=blocks, **kw))
            outs[name] = jax.block_until_ready(f(o, lse))
            again = jax.block_until_ready(f(o, lse))
        except Exception as exc:
            print(f"d={d} seq={seq} causal={causal} {name} failed: {str(exc)[:600]}", flush=True); continue
        rerun = max(float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32)))) for a, b in zip(outs[name], again))
        entries[name] = (lambda f=f: f(o, lse), jax.block_until_ready, "wall")
        outs[name] = (outs[name], rerun)
    got = bench.time_interleaved(entries, warmup=2, iters=9, min_batch_ms=25, lead_in_ms=200)
    base = got["default"][0]
    ref = outs["default"][0]
    def diff(n):
        return max(float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32)))) for a, b in zip(outs[n][0], ref))
    print(f"d={d} seq={seq} causal={causal}: " + " | ".join(
        f"{n} {t[0]:.4f} ms [{t[1]:.4f},{t[2]:.4f}] ({base / t[0]:.3f}x, diff {diff(n):.1e}, rerun {outs[n][1]:.1e})"
        if not isinstance(t, Exception) else f"{n} FAILED {t}" for n, t in got.items()), flush=True)
