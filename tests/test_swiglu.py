"""The SwiGLU FFN around its epilogue kernels: the hand-written backward against autodiff of the
plain FFN, the backends' dispatch, and the Mosaic kernels lowered for a Hopper GPU (on any
machine: lowering needs no GPU)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import swiglu as sw


def _plain(x, w1, w2, w3):
    lin = lambda a, w: jnp.einsum("...i,oi->...o", a, w)  # noqa: E731
    return lin(jax.nn.silu(lin(x, w1)) * lin(x, w3), w2)


def _inputs(dtype=jnp.float32):
    k = jax.random.split(jax.random.key(0), 5)
    x = jax.random.normal(k[0], (2, 8, 16))
    w1, w3 = (jax.random.normal(kk, (32, 16)) * 0.2 for kk in (k[1], k[3]))
    w2 = jax.random.normal(k[2], (16, 32)) * 0.2
    ct = jax.random.normal(k[4], (2, 8, 16))
    return tuple(a.astype(dtype) for a in (x, w1, w2, w3, ct))


def test_the_hand_written_backward_is_autodiff_of_the_plain_ffn() -> None:
    x, w1, w2, w3, ct = _inputs()
    y_ref, vjp_ref = jax.vjp(_plain, x, w1, w2, w3)
    y, vjp = jax.vjp(lambda *a: sw.swiglu_ffn(*a, backend="reference"), x, w1, w2, w3)
    # float32 throughout: the two differ by summation order only.
    np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-5)
    for got, want in zip(vjp(ct), vjp_ref(ct)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_mosaic_says_why_it_cannot_run_and_auto_falls_back() -> None:
    x, w1, w2, w3, _ = _inputs()
    with pytest.raises(ValueError, match="cannot run here"):
        sw.swiglu_ffn(x, w1, w2, w3, backend="mosaic")
    with pytest.raises(ValueError, match="backend='cuda'"):
        sw.swiglu_ffn(x, w1, w2, w3, backend="cuda")
    np.testing.assert_array_equal(sw.swiglu_ffn(x, w1, w2, w3), sw.swiglu_ffn(x, w1, w2, w3, backend="reference"))


def test_the_kernels_lower_for_a_hopper_gpu() -> None:
    from pallas_kernels.hopper import gated
    from pallas_kernels.hopper.pipeline import AVAILABLE

    if not AVAILABLE:
        pytest.skip("this jax has no Mosaic GPU")
    spec = jax.ShapeDtypeStruct
    m, d, f = 256, 128, 256
    x, w1, w2, h = (spec(s, jnp.bfloat16) for s in ((m, d), (f, d), (d, f), (m, f)))
    for fn, args, name in ((gated.gate_up, (x, w1, w1), "swiglu_gate_up"),
                           (gated.gate_down, (x, w2, h, h), "swiglu_gate_down")):
        text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
        assert "mosaic_gpu" in text, name
    assert gated.shape_reason(256, 128, 256) is None
    assert gated.shape_reason(200, 128, 256) == "tokens=200 is not a multiple of 128"
