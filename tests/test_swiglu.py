"""SwiGLU's gate over stacked halves (`pallas_kernels.swiglu`) against its jnp reference: the
backward kernel's gradient in the Pallas interpreter on CPU, the row partitioning on two host
devices, the lowering for a GPU, and the model on the kernel.

The forward is the reference itself. The kernel's gradient is the reference's autodiff by
another formula: da = dp b s (1 + a (1 - s)) against autodiff's dp b (s + a s (1 - s)), s the
sigmoid as 1 / (1 + exp(-a)) against lax.logistic. Each side is a product and a sum of a few
float32 terms, each rounding within eps/2 of its result, so float32 gradients agree within 16
eps of the largest entry. Rounded to bfloat16 an entry may round the other way: one bfloat16
ulp, 2^-7 relative."""

from __future__ import annotations

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import on_host_devices, tiny_jax_loss

import jax_impl
from harness.config import get_config
from pallas_kernels import swiglu
from pallas_kernels.reference import gated_silu_reference
from pallas_kernels.swiglu import GateBlocks, gated_silu

EPS32 = float(np.finfo(np.float32).eps)
BF16_ULP = 2.0 ** -7
# Two rows and 16 columns per program, so short inputs take several programs each way.
SMALL = GateBlocks(rows=2, cols=16)


