"""Hopper forward A/B of block-size variants, interleaved rounds in one process.
usage: ab.py 'name:field=v,field=v;name2:...' d:seq:c|n ...   (default always included)
MGPU_SMEM_LIMIT overrides the module's shared-memory budget."""
import dataclasses, math, os, sys
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
import jax, jax.numpy as jnp
from harness import bench_attention as bench
from pallas_kernels import flash_attention_mgpu as mgpu
if os.environ.get("MGPU_SMEM_LIMIT"):
    mgpu._SMEM_LIMIT = int(os.environ["MGPU_SMEM_LIMIT"])

def parse(v):
    return {"true": True, "false": False}.get(v.lower(), None) if v.lower() in ("true", "false") else int(v)

VARIANTS = {"default": {}}
for spec in sys.argv[1].split(";"):
    name, fields = spec.split(":")
    VARIANTS[name] = {f.split("=")[0]: parse(f.split("=")[1]) for f in fields.split(",")}
cells = [(int(d), int(s), c == "c") for d, s, c in (x.split(":") for x in sys.argv[2:])]
for d, seq, causal in cells:
    shape = (16384 // seq, seq, 2048 // d, d)
    ks = jax.random.split(jax.random.key(0), 3)
    q, k, v = (jax.random.normal(kk, shape, jnp.float32).astype(jnp.bfloat16) for kk in ks)
    entries, outs = {}, {}
    for name, ch in VARIANTS.items():
        try:
            blocks = dataclasses.replace(mgpu.MosaicBlockSizes.get_default(d, seq), **ch)
            f = jax.jit(lambda q, k, v, blocks=blocks: mgpu.mosaic_forward(q, k, v, causal=causal, sm_scale=1 / math.sqrt(d), block_sizes=blocks)[0])
            outs[name] = jax.block_until_ready(f(q, k, v))
        except Exception as exc:
            print(f"d={d} seq={seq} causal={causal} {name} failed: {str(exc)[:400]}", flush=True); continue
        entries[name] = (lambda f=f: f(q, k, v), jax.block_until_ready, "wall")
    got = bench.time_interleaved(entries, warmup=2, iters=9, min_batch_ms=25, lead_in_ms=200)
    base = got["default"][0]
    diff = {n: float(jnp.max(jnp.abs(outs[n].astype(jnp.float32) - outs["default"].astype(jnp.float32)))) for n in outs}
    print(f"d={d} seq={seq} causal={causal}: " + " | ".join(
        f"{n} {t[0]:.4f} ms [{t[1]:.4f},{t[2]:.4f}] ({base / t[0]:.3f}x, diff {diff[n]:.1e})" if not isinstance(t, Exception) else f"{n} FAILED {t}"
        for n, t in got.items()), flush=True)
