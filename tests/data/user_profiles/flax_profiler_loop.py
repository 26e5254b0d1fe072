"""A plain Flax NNX training loop under JAX's own profiler, written the way users write one.

A small Transformer LM (RMSNorm, causal attention through jax.nn.dot_product_attention,
SwiGLU), `nnx.Optimizer` with optax AdamW, one `nnx.jit` train step; the loop runs inside
`jax.profiler.trace(DIR)` and marks each step with `jax.profiler.StepTraceAnnotation`. The
first two steps compile; the profile starts after them, as the JAX docs suggest.

    python flax_profiler_loop.py traces/
"""

import sys

import jax
import jax.numpy as jnp
import optax
from flax import nnx

WARMUP, STEPS = 2, 4
VOCAB, DIM, HEADS, LAYERS, CTX, BATCH = 4096, 512, 8, 4, 256, 8


class Block(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.n1, self.n2 = nnx.RMSNorm(DIM, rngs=rngs), nnx.RMSNorm(DIM, rngs=rngs)
        self.qkv = nnx.Linear(DIM, 3 * DIM, use_bias=False, rngs=rngs)
        self.o = nnx.Linear(DIM, DIM, use_bias=False, rngs=rngs)
        self.w1 = nnx.Linear(DIM, 4 * DIM, use_bias=False, rngs=rngs)
        self.w3 = nnx.Linear(DIM, 4 * DIM, use_bias=False, rngs=rngs)
        self.w2 = nnx.Linear(4 * DIM, DIM, use_bias=False, rngs=rngs)

    def __call__(self, x):
        b, t, d = x.shape
        q, k, v = jnp.split(self.qkv(self.n1(x)).reshape(b, t, 3 * HEADS, d // HEADS), 3, axis=2)
        a = jax.nn.dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.reshape(b, t, d))
        h = self.n2(x)
        return x + self.w2(nnx.silu(self.w1(h)) * self.w3(h))


class LM(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.emb = nnx.Embed(VOCAB, DIM, rngs=rngs)
        self.blocks = nnx.List([Block(rngs=rngs) for _ in range(LAYERS)])
        self.norm = nnx.RMSNorm(DIM, rngs=rngs)
        self.head = nnx.Linear(DIM, VOCAB, use_bias=False, rngs=rngs)

    def __call__(self, idx):
        x = self.emb(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


@nnx.jit
def train_step(model, optimizer, x, y):
    def loss_fn(model):
        return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss


def main():
    model = LM(rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adamw(3e-4), wrt=nnx.Param)
    data = jax.random.randint(jax.random.key(0), (BATCH, CTX + 1), 0, VOCAB)
    x, y = data[:, :-1], data[:, 1:]
    for _ in range(WARMUP):
        train_step(model, optimizer, x, y).block_until_ready()
    with jax.profiler.trace(sys.argv[1]):
        for step in range(WARMUP, WARMUP + STEPS):
            with jax.profiler.StepTraceAnnotation("train", step_num=step):
                loss = train_step(model, optimizer, x, y)
            loss.block_until_ready()
    print(f"loss {float(loss):.4f}")


if __name__ == "__main__":
    main()
