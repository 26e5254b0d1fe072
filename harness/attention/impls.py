"""The attention implementations the benchmark and the tuner time, each built for one cell.

Each builder returns ({pass: thunk}, sync, timer kind); JAX works in [batch, seq, heads,
dim], PyTorch in [batch, heads, seq, dim].
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import warnings
from collections.abc import Callable

import jax
import jax.numpy as jnp


def jax_attention(impl: str, interpret: bool, block_sizes: object = None) -> Callable:
    if impl in ("pallas", "pallas_mosaic"):
        from pallas_kernels import flash_attention

        backend = "triton" if impl == "pallas" else "mosaic"
        return lambda q, k, v, causal: flash_attention(q, k, v, causal=causal, interpret=interpret,
                                                       backend=backend, block_sizes=block_sizes)
    if block_sizes is not None:
        raise ValueError(f"block_sizes apply to our kernels only, not {impl=}")
    if impl == "jax_cudnn":
        return lambda q, k, v, causal: jax.nn.dot_product_attention(q, k, v, is_causal=causal,
                                                                    implementation="cudnn")
    if impl == "jax_pallas_mha":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            from jax.experimental.pallas.ops.gpu import attention as jax_attention

        return lambda q, k, v, causal: jax_attention.mha(q, k, v, None, sm_scale=1 / math.sqrt(q.shape[-1]),
                                                         causal=causal)
    if impl == "xla_naive":
        def naive(q, k, v, causal):
            s = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) / math.sqrt(q.shape[-1])
            if causal:
                s = jnp.where(jnp.tril(jnp.ones(s.shape[-2:], bool)), s, -jnp.inf)
            p = jax.nn.softmax(s, axis=-1).astype(q.dtype)
            return jnp.einsum("bhqk,bkhd->bqhd", p, v)

        return naive
    raise ValueError(f"{impl=} is not a JAX implementation")


def build_jax(impl: str, cell: dict, device: str, block_sizes: object = None):
    attention = jax_attention(impl, interpret=device == "cpu", block_sizes=block_sizes)
    shape = (cell["batch"], cell["seq"], cell["heads"], cell["head_dim"])
    keys = jax.random.split(jax.random.key(0), 4)
    q, k, v, do = (jax.random.normal(key, shape, jnp.float32).astype(cell["dtype"]) for key in keys)

    def f(q, k, v):
        return attention(q, k, v, cell["causal"])

    fwd = jax.jit(f)
    fwd_bwd = jax.jit(lambda q, k, v, do: jax.vjp(f, q, k, v)[1](do))
    # The residuals come back as a pytree (jax.tree_util.Partial), so the
    # backward alone can be jitted and timed from them.
    _, vjp_fn = jax.jit(lambda q, k, v: jax.vjp(f, q, k, v))(q, k, v)
    bwd = jax.jit(lambda vjp_fn, do: vjp_fn(do))
    thunks = {"fwd": lambda: fwd(q, k, v), "bwd": lambda: bwd(vjp_fn, do),
              "fwd_bwd": lambda: fwd_bwd(q, k, v, do)}
    return thunks, jax.block_until_ready, "wall"


def build_torch(impl: str, cell: dict, device: str):
    import torch
    import torch.nn.functional as F

    dev = device
    dtype = getattr(torch, cell["dtype"])
    shape = (cell["batch"], cell["heads"], cell["seq"], cell["head_dim"])
    gen = torch.Generator(device=dev).manual_seed(0)
    q, k, v = (torch.randn(shape, device=dev, dtype=dtype, generator=gen).requires_grad_() for _ in range(3))
    do = torch.randn(shape, device=dev, dtype=dtype, generator=gen)
    causal = cell["causal"]

    if impl == "torch_naive":
        future = torch.ones(shape[-2], shape[-2], dtype=torch.bool, device=dev).triu(1)

        def attention(q, k, v):
            s = (q @ k.transpose(-1, -2)).float() / math.sqrt(q.shape[-1])
            if causal:
                s = s.masked_fill(future, float("-inf"))
            return torch.softmax(s, dim=-1).to(q.dtype) @ v

        context = contextlib.nullcontext
    else:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = {"torch_sdpa_flash": SDPBackend.FLASH_ATTENTION,
                   "torch_sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION,
                   "torch_sdpa_cudnn": SDPBackend.CUDNN_ATTENTION}[impl]

        def attention(q, k, v):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        def context():
            return sdpa_kernel(backend)

    def fwd():
        with context(), torch.no_grad():
            return attention(q, k, v)

    with context():
        out = attention(q, k, v)

    def bwd():
        return torch.autograd.grad(out, (q, k, v), do, retain_graph=True)

    def fwd_bwd():
        with context():
            return torch.autograd.grad(attention(q, k, v), (q, k, v), do)

    sync = torch.cuda.synchronize if dev == "cuda" else (lambda *_: None)
    return {"fwd": fwd, "bwd": bwd, "fwd_bwd": fwd_bwd}, sync, "cuda" if dev == "cuda" else "wall"


def block_sizes_for(backend: str, head_dim: int, overrides: dict, seq_len: int | None = None,
                    causal: bool | None = None) -> object:
    """The backend's default block sizes for head_dim, seq_len and causal
    with `overrides` applied (a ValueError from the block-size checks passes
    through)."""
    from pallas_kernels import default_block_sizes

    return dataclasses.replace(default_block_sizes(backend, head_dim, seq_len, causal), **overrides)
