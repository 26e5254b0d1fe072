"""The Transformer LM in Flax NNX: pre-norm blocks, RoPE, SwiGLU, RMSNorm, untied head.

Parameter names and layouts match `torch_impl/model.py` one to one (linear weights are
stored [d_out, d_in] and applied as y = x W^T), so weight conversion is a plain copy.
The model computes in the dtype of its parameters; mixed precision is applied from
outside by casting the float32 master parameters before the call (see harness.run).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from harness.config import ModelConfig
from pallas_kernels.rmsnorm import add_rms_norm


def trunc_normal(key: jax.Array, shape: tuple[int, ...], std: float) -> jax.Array:
    """Truncated normal init, cut at +-3 std."""
    return std * jax.random.truncated_normal(key, -3.0, 3.0, shape, jnp.float32)


class Linear(nnx.Module):
    """Bias-free linear layer, weight [d_out, d_in], std sqrt(2 / (d_in + d_out))."""

    def __init__(self, d_in: int, d_out: int, *, rngs: nnx.Rngs):
        self.weight = nnx.Param(trunc_normal(rngs.params(), (d_out, d_in), math.sqrt(2.0 / (d_in + d_out))))

    def __call__(self, x: jax.Array) -> jax.Array:
        return linear(x, self.weight[...])


def linear(x: jax.Array, w: jax.Array) -> jax.Array:
    """y = x W^T for W [d_out, d_in]; the input takes the weight's dtype, as torch autocast
    does for matmuls."""
    return jnp.einsum("...i,oi->...o", x.astype(w.dtype), w)


class Embedding(nnx.Module):
    def __init__(self, vocab_size: int, d_model: int, *, rngs: nnx.Rngs):
        self.weight = nnx.Param(trunc_normal(rngs.params(), (vocab_size, d_model), 1.0))

    def __call__(self, tokens: jax.Array) -> jax.Array:
        return jnp.take(self.weight[...], tokens, axis=0)


class RMSNorm(nnx.Module):
    def __init__(self, d_model: int, eps: float):
        self.eps = eps
        self.weight = nnx.Param(jnp.ones((d_model,), jnp.float32))

    def __call__(self, x: jax.Array, delta: jax.Array | None = None, *,
                 out_dtype: jnp.dtype | None = None) -> tuple[jax.Array, jax.Array]:
        """(x + delta, the sum normalized): the residual add done with the norm, so that on a GPU
        one kernel reads the float32 stream once each way (`pallas_kernels.rmsnorm`). Computed
        in float32 whatever the input dtype; the result in out_dtype (x's by default)."""
        return add_rms_norm(x, delta, self.weight[...], eps=self.eps, out_dtype=out_dtype)


def rope_tables(seq_len: int, d_head: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """RoPE's rotation as two [seq, d_head] float32 tables for `apply_rope`: cos(p * f_i) at
    both positions of pair i, and sin(p * f_i) signed -, + (f_i = theta^(-2i/d_head)).

    Computed with NumPy while tracing, so the step holds them as constants. Computed inside
    the jitted step instead, XLA fuses the cos and sin into each consumer and evaluates them
    once per element of q and k rather than once per position and frequency."""
    inv_freq = np.float32(theta) ** (-np.arange(0, d_head, 2, dtype=np.float32) / np.float32(d_head))
    angles = np.arange(seq_len, dtype=np.float32)[:, None] * inv_freq[None, :]
    cos, sin = np.cos(angles), np.sin(angles)
    return (jnp.asarray(np.repeat(cos, 2, axis=-1)),
            jnp.asarray(np.stack((-sin, sin), axis=-1).reshape(seq_len, d_head)))


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate adjacent pairs (2i, 2i+1) of the last axis in place of the pair, in float32.
    x: (B, T, nh, hd); cos, sin from `rope_tables`. Written as x * cos + swap(x) * sin, with
    swap exchanging each pair's two entries: one elementwise pass, where slicing the even
    and odd entries and stacking the results back takes strided reads and a concatenation."""
    x32 = x.astype(jnp.float32)
    swapped = x32.reshape(*x.shape[:-1], x.shape[-1] // 2, 2)[..., ::-1].reshape(x.shape)
    return (x32 * cos[:, None, :] + swapped * sin[:, None, :]).astype(x.dtype)


class CausalSelfAttention(nnx.Module):
    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        d = config.d_model
        self.num_heads, self.d_head = config.num_heads, config.d_head
        self.rope_theta, self.attention = config.rope_theta, config.attention
        self.q_proj, self.k_proj, self.v_proj = (Linear(d, d, rngs=rngs) for _ in range(3))
        self.output_proj = Linear(d, d, rngs=rngs)

    # The three steps of naive attention are separate methods so that a profiler can
    # wrap each one from outside (the harness's --annotate-attention).
    def scores(self, q: jax.Array, k: jax.Array) -> jax.Array:
        return jnp.einsum("BTNH,BSNH->BNTS", q, k) * (1.0 / math.sqrt(self.d_head))

    def softmax(self, scores: jax.Array) -> jax.Array:
        T = scores.shape[-1]
        mask = jnp.tril(jnp.ones((T, T), dtype=bool))
        # softmax in float32, probabilities back in the input dtype (as torch does).
        s32 = jnp.where(mask, scores.astype(jnp.float32), -jnp.inf)
        return jax.nn.softmax(s32, axis=-1).astype(scores.dtype)

    def values(self, probs: jax.Array, v: jax.Array) -> jax.Array:
        return jnp.einsum("BNTS,BSNH->BTNH", probs.astype(v.dtype), v)

    def __call__(self, x: jax.Array) -> jax.Array:
        B, T, D = x.shape
        # (B, T, D) -> (B, T, nh, hd)
        q, k, v = (p(x).reshape(B, T, self.num_heads, self.d_head) for p in (self.q_proj, self.k_proj, self.v_proj))
        cos, sin = rope_tables(T, self.d_head, self.rope_theta)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        scale = 1.0 / math.sqrt(self.d_head)
        if self.attention == "fused":
            # implementation=None means XLA's composite attention (the scores materialized),
            # not a fused kernel: ask for cuDNN's flash attention where it runs, as torch's
            # SDPA picks its flash kernel.
            cudnn = jax.default_backend() == "gpu" and q.dtype in (jnp.bfloat16, jnp.float16)
            y = jax.nn.dot_product_attention(q, k, v, scale=scale, is_causal=True,
                                             implementation="cudnn" if cudnn else None)
        elif self.attention == "pallas":
            from pallas_kernels import flash_attention

            # Pallas GPU kernels run in the Pallas interpreter on a CPU-only JAX.
            y = flash_attention(q, k, v, causal=True, sm_scale=scale, interpret=jax.default_backend() == "cpu")
        else:
            y = self.values(self.softmax(self.scores(q, k)), v)
        return self.output_proj(y.reshape(B, T, D))


class SwiGLU(nnx.Module):
    def __init__(self, d_model: int, d_ff: int, *, rngs: nnx.Rngs):
        self.w1 = Linear(d_model, d_ff, rngs=rngs)
        self.w2 = Linear(d_ff, d_model, rngs=rngs)
        self.w3 = Linear(d_model, d_ff, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        # w1 and w3 run as one matmul of their stacked weights: its weight gradient is one
        # [2 d_ff, d_model] product (twice the output tiles of each alone, so fewer SMs idle
        # in its last wave of tiles), and the backward's elementwise pass writes the two
        # halves of its input gradient as one array. Under remat keeping only the matmuls'
        # outputs, the backward gets that product and recomputes silu and the gate from it,
        # where plain autodiff keeps six [B, T, d_ff] arrays per layer (silu's intermediates,
        # the product). Recomputing is elementwise work on inputs the backward reads anyway.
        keep_matmuls = jax.checkpoint_policies.dots_with_no_batch_dims_saveable
        w13 = jnp.concatenate([self.w1.weight[...], self.w3.weight[...]])
        return jax.checkpoint(swiglu, policy=keep_matmuls)(x, w13, self.w2.weight[...])


def swiglu(x: jax.Array, w13: jax.Array, w2: jax.Array) -> jax.Array:
    """silu(x W1^T) * (x W3^T), projected by W2, for w13 = [W1; W3] ([2 d_ff, d_model])."""
    gate, up = jnp.split(linear(x, w13), 2, axis=-1)
    return linear(jax.nn.silu(gate) * up, w2)


class TransformerBlock(nnx.Module):
    def __init__(self, config: ModelConfig, index: int, *, rngs: nnx.Rngs):
        self.ln1 = RMSNorm(config.d_model, config.norm_eps)
        self.attn = CausalSelfAttention(config, rngs=rngs)
        self.ln2 = RMSNorm(config.d_model, config.norm_eps)
        self.ffn = SwiGLU(config.d_model, config.layer_d_ff(index), rngs=rngs)

    def __call__(self, x: jax.Array, delta: jax.Array | None) -> tuple[jax.Array, jax.Array]:
        """x: the residual stream; delta: the previous block's output, not yet added (None in the
        first block). Returns the stream after attention and the FFN's output: the next norm adds
        it, as ln2 adds attention's."""
        # Named scopes label the HLO ops' metadata (op_name) and nothing else; a profile's
        # kernels are joined to layers through them (harness.trace.analyses.hlo_join).
        with jax.named_scope("ln1"):
            x, a = self.ln1(x, delta, out_dtype=self.attn.q_proj.weight[...].dtype)
        with jax.named_scope("attn"):
            a = self.attn(a)
        with jax.named_scope("ln2"):
            h, f = self.ln2(x, a, out_dtype=self.ffn.w1.weight[...].dtype)
        with jax.named_scope("ffn"):
            f = self.ffn(f)
        return h, f


class TransformerLM(nnx.Module):
    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.token_embeddings = Embedding(config.vocab_size, config.d_model, rngs=rngs)
        self.layers = nnx.List([TransformerBlock(config, i, rngs=rngs) for i in range(config.num_layers)])
        self.ln_final = RMSNorm(config.d_model, config.norm_eps)
        self.lm_head = Linear(config.d_model, config.vocab_size, rngs=rngs)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        """tokens (B, T) int -> logits (B, T, vocab)."""
        with jax.named_scope("token_embeddings"):
            x = self.token_embeddings(tokens)
        delta = None
        for i, layer in enumerate(self.layers):
            with jax.named_scope(f"layers.{i}"):
                x, delta = layer(x, delta)
        with jax.named_scope("ln_final"):
            _, x = self.ln_final(x, delta, out_dtype=self.lm_head.weight[...].dtype)
        with jax.named_scope("lm_head"):
            return self.lm_head(x)


def cross_entropy_loss(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Mean next-token cross-entropy, computed in float32."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))
