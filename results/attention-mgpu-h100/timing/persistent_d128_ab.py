"""head_dim 128 forward: default grid vs persistent (and three consumers can't: 160 regs), interleaved rounds."""
import dataclasses, math, os
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
import jax, jax.numpy as jnp
from harness import bench_attention as bench
from pallas_kernels import flash_attention_mgpu as mgpu

VARIANTS = {"default": {}, "persistent": {"persistent": True}, "stages1_bk256": {"block_k": 256, "num_stages": 1}}
for seq, causal in ((4096, False), (16384, False), (4096, True), (16384, True)):
    d = 128
    shape = (16384 // seq, seq, 2048 // d, d)
    ks = jax.random.split(jax.random.key(0), 3)
    q, k, v = (jax.random.normal(kk, shape, jnp.float32).astype(jnp.bfloat16) for kk in ks)
    entries, outs = {}, {}
    for name, ch in VARIANTS.items():
        blocks = dataclasses.replace(mgpu.MosaicBlockSizes.get_default(d, seq), **ch)
        f = jax.jit(lambda q, k, v, blocks=blocks: mgpu.mosaic_forward(q, k, v, causal=causal, sm_scale=1 / math.sqrt(d), block_sizes=blocks)[0])
        try:
            outs[name] = f(q, k, v)
        except Exception as exc:
            print(name, "failed:", str(exc)[:200]); continue
        entries[name] = (lambda f=f: f(q, k, v), jax.block_until_ready, "wall")
    got = bench.time_interleaved(entries, warmup=2, iters=21, min_batch_ms=25)
    base = got["default"][0]
    diff = {n: float(jnp.max(jnp.abs(outs[n].astype(jnp.float32) - outs["default"].astype(jnp.float32)))) for n in outs}
    print(f"seq={seq} causal={causal}: " + " | ".join(f"{n} {t[0]:.4f} ms ({base / t[0]:.3f}x, diff {diff[n]:.1e})" for n, t in got.items()), flush=True)
