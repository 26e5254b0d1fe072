"""A/B of the Hopper kernels: .gpu/base (committed tree) vs working tree, forward and backward
with each head_dim's defaults, interleaved rounds in one process."""
import importlib.util, math, os, sys
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
import jax, jax.numpy as jnp
from harness import bench_attention as bench
from pallas_kernels import flash_attention_mgpu as new
spec = importlib.util.spec_from_file_location("old_mgpu", ".gpu/base/pallas_kernels/flash_attention_mgpu.py")
old = importlib.util.module_from_spec(spec); sys.modules["old_mgpu"] = old; spec.loader.exec_module(old)
cells = [(int(d), int(s), c == "c") for d, s, c in (x.split(":") for x in sys.argv[1:])]
for d, seq, causal in cells:
    shape = (16384 // seq, seq, 2048 // d, d)
    ks = jax.random.split(jax.random.key(0), 4)
    q, k, v, do = (jax.random.normal(kk, shape, jnp.float32).astype(jnp.bfloat16) for kk in ks)
    kw = dict(causal=causal, sm_scale=1 / math.sqrt(d))
    entries, outs = {}, {}
    for name, mod in (("old", old), ("new", new)):
        blocks = mod.MosaicBlockSizes.get_default(d, seq)
        fwd = jax.jit(lambda q, k, v, mod=mod, blocks=blocks: mod.mosaic_forward(q, k, v, block_sizes=blocks, **kw))
        o, lse = fwd(q, k, v)
        bwd = jax.jit(lambda o, lse, mod=mod, blocks=blocks: mod.mosaic_backward(q, k, v, o, lse, do, block_sizes=blocks, **kw))
        grads = bwd(o, lse)
        outs[name] = (o, *grads)
        entries[(name, "fwd")] = (lambda f=fwd: f(q, k, v), jax.block_until_ready, "wall")
        entries[(name, "bwd")] = (lambda f=bwd, o=o, lse=lse: f(o, lse), jax.block_until_ready, "wall")
    diff = [float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32)))) for a, b in zip(outs["old"], outs["new"])]
    got = bench.time_interleaved(entries, warmup=2, iters=15, min_batch_ms=25)
    line = f"d={d} seq={seq} causal={causal}:"
    for p in ("fwd", "bwd"):
        o_, n_ = got[("old", p)], got[("new", p)]
        line += f" {p} old {o_[0]:.4f} new {n_[0]:.4f} ms (old/new {o_[0]/n_[0]:.3f}x) |"
    print(line + f" max|diff| o,dq,dk,dv {['%.1e' % x for x in diff]}", flush=True)
