"""Launch order of the backward kernels. Pallas Mosaic GPU maps its grid's LAST axis to CUDA's x
(fastest in launch order). Variants give _backward_grid's (grid, names) in Pallas order.
  timing: python bwd_order.py time d:seq:c|n ...      ncu target: python bwd_order.py once VARIANT d seq c|n"""
import math, os, sys
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
import jax, jax.numpy as jnp
from pallas_kernels import flash_attention_mgpu as mgpu

ORIG = mgpu._backward_grid
VARIANTS = {
    "current": ORIG,
    # x = batch, y = tiles, z = heads
    "heads_tiles_batch": lambda T, H, B, S, fused: ((H, T, B), ("heads", "tiles", "batch")),
    # x = tiles, y = heads, z = batch  (tiles fastest for real)
    "batch_heads_tiles": lambda T, H, B, S, fused: ((B, H, T), ("batch", "heads", "tiles")),
    # x = batch, y = heads, z = tiles
    "tiles_heads_batch": lambda T, H, B, S, fused: ((T, H, B), ("tiles", "heads", "batch")),
    # the same again, compiled separately: the noise of the A/B
    "tiles_heads_batch_again": lambda T, H, B, S, fused: ((T, H, B), ("tiles", "heads", "batch")),
}

def make(variant, d, seq, causal, fused=None):
    shape = (16384 // seq, seq, 2048 // d, d)
    ks = jax.random.split(jax.random.key(0), 4)
    q, k, v, do = (jax.random.normal(kk, shape, jnp.float32).astype(jnp.bfloat16) for kk in ks)
    blocks = mgpu.MosaicBlockSizes.get_default(d, seq)
    if fused is not None:
        import dataclasses
        blocks = dataclasses.replace(blocks, fused_bwd=fused, dq_split=False)
    kw = dict(causal=causal, sm_scale=1 / math.sqrt(d), block_sizes=blocks)
    o, lse = jax.jit(lambda q, k, v: mgpu.mosaic_forward(q, k, v, **kw))(q, k, v)
    bwd = jax.jit(lambda o, lse: mgpu.mosaic_backward(q, k, v, o, lse, do, **kw))
    fn = VARIANTS[variant]
    mgpu._backward_grid = lambda T, H, B, S, *, fused: fn(T, H, B, S, fused)
    try:
        out = jax.block_until_ready(bwd(o, lse))  # traces with this order
    finally:
        mgpu._backward_grid = ORIG
    return (lambda: bwd(o, lse)), out

if sys.argv[1] == "once":
    _, variant, d, seq, c = sys.argv[1:]
    f, _ = make(variant, int(d), int(seq), c == "c")
    jax.block_until_ready(f())
else:
    from harness import bench_attention as bench
    names = [n for n in VARIANTS if n != "current"]
    for cell in sys.argv[2:]:
        d, seq, c, *rest = cell.split(":")
        fused = {"fused": True, "two": False}.get(rest[0]) if rest else None
        entries, outs = {}, {}
        for n in names:
            f, out = make(n, int(d), int(seq), c == "c", fused)
            outs[n] = out
            entries[n] = (f, jax.block_until_ready, "wall")
        ref = outs[names[0]]
        diff = max(float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32))))
                   for n in names for a, b in zip(ref, outs[n]))
        got = bench.time_interleaved(entries, warmup=2, iters=15, min_batch_ms=25)
        base = got[names[0]][0]
        print(f"{cell}: " + " | ".join(f"{n} {got[n][0]:.4f} ms ({base / got[n][0]:.3f}x)" for n in names)
              + f" | max|diff| {diff:.1e}", flush=True)
