"""FlashAttention forward and backward for Hopper GPUs (sm_90) in Pallas Mosaic GPU.

The portable kernels (`pallas_kernels.triton`) go through the Triton
lowering, which on Hopper issues neither `wgmma` nor TMA copies. These follow
FlashAttention-3 (Shah et al. 2024, arXiv:2407.08608) instead: `tiles` holds
the per-shape parameters and their table of defaults, `pipeline` the pieces
every kernel shares, `forward` and `backward` the kernels. Layout and
contracts are those of the portable kernels: q, k, v, o are
[batch, seq, heads, head_dim]; lse is [batch, heads, seq] float32, natural log.
"""

from pallas_kernels.hopper.backward import mosaic_backward
from pallas_kernels.hopper.forward import mosaic_forward
from pallas_kernels.hopper.pipeline import (
    AVAILABLE,
    SUPPORTED_DTYPES,
    unsupported_reason,
)
from pallas_kernels.hopper.tiles import (
    DEFAULTS,
    SEQ_MULTIPLE,
    SUPPORTED_HEAD_DIMS,
    MosaicBlockSizes,
)

__all__ = [
    "AVAILABLE",
    "DEFAULTS",
    "SEQ_MULTIPLE",
    "SUPPORTED_DTYPES",
    "SUPPORTED_HEAD_DIMS",
    "MosaicBlockSizes",
    "mosaic_backward",
    "mosaic_forward",
    "unsupported_reason",
]
