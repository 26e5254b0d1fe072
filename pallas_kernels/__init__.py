"""Pallas attention kernels for the profiling workbench.

`flash_attention` (differentiable) and `flash_attention_with_lse` (forward
only) dispatch to the portable FlashAttention-2 kernels (`triton`) or the
Hopper kernels (`hopper`); `mha_reference` is the float32 jnp reference.
"""

from pallas_kernels.attention import (
    BACKENDS,
    default_block_sizes,
    flash_attention,
    flash_attention_with_lse,
    resolve_backend,
)
from pallas_kernels.hopper import MosaicBlockSizes
from pallas_kernels.reference import mha_reference, reference_lse
from pallas_kernels.triton import MAX_HEAD_DIM, BlockSizes

__all__ = [
    "BACKENDS",
    "MAX_HEAD_DIM",
    "BlockSizes",
    "MosaicBlockSizes",
    "default_block_sizes",
    "flash_attention",
    "flash_attention_with_lse",
    "mha_reference",
    "reference_lse",
    "resolve_backend",
]
