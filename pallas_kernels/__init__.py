"""Pallas kernels for the profiling workbench."""

from pallas_kernels.flash_attention import (
    BACKENDS,
    MAX_HEAD_DIM,
    BlockSizes,
    MosaicBlockSizes,
    flash_attention,
    flash_attention_with_lse,
    mha_reference,
    reference_lse,
)

__all__ = [
    "BACKENDS",
    "MAX_HEAD_DIM",
    "BlockSizes",
    "MosaicBlockSizes",
    "flash_attention",
    "flash_attention_with_lse",
    "mha_reference",
    "reference_lse",
]
