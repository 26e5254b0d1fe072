"""A/B of the Hopper forward: the committed kernel (.gpu/base) against the working
tree's, interleaved repeats in one process (bench_attention.time_interleaved)."""
import importlib.util, math, os, sys
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
import jax, jax.numpy as jnp
from harness import bench_attention as bench
from pallas_kernels import flash_attention_mgpu as new

spec = importlib.util.spec_from_file_location("old_mgpu", ".gpu/base/pallas_kernels/flash_attention_mgpu.py")
old = importlib.util.module_from_spec(spec); sys.modules["old_mgpu"] = old; spec.loader.exec_module(old)

CELLS = [(64, 1024, True), (64, 2048, True), (64, 4096, True), (64, 1024, False), (128, 1024, True)]
for d, seq, causal in CELLS:
    shape = (16384 // seq, seq, 2048 // d, d)
    ks = jax.random.split(jax.random.key(0), 3)
    q, k, v = (jax.random.normal(kk, shape, jnp.float32).astype(jnp.bfloat16) for kk in ks)
    entries, outs = {}, {}
    for name, mod in (("old", old), ("new", new)):
        blocks = mod.MosaicBlockSizes.get_default(d, seq)
        f = jax.jit(lambda q, k, v, mod=mod, blocks=blocks: mod.mosaic_forward(
            q, k, v, causal=causal, sm_scale=1 / math.sqrt(d), block_sizes=blocks))
        outs[name] = f(q, k, v)
        entries[name] = (lambda f=f: f(q, k, v), jax.block_until_ready, "wall")
    diff = max(float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32)))) for a, b in zip(outs["old"], outs["new"]))
    got = bench.time_interleaved(entries, warmup=2, iters=21, min_batch_ms=25)
    o, n = got["old"], got["new"]
    print(f"d={d} seq={seq} causal={causal}: old {o[0]:.4f} [{o[1]:.4f},{o[2]:.4f}] new {n[0]:.4f} [{n[1]:.4f},{n[2]:.4f}] "
          f"old/new {o[0]/n[0]:.3f}  max|diff| {diff:.2e}", flush=True)
