"""Tile and launch parameters of the Hopper kernels, and the table of defaults.

Sizes that every shipped shape uses are constants here; what differs between
shapes is a field of `MosaicBlockSizes`, and `DEFAULTS` says which shape gets
which value, in the manner of FlashAttention-3's tile-size tables
(`hopper/tile_size.h`): a few rows per (head_dim, causal, sequence length).
"""

from __future__ import annotations

import dataclasses

# Query rows per forward consumer warpgroup: one wgmma M tile.
BLOCK_Q = 64
# Key rows per forward pipeline step.
BLOCK_K = 128
# dQ kernel: query rows per consumer. dK/dV and fused kernels: key rows per consumer.
BLOCK_Q_DQ = 64
BLOCK_K_DKV = 64
# Depth of the backward kernels' rings.
NUM_STAGES_BWD = 2
# Sequences are zero-padded to a multiple of this: every tile above divides
# it (a backward CTA owns 2 x 64 rows); the forward's 192-row tiles do not
# need to, since consumers past the end idle.
SEQ_MULTIPLE = 128

# Registers per thread after `setmaxnreg`, (consumer, producer), by the
# number of consumer warpgroups: the whole register file of one CTA (65536)
# either way, 2 * 232 + 40 = 3 * 168 and 3 * 160 + 32 = 4 * 128.
REGISTERS = {2: (232, 40), 3: (160, 32)}
# lse_early holds 16 more registers per thread across the wait for S: its
# consumers take 240 and leave the producer 24 (enough for its loop of
# barrier waits and TMA issues).
LSE_EARLY_REGISTERS = (240, 24)

# wgmma consumes 16 bf16/fp16 values of the contraction per instruction and
# shared-memory rows must be a whole number of 32-byte swizzle atoms, so
# head_dim must be a multiple of 16; above 128 the two consumers'
# accumulators no longer fit in registers next to the score tile.
SUPPORTED_HEAD_DIMS = (32, 48, 64, 80, 96, 112, 128)


