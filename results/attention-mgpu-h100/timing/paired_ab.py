"""Hopper forward: default ping-pong (waits for P V inside its turn) vs paired
(P V and the next S issued together in one turn), interleaved rounds, one process."""
import dataclasses, math, os, sys
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
import jax, jax.numpy as jnp
from harness import bench_attention as bench
from pallas_kernels import flash_attention_mgpu as mgpu

VARIANTS = {"default": {}, "paired": {"paired": True}}
cells = [(int(d), int(s), c == "c") for d, s, c in (x.split(":") for x in sys.argv[1:])]
for d, seq, causal in cells:
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
            print(name, "failed:", str(exc)[:300], flush=True); continue
        entries[name] = (lambda f=f: f(q, k, v), jax.block_until_ready, "wall")
    got = bench.time_interleaved(entries, warmup=2, iters=21, min_batch_ms=25)
    base = got["default"][0]
    diff = {n: float(jnp.max(jnp.abs(outs[n].astype(jnp.float32) - outs["default"].astype(jnp.float32)))) for n in outs}
    print(f"d={d} seq={seq} causal={causal}: " + " | ".join(
        f"{n} {t[0]:.4f} ms [{t[1]:.4f},{t[2]:.4f}] ({base / t[0]:.3f}x, diff {diff[n]:.1e})" for n, t in got.items()), flush=True)
