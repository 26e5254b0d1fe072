# The program profiled for flash_attention_fwd_d64.csv: a forward call, then one
# forward+backward, of the portable Pallas kernel per head_dim (bf16, causal, 1x4096x16).
import jax
import jax.numpy as jnp

from pallas_kernels import flash_attention

for d in (64, 128):
    q, k, v = (jax.random.normal(jax.random.key(i), (1, 4096, 16, d), jnp.bfloat16) for i in range(3))
    jax.jit(lambda q, k, v: flash_attention(q, k, v, causal=True))(q, k, v).block_until_ready()
    loss = lambda q, k, v: flash_attention(q, k, v, causal=True).astype(jnp.float32).sum()  # noqa: E731
    jax.block_until_ready(jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v))