def padded_length(seq_len: int) -> int:
    """Sequences are zero-padded to whole SEQ_MULTIPLE tiles before the kernels run."""
    return -(-seq_len // SEQ_MULTIPLE) * SEQ_MULTIPLE


@dataclasses.dataclass(frozen=True, slots=True)
class MosaicBlockSizes:
    """The per-shape choices of the Hopper kernels (see `DEFAULTS`).

    Forward (one CTA per SM walks a static schedule of query tiles; FA3 §3.1):
      num_stages: depth of the K/V ring in shared memory.
      consumers: consumer warpgroups per CTA, 2 or 3. Three share each K/V
        block among 192 query rows (FA3's head_dim 64 tile) on 160
        registers each instead of 232.
      overlap: each consumer overlaps its softmax with its previous block's
        P V (FA3 §3.2, the head_dim > 64 schedule). False: the consumers
        take turns on the tensor cores in a round robin (FA3 §3.1
        ping-pong), and a causal consumer whose rows see only the first half
        of its diagonal key block multiplies that half alone.
      fwd_stagger: with overlap, consumer c starts once c - 1 has its first
        scores, so their softmaxes fall while the other one's products run.
      group_heads: the schedule hands tiles out in groups of heads whose K/V
        fit a share of L2; False: one head after another (short sequences,
        where a head has few tiles).
      kv_multicast: non-causal, where each head has an even number of query
        tiles: CTAs run in clusters of two on two tiles of one head, in step,
        and each loads half of every K/V block into both CTAs' rings (FA3's
        TMA multicast), so each block leaves L2 once per cluster. Elsewhere
        it has no effect.

    Backward (no atomics; dQ either in its own kernel or by TMA reduce-add):
      fused_bwd: one kernel per key tile computes dK, dV and adds its share
        of dQ into a float32 buffer with TMA reduce-adds (FA3 §3.3's
        backward: 5 matmuls per block pair instead of 7). dQ then depends on
        the order of the adds (within one bf16 rounding). False: a dQ kernel
        and a dK/dV kernel.
      block_k_dq: key rows per step of the dQ kernel (64 or 128).
      block_q_dkv: query rows per step of the dK/dV and fused kernels (64 or 128).
      dq_split: fused only, head_dim 128: each consumer computes half of dQ's
        columns over both consumers' keys (FA3's head_dim 128 layout), each
        step issues its products in FA3's order (dV before the dS^T
        exchange, dK over the dQ store), and causal steps run in one loop.
      dq_lag: with dq_split, each step multiplies the previous query block's
        dS^T for dQ and consumer 1 starts half a step after consumer 0, so
        neither waits for the other's dS^T of the current block.
      mask_tile: causal dK/dV and fused kernels with square steps: the
        diagonal block's mask is a shared-memory tile of 0 and -inf added to
        the scores, instead of a mask computed from indices in registers.
      lse_early: dK/dV and fused kernels load each step's lse while S and dP
        run; the consumers then take LSE_EARLY_REGISTERS.
    """

    num_stages: int = 2
    consumers: int = 2
    overlap: bool = False
    fwd_stagger: bool = False
    group_heads: bool = True
    kv_multicast: bool = False
    fused_bwd: bool = False
    block_k_dq: int = 64
    block_q_dkv: int = 64
    dq_split: bool = False
    dq_lag: bool = False
    mask_tile: bool = False
    lse_early: bool = False

    def __post_init__(self) -> None:
        if self.consumers not in REGISTERS:
            raise ValueError(f"consumers={self.consumers!r} must be one of {tuple(REGISTERS)}")
        if self.consumers == 3 and self.overlap:
            raise ValueError("consumers=3 takes turns on the tensor cores: use overlap=False (or consumers=2)")
        if self.fwd_stagger and not self.overlap:
            raise ValueError("fwd_stagger=True staggers the overlapped forward: also set overlap=True")
        if self.dq_split and not self.fused_bwd:
            raise ValueError("dq_split=True splits the fused backward's dQ: also set fused_bwd=True")
        if self.dq_lag and not self.dq_split:
            raise ValueError("dq_lag=True lags the split dQ product: also set fused_bwd=True and dq_split=True")
        for field in ("block_k_dq", "block_q_dkv"):
            value = getattr(self, field)
            if value not in (64, 128):
                raise ValueError(f"{field}={value!r} must be 64 or 128")
        if not isinstance(self.num_stages, int) or not 1 <= self.num_stages <= 8:
            raise ValueError(f"num_stages={self.num_stages!r} must be an integer between 1 and 8")

    def as_run(self, seq_len: int, causal: bool) -> MosaicBlockSizes:
        """These block sizes as the kernels run them on sequences of `seq_len`: kv_multicast off
        where the forward's query tiles cannot pair (causal tiles read different key blocks; a
        head of an odd number of tiles has one left over)."""
        tiles = -(-padded_length(seq_len) // (self.consumers * BLOCK_Q))
        if self.kv_multicast and (causal or tiles % 2):
            return dataclasses.replace(self, kv_multicast=False)
        return self

    @classmethod
    def get_default(cls, head_dim: int, seq_len: int | None = None, causal: bool | None = None) -> MosaicBlockSizes:
        """The `DEFAULTS` row for this shape; seq_len None counts as long,
        causal None as causal."""
        seq = seq_len if seq_len is not None else float("inf")
        is_causal = causal is not False
        for max_head_dim, row_causal, (low, high), blocks in DEFAULTS:
            if head_dim <= max_head_dim and row_causal in (None, is_causal) and low <= seq <= high:
                return blocks
        raise ValueError(f"{head_dim=} must be at most {max(SUPPORTED_HEAD_DIMS)} for the Mosaic kernels")


_LONG = float("inf")
_D64 = dict(num_stages=3, block_k_dq=128)
_D128 = dict(overlap=True, fwd_stagger=True, mask_tile=True)
_D128_FUSED = dict(_D128, fused_bwd=True, dq_split=True)

# (max head_dim, causal (None: either), (min seq, max seq), tiles); the first
# matching row wins. Measured on an H100 in bf16 at the FA3 shapes
# (EXPERIMENTS.md has the A/Bs):
# - head_dim <= 64: turns with three K/V stages; three consumers once a
#   192-row tile covers most of the sequence, the fused backward above seq
#   1024 (below it the float32 dQ buffer and reduce-adds outweigh the saved
#   matmuls);
# - head_dim 80-112: two consumers overlapping their softmax, two kernels;
# - head_dim 128: overlapped and staggered forward; the split fused backward,
#   except causal up to seq 1024 where the two kernels win; causal steps
#   load lse early, non-causal ones lag dQ; non-causal short sequences run
#   one head at a time;
# - K/V multicast to clusters of two (non-causal only) from seq 4096 at
#   head_dim 128 and above it at 64, measured on an H200: at seq 1024 it was
#   slower, at head_dim 64 and seq 4096 even (`results/attention/kv-multicast-h200/`).
DEFAULTS: tuple[tuple[int, bool | None, tuple[float, float], MosaicBlockSizes], ...] = (
    (64, None, (1, 1023), MosaicBlockSizes(**_D64, block_q_dkv=128)),
    (64, True, (1024, 1024), MosaicBlockSizes(**_D64, block_q_dkv=128)),
    (64, False, (1024, 1024), MosaicBlockSizes(**_D64, block_q_dkv=128, consumers=3)),
    (64, None, (1025, 4096), MosaicBlockSizes(**_D64, consumers=3, fused_bwd=True)),
    (64, None, (4097, _LONG), MosaicBlockSizes(**_D64, consumers=3, fused_bwd=True, kv_multicast=True)),
    (112, None, (1, _LONG), MosaicBlockSizes(overlap=True)),
    (128, True, (1, 1024), MosaicBlockSizes(**_D128)),
    (128, True, (1025, _LONG), MosaicBlockSizes(**_D128_FUSED, lse_early=True)),
    (128, False, (1, 2048), MosaicBlockSizes(**_D128_FUSED, dq_lag=True, group_heads=False)),
    (128, False, (2049, _LONG), MosaicBlockSizes(**_D128_FUSED, dq_lag=True, kv_multicast=True)),
)
