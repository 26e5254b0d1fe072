"""SwiGLU's gate, silu(a) * b, with a and b side by side in one array, and its backward as a
JAX Pallas kernel.

With the FFN's W1 and W3 stacked, one matmul gives h = [a | b] ([..., 2f]), and the gradient
of x is one matmul over the stacked weights instead of two summed. XLA fuses the forward's
reads of the two halves into the product. The backward is where stacking costs: autodiff of
the split hands back da and db, and h's gradient is their concatenation, which XLA runs as a
copy kernel of its own, reading and writing every element of the gradient once more. The
kernel here writes dh = [da | db] in the one pass that computes it:

    p  = silu(a) * b,   silu(a) = a * sigmoid(a)
    da = dp * b * sigmoid(a) * (1 + a * (1 - sigmoid(a)))
    db = dp * silu(a)

Each program reads a block of rows of a, the same block of b and of dp, and writes both
halves of dh. The forward stays XLA's fusion. Under a sharded `jit` the kernel is partitioned
by rows (`pallas_kernels.rows`).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels.reference import gated_silu_reference
from pallas_kernels.rows import by_rows, choose_implementation, dividing_power_of_two

__all__ = ["GateBlocks", "gated_silu"]


@dataclasses.dataclass(frozen=True, slots=True)
class GateBlocks:
    """Block and launch parameters of the backward kernel.

    Attributes:
      rows: rows per program, shrunk to the largest power of two that divides the row count.
      cols: columns of each half per program, shrunk to the largest power of two that
        divides the half's width.
      num_warps: warps per program.
    """

    rows: int = 4
    cols: int = 1024
    num_warps: int = 4



def _bwd_kernel(h_ref, dp_ref, dh_ref):
    # h and dh are viewed as [rows, 2, f]: index 0 of the middle axis is a's half, 1 is b's.
    a = h_ref[:, 0, :].astype(jnp.float32)
    b = h_ref[:, 1, :].astype(jnp.float32)
    dp = dp_ref[...].astype(jnp.float32)
    sig = 1.0 / (1.0 + jnp.exp(-a))
    dh_ref[:, 0, :] = (dp * b * sig * (1.0 + a * (1.0 - sig))).astype(dh_ref.dtype)
    dh_ref[:, 1, :] = (dp * a * sig).astype(dh_ref.dtype)


def _backward(h, dp, *, blocks: GateBlocks, interpret: bool):
    """dh for h [..., 2f] and the product's gradient dp [..., f], in h's dtype."""
    f = dp.shape[-1]
    n = dp.size // f
    rows, cols = dividing_power_of_two(n, blocks.rows), dividing_power_of_two(f, blocks.cols)
    pair = pl.BlockSpec((rows, 2, cols), lambda i, j: (i, 0, j))
    dh = pl.pallas_call(
        _bwd_kernel,
        grid=(n // rows, f // cols),
        in_specs=[pair, pl.BlockSpec((rows, cols), lambda i, j: (i, j))],
        out_specs=pair,
        out_shape=jax.ShapeDtypeStruct((n, 2, f), h.dtype),
        compiler_params=plgpu.CompilerParams(num_warps=blocks.num_warps, num_stages=1),
        interpret=interpret,
        name="gated_silu_bwd",
    )(h.reshape(n, 2, f), dp.reshape(n, f))
    return dh.reshape(h.shape)


@dataclasses.dataclass(frozen=True)
class _Config:
    blocks: GateBlocks
    interpret: bool


def _launch_bwd(h, dp, config):
    return _backward(h, dp, blocks=config.blocks, interpret=config.interpret)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _gated_silu(h, config):
    return gated_silu_reference(h)


def _gated_silu_fwd(h, config):
    return gated_silu_reference(h), h


def _gated_silu_bwd(config, h, dp):
    return (by_rows(_launch_bwd, ("... e", "... f"), ("... e",))(h, dp, config),)


_gated_silu.defvjp(_gated_silu_fwd, _gated_silu_bwd)


def gated_silu(h: jax.Array, *, implementation: str | None = None, blocks: GateBlocks | None = None,
               interpret: bool = False) -> jax.Array:
    """silu(a) * b for h = [a | b] ([..., 2f], a the first half), in h's dtype.

    Args:
      h: the stacked matmul's output, [..., 2f] with at least one leading dim.
      implementation: "pallas" (the backward kernel), "xla" (the jnp reference, autodiff
        and XLA's fusion both ways), or None: the kernel on a GPU, the reference elsewhere and
        for arrays split over a mesh's explicit axes, which a Pallas call refuses.
      blocks: the backward's block and launch parameters; `GateBlocks()` if None.
      interpret: run the kernel in the Pallas interpreter (works on CPU).

    Differentiable in h; computed in float32 whatever h's dtype.
    """
    if h.ndim < 2 or h.shape[-1] % 2:
        raise ValueError(f"gated_silu takes h [..., 2f] (at least two dims, an even last one); got {h.shape}")
    if choose_implementation(implementation, h) == "xla":
        return gated_silu_reference(h)
    return _gated_silu(h, _Config(blocks or GateBlocks(), bool(interpret)))
