"""SwiGLU's FFN with its elementwise work in the epilogues of its GEMMs (Hopper kernels in
`pallas_kernels.hopper.gated`), beside the plain references of the two fused steps.

    h1 = x w1^T,  h3 = x w3^T,  g = silu(h1) * h3,  y = g w2^T

The backward is written by hand around the two kernels: dg = dy w2 goes through the gate
inside `gate_down`, which also recomputes g for w2's gradient; the residuals are x, h1 and h3,
as under the plain model's remat policy.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

BACKENDS = ("auto", "mosaic", "reference")


def _dot(a: jax.Array, b: jax.Array, spec: str) -> jax.Array:
    return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)


def gate_up_reference(x: jax.Array, w1: jax.Array, w3: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(h1, h3, g) in x's dtype, from float32 products as the kernel computes them."""
    h1, h3 = (_dot(x, w, "md,fd->mf").astype(x.dtype) for w in (w1, w3))
    a = h1.astype(jnp.float32)
    return h1, h3, (jax.nn.sigmoid(a) * a * h3.astype(jnp.float32)).astype(x.dtype)


def gate_down_reference(dy: jax.Array, w2: jax.Array, h1: jax.Array, h3: jax.Array
                        ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(dh1, dh3, g): dg = dy w2 through g = silu(h1) * h3, and g, in dy's dtype."""
    dg = _dot(dy, w2, "md,df->mf")
    a, b = h1.astype(jnp.float32), h3.astype(jnp.float32)
    sig = jax.nn.sigmoid(a)
    silu = a * sig
    return ((dg * b * sig * (1.0 + a * (1.0 - sig))).astype(dy.dtype), (dg * silu).astype(dy.dtype),
            (silu * b).astype(dy.dtype))


def unsupported_reason(x: jax.Array, w1: jax.Array) -> str | None:
    """Why the Mosaic kernels cannot run this FFN here, or None."""
    from pallas_kernels.hopper import gated
    from pallas_kernels.hopper.pipeline import AVAILABLE

    if not AVAILABLE:
        return "jax.experimental.pallas.mosaic_gpu is unavailable"
    device = jax.devices()[0]
    if device.platform != "gpu" or not str(getattr(device, "compute_capability", "")).startswith("9."):
        return f"device {device.device_kind!r} is not a Hopper GPU"
    if x.dtype != jnp.bfloat16 or w1.dtype != jnp.bfloat16:
        return f"dtype {x.dtype} / {w1.dtype}: the kernels take bfloat16"
    tokens = x.size // x.shape[-1]
    return gated.shape_reason(tokens, x.shape[-1], w1.shape[0])


def _kernels(backend: str):
    if backend == "reference":
        return gate_up_reference, gate_down_reference
    from pallas_kernels.hopper import gated

    return gated.gate_up, gated.gate_down


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _ffn(x, w1, w2, w3, backend):
    return _ffn_fwd(x, w1, w2, w3, backend)[0]


def _ffn_fwd(x, w1, w2, w3, backend):
    up, _ = _kernels(backend)
    x2 = x.reshape(-1, x.shape[-1])
    h1, h3, g = up(x2, w1, w3)
    y = jnp.einsum("mf,df->md", g, w2)
    return y.reshape(x.shape), (x2, w1, w2, w3, h1, h3)


def _ffn_bwd(backend, res, dy):
    _, down = _kernels(backend)
    x2, w1, w2, w3, h1, h3 = res
    dy2 = dy.reshape(-1, dy.shape[-1])
    dh1, dh3, g = down(dy2, w2, h1, h3)
    dw2 = jnp.einsum("md,mf->df", dy2, g)
    dw1, dw3 = (jnp.einsum("mf,md->fd", dh, x2) for dh in (dh1, dh3))
    dx = jnp.einsum("mf,fd->md", dh1, w1) + jnp.einsum("mf,fd->md", dh3, w3)
    return dx.reshape(dy.shape), dw1, dw2, dw3


_ffn.defvjp(_ffn_fwd, _ffn_bwd)


def swiglu_ffn(x: jax.Array, w1: jax.Array, w2: jax.Array, w3: jax.Array, *, backend: str = "auto") -> jax.Array:
    """y = (silu(x w1^T) * (x w3^T)) w2^T for x [..., d_model], w1 and w3 [d_ff, d_model],
    w2 [d_model, d_ff], all of one dtype; differentiable in all four.

    backend: "mosaic" (the Hopper kernels; a ValueError says why where they cannot run),
    "reference" (the jnp references, any device), "auto" (mosaic where it can run)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not one of {BACKENDS}")
    if backend != "reference":
        reason = unsupported_reason(x, w1)
        if reason is not None and backend == "mosaic":
            raise ValueError(f"the SwiGLU kernels cannot run here: {reason}")
        backend = "reference" if reason is not None else "mosaic"
    return _ffn(x, w1, w2, w3, backend)