def _gradients(fn, shape, dtype, seed=0):
    k = jax.random.split(jax.random.key(seed), 2)
    h = (2 * jax.random.normal(k[0], shape, jnp.float32)).astype(dtype)
    dp = jax.random.normal(k[1], (*shape[:-1], shape[-1] // 2), jnp.float32).astype(dtype)
    p, pullback = jax.vjp(fn, h)
    return p, pullback(dp)[0]


# Half-widths of one power-of-two block, of five blocks (80 = 5 x 16) and of one that no
# power of two above 4 divides (100); row counts even, odd (7 rows: one per program).
CASES = [((2, 8, 2 * 16), jnp.float32), ((2, 16, 2 * 80), jnp.bfloat16), ((1, 7, 2 * 100), jnp.float32),
         ((3, 8, 2 * 80), jnp.float32), ((1, 7, 2 * 100), jnp.bfloat16)]


@pytest.mark.parametrize("shape, dtype", CASES, ids=[f"{s}-{d.__name__}" for s, d in CASES])
def test_kernel_gradient_matches_the_reference(shape, dtype):
    want_p, want = _gradients(gated_silu_reference, shape, dtype)
    got_p, got = _gradients(functools.partial(gated_silu, implementation="pallas", blocks=SMALL, interpret=True),
                            shape, dtype)
    assert got.dtype == dtype and got.shape == shape
    np.testing.assert_array_equal(np.asarray(got_p, np.float32), np.asarray(want_p, np.float32))
    want = np.asarray(want, np.float64)
    rtol = BF16_ULP if dtype == jnp.bfloat16 else 0.0
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=rtol, atol=16 * EPS32 * np.abs(want).max())


def test_a_wrong_half_fails_the_comparison():
    """The comparison above catches a kernel that swaps the halves' gradients' roles."""
    shape, dtype = (2, 8, 2 * 16), jnp.float32
    _, want = _gradients(gated_silu_reference, shape, dtype)
    _, got = _gradients(functools.partial(gated_silu, implementation="pallas", blocks=SMALL, interpret=True),
                        shape, dtype)
    swapped = np.concatenate(np.split(np.asarray(got), 2, axis=-1)[::-1], axis=-1)
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(swapped, np.asarray(want), atol=16 * EPS32 * np.abs(want).max())


def test_kernel_lowers_for_a_gpu_at_the_large_models_width():
    """The Triton lowering takes only power-of-two tiles: the large model's [T, 2 d_ff] rows,
    lowered for CUDA without a GPU."""
    f = get_config("large").d_ff
    h = jax.ShapeDtypeStruct((2, 64, 2 * f), jnp.bfloat16)
    dp = jax.ShapeDtypeStruct((2, 64, f), jnp.bfloat16)
    bwd = functools.partial(swiglu._backward, blocks=GateBlocks(), interpret=False)
    text = jax.jit(bwd).trace(h, dp).lower(lowering_platforms=("cuda",)).as_text()
    assert "__gpu$xla.gpu.triton" in text or "triton_kernel_call" in text


def test_model_on_the_kernel_matches_the_model_on_xla(monkeypatch):
    """The tiny model's loss and gradients with its FFN gates on the kernel (as on a GPU)
    against the same model on the reference."""
    config, loss, params, tokens = tiny_jax_loss()
    want, want_grads = jax.jit(jax.value_and_grad(loss))(params)
    monkeypatch.setattr(jax_impl.model, "gated_silu",
                        functools.partial(gated_silu, implementation="pallas", blocks=SMALL, interpret=True))
    jax.clear_caches()  # jax.checkpoint keeps the SwiGLU's trace, which called the reference
    assert "pallas_call" in str(jax.make_jaxpr(jax.grad(loss))(params))
    got, got_grads = jax.jit(jax.value_and_grad(loss))(params)
    assert float(got) == float(want)  # the forward is the reference's
    assert jax.tree.structure(got_grads) == jax.tree.structure(want_grads)
    for g, w_ in zip(jax.tree.leaves(got_grads), jax.tree.leaves(want_grads)):
        # the gate's gradients pass through each block's matmuls, norms and the other block:
        # sums of up to d_ff terms per row and of the batch's tokens per weight
        w_ = np.asarray(w_, np.float64)
        np.testing.assert_allclose(np.asarray(g, np.float64), w_, rtol=0.0,
                                   atol=4 * (config.d_ff + tokens.size) * EPS32 * np.abs(w_).max())


_SHARDED = r"""
import json, re, jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from pallas_kernels.swiglu import GateBlocks, gated_silu
k = jax.random.split(jax.random.key(0), 2)
h = jax.random.normal(k[0], (4, 8, 2 * 48), jnp.float32)
c = jax.random.normal(k[1], (4, 8, 48), jnp.float32)
def loss(h):
    p = gated_silu(h, implementation="pallas", blocks=GateBlocks(rows=2, cols=16), interpret=True)
    return jnp.sum(p * c)
step = jax.jit(jax.value_and_grad(loss))
mesh = Mesh(np.array(jax.devices()[:2]), ("data",))
hs = jax.device_put(h, NamedSharding(mesh, P("data")))
l1, g1 = step(h)
l2, g2 = step(hs)
hlo = step.lower(hs).compile().as_text()
print(json.dumps({"devices": len(jax.devices()), "rows_axis": g2.sharding.spec[0],
                  "all_gather": "all-gather" in hlo, "loss": [float(l1), float(l2)],
                  "grads": float(jnp.max(jnp.abs(g1 - g2)))}))
"""


def test_kernel_runs_on_each_devices_rows():
    """Batch-sharded h on two host devices: each device computes its own rows' gradient (no
    all-gather, the gradient split as h is), the same numbers as on one device."""
    proc = on_host_devices(_SHARDED)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["devices"] == 2 and got["rows_axis"] == "data" and not got["all_gather"]
    assert got["grads"] == 0.0  # each row's gradient computed alike wherever it runs
    np.testing.assert_allclose(got["loss"][1], got["loss"][0], rtol=64 * EPS32)  # summed in another order


@pytest.mark.parametrize("shape, kwargs, message", [
    ((2, 4, 15), {}, "an even last one"),
    ((16,), {}, "at least two dims"),
    ((2, 4, 16), {"implementation": "cuda"}, "implementation='cuda'"),
])
def test_bad_arguments_name_what_is_wrong(shape, kwargs, message):
    with pytest.raises(ValueError, match=message):
        gated_silu(jnp.ones(shape), **kwargs)
