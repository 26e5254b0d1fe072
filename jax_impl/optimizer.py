"""AdamW with decoupled weight decay (Loshchilov & Hutter) as an optax transformation.

Per parameter, with t starting at 1:
    m <- b1 m + (1 - b1) g
    v <- b2 v + (1 - b2) g^2
    a_t = lr sqrt(1 - b2^t) / (1 - b1^t)
    theta <- theta - a_t m / (sqrt(v) + eps)
    theta <- theta - lr * weight_decay * theta

The returned updates u satisfy theta_new = theta + u, with the decay applied to the
already-updated theta as written above. optax.adamw differs: it adds eps to the
bias-corrected sqrt(v_hat) (effective eps = ours * sqrt(1 - b2^t)) and decays the
pre-step theta; torch.optim.AdamW does the same. tests/test_optimizers.py measures both.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax


class AdamWState(NamedTuple):
    count: jax.Array  # steps taken so far (t - 1 before an update)
    mu: optax.Updates
    nu: optax.Updates


def adamw(
    learning_rate: float = 1e-3,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 0.01,
) -> optax.GradientTransformation:
    """The published AdamW; use with `nnx.Optimizer(model, adamw(), wrt=nnx.Param)`."""
    if learning_rate < 0:
        raise ValueError(f"learning_rate={learning_rate} must be >= 0")
    if not (0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0):
        raise ValueError(f"b1={b1}, b2={b2} must each be in [0, 1)")

    def init_fn(params: optax.Params) -> AdamWState:
        zeros = lambda p: jnp.zeros_like(p, dtype=jnp.float32)  # noqa: E731
        return AdamWState(jnp.zeros([], jnp.int32), jax.tree.map(zeros, params), jax.tree.map(zeros, params))

    def update_fn(grads: optax.Updates, state: AdamWState, params: optax.Params | None = None):
        if params is None:
            raise ValueError("adamw needs the parameters for weight decay: call update(grads, state, params)")
        t = state.count + 1
        mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state.mu, grads)
        nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, state.nu, grads)
        tf = t.astype(jnp.float32)
        a_t = learning_rate * jnp.sqrt(1 - b2**tf) / (1 - b1**tf)

        def step(p, m, v):
            stepped = p - a_t * m / (jnp.sqrt(v) + eps)
            return (stepped - learning_rate * weight_decay * stepped - p).astype(p.dtype)

        updates = jax.tree.map(step, params, mu, nu)
        return updates, AdamWState(t, mu, nu)

    return optax.GradientTransformation(init_fn, update_fn)
