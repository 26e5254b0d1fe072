"""The Transformer LM in PyTorch: pre-norm blocks, RoPE, SwiGLU, RMSNorm, untied head.

Parameter names and layouts match `jax_impl/model.py` one to one (linear weights are
stored [d_out, d_in] and applied as y = x W^T), so weight conversion is a plain copy.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from harness.config import ModelConfig


def trunc_normal_(weight: torch.Tensor, std: float) -> torch.Tensor:
    """Truncated normal init, cut at +-3 std."""
    return nn.init.trunc_normal_(weight, mean=0.0, std=std, a=-3 * std, b=3 * std)


class Linear(nn.Module):
    """Bias-free linear layer, weight [d_out, d_in], std sqrt(2 / (d_in + d_out))."""

    def __init__(self, d_in: int, d_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(d_out, d_in))
        trunc_normal_(self.weight, math.sqrt(2.0 / (d_in + d_out)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


class Embedding(nn.Module):
    def __init__(self, vocab_size: int, d_model: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, d_model))
        trunc_normal_(self.weight, 1.0)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.weight[tokens]


class RMSNorm(nn.Module):
    def __init__(self, d_model: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Computed in float32 whatever the input dtype, then cast back.
        x32 = x.float()
        rms = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * rms * self.weight.float()).to(x.dtype)


def rope_angles(seq_len: int, d_head: int, theta: float, device) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE's rotation as two [seq, d_head] float32 tables for `apply_rope`: cos(p * f_i) at
    both positions of pair i, and sin(p * f_i) signed -, + (f_i = theta^(-2i/d_head))."""
    inv_freq = theta ** (-torch.arange(0, d_head, 2, device=device, dtype=torch.float32) / d_head)
    angles = torch.arange(seq_len, device=device, dtype=torch.float32)[:, None] * inv_freq[None, :]
    cos, sin = angles.cos(), angles.sin()
    return cos.repeat_interleave(2, dim=-1), torch.stack((-sin, sin), dim=-1).flatten(-2)


@torch.library.custom_op("xfprof::rope_angles", mutates_args=())
def _rope_angles_op(seq_len: int, d_head: int, theta: float, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    return rope_angles(seq_len, d_head, theta, device)


@_rope_angles_op.register_fake
def _(seq_len, d_head, theta, device):
    return tuple(torch.empty(seq_len, d_head, device=device) for _ in range(2))


def rope_tables(seq_len: int, d_head: int, theta: float, device) -> tuple[torch.Tensor, torch.Tensor]:
    """`rope_angles`, made opaque to torch.compile: as plain ops, Inductor fuses the pow,
    cos and sin into the kernels that apply RoPE and evaluates them once per element of q
    and k in every layer. As one op the tables are computed once per step (the compiler
    merges the layers' identical calls) and the RoPE kernels only read them. Eager calls the
    function itself, which costs less than the op's dispatch."""
    if torch.compiler.is_compiling():
        return _rope_angles_op(seq_len, d_head, theta, torch.device(device))
    return rope_angles(seq_len, d_head, theta, device)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate adjacent pairs (2i, 2i+1) of the last axis in place of the pair, in float32.
    x: (B, T, nh, hd); cos, sin from `rope_angles`. Written as x * cos + swap(x) * sin, with
    swap exchanging each pair's two entries: one elementwise pass over x as the projection
    laid it out, where slicing the even and odd entries, stacking the results back and
    writing them in attention's (B, nh, T, hd) order takes strided reads and writes."""
    x32 = x.float()
    swapped = x32.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)
    return (x32 * cos[:, None, :] + swapped * sin[:, None, :]).to(x.dtype)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        d = config.d_model
        self.num_heads, self.d_head = config.num_heads, config.d_head
        self.rope_theta, self.attention = config.rope_theta, config.attention
        if self.attention == "pallas":
            raise ValueError("attention='pallas' is a JAX kernel; use 'naive' or 'fused' in torch_impl")
        self.q_proj, self.k_proj, self.v_proj = Linear(d, d), Linear(d, d), Linear(d, d)
        self.output_proj = Linear(d, d)

    # The three steps of naive attention are separate methods so that a profiler can
    # wrap each one from outside (the harness's --annotate-attention).
    def scores(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.d_head))

    def softmax(self, scores: torch.Tensor) -> torch.Tensor:
        T = scores.shape[-1]
        mask = torch.ones(T, T, dtype=torch.bool, device=scores.device).tril()
        # softmax in float32 (what autocast would do too), probabilities back in input dtype.
        return torch.softmax(scores.float().masked_fill(~mask, float("-inf")), dim=-1).to(scores.dtype)

    def values(self, probs: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return probs.to(v.dtype) @ v

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape
        # (B, T, D) -> (B, T, nh, hd): RoPE in the projections' layout, then (B, nh, T, hd) views
        q, k, v = (proj(x).view(B, T, self.num_heads, self.d_head) for proj in (self.q_proj, self.k_proj, self.v_proj))
        cos, sin = rope_tables(T, self.d_head, self.rope_theta, x.device)
        q, k, v = (t.transpose(1, 2) for t in (apply_rope(q, cos, sin), apply_rope(k, cos, sin), v))
        if self.attention == "fused":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0 / math.sqrt(self.d_head))
        else:
            y = self.values(self.softmax(self.scores(q, k)), v)
        return self.output_proj(y.transpose(1, 2).reshape(B, T, D))


class SwiGLU(nn.Module):
    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.w1, self.w2, self.w3 = Linear(d_model, d_ff), Linear(d_ff, d_model), Linear(d_model, d_ff)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, config: ModelConfig, index: int):
        super().__init__()
        self.ln1 = RMSNorm(config.d_model, config.norm_eps)
        self.attn = CausalSelfAttention(config)
        self.ln2 = RMSNorm(config.d_model, config.norm_eps)
        self.ffn = SwiGLU(config.d_model, config.layer_d_ff(index))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attn(self.ln1(x))
        return h + self.ffn(self.ln2(h))


class TransformerLM(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.token_embeddings = Embedding(config.vocab_size, config.d_model)
        self.layers = nn.ModuleList(TransformerBlock(config, i) for i in range(config.num_layers))
        self.ln_final = RMSNorm(config.d_model, config.norm_eps)
        self.lm_head = Linear(config.d_model, config.vocab_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (B, T) int -> logits (B, T, vocab)."""
        x = self.token_embeddings(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.ln_final(x))


def cross_entropy_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy, computed in float32."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
