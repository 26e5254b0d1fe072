"""sha1 (first 8 hex digits) of the traced forward and backward of each FA3 cell's
default kernels, as on an H100 (132 SMs): equal hashes, same kernels. CPU only.
usage: jaxpr_hashes.py d:seq:c|n ..."""
import hashlib, math, sys
import jax, jax.numpy as jnp
from pallas_kernels import flash_attention_mgpu as mgpu

mgpu._num_sms = lambda default=132: 132
for cell in sys.argv[1:]:
    d, seq, c = cell.split(":")
    d, seq, causal = int(d), int(seq), c == "c"
    kw = dict(causal=causal, sm_scale=1 / math.sqrt(d), block_sizes=mgpu.MosaicBlockSizes.get_default(d, seq, causal))
    shape = (16384 // seq, seq, 2048 // d, d)
    x = jax.ShapeDtypeStruct(shape, jnp.bfloat16)
    lse = jax.ShapeDtypeStruct((shape[0], shape[2], seq), jnp.float32)
    fwd = jax.make_jaxpr(lambda q, k, v: mgpu.mosaic_forward(q, k, v, **kw))(x, x, x)
    bwd = jax.make_jaxpr(lambda q, k, v, o, l, do: mgpu.mosaic_backward(q, k, v, o, l, do, **kw))(x, x, x, x, lse, x)
    print(cell, *(hashlib.sha1(str(j).encode()).hexdigest()[:8] for j in (fwd, bwd)), flush=True)
