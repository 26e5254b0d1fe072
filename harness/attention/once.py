"""One forward+backward of an attention kernel, as a target for a kernel profiler (the
library behind `python -m harness.attention_once`).

Runs `flash_attention` once under `jax.grad` (forward, then the backward
kernels), so each kernel launches exactly once per --repeat.

JAX normally reserves most of the GPU as one pool. Nsight Compute's kernel
replay saves and restores every allocation a kernel could write, so with the
pool in place each replay pass copies tens of GiB to the host and a profile
of a backward kernel times out or fails. This program therefore switches JAX
to plain per-buffer allocations (`XLA_PYTHON_CLIENT_ALLOCATOR=platform`)
before JAX starts.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

os.environ.setdefault("XLA_PYTHON_CLIENT_ALLOCATOR", "platform")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from harness.attention.catalog import DTYPES  # noqa: E402

if TYPE_CHECKING:
    from harness.attention.options import OnceOptions


def run(args: OnceOptions) -> tuple[jax.Array, ...]:
    """Compiles and runs forward+backward 1 + args.repeat times; returns the
    last gradients (dq, dk, dv)."""
    from pallas_kernels import flash_attention

    interpret = args.device == "cpu"
    causal = args.causal
    shape = (args.batch, args.seq, args.heads, args.head_dim)
    q, k, v = (jax.random.normal(jax.random.key(i), shape, jnp.float32).astype(jnp.dtype(DTYPES[args.dtype]))
               for i in range(3))

    def loss(q, k, v):
        o = flash_attention(q, k, v, causal=causal, backend=args.kernel, block_sizes=args.block_sizes,
                            interpret=interpret)
        return o.astype(jnp.float32).sum()

    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    for _ in range(1 + args.repeat):
        grads = jax.block_until_ready(grad(q, k, v))
    return grads
