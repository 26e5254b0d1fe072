"""Plain-jnp attention (float32 throughout), residual add + RMSNorm and SwiGLU's gate: the
references for tests and benchmarks."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

__all__ = ["add_rms_norm_reference", "gated_silu_reference", "mha_reference", "reference_lse"]


def _reference_scores(q: jax.Array, k: jax.Array, causal: bool, sm_scale: float | None) -> jax.Array:
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(q.shape[-1])
    s = jnp.einsum("bqhd,bkhd->bhqk", q.astype(jnp.float32), k.astype(jnp.float32),
                   precision=lax.Precision.HIGHEST) * sm_scale
    if causal:
        seq_len = q.shape[1]
        s = jnp.where(jnp.tril(jnp.ones((seq_len, seq_len), dtype=bool)), s, -jnp.inf)
    return s


def mha_reference(q: jax.Array, k: jax.Array, v: jax.Array, *, causal: bool = True,
                  sm_scale: float | None = None) -> jax.Array:
    """softmax(q k^T * sm_scale) v in float32; [batch, seq, heads, head_dim]."""
    p = jax.nn.softmax(_reference_scores(q, k, causal, sm_scale), axis=-1)
    return jnp.einsum("bhqk,bkhd->bqhd", p, v.astype(jnp.float32), precision=lax.Precision.HIGHEST)


def reference_lse(q: jax.Array, k: jax.Array, *, causal: bool = True,
                  sm_scale: float | None = None) -> jax.Array:
    """Row log-sum-exp of the scaled scores in float32; [batch, heads, seq]."""
    return jax.nn.logsumexp(_reference_scores(q, k, causal, sm_scale), axis=-1)


def add_rms_norm_reference(x: jax.Array, delta: jax.Array | None, w: jax.Array, *, eps: float,
                           out_dtype: jnp.dtype | None = None) -> tuple[jax.Array, jax.Array]:
    """(h, y): h = x + delta in x's dtype (x when delta is None), y = h * rsqrt(mean(h^2) + eps) * w
    computed in float32, cast to out_dtype (x's dtype if None)."""
    h = x if delta is None else (x.astype(jnp.float32) + delta.astype(jnp.float32)).astype(x.dtype)
    h32 = h.astype(jnp.float32)
    rstd = lax.rsqrt(jnp.mean(h32 * h32, axis=-1, keepdims=True) + eps)
    return h, (h32 * rstd * w.astype(jnp.float32)).astype(out_dtype or x.dtype)


def gated_silu_reference(h: jax.Array) -> jax.Array:
    """silu(a) * b for h = [a | b] split in halves along the last axis, computed in float32 and
    cast to h's dtype."""
    a, b = jnp.split(h.astype(jnp.float32), 2, axis=-1)
    return (jax.nn.silu(a) * b).astype(h.dtype)
