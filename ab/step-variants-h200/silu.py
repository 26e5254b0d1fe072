import time, jax, jax.numpy as jnp
k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
sh = (24576, 5120)
a, b, g = (jax.random.normal(k, sh, jnp.bfloat16) for k in (k1, k2, k3))
def t(f, *xs, n=50):
    f = jax.jit(f); jax.block_until_ready(f(*xs))
    t0 = time.perf_counter()
    for _ in range(n): r = f(*xs)
    jax.block_until_ready(r); return (time.perf_counter() - t0) / n * 1e6
f32 = lambda x: x.astype(jnp.float32)
sig_tanh = lambda x: 0.5 * jnp.tanh(0.5 * x) + 0.5
forms = {
  "copy a->out (bw ref, 2 arrays)": (lambda a, b: a + b, a, b),
  "jax.nn.silu(a)*b bf16": (lambda a, b: jax.nn.silu(a) * b, a, b),
  "f32 a*sigmoid(a)*b": (lambda a, b: (f32(a) * jax.nn.sigmoid(f32(a)) * f32(b)).astype(a.dtype), a, b),
  "f32 a*tanh-sigmoid*b": (lambda a, b: (f32(a) * sig_tanh(f32(a)) * f32(b)).astype(a.dtype), a, b),
  "f32 a/(1+exp(-a))*b": (lambda a, b: (f32(a) / (1 + jnp.exp(-f32(a))) * f32(b)).astype(a.dtype), a, b),
  "bwd both, sigmoid": (lambda a, b, g: (lambda s: ((f32(g)*f32(b)*s*(1+f32(a)*(1-s))).astype(a.dtype), (f32(g)*f32(a)*s).astype(a.dtype)))(jax.nn.sigmoid(f32(a))), a, b, g),
  "bwd both, tanh": (lambda a, b, g: (lambda s: ((f32(g)*f32(b)*s*(1+f32(a)*(1-s))).astype(a.dtype), (f32(g)*f32(a)*s).astype(a.dtype)))(sig_tanh(f32(a))), a, b, g),
  "jax.grad of silu(a)*b (vjp)": (lambda a, b, g: jax.vjp(lambda a, b: jax.nn.silu(a) * b, a, b)[1](g), a, b, g),
}
for name, (f, *xs) in forms.items():
    us = t(f, *xs)
    nbytes = sum(x.size * 2 for x in xs) + (2 if "bwd" in name or "vjp" in name else 1) * a.size * 2
    print(f"{name:34s} {us:8.1f} us  {nbytes / us / 1e3:6.2f} TB/s", flush=True)
