"""AdamW in both frameworks against the published algorithm and against the libraries."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
from flax import nnx

import jax_impl
import torch_impl

STEPS = 200
# float32 arithmetic against a float64 reference over 200 steps drifts to ~3e-6.
FLOAT32_NOISE = 1e-5
HP = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)  # large lr and wd so decay order shows


def published_adamw(theta, grads, lr, betas, eps, weight_decay):
    """Loshchilov & Hutter as written in the docstrings, in float64 numpy. Yields theta after each step."""
    b1, b2 = betas
    theta, m, v = theta.astype(np.float64), np.zeros_like(theta, np.float64), np.zeros_like(theta, np.float64)
    for t, g in enumerate(grads, start=1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        a_t = lr * math.sqrt(1 - b2**t) / (1 - b1**t)
        theta = theta - a_t * m / (np.sqrt(v) + eps)
        theta = theta - lr * weight_decay * theta
        yield theta


def gradient_sequence(shape, steps, seed=0):
    """Noisy gradients whose scale changes over time (so the bias corrections matter)."""
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(shape) * (0.1 + t / steps)).astype(np.float32) for t in range(steps)]


def run_torch(opt_cls, theta0, grads, **kw):
    p = torch.nn.Parameter(torch.from_numpy(theta0.copy()))
    opt = opt_cls([p], **kw)
    for g in grads:
        p.grad = torch.from_numpy(g)
        opt.step()
    return p.detach().numpy()


def run_optax(tx, theta0, grads):
    params = jnp.asarray(theta0)
    state = tx.init(params)
    for g in grads:
        updates, state = tx.update(jnp.asarray(g), state, params)
        params = optax.apply_updates(params, updates)
    return np.asarray(params)


def rel(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


@pytest.fixture(scope="module")
def problem():
    theta0 = np.random.default_rng(1).standard_normal((64, 33)).astype(np.float32)
    grads = gradient_sequence(theta0.shape, STEPS)
    ref = list(published_adamw(theta0, grads, **HP))[-1]
    return theta0, grads, ref


def test_torch_adamw_is_the_published_algorithm(problem):
    theta0, grads, ref = problem
    assert rel(run_torch(torch_impl.AdamW, theta0, grads, **HP), ref) < FLOAT32_NOISE


def test_jax_adamw_is_the_published_algorithm(problem):
    theta0, grads, ref = problem
    tx = jax_impl.adamw(HP["lr"], *HP["betas"], HP["eps"], HP["weight_decay"])
    assert rel(run_optax(tx, theta0, grads), ref) < FLOAT32_NOISE


def test_library_adamw_differ_only_by_the_documented_details(problem):
    """torch.optim.AdamW and optax.adamw decay the pre-step theta and put eps under the bias
    correction. At lr 1e-2, wd 0.1 that shows after 200 steps, but stays far below a real bug."""
    theta0, grads, ref = problem
    ours = run_torch(torch_impl.AdamW, theta0, grads, **HP)
    lib_torch = run_torch(torch.optim.AdamW, theta0, grads, **HP)
    lib_optax = run_optax(optax.adamw(HP["lr"], *HP["betas"], HP["eps"], weight_decay=HP["weight_decay"]), theta0,
                          grads)
    assert rel(lib_torch, lib_optax) < 1e-5  # the two libraries agree with each other
    gap = rel(ours, lib_torch)
    print(f"published vs torch.optim.AdamW after {STEPS} steps: {gap:.2e}")
    assert 10 * FLOAT32_NOISE < gap < 1e-3  # a real, small difference (decay order)...
    # ...which the published recursion with the library's decay order removes:
    b1, b2 = HP["betas"]
    theta, m, v = theta0.astype(np.float64), 0.0, 0.0
    for t, g in enumerate(grads, start=1):
        theta = theta * (1 - HP["lr"] * HP["weight_decay"])
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        m_hat, v_hat = m / (1 - b1**t), v / (1 - b2**t)
        theta = theta - HP["lr"] * m_hat / (np.sqrt(v_hat) + HP["eps"])
    assert rel(lib_torch, theta) < FLOAT32_NOISE


def test_default_hyperparameters():
    p = torch.nn.Parameter(torch.zeros(1))
    assert torch_impl.AdamW([p]).defaults == dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)


@pytest.mark.parametrize("bug", ["no_bias_correction", "coupled_decay"])
def test_a_wrong_adamw_fails_the_reference_bound(problem, bug):
    theta0, grads, ref = problem
    b1, b2 = HP["betas"]
    theta, m, v = theta0.astype(np.float64), 0.0, 0.0
    for t, g in enumerate(grads, start=1):
        if bug == "coupled_decay":  # Adam with L2: decay folded into the gradient
            g = g + HP["weight_decay"] * theta
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        a_t = HP["lr"] if bug == "no_bias_correction" else HP["lr"] * math.sqrt(1 - b2**t) / (1 - b1**t)
        theta = theta - a_t * m / (np.sqrt(v) + HP["eps"])
        if bug != "coupled_decay":
            theta = theta - HP["lr"] * HP["weight_decay"] * theta
    assert rel(theta, ref) > 1e-3


def test_jax_adamw_works_with_nnx_optimizer():
    model = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
    before = np.asarray(model.kernel[...]).copy()
    opt = nnx.Optimizer(model, jax_impl.adamw(0.1), wrt=nnx.Param)
    grads = nnx.grad(lambda m: jnp.sum(m(jnp.ones((1, 3))) ** 2))(model)
    opt.update(model, grads)
    step = np.asarray(model.kernel[...]) - before
    # first step: theta - lr * g / |g| (bias corrections cancel), then decay
    expected_first = -0.1 * np.sign(np.asarray(grads["kernel"][...]))
    np.testing.assert_allclose(step, expected_first - 0.1 * 0.01 * (before + expected_first), atol=1e-5)
    jax.clear_caches()
