"""Pallas kernels for the profiling workbench.

`flash_attention` (differentiable) and `flash_attention_with_lse` (forward
only) dispatch to the portable FlashAttention-2 kernels (`triton`) or the
Hopper kernels (`hopper`); `mha_reference` is the float32 jnp reference.
`add_rms_norm` is the residual add with RMSNorm (`rmsnorm`), beside its
reference `add_rms_norm_reference`; `gated_silu` is SwiGLU's gate over the
stacked matmul's two halves, its backward a kernel (`swiglu`), beside
`gated_silu_reference`. `rows` holds what the row-wise kernels share.
"""

from pallas_kernels.attention import (
    BACKENDS,
    default_block_sizes,
    flash_attention,
    flash_attention_with_lse,
    resolve_backend,
)
from pallas_kernels.hopper import MosaicBlockSizes
from pallas_kernels.reference import add_rms_norm_reference, gated_silu_reference, mha_reference, reference_lse
from pallas_kernels.rmsnorm import NormBlocks, add_rms_norm
from pallas_kernels.swiglu import GateBlocks, gated_silu
from pallas_kernels.triton import MAX_HEAD_DIM, BlockSizes

__all__ = [
    "BACKENDS",
    "MAX_HEAD_DIM",
    "BlockSizes",
    "GateBlocks",
    "MosaicBlockSizes",
    "NormBlocks",
    "add_rms_norm",
    "add_rms_norm_reference",
    "default_block_sizes",
    "flash_attention",
    "flash_attention_with_lse",
    "gated_silu",
    "gated_silu_reference",
    "mha_reference",
    "reference_lse",
    "resolve_backend",
]
