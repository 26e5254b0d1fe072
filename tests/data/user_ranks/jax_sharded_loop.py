"""A user's data-parallel Flax NNX loop over every local GPU, traced by JAX's own profiler.

A small Transformer LM (as in a Flax tutorial), its parameters and AdamW state replicated
over a one-axis mesh, the batch split over the devices with `NamedSharding`; XLA inserts the
gradient all-reduce. Two steps compile; `jax.profiler.trace` then records four steps marked
with `StepTraceAnnotation`, writing the `.xplane.pb` and the trace-viewer export
(`perfetto_trace.json.gz`) that users open in Perfetto.

    python jax_sharded_loop.py traces/
"""

import sys

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

WARMUP, STEPS = 2, 4
VOCAB, DIM, HEADS, LAYERS, CTX, BATCH = 8192, 768, 12, 6, 512, 16


class Block(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.n1, self.n2 = nnx.RMSNorm(DIM, rngs=rngs), nnx.RMSNorm(DIM, rngs=rngs)
        self.qkv = nnx.Linear(DIM, 3 * DIM, use_bias=False, rngs=rngs)
        self.o = nnx.Linear(DIM, DIM, use_bias=False, rngs=rngs)
        self.w1 = nnx.Linear(DIM, 4 * DIM, use_bias=False, rngs=rngs)
        self.w2 = nnx.Linear(4 * DIM, DIM, use_bias=False, rngs=rngs)

    def __call__(self, x):
        b, t, d = x.shape
        q, k, v = jnp.split(self.qkv(self.n1(x)).reshape(b, t, 3 * HEADS, d // HEADS), 3, axis=2)
        a = jax.nn.dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.reshape(b, t, d))
        return x + self.w2(nnx.gelu(self.w1(self.n2(x))))


class LM(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.emb = nnx.Embed(VOCAB, DIM, rngs=rngs)
        self.blocks = nnx.List([Block(rngs=rngs) for _ in range(LAYERS)])
        self.norm = nnx.RMSNorm(DIM, rngs=rngs)
        self.head = nnx.Linear(DIM, VOCAB, use_bias=False, rngs=rngs)

    def __call__(self, idx):
        x = self.emb(idx).astype(jnp.bfloat16)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)).astype(jnp.float32)


@nnx.jit
def train_step(model, optimizer, x, y):
    def loss_fn(model):
        return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss


def main():
    mesh = Mesh(jax.devices(), ("data",))
    model = LM(rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adamw(3e-4), wrt=nnx.Param)
    state = jax.device_put(nnx.state((model, optimizer)), NamedSharding(mesh, P()))
    nnx.update((model, optimizer), state)
    data = jax.random.randint(jax.random.key(0), (BATCH, CTX + 1), 0, VOCAB)
    data = jax.device_put(data, NamedSharding(mesh, P("data")))
    x, y = data[:, :-1], data[:, 1:]
    for _ in range(WARMUP):
        train_step(model, optimizer, x, y).block_until_ready()
    with jax.profiler.trace(sys.argv[1], create_perfetto_trace=True):
        for step in range(WARMUP, WARMUP + STEPS):
            with jax.profiler.StepTraceAnnotation("train", step_num=step):
                loss = train_step(model, optimizer, x, y)
            loss.block_until_ready()
    print(f"loss {float(loss):.4f} on {jax.device_count()} devices")


if __name__ == "__main__":
    main()
