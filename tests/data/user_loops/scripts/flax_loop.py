"""A plain Flax NNX training loop, written the way users write one (not through the harness).

A small MLP language model, `nnx.Optimizer` with optax AdamW, one `nnx.jit` train step,
an NVTX range from the `nvtx` package around each step (XLA's own ranges sit in the
"TSL" domain, which the profile excludes). The first step compiles and autotunes inside
its range: there is no warm-up range.

    nsys profile -o flax_loop --trace=cuda,nvtx --sample=none --cpuctxsw=none \
        --nvtx-domain-exclude=TSL --cuda-graph-trace=node python tests/data/user_loops/scripts/flax_loop.py
    (and once without --cuda-graph-trace=node: XLA's CUDA graphs then show as whole graphs)
"""

import jax
import nvtx
import optax
from flax import nnx

STEPS = 6
VOCAB, DIM, CTX, BATCH = 512, 256, 128, 8


class MLPLM(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.emb = nnx.Embed(VOCAB, DIM, rngs=rngs)
        self.norm = nnx.RMSNorm(DIM, rngs=rngs)
        self.fc1 = nnx.Linear(DIM, 4 * DIM, rngs=rngs)
        self.fc2 = nnx.Linear(4 * DIM, DIM, rngs=rngs)
        self.head = nnx.Linear(DIM, VOCAB, use_bias=False, rngs=rngs)

    def __call__(self, idx):
        x = self.emb(idx)
        x = x + self.fc2(nnx.gelu(self.fc1(self.norm(x))))
        return self.head(x)


@nnx.jit
def train_step(model, optimizer, x, y):
    def loss_fn(model):
        return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss


def main():
    model = MLPLM(rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adamw(3e-4), wrt=nnx.Param)
    data = jax.random.randint(jax.random.key(0), (BATCH, CTX + 1), 0, VOCAB)
    x, y = data[:, :-1], data[:, 1:]
    for step in range(STEPS):
        with nvtx.annotate("train_step"):
            loss = train_step(model, optimizer, x, y)
            loss.block_until_ready()
        print(f"step {step} loss {float(loss):.4f}")


if __name__ == "__main__":
    main()
