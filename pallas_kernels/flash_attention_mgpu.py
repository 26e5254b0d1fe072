"""FlashAttention forward and backward for Hopper GPUs (sm_90) in Pallas Mosaic GPU.

The portable kernels in `flash_attention.py` go through the Triton lowering,
which on Hopper issues neither `wgmma` (the warpgroup tensor-core instruction)
nor bulk tensor copies (TMA), so most of the tensor cores sit idle. These
kernels are written against `jax.experimental.pallas.mosaic_gpu` instead and
follow the FlashAttention-3 design (Shah et al. 2024, arXiv:2407.08608):

- one CTA = a producer warpgroup that only issues TMA copies into a ring of
  swizzled shared-memory slots, and two (or, in the forward, three)
  consumer warpgroups that run `wgmma` and the softmax;
- the consumers take turns on the tensor cores ("ping-pong", FA3 §3.1, as
  a round robin): while one runs its matmuls the others run their
  exponentials; or (the head_dim 128 default) each consumer overlaps its
  own softmax with its previous block's P V (FA3 §3.2);
- the forward can run persistent: one CTA per SM walks its row of a static
  schedule of query tiles (a few heads at a time, so their K/V stays in L2;
  causal tiles longest first within them, balanced by list scheduling), with
  its K/V pipeline running on across tiles;
- scores live in base 2 with the softmax scale and log2(e) folded into one
  multiply-add; causal loops are split into an unmasked and a masked part,
  and a forward consumer whose rows see only the first half of their
  diagonal key block multiplies that half alone;
- the backward is two kernels, dQ (one query tile per CTA, streaming K/V) and
  dK/dV (one key tile per CTA, streaming Q/dO/lse/delta), so no atomics;
  or one fused kernel that adds dQ up with TMA reduce-adds: the head_dim
  <= 64 default above seq 1024, and at head_dim 128 (dQ split by columns
  between the consumers, each step's products in FA3's order) the default
  except causal up to seq 1024.

Layout and contracts are those of the portable kernels: q, k, v, o are
[batch, seq, heads, head_dim]; lse is [batch, heads, seq] float32, natural log.
Entry points are `mosaic_forward` / `mosaic_backward`; `flash_attention.py`
registers them as the "mosaic" backend and owns validation, the custom_vjp
wiring and the float32 reference (`mha_reference`).

This module imports on any machine: without `mosaic_gpu` (older jax, or a
build without it) `AVAILABLE` is False and calling a kernel raises.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

try:  # Mosaic GPU is optional: CPU-only installs and older jax lack parts of it.
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    _ = (plgpu.kernel, plgpu.wgmma, plgpu.Barrier, plgpu.ACC, plgpu.SwizzleTransform, plgpu.Layout.WGMMA)
    _IMPORT_ERROR: Exception | None = None
except Exception as exc:  # noqa: BLE001 -- any failure means "not available"
    plgpu = None
    _IMPORT_ERROR = exc

AVAILABLE = _IMPORT_ERROR is None

__all__ = [
    "AVAILABLE",
    "MosaicBlockSizes",
    "SUPPORTED_DTYPES",
    "SUPPORTED_HEAD_DIMS",
    "mosaic_backward",
    "mosaic_forward",
    "unsupported_reason",
]

LOG2_E = math.log2(math.e)
LN_2 = math.log(2.0)
SUPPORTED_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
# wgmma consumes 16 bf16/fp16 values of the contraction per instruction and
# shared-memory rows must be a whole number of 32-byte swizzle atoms, so
# head_dim must be a multiple of 16; above 128 the two consumers' accumulators
# no longer fit in registers next to the score tile.
SUPPORTED_HEAD_DIMS = (32, 48, 64, 80, 96, 112, 128)
# Registers per thread after `setmaxnreg`, (consumer, producer), by the number
# of consumer warpgroups: the whole register file of one CTA (65536) either
# way, 2 * 232 + 40 = 3 * 168 and 3 * 160 + 32 = 4 * 128.
_REGISTERS = {2: (232, 40), 3: (160, 32)}
_CONSUMER_REGISTERS, _PRODUCER_REGISTERS = _REGISTERS[2]
# What two consumers and a producer share: N registers per consumer leave
# the producer this minus 2 N (MosaicBlockSizes.bwd_registers).
_TWO_CONSUMER_REGISTERS = 2 * _CONSUMER_REGISTERS + _PRODUCER_REGISTERS
# The head_dim <= 64 default backward is fused above this sequence length.
# Up to it the two kernels were as fast on an H100 (the fused kernel 1.02x
# non-causal at seq 1024, 0.91x causal in an earlier run): there the fused
# kernel's float32 dQ buffer (zero-filled, then scaled and cast by XLA) and
# its reduce-adds weigh more against less compute. At seq 2048 the fused
# kernel measured 1.08x (causal) and 1.09x (non-causal) the two kernels,
# each timed at its own steady state (results/attention-mgpu-h100/timing/
# ab-fused-short.log; without the lead-in it had looked 0.98-1.00x).
FUSED_BWD_MIN_SEQ = 1024
# The head_dim 128 default backward is the fused kernel with dQ split by
# columns, in FA3's step order (split_order) and, causal, in one loop
# (masked_loop=False). Non-causal it measured 1.04-1.10x the two kernels at
# seq 1024-16384 on an H100; causal 0.96x and 0.97x at seq 1024 and 2048,
# 1.01-1.06x at 4096-16384 (results/attention-mgpu-h100/split-order/
# split-order-ab*.log, one-loop-ab*.log). With the diagonal's mask from a
# tile and lse loaded early (mask_tile, lse_early) the causal fused kernel
# measured 1.033x the two kernels at seq 2048 and 0.997x at 1024
# (results/attention-mgpu-h100/timing/ab-bwd128-causal-short-fused.log).
# So causal inputs keep the two kernels up to this length.
FUSED_BWD128_CAUSAL_MIN_SEQ = 1024
# The head_dim <= 64 default forward runs three consumers (192-row tiles)
# above this length, and non-causal from THREE_CONSUMERS_NON_CAUSAL_MIN_SEQ;
# two (128-row tiles) otherwise. 192 rows do not divide 1024: the last
# tile's third consumers idle. At seq 1024 three consumers measured 1.05x
# two non-causal and 0.98x causal on an H100; when the idle consumers
# still recomputed the last rows, 0.93-0.99x
# (results/attention-mgpu-h100/timing/ab-idle-past-end.log).
THREE_CONSUMERS_MIN_SEQ = 1024
THREE_CONSUMERS_NON_CAUSAL_MIN_SEQ = 1024
# head_dim 128 non-causal forwards up to this length run one head at a time
# (group_heads=False): 1.07-1.08x the grouped order at seq 1024 and 2048 on
# an H100 (NOTES.md); the grouped order was tuned at seq 4096 and above.
ONE_HEAD_AT_A_TIME_MAX_SEQ = 2048

@dataclasses.dataclass(frozen=True, slots=True)
class MosaicBlockSizes:
    """Tiles of the Hopper kernels.

    A forward CTA runs `consumers` consumer warpgroups and owns
    consumers * block_q query rows; the backward CTAs run two, so a dQ CTA
    owns 2 * block_q_dq query rows and a dK/dV CTA 2 * block_k_dkv key rows.

    Attributes:
      block_q: query rows per consumer warpgroup in the forward (64: one wgmma
        M tile; 128 doubles the registers per warpgroup).
      block_k: key rows per pipeline step in the forward.
      num_stages: depth of the forward's K/V ring in shared memory.
      consumers: consumer warpgroups per forward CTA, 2 or 3. Three share each
        K/V block among 192 query rows (FA3's head_dim 64 tile) but leave
        each consumer 160 registers instead of 232.
      persistent: the forward launches one program per SM, each walking
        its row of a static schedule (_forward_schedule: a few heads at a
        time, causal tiles longest first, balanced by list scheduling) with
        the K/V ring running on across tiles and the next tile's q loading
        while the current one computes. False: one program per tile.
      block_q_dq, block_k_dq: dQ kernel: query rows per consumer, key rows
        per step.
      block_k_dkv, block_q_dkv: dK/dV kernel and fused backward: key rows
        per consumer, query rows per step.
      num_stages_bwd: depth of the backward kernels' rings.
      fused_bwd: one backward kernel instead of two: the dK/dV kernel also
        multiplies its dS by its keys and adds that share of dQ to a float32
        dQ in global memory with TMA reduce-add (FA3's backward), so S and
        dP are computed once per block pair, not twice (5 matmuls instead
        of 7). block_q_dq and block_k_dq are then unused. dQ then depends on
        the order of the float32 adds: not bit-reproducible across runs
        (within one bf16 rounding); fused_bwd=False is.
      dq_split: fused backward only: every query block's dQ is split by
        columns, each consumer computing half of head_dim over both
        consumers' keys (FA3's head_dim 128 layout: 64 - not 128 - float32
        dQ columns in a consumer's registers). Without it the block's owner
        (the consumers alternate) computes all of them. Needs each half to
        be whole 128-byte swizzle rows of keys: head_dim 128.
      pingpong: let the forward consumers take turns on the tensor cores
        (round robin: each issues its matmuls, then hands the turn on).
      paired: ping-pong only: a consumer's turn issues P_{j-1} V_{j-1} and
        S_j back to back and it waits for both after handing the turn on
        (FA3's ping-pong). Without it the consumer waits for P V inside its
        turn before it issues S. Within noise at head_dim 128 on an H100,
        and it spills at head_dim 64's 160 registers: not a default.
      overlap: forward consumers overlap their own matmuls and softmax
        (FA3 §3.2): the scores of the next key block and the previous
        block's P V are in flight while the softmax runs. With pingpong,
        both are issued in one turn (FA3's head_dim 128 schedule).
      bwd_overlap: backward consumers (every backward kernel) compute the
        exponentials of P once S is done, while dP is still on the tensor
        cores, instead of waiting for both. Bit-identical results; the
        default (0.98-1.07x the serial schedule on an H100, NOTES.md).
      split_order: fused backward with dq_split only: each step issues its
        gradient products in FA3's order: dV += P^T dO before the dS^T
        exchange (it runs while the consumer computes dS and waits for the
        other one), then dQ, then dK += dS^T Q, which stays on the tensor
        cores while the consumer stores its dQ tile and issues the
        reduce-add. Without it all three are issued after the exchange and
        the dQ store waits for all of them. Each accumulator sees the same
        products in the same order either way.
      masked_loop: causal dK/dV and fused backward: the query blocks that
        cross the diagonal run in a loop of their own, masked, before the
        loop over the rest. False: one loop over all of them, the mask
        under a branch that only those blocks take. Two loops hold two sets
        of loop invariants (wgmma descriptors among them): the causal dq_split
        fused kernel spilled 508 bytes with them and 124 in one loop.
      mask_tile: causal dK/dV and fused backward with square steps
        (block_k_dkv == block_q_dkv; ignored otherwise): each consumer
        writes the diagonal block's mask once, as a shared-memory tile of 0
        and -inf, and the steps that cross the diagonal add it to their
        scaled scores, so the only per-step mask state is the block's
        offset from the diagonal. False: those steps compute the mask from
        row and column indices, which the causal head_dim 128 fused kernel
        kept in registers it spilled (120 bytes, reloaded every step; 16
        with the tile). Same dK and dV bit for bit.
      group_heads: persistent forward: query tiles are handed out in
        groups of heads whose K/V fit in a share of L2 (_head_group), rank
        by rank with the heads innermost. False: one head after another,
        each head's tiles consecutively, so all of them stream its K/V at
        about the same time (short sequences: a head has few tiles).
      half_diagonal: causal forward with turns (not overlap or paired), 64-row
        consumers on 128-key steps: a consumer whose rows lie in the first
        half of their diagonal key block multiplies only that half (S on 64
        keys, P V on 64 rows of V), since every one of its rows masks the
        second half. False: the whole block, half of it masked to zero.
      lse_early: dK/dV and fused backward with bwd_overlap: a consumer loads
        the step's log-sum-exp from shared memory right after issuing S and
        dP, so the loads are in flight with the products, instead of once S
        is done (where the first exponentials waited for them). Holds 16
        more registers per thread across the wait for S.
      bwd_registers: registers per thread of each dK/dV or fused backward
        consumer warpgroup (`setmaxnreg`); the producer gets
        3 * 168 - 2 * bwd_registers (24 at 240, which its loop of barrier
        waits and TMA issues fits in).
      dq_lag: fused backward with split_order (ignored otherwise): a step
        multiplies the previous query block's dS^T tiles for dQ (and adds
        that block's dQ columns), not its own, so a consumer never waits
        for the other one's dS^T of the current block; the last block's dQ
        follows the loop.
      stagger: fused backward (ignored by the two kernels): consumer 1
        starts once consumer 0's first S and dP are done, so that their
        exponentials fall while the other one's products are on the tensor
        cores rather than at once.
      fwd_stagger: forward with overlap and no turns (ignored otherwise):
        a consumer starts its first tile once the one before it has its
        first block's scores, so the consumers run about half a step
        apart from then on (the K/V ring they share is their only other
        synchronization) and their softmaxes fall while the other one's
        products are on the tensor cores rather than at once.
    """

    block_q: int = 64
    block_k: int = 128
    num_stages: int = 2
    block_q_dq: int = 64
    block_k_dq: int = 64
    block_k_dkv: int = 64
    block_q_dkv: int = 64
    num_stages_bwd: int = 2
    pingpong: bool = True
    paired: bool = False
    overlap: bool = False
    consumers: int = 2
    persistent: bool = False
    fused_bwd: bool = False
    dq_split: bool = False
    bwd_overlap: bool = True
    split_order: bool = False
    masked_loop: bool = True
    mask_tile: bool = False
    group_heads: bool = True
    half_diagonal: bool = True
    lse_early: bool = False
    bwd_registers: int = _CONSUMER_REGISTERS
    dq_lag: bool = False
    stagger: bool = False
    fwd_stagger: bool = False

    def __post_init__(self) -> None:
        if self.overlap and self.paired:
            raise ValueError("overlap=True and paired=True are two schedules of a consumer's matmuls: choose one")
        if self.paired and not self.pingpong:
            raise ValueError("paired=True pairs the matmuls of a ping-pong turn: also set pingpong=True")
        if self.dq_split and not self.fused_bwd:
            raise ValueError("dq_split=True splits the fused backward's dQ: also set fused_bwd=True")
        if self.split_order and not self.dq_split:
            raise ValueError("split_order=True orders the steps of the dq_split backward: also set "
                             "fused_bwd=True and dq_split=True")
        if self.consumers not in _REGISTERS:
            raise ValueError(f"consumers={self.consumers!r} must be one of {tuple(_REGISTERS)}")
        if self.consumers == 3 and self.block_q != 64:
            raise ValueError("consumers=3 leaves 160 registers per consumer, too few for a 128-row tile: "
                             "use block_q=64")
        for field in ("block_q", "block_q_dq", "block_k_dkv"):
            value = getattr(self, field)
            if value not in (64, 128):
                raise ValueError(f"{field}={value!r} must be 64 or 128 (rows of one warpgroup's wgmma tile)")
        for field in ("block_k", "block_k_dq", "block_q_dkv"):
            value = getattr(self, field)
            if not isinstance(value, int) or value < 64 or value > 256 or value % 64:
                raise ValueError(f"{field}={value!r} must be 64, 128, 192 or 256")
        if self.lse_early and not self.bwd_overlap:
            raise ValueError("lse_early=True loads lse while S and dP run, which needs bwd_overlap=True")
        regs = self.bwd_registers
        if not isinstance(regs, int) or regs % 8 or not 24 <= _TWO_CONSUMER_REGISTERS - 2 * regs <= 256:
            # setmaxnreg takes multiples of 8 from 24 to 256.
            low, high = -(-(_TWO_CONSUMER_REGISTERS - 256) // 16) * 8, (_TWO_CONSUMER_REGISTERS - 24) // 16 * 8
            raise ValueError(f"bwd_registers={self.bwd_registers!r} must be a multiple of 8 that leaves the "
                             f"producer 24-256 registers ({_TWO_CONSUMER_REGISTERS} - 2 * bwd_registers): "
                             f"{low} to {high}")
        for field in ("num_stages", "num_stages_bwd"):
            value = getattr(self, field)
            if not isinstance(value, int) or not 1 <= value <= 8:
                raise ValueError(f"{field}={value!r} must be an integer between 1 and 8")

    @classmethod
    def get_default(cls, head_dim: int, seq_len: int | None = None, causal: bool | None = None) -> MosaicBlockSizes:
        """Defaults per head_dim and sequence length (None: a long one), from
        `harness.tune_attention` (NOTES.md): 64-row consumer tiles and
        128-key forward steps. head_dim <= 64 affords a third K/V stage,
        128-row streamed tiles in the backward (dQ streams 128 keys, dK/dV
        128 queries per step) and, on an H100, a persistent forward with
        three consumers above THREE_CONSUMERS_MIN_SEQ (1.06-1.13x the
        two-consumer grid at every FA3 shape tried, seq 1024-16384) and,
        non-causal, from THREE_CONSUMERS_NON_CAUSAL_MIN_SEQ (1.05x two at
        seq 1024); two otherwise (persistent too: 1.02x three causal at seq
        1024, where the last tile's third consumers idle). Its backward is the fused kernel with
        64-query steps above FUSED_BWD_MIN_SEQ (1.01-1.10x the two kernels
        at seq 4096 and 16384, 1.08-1.09x at 2048) and the two kernels up
        to it (as fast at seq 1024). At 128 three consumers were slower
        (registers and shared memory are already full there), and so was
        the fused backward until its steps took FA3's order (below): with dQ
        split by columns but every gradient product issued after the dS^T
        exchange it measured 0.71-0.97x the two kernels. The forward runs
        persistent at every length (at head_dim 128 seq 1024-2048 1.07-1.26x
        the one-program-per-tile grid on an H100 once its schedule was list
        scheduled over head groups), and at head_dim 128 each of its
        consumers overlaps its own matmuls and softmax (overlap=True, no
        turns): 1.05-1.09x the round-robin turns non-causal and
        1.00-1.03x causal on an H100, with bit-identical outputs, and its
        consumers start half a step apart (fwd_stagger: 0.999-1.016x
        non-causal at seq 1024-16384 in three A/Bs on an H100, and 1.03-1.11x
        causal in two, whose spread between identical kernels was a few
        percent). At head_dim 64 the overlapped schedule spills
        at three consumers' 160 registers (1.01-1.05x non-causal, 0.67-0.95x causal) and two
        consumers are slower still, so it keeps the turns. block_k_dq=128
        keeps the dQ kernel of the two-kernel backward (fused_bwd=False)
        as tuned; its dK/dV kernel was tuned with block_q_dkv=128.

        The head_dim 128 backward is the fused kernel with dQ split by
        columns in FA3's step order (dq_split, split_order; causal in one
        loop, masked_loop=False), except causal up to
        FUSED_BWD128_CAUSAL_MIN_SEQ, where it is the two kernels. Its causal
        steps read the diagonal's mask from a shared-memory tile
        (mask_tile): the fused kernel then spills 16 bytes instead of 120.
        Causal, its consumers also load each step's lse while S and dP run,
        on 240 registers each (lse_early, bwd_registers): 1.015-1.047x at
        seq 4096-16384 on an H100; non-causal that measured 0.97-0.98x.
        Non-causal, its consumers run half a step apart (stagger) and each
        multiplies the previous block's dS^T for dQ (dq_lag), so neither
        waits for the other's dS^T of the current block and their
        exponentials do not coincide: 1.05x at seq 16384 in one A/B on an
        H100, and 7.92M cycles against 8.39M at seq 8192. Causal, where
        that kernel spills 88-104 bytes (8 without), it measured 0.98-1.00x.
        `causal` None (not known) counts as causal."""
        if head_dim <= 64:
            fused = seq_len is None or seq_len > FUSED_BWD_MIN_SEQ
            three = (seq_len is None or seq_len > THREE_CONSUMERS_MIN_SEQ
                     or (causal is False and seq_len >= THREE_CONSUMERS_NON_CAUSAL_MIN_SEQ))
            return cls(block_k=128, num_stages=3, block_k_dq=128, block_q_dkv=64 if fused else 128,
                       consumers=3 if three else 2, persistent=True, fused_bwd=fused)
        forward = dict(block_k=128, num_stages=2, pingpong=False, overlap=True, persistent=True)
        if head_dim < 128:
            return cls(**forward)
        forward["fwd_stagger"] = True
        if causal is False and seq_len is not None and seq_len <= ONE_HEAD_AT_A_TIME_MAX_SEQ:
            forward["group_heads"] = False
        if causal is not False and seq_len is not None and seq_len <= FUSED_BWD128_CAUSAL_MIN_SEQ:
            return cls(**forward, mask_tile=True)
        backward = dict(fused_bwd=True, dq_split=True, split_order=True, masked_loop=False, mask_tile=True)
        if causal is not False:
            backward.update(lse_early=True, bwd_registers=240)
        else:
            backward.update(dq_lag=True, stagger=True)
        return cls(**forward, **backward)

    @property
    def seq_multiple(self) -> int:
        """Sequences are zero-padded to a multiple of this before the kernels run."""
        # The forward idles (or clamps) its last tile's consumers past the
        # sequence, so it needs whole consumer tiles only (see _forward_call).
        return math.lcm(self.block_q, self.block_k, 2 * self.block_q_dq, self.block_k_dq,
                        2 * self.block_k_dkv, self.block_q_dkv)


def unsupported_reason(q: jax.Array, *, interpret: bool = False, device=None) -> str | None:
    """Why the Mosaic kernels cannot run these inputs here, or None if they can.

    Used by the dispatcher: under backend="auto" any reason means "use the
    portable kernel"; with backend="mosaic" it becomes the ValueError.
    `device` defaults to the first JAX device (where the kernels would run)."""
    if not AVAILABLE:
        return f"jax.experimental.pallas.mosaic_gpu is unavailable ({type(_IMPORT_ERROR).__name__}: {_IMPORT_ERROR})"
    if interpret:
        return "interpret=True: the Mosaic GPU kernels have no interpreter path here; use backend='triton'"
    device = jax.devices()[0] if device is None else device
    capability = getattr(device, "compute_capability", None)
    if device.platform != "gpu" or not str(capability).startswith("9."):
        return (f"device {device.device_kind!r} (compute capability {capability}) is not a Hopper GPU; "
                "the Mosaic kernels need compute capability 9.x")
    if q.dtype not in SUPPORTED_DTYPES:
        return (f"dtype={q.dtype} is not supported by the Mosaic kernels (bfloat16, float16); "
                "float32 runs on backend='triton' (TF32 products)")
    head_dim = q.shape[-1]
    if head_dim not in SUPPORTED_HEAD_DIMS:
        return f"{head_dim=} is not one of {SUPPORTED_HEAD_DIMS} supported by the Mosaic kernels"
    return None


# ----------------------------------------------------------------------------
# Shared pieces.


# The widest swizzle the tiles may use (bytes). Narrower ones are a
# measurement switch: wgmma contracts over K in groups of the swizzle's
# width, so tiles whose rows are contracted in steps that are not a multiple
# of 64 elements (an 80-row query block) need 32 bytes. At 32 bytes the
# head_dim 128 backward took 1.05-1.12x as long on an H100 (NOTES.md).
_MAX_SWIZZLE = 128


def _smem_transforms(head_dim: int, itemsize: int) -> tuple:
    """Tiling + swizzle for a [rows, head_dim] tile in shared memory.

    The widest swizzle (128 B) whose atom divides a row is used, so wgmma and
    TMA see conflict-free banks. head_dim 80 (160-byte rows) gets the 32-byte
    swizzle instead of being padded to 128 columns."""
    row_bytes = head_dim * itemsize
    for swizzle in (128, 64, 32):
        if swizzle <= _MAX_SWIZZLE and row_bytes % swizzle == 0:
            return plgpu.TilingTransform((8, swizzle // itemsize)), plgpu.SwizzleTransform(swizzle)
    raise ValueError(f"{head_dim=} must be a multiple of {32 // itemsize} for the Mosaic kernels")


# Shared memory per CTA on sm_90 (227 KiB), less room for Mosaic's own
# scratch (cross-warp reductions) and the barriers.
_SMEM_LIMIT = 232_448 - 8_192


def _fit_stages(kernel: str, requested: int, useful: int, fixed_bytes: int, per_stage_bytes: int) -> int:
    """Pipeline depth: as requested, but no deeper than the number of steps
    and shallow enough for shared memory; ValueError if even 1 does not fit."""
    stages = max(1, min(requested, useful))
    while stages > 1 and fixed_bytes + stages * per_stage_bytes > _SMEM_LIMIT:
        stages -= 1
    if fixed_bytes + stages * per_stage_bytes > _SMEM_LIMIT:
        raise ValueError(f"{kernel}: tiles need {fixed_bytes + per_stage_bytes} bytes of shared memory "
                         f"(limit {_SMEM_LIMIT}); use smaller blocks")
    return stages


def _when(cond, fn) -> None:
    """pl.when that also accepts a Python bool (static loop bounds)."""
    if isinstance(cond, bool):
        if cond:
            fn()
        return
    pl.when(cond)(fn)


def _zeros(shape, layout) -> jax.Array:
    return plgpu.layout_cast(jnp.zeros(shape, jnp.float32), layout)


def _rows(x: jax.Array, shape) -> jax.Array:
    """Broadcast a per-row vector along the columns of `shape`."""
    return lax.broadcast_in_dim(x, shape, [0])


def _cols(x: jax.Array, shape) -> jax.Array:
    """Broadcast a per-column vector along the rows of `shape`."""
    return lax.broadcast_in_dim(x, shape, [1])


def _iota(shape, dim) -> jax.Array:
    return plgpu.broadcasted_iota(jnp.int32, shape, dim, layout=plgpu.Layout.WGMMA)


def _accumulate(fn, *initial):
    """Runs `fn` on wgmma accumulators that start at `initial` (register
    arrays) and returns their final values; one wgmma wait at the end."""
    out = pl.run_state(fn)(tuple(plgpu.ACC.init(x) for x in initial))
    return out if len(initial) > 1 else out[0]


def _scores_and_dp(issue, probabilities, shape, overlap: bool, prefetch=None):
    """Runs `issue(s_ref, dp_ref)`, which issues the backward's two score
    products S and dP (wgmma, in this order), and returns
    (probabilities(S), dP). With `overlap` the probabilities (the
    exponentials) are computed once S is done, while dP is still on the
    tensor cores; otherwise after both. `prefetch()` (overlap only), if
    given, runs right after the products are issued, so its shared-memory
    loads are in flight with them, and its result is passed to
    `probabilities` as a second argument."""
    zeros = _zeros(shape, plgpu.Layout.WGMMA)
    if not overlap:
        s, dp = _accumulate(lambda refs: issue(*refs), zeros, zeros)
        return probabilities(s), dp

    def body(refs):
        s_ref, dp_ref, p_ref = refs
        issue(s_ref, dp_ref)
        fetched = () if prefetch is None else (prefetch(),)
        p_ref[...] = probabilities(plgpu.wgmma_accumulator_load(s_ref, wait_n=1), *fetched)

    _, dp, p = pl.run_state(body)((plgpu.ACC.init(zeros), plgpu.ACC.init(zeros), zeros))
    return p, dp


# Pallas puts a warpgroup barrier (bar.sync of the consumer's 128 threads)
# before and after every store from registers to shared memory and around
# every scoped region (run_scoped/run_state), so that the code reads as if
# each warpgroup ran in lockstep. The backward kernels run without them
# (1.02-1.05x on an H100, NOTES.md): every hazard they guard against is
# already ordered there. Each thread arrives on the ring's release barriers
# itself (mbarrier arrivals release that thread's own reads of lse and
# delta); commit_smem and wait_smem_to_gmem carry a warpgroup barrier, which
# orders the dS^T and dQ tiles' stores before the TMA and wgmma that read
# them and the dQ tile's TMA read before its next store; a consumer writes
# dS^T only once every thread of both consumers has released its earlier
# use; and dK, dV (dQ in the dQ kernel) overwrite operand tiles only after a
# wgmma issued later has completed, which no warp can see before every warp
# issued it. The forward keeps them: without them it measured 0.95-0.98x.
_FWD_AUTO_BARRIERS = True
_BWD_AUTO_BARRIERS = False

# dS^T buffers of the fused backward with dq_lag (each 2 consumers x
# block_k_dkv x block_q_dkv). Two suffice: a consumer stores block i's tile
# once both consumers' dQ products of block i - 2 are done, which with the
# stagger they finished a step earlier. Three let the consumers drift a step
# further apart, but on an H100 the head_dim 128 kernel then spilled 244-500
# bytes at seq 16384 and measured 0.56-0.76x the kernel without the lag there
# (results/attention-mgpu-h100/timing/ab-lag-stagger-peeled.log).
_LAG_DS_BUFFERS = 2


def _compiler_params(auto_barriers: bool = True):
    # approx_math: exp2/log use the MUFU approximations (ex2.approx), which is
    # what makes the softmax cheap enough to hide behind the matmuls.
    return plgpu.CompilerParams(approx_math=True, unsafe_no_auto_barriers=not auto_barriers)


def _tile_grid(heads: int, num_tiles: int, batch: int) -> tuple[int, int, int]:
    """Grid of the kernels with one program per (head, tile, batch), in
    Pallas order, named _TILE_GRID_NAMES.

    Mosaic GPU launches a Pallas grid reversed: its last axis becomes CUDA's
    x, the fastest in launch order. So this runs batch fastest, then tiles,
    then heads, and the programs running at once cover every tile of a few
    (batch, head) pairs, whose streamed blocks they share through L2. The
    reverse ((tiles, heads, batch) here: heads and batch fastest, programs
    running at once spread over every head) read 48-58% of DRAM bandwidth at
    32-36% L2 hits in the head_dim 128 backward at seq 4096, against 7-10%
    and 85-88% (Nsight Compute on an H100); it ran the head_dim 64 fused
    backward at 0.58x and the forward grid at seq 1024 at 0.64x."""
    return heads, num_tiles, batch


_TILE_GRID_NAMES = ("heads", "tiles", "batch")


def _launch(body, out_type, scratch, grid: tuple, name: str, consumers: int = 2,
            grid_names: tuple = _TILE_GRID_NAMES, mutable: bool = False, auto_barriers: bool = True):
    """One program per grid point (by default _tile_grid's) with `consumers`
    consumer warpgroups (`wg` 0 .. consumers - 1) and the producer
    (`wg` == consumers). Mosaic GPU launches the grid's last axis fastest.

    mutable: some operands are `jax.Ref`s the kernel writes in place. That
    takes `pl.kernel` itself: `plgpu.kernel` wraps the call in a custom_vmap,
    which does not pass refs through."""
    if not mutable:
        return plgpu.kernel(body, out_type=out_type, scratch_types=scratch, grid=grid,
                            grid_names=grid_names, num_threads=consumers + 1, thread_name="wg",
                            compiler_params=_compiler_params(auto_barriers), kernel_name=name)
    mesh = plgpu.Mesh(grid=grid, grid_names=grid_names, num_threads=consumers + 1, thread_name="wg")

    def with_scratch(*refs):
        pl.run_scoped(functools.partial(body, *refs), *scratch, collective_axes="wg")

    return pl.kernel(with_scratch, out_type=out_type, mesh=mesh, compiler_params=_compiler_params(auto_barriers),
                     name=name)


def _kv_producer(k_ref, v_ref, k_smem, v_smem, k_ready, v_ready, k_free, v_free, *, b, h, block_k: int,
                 n_blocks, num_stages: int, start=0):
    """Producer warpgroup of the kernels that stream key/value blocks (forward, dQ):
    TMA copies of each block's K and V into the ring, each slot refilled once all
    consumers have released it. `start`: ring steps issued before (earlier
    tiles of a persistent program); returns the count after this tile."""

    def issue(step, slot, wait):
        rows = pl.ds(step * block_k, block_k)
        _when(wait, lambda: plgpu.barrier_wait(k_free.at[slot]))
        plgpu.copy_gmem_to_smem(k_ref.at[b, rows, h], k_smem.at[slot], k_ready.at[slot])
        _when(wait, lambda: plgpu.barrier_wait(v_free.at[slot]))
        plgpu.copy_gmem_to_smem(v_ref.at[b, rows, h], v_smem.at[slot], v_ready.at[slot])

    return _producer_loop(n_blocks, num_stages, issue, start=start)


def _longest_first(t, num_tiles: int, causal: bool):
    """Causal tiles run longest (most keys) first, so short ones fill the last wave."""
    return num_tiles - 1 - t if causal else t


def _query_tile_key_blocks(t, tile: int, block_k: int, num_k_blocks: int, causal: bool, *, unmasked: int):
    """For the kernels whose program owns a tile of query rows (forward, dQ):
    tile `t`'s first row, the key blocks it visits and how many of them need
    no mask.

    All consumers run the same key blocks (the whole tile's range), so their
    turn-taking stays paired; a block beyond one consumer's diagonal is fully
    masked for it and adds exactly zero. Non-causal: every block, of which
    `unmasked` need no mask."""
    tile_start = t * tile
    if not causal:
        return tile_start, num_k_blocks, unmasked
    n_blocks = jnp.minimum(lax.div(tile_start + tile + block_k - 1, block_k), num_k_blocks)
    return tile_start, n_blocks, lax.div(tile_start, block_k)  # blocks below every row's diagonal


def _consumer_key_blocks(row0, rows: int, block_k: int, n_free, n_blocks, causal: bool):
    """(unmasked, end): of its tile's key blocks, how many a consumer whose
    rows start at `row0` runs without a mask, and where its blocks end.
    Causal: blocks before the one holding row0 are below every one of its
    rows' diagonals, and blocks past the one holding its last row are above
    all of them (fully masked: they would add exactly zero). Otherwise the
    tile's own counts."""
    if not causal:
        return n_free, n_blocks
    return lax.div(row0, block_k), jnp.minimum(lax.div(row0 + rows - 1, block_k) + 1, n_blocks)


def _producer_loop(n_steps, num_stages: int, issue, *, start=0):
    """Producer warpgroup: fill the ring, then refill each slot as soon as the
    consumers release it. `issue(step, slot, wait)` starts the copies of one
    step into `slot`, first waiting for the slot's release by the consumers
    if `wait` (a Python or traced bool) is true. `start` counts the ring steps
    issued before this loop (earlier tiles of a persistent program); returns
    the count after it."""
    if isinstance(start, int) and start == 0:
        for step in range(num_stages):  # empty ring: nothing to wait for
            _when(step < n_steps, functools.partial(issue, step, step, False))

        def refill(step, _):
            issue(step, lax.rem(step, num_stages), True)

        if not (isinstance(n_steps, int) and n_steps <= num_stages):
            lax.fori_loop(num_stages, n_steps, refill, None)
    else:
        def step_fn(step, _):
            g = start + step
            issue(step, lax.rem(g, num_stages), g >= num_stages)

        lax.fori_loop(0, n_steps, step_fn, None)
    return start + n_steps


def _drain(n_steps, num_stages: int, frees) -> None:
    """Producer, before exiting: wait for the release of each slot's last
    step (of `n_steps` issued in all), so every phase of the release barriers
    `frees` is observed before the CTA exits."""

    def drain(step, _):
        slot = lax.rem(step, num_stages)
        for free in frees:
            plgpu.barrier_wait(free.at[slot])

    lax.fori_loop(jnp.maximum(n_steps - num_stages, 0), n_steps, drain, None)


# ----------------------------------------------------------------------------
# Forward.


def _num_sms(default: int = 132) -> int:
    """Streaming multiprocessors of the first device (the persistent grid's
    size); `default` (an H100 SXM) where the count is unknown (CPU lowering)."""
    device = jax.devices()[0]
    count = getattr(device, "core_count", None) if device.platform == "gpu" else None
    return int(count) if count else default


# Bytes of streamed K/V that the programs of a persistent grid running at once
# should share: a fraction of the 50 MiB L2 of an H100, leaving room for the
# queries and outputs passing through it.
_L2_WORKING_SET = 16 * 2**20


def _head_group(n_heads: int, bytes_per_head: int) -> int:
    """The largest divisor of n_heads (batch x heads) whose heads' streamed
    blocks fit in _L2_WORKING_SET, at least 1."""
    limit = max(1, _L2_WORKING_SET // bytes_per_head)
    return max(d for d in range(1, min(n_heads, limit) + 1) if n_heads % d == 0)


def _work_order(n_heads: int, num_tiles: int, *, group: int, causal: bool) -> np.ndarray:
    """The persistent forward's work items, bh * num_tiles + tile for each
    (batch x head bh, query tile), in the order they are handed out: groups
    of `group` heads, each group's tiles by rank (longest first when causal)
    with its heads innermost. Programs running at once then stream the K/V
    of about `group` heads, which stay in L2."""
    bh = np.arange(n_heads).reshape(n_heads // group, 1, group)
    rank = np.arange(num_tiles).reshape(1, num_tiles, 1)
    tile = num_tiles - 1 - rank if causal else rank
    return (bh * num_tiles + tile).reshape(-1)


def _list_schedule(costs, n_programs: int) -> np.ndarray:
    """Static list scheduling of a persistent grid: items are handed out in
    order, each to the program that, by the estimated `costs`, is free first
    (ties: the lowest program), which is what a dynamic tile scheduler would
    do if the estimates were exact. Equal costs give round robin. Returns
    int32 [n_programs, 1 + most items]: row p is p's item count, then the
    indices of its items in the order it runs them (zero-padded).

    Unlike a fixed pattern over the numbering (a snake), this balances the
    programs whatever the order of the lengths: grouped causal tiles come
    long, short, long, short group after group."""
    free_at = [(0.0, p) for p in range(n_programs)]
    runs: list[list[int]] = [[] for _ in range(n_programs)]
    for item, cost in enumerate(costs):
        t, p = heapq.heappop(free_at)
        runs[p].append(item)
        heapq.heappush(free_at, (t + float(cost), p))
    table = np.zeros((n_programs, 1 + max(map(len, runs))), np.int32)
    for p, run in enumerate(runs):
        table[p, 0] = len(run)
        table[p, 1:1 + len(run)] = run
    return table


def _forward_schedule(batch: int, heads: int, num_tiles: int, n_programs: int, *, causal: bool, key_blocks,
                      bytes_per_head: int, group_heads: bool = True) -> np.ndarray:
    """The persistent forward's schedule: _list_schedule's table with each
    item replaced by its work code (bh * num_tiles + tile, _work_order).
    `key_blocks(t)`: query tile t's work in key blocks (_forward_tile_cost);
    a tile is estimated to cost that plus one (its q load, pipeline fill and
    store)."""
    group = _head_group(batch * heads, bytes_per_head) if group_heads else 1
    order = _work_order(batch * heads, num_tiles, group=group, causal=causal)
    table = _list_schedule([key_blocks(int(code) % num_tiles) + 1 for code in order], n_programs)
    table[:, 1:] = order[table[:, 1:]]
    return table


def _forward_tile_cost(t: int, *, tile: int, block_k: int, num_k_blocks: int, padded_len: int,
                       causal: bool, idle_past_end: bool) -> float:
    """The schedule's estimate of query tile t's work, in key blocks: those
    it visits (_query_tile_key_blocks' count, on Python ints), scaled by the
    share of its consumers that compute when those past the end idle. It
    counts a half diagonal block (half_diagonal) as a whole one: estimating
    the tile as its consumers' mean, halves as halves, measured within 1% of
    this on an H100 (results/attention-mgpu-h100/timing/ab-cost.log)."""
    n = min(-(-(t + 1) * tile // block_k), num_k_blocks) if causal else num_k_blocks
    if idle_past_end:
        n *= min(tile, padded_len - t * tile) / tile  # whole consumers: padded_len is a multiple of block_q
    return n


def _forward_call(q, k, v, *, causal: bool, sm_scale: float, seq_len: int, blocks: MosaicBlockSizes):
    batch, padded_len, heads, head_dim = q.shape
    dtype = q.dtype
    bq, bk, n_wg = blocks.block_q, blocks.block_k, blocks.consumers
    consumer_registers, producer_registers = _REGISTERS[n_wg]
    tile = n_wg * bq
    # The last tile may reach past the sequence (192-row tiles over 1024 rows):
    # its consumers that would start past the end take the last block_q rows
    # instead (their q loads stay in bounds) and every consumer still runs the
    # shared K/V loop; they idle or recompute those rows (idle_past_end).
    num_tiles = pl.cdiv(padded_len, tile)
    # Key blocks holding at least one real key; fully padded blocks are skipped.
    num_k_blocks = pl.cdiv(seq_len, bk)
    row = head_dim * dtype.itemsize
    persistent = blocks.persistent
    # Persistent: one program per SM walks its row of a static schedule
    # (_forward_schedule: a few heads at a time, balanced by list
    # scheduling), with two query/output buffers so the next tile's q loads
    # while this one computes, and one K/V ring across tiles.
    #
    # Where the consumers do not divide the sequence (192-row tiles over 1024
    # rows), a consumer whose rows of the last tile start past the end walks
    # the ring without computing or storing (the turn-taking schedule;
    # overlap and paired, whose pipelines start with a block, clamp it onto
    # the last rows instead, recomputing them): 1.04-1.06x the clamped tiles
    # at head_dim 64, seq 1024-2048, 1.00x at 4096, on an H100 (NOTES.md).
    idle_past_end = not (blocks.overlap or blocks.paired) and padded_len % tile != 0
    # Causal, turn-taking schedule: a consumer whose rows all lie in the
    # first half of their diagonal key block (row0 % bk + bq <= bk / 2) runs
    # that block on its first half only; the second half is masked for every
    # one of its rows.
    half_diagonal = (blocks.half_diagonal and causal and not (blocks.overlap or blocks.paired)
                     and bk % 128 == 0 and bq <= bk // 2)
    if persistent:
        n_programs = min(num_tiles * batch * heads, _num_sms())

        def key_blocks(t):
            return _forward_tile_cost(t, tile=tile, block_k=bk, num_k_blocks=num_k_blocks,
                                      padded_len=padded_len, causal=causal, idle_past_end=idle_past_end)

        schedule = jnp.asarray(_forward_schedule(batch, heads, num_tiles, n_programs, causal=causal,
                                                 key_blocks=key_blocks, bytes_per_head=2 * padded_len * row,
                                                 group_heads=blocks.group_heads))
    n_bufs = 2 if persistent else 1
    stages = _fit_stages("forward", blocks.num_stages, num_k_blocks, n_bufs * n_wg * bq * (row + 4), 2 * bk * row)
    qk_scale = sm_scale * LOG2_E
    transforms = _smem_transforms(head_dim, dtype.itemsize)
    pingpong, overlap, paired = blocks.pingpong, blocks.overlap, blocks.paired
    # fwd_stagger: consumer c > 0 waits once, for c - 1's first scores (on
    # the turn barriers, which the schedule without turns leaves unused).
    stagger = blocks.fwd_stagger and overlap and not pingpong
    # Block 0 of a pipelined schedule runs alone, masked wherever any block may need it.
    first_masked = causal or seq_len % bk != 0

    def body(q_ref, k_ref, v_ref, *refs):
        if persistent:
            schedule_ref, *refs = refs
        (o_ref, lse_ref, q_smem, k_smem, v_smem, lse_smem, q_ready, k_ready, v_ready, k_free, v_free, turn) = refs
        wg = lax.axis_index("wg")
        if persistent:
            program = lax.axis_index("programs")
            n_items = schedule_ref[program, 0]

            def coords(i):
                code = schedule_ref[program, 1 + i]
                bh = lax.div(code, num_tiles)
                return lax.div(bh, heads), lax.rem(bh, heads), lax.rem(code, num_tiles)
        else:
            n_items = 1

            def coords(i):
                del i
                return (lax.axis_index("batch"), lax.axis_index("heads"),
                        _longest_first(lax.axis_index("tiles"), num_tiles, causal))

        def tile_blocks(t):
            # Only a ragged tail key block needs a mask when not causal.
            return _query_tile_key_blocks(t, tile, bk, num_k_blocks, causal, unmasked=seq_len // bk)

        def for_each_tile(fn, init):
            """fn(i, ring steps so far) -> ring steps after tile i, over this program's tiles."""
            return lax.fori_loop(0, n_items, fn, init) if persistent else fn(0, init)

        @pl.when(wg == n_wg)
        def _producer():
            plgpu.set_max_registers(producer_registers, action="decrease")

            def produce(i, steps):
                b, h, t = coords(i)
                return _kv_producer(k_ref, v_ref, k_smem, v_smem, k_ready, v_ready, k_free, v_free, b=b, h=h,
                                    block_k=bk, n_blocks=tile_blocks(t)[1], num_stages=stages, start=steps)

            _drain(for_each_tile(produce, 0), stages, (k_free, v_free))

        @pl.when(wg < n_wg)
        def _consumer():
            plgpu.set_max_registers(consumer_registers, action="increase")

            # Ping-pong (FA3 §3.1) as a round robin: a consumer takes its turn
            # before it issues P_{j-1} V_{j-1} and S_j and hands it to the next
            # consumer once they are issued, so while one runs its matmuls the
            # others run their softmax. One token circulates: turn[i] is
            # arrived on only by consumer i - 1 (or, to start, by the last).
            def take_turn():
                if pingpong:
                    plgpu.barrier_wait(turn.at[wg])

            def give_turn():
                if pingpong:
                    plgpu.barrier_arrive(turn.at[lax.rem(wg + 1, n_wg)])

            def my_rows(i):
                b, h, t = coords(i)
                tile_start, n_blocks, n_free = tile_blocks(t)
                return b, h, jnp.minimum(tile_start + wg * bq, padded_len - bq), n_blocks, n_free

            def past_end(i):
                """Whether this consumer's rows of tile i start past the sequence."""
                return tile_blocks(coords(i)[2])[0] + wg * bq >= padded_len

            def load_q(i, buf):
                b, h, row0, _, _ = my_rows(i)
                plgpu.copy_gmem_to_smem(q_ref.at[b, pl.ds(row0, bq), h], q_smem.at[buf * n_wg + wg],
                                        q_ready.at[buf * n_wg + wg])

            def run_tile(i, steps):
                b, h, row0, n_blocks, n_free = my_rows(i)
                buf = lax.rem(i, 2) if persistent else 0
                if persistent:
                    @pl.when(i + 1 < n_items)
                    def _prefetch():
                        # The other buffer holds the previous tile's output:
                        # its store must have read it before q overwrites it.
                        plgpu.wait_smem_to_gmem(0, wait_read_only=True)
                        load_q(i + 1, 1 - buf)

                q_tile, lse_tile = q_smem.at[buf * n_wg + wg], lse_smem.at[buf * n_wg + wg]
                plgpu.barrier_wait(q_ready.at[buf * n_wg + wg])

                def ring(j):
                    return lax.rem(steps + j, stages)

                def keep(j, keys: int):
                    cols = j * bk + _iota((bq, keys), 1)
                    return cols <= row0 + _iota((bq, keys), 0) if causal else cols < seq_len

                def softmax_update(s, m, l, j, masked: bool):
                    if masked:
                        s = jnp.where(keep(j, s.shape[1]), s, -jnp.inf)
                    # m is kept in scaled base-2 units: p = exp2(s * c - m) is one
                    # FMA and one MUFU op per score (FA3 §3.3 / FA2 §3.1.1).
                    m_new = jnp.maximum(m, s.max(axis=1) * qk_scale)
                    alpha = jnp.exp2(m - m_new)
                    p = jnp.exp2(s * qk_scale - _rows(m_new, s.shape))
                    return m_new, alpha, l * alpha + p.sum(axis=1), p

                def step(j, carry, *, masked: bool, keys: int = bk):
                    """One key block; with keys < bk only its first `keys`
                    keys (the rest are masked for every row: half_diagonal)."""
                    acc, m, l = carry
                    slot = ring(j)
                    k_block, v_block = k_smem.at[slot], v_smem.at[slot]
                    if keys < bk:
                        k_block, v_block = k_block.at[pl.ds(0, keys)], v_block.at[pl.ds(0, keys)]
                    plgpu.barrier_wait(k_ready.at[slot])

                    def scores(ref):
                        plgpu.wgmma(ref, q_tile, k_block.transpose((1, 0)))
                        give_turn()
                        return ref[...]

                    s = pl.run_scoped(scores, plgpu.ACC((bq, keys), jnp.float32))
                    plgpu.barrier_arrive(k_free.at[slot])
                    m_new, alpha, l, p = softmax_update(s, m, l, j, masked)
                    acc = acc * _rows(alpha, acc.shape)
                    p = p.astype(dtype)
                    plgpu.barrier_wait(v_ready.at[slot])
                    take_turn()
                    acc = _accumulate(lambda refs: plgpu.wgmma(refs[0], p, v_block), acc)
                    plgpu.barrier_arrive(v_free.at[slot])
                    return acc, m_new, l

                def enter_pipelined(j):
                    """A pipelined step's start: K_j and V_{j-1} are in, the
                    turn is taken. Returns their ring slots."""
                    slot, prev = ring(j), ring(j - 1)
                    plgpu.barrier_wait(k_ready.at[slot])
                    plgpu.barrier_wait(v_ready.at[prev])
                    take_turn()
                    return slot, prev

                def paired_step(j, carry, *, masked: bool):
                    # Enters with P of block j-1 (not yet multiplied by V) and
                    # acc rescaled to its running max. In its turn the consumer
                    # issues P_{j-1} V_{j-1} and S_j = Q K_j^T back to back and
                    # hands the turn on; only then does it wait for both.
                    acc, m, l, p_prev = carry
                    slot, prev = enter_pipelined(j)

                    def products(refs):
                        pv_ref, s_ref = refs
                        plgpu.wgmma(pv_ref, p_prev, v_smem.at[prev])
                        plgpu.wgmma(s_ref, q_tile, k_smem.at[slot].transpose((1, 0)))
                        give_turn()

                    acc, s = _accumulate(products, acc, _zeros((bq, bk), plgpu.Layout.WGMMA))
                    plgpu.barrier_arrive(v_free.at[prev])
                    plgpu.barrier_arrive(k_free.at[slot])
                    m_new, alpha, l, p = softmax_update(s, m, l, j, masked)
                    return acc * _rows(alpha, acc.shape), m_new, l, p.astype(dtype)

                def overlapped_step(j, carry, *, masked: bool):
                    # Enters as paired_step. Issues S_j = Q K_j^T and then
                    # P_{j-1} V_{j-1} (accumulated into acc), waits only for
                    # S_j, and runs the softmax of block j while P_{j-1} V_{j-1}
                    # is in flight (FA3 §3.2). acc is rescaled once that is done.
                    acc, m, l, p_prev = carry
                    slot, prev = enter_pipelined(j)

                    def products(refs):
                        acc_ref, s_ref, m_ref, l_ref, alpha_ref, p_ref = refs
                        plgpu.wgmma(s_ref, q_tile, k_smem.at[slot].transpose((1, 0)))
                        plgpu.wgmma(acc_ref, p_prev, v_smem.at[prev])
                        give_turn()
                        s = plgpu.wgmma_accumulator_load(s_ref, wait_n=1)  # S_j done, P V may still run
                        plgpu.barrier_arrive(k_free.at[slot])
                        m_ref[...], alpha_ref[...], l_ref[...], p_ref[...] = softmax_update(
                            s, m_ref[...], l_ref[...], j, masked)

                    s0 = _zeros((bq, bk), plgpu.Layout.WGMMA)
                    acc, _, m, l, alpha, p = pl.run_state(products)(
                        (plgpu.ACC.init(acc), plgpu.ACC.init(s0), m, l, m, s0))
                    # P_{j-1} V_{j-1} has completed here. The barrier keeps the
                    # conversion of P_j, whose registers may be those P_{j-1}
                    # was read from, after that wait: if it came before, ptxas
                    # would serialize every wgmma of the kernel (C7513).
                    acc, p = lax.optimization_barrier((acc, p))
                    plgpu.barrier_arrive(v_free.at[prev])
                    return acc * _rows(alpha, acc.shape), m, l, p.astype(dtype)

                def store(acc, m, l):
                    # Every row (padded ones too: their q is zero) saw at least
                    # key 0, so l > 0 and both outputs are finite. The output
                    # goes out through q's buffer (q is no longer needed).
                    o = acc * _rows(1.0 / l, acc.shape)
                    q_tile[...] = o.astype(dtype)
                    lse_tile[...] = m * LN_2 + jnp.log(l)
                    plgpu.commit_smem()
                    plgpu.copy_smem_to_gmem(q_tile, o_ref.at[b, pl.ds(row0, bq), h], commit_group=False)
                    plgpu.copy_smem_to_gmem(lse_tile, lse_ref.at[b, h, pl.ds(row0, bq)], commit_group=False)
                    plgpu.commit_smem_to_gmem_group()

                acc0 = _zeros((bq, head_dim), plgpu.Layout.WGMMA)
                m0 = plgpu.layout_cast(jnp.full((bq,), -jnp.inf, jnp.float32), plgpu.Layout.WGMMA.reduce(1))
                l0 = _zeros((bq,), plgpu.Layout.WGMMA.reduce(1))
                # Causal: the tile's key blocks run up to its last row's
                # diagonal; this consumer's own rows need fewer (my_end) and
                # fewer masks (my_free). It computes those, stores its
                # output, then walks the rest of the ring without computing:
                # it still observes every barrier phase and takes its turns,
                # so the others' hand-offs stay paired. Every schedule takes
                # n_blocks + 1 turns per tile.
                my_free, my_end = _consumer_key_blocks(row0, bq, bk, n_free, n_blocks, causal)
                if idle_past_end:
                    my_end = jnp.where(past_end(i), 0, my_end)
                    my_free = jnp.minimum(my_free, my_end)
                if overlap or paired:
                    # Block 0's scores and softmax start the pipeline; the
                    # last block's P V ends it.
                    first = ring(0)
                    if stagger:
                        # Consumer c > 0 starts once consumer c - 1's first scores are done.
                        _when(jnp.logical_and(wg > 0, i == 0), lambda: plgpu.barrier_wait(turn.at[wg]))
                    plgpu.barrier_wait(k_ready.at[first])
                    take_turn()

                    def first_scores(ref):
                        plgpu.wgmma(ref, q_tile, k_smem.at[first].transpose((1, 0)))
                        give_turn()
                        return ref[...]

                    s = pl.run_scoped(first_scores, plgpu.ACC((bq, bk), jnp.float32))
                    plgpu.barrier_arrive(k_free.at[first])
                    if stagger:
                        _when(jnp.logical_and(wg + 1 < n_wg, i == 0), lambda: plgpu.barrier_arrive(turn.at[wg + 1]))
                    m, _, l, p = softmax_update(s, m0, l0, 0, first_masked)
                    carry = (acc0, m, l, p.astype(dtype))
                    pipelined = overlapped_step if overlap else paired_step
                    carry = lax.fori_loop(1, my_free, functools.partial(pipelined, masked=False), carry)
                    acc, m, l, p = lax.fori_loop(jnp.maximum(my_free, 1), my_end,
                                                 functools.partial(pipelined, masked=True), carry)
                    last = ring(my_end - 1)
                    plgpu.barrier_wait(v_ready.at[last])
                    take_turn()

                    def last_product(refs):
                        plgpu.wgmma(refs[0], p, v_smem.at[last])
                        give_turn()

                    acc = _accumulate(last_product, acc)
                    plgpu.barrier_arrive(v_free.at[last])
                else:
                    take_turn()
                    carry = lax.fori_loop(0, my_free, functools.partial(step, masked=False), (acc0, m0, l0))
                    if half_diagonal:
                        # Rows in the first half of their diagonal block see
                        # none of its second half: that one block (the
                        # consumer's only masked one) runs on half the keys.
                        first_half = lax.rem(row0, bk) + bq <= bk // 2
                        half_end = jnp.where(first_half, my_end, my_free)
                        carry = lax.fori_loop(my_free, half_end,
                                              functools.partial(step, masked=True, keys=bk // 2), carry)
                    else:
                        half_end = my_free
                    acc, m, l = lax.fori_loop(half_end, my_end, functools.partial(step, masked=True), carry)
                    give_turn()
                if idle_past_end:
                    _when(jnp.logical_not(past_end(i)), lambda: store(acc, m, l))
                else:
                    store(acc, m, l)

                def idle_step(j, _):
                    slot = ring(j)
                    plgpu.barrier_wait(k_ready.at[slot])
                    plgpu.barrier_arrive(k_free.at[slot])
                    plgpu.barrier_wait(v_ready.at[slot])
                    plgpu.barrier_arrive(v_free.at[slot])
                    take_turn()
                    give_turn()

                lax.fori_loop(my_end, n_blocks, idle_step, None)
                return steps + n_blocks

            if pingpong:
                _when(wg == n_wg - 1, lambda: plgpu.barrier_arrive(turn.at[0]))
            load_q(0, 0)
            for_each_tile(run_tile, 0)
            # The stores must have read shared memory before the CTA exits
            # (their writes to global memory complete on their own).
            plgpu.wait_smem_to_gmem(0, wait_read_only=True)

    scratch = (
        plgpu.SMEM((n_bufs * n_wg, bq, head_dim), dtype, transforms=transforms),
        plgpu.SMEM((stages, bk, head_dim), dtype, transforms=transforms),
        plgpu.SMEM((stages, bk, head_dim), dtype, transforms=transforms),
        plgpu.SMEM((n_bufs * n_wg, bq), jnp.float32),
        plgpu.Barrier(num_barriers=n_bufs * n_wg),
        plgpu.Barrier(num_barriers=stages),
        plgpu.Barrier(num_barriers=stages),
        plgpu.Barrier(num_arrivals=n_wg, num_barriers=stages),
        plgpu.Barrier(num_arrivals=n_wg, num_barriers=stages),
        plgpu.Barrier(num_barriers=n_wg),
    )
    out_type = (jax.ShapeDtypeStruct(q.shape, dtype), jax.ShapeDtypeStruct((batch, heads, padded_len), jnp.float32))
    if persistent:
        grid, names = (n_programs,), ("programs",)
    else:
        grid, names = _tile_grid(heads, num_tiles, batch), _TILE_GRID_NAMES
    return _launch(body, out_type, scratch, grid, "flash_attention_mgpu_fwd", consumers=n_wg,
                   grid_names=names, auto_barriers=_FWD_AUTO_BARRIERS)(q, k, v, *((schedule,) if persistent else ()))


# ----------------------------------------------------------------------------
# Backward: dQ kernel.


def _dq_call(q, k, v, do, lse, delta, *, causal: bool, sm_scale: float, seq_len: int, blocks: MosaicBlockSizes):
    batch, padded_len, heads, head_dim = q.shape
    dtype = q.dtype
    bq, bk = blocks.block_q_dq, blocks.block_k_dq
    tile = 2 * bq
    num_tiles = padded_len // tile
    # Padded keys are zero, so their dS * K terms vanish: no tail mask needed,
    # and fully padded blocks are skipped.
    num_k_blocks = pl.cdiv(seq_len, bk)
    row = head_dim * dtype.itemsize
    stages = _fit_stages("dQ", blocks.num_stages_bwd, num_k_blocks, 2 * bq * (2 * row + 8), 2 * bk * row)
    qk_scale = sm_scale * LOG2_E
    transforms = _smem_transforms(head_dim, dtype.itemsize)

    def body(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dq_ref, q_smem, do_smem, lse_smem, delta_smem,
             k_smem, v_smem, row_ready, k_ready, v_ready, k_free, v_free):
        b, h, wg = lax.axis_index("batch"), lax.axis_index("heads"), lax.axis_index("wg")
        t = _longest_first(lax.axis_index("tiles"), num_tiles, causal)
        tile_start, n_blocks, n_free = _query_tile_key_blocks(t, tile, bk, num_k_blocks, causal,
                                                              unmasked=num_k_blocks)

        @pl.when(wg == 2)
        def _producer():
            plgpu.set_max_registers(_PRODUCER_REGISTERS, action="decrease")
            n = _kv_producer(k_ref, v_ref, k_smem, v_smem, k_ready, v_ready, k_free, v_free, b=b, h=h,
                             block_k=bk, n_blocks=n_blocks, num_stages=stages)
            _drain(n, stages, (k_free, v_free))

        @pl.when(wg < 2)
        def _consumer():
            plgpu.set_max_registers(_CONSUMER_REGISTERS, action="increase")
            row0 = tile_start + wg * bq
            rows = pl.ds(row0, bq)
            ready = row_ready.at[wg]
            # Four copies complete on one barrier: one arrival per copy.
            plgpu.copy_gmem_to_smem(q_ref.at[b, rows, h], q_smem.at[wg], ready)
            plgpu.copy_gmem_to_smem(do_ref.at[b, rows, h], do_smem.at[wg], ready)
            plgpu.copy_gmem_to_smem(lse_ref.at[b, h, rows], lse_smem.at[wg], ready)
            plgpu.copy_gmem_to_smem(delta_ref.at[b, h, rows], delta_smem.at[wg], ready)
            plgpu.barrier_wait(ready)
            lse2 = plgpu.load(lse_smem.at[wg], (), layout=plgpu.Layout.WGMMA.reduce(1)) * LOG2_E
            delta = plgpu.load(delta_smem.at[wg], (), layout=plgpu.Layout.WGMMA.reduce(1))

            def step(j, dq, *, masked: bool):
                slot = lax.rem(j, stages)
                plgpu.barrier_wait(k_ready.at[slot])
                plgpu.barrier_wait(v_ready.at[slot])

                def products(s_ref, dp_ref):
                    # Both matmuls in flight before the first wait.
                    plgpu.wgmma(s_ref, q_smem.at[wg], k_smem.at[slot].transpose((1, 0)))
                    plgpu.wgmma(dp_ref, do_smem.at[wg], v_smem.at[slot].transpose((1, 0)))

                def probabilities(s):
                    # P recomputed from the saved log-sum-exp (FA2 Algorithm 2).
                    p = jnp.exp2(s * qk_scale - _rows(lse2, s.shape))
                    if masked:
                        keep = j * bk + _iota((bq, bk), 1) <= row0 + _iota((bq, bk), 0)
                        # where(), not a multiply: a masked exp2 may overflow to inf.
                        p = jnp.where(keep, p, 0.0)
                    return p

                p, dp = _scores_and_dp(products, probabilities, (bq, bk), blocks.bwd_overlap)
                plgpu.barrier_arrive(v_free.at[slot])
                ds = (p * (dp - _rows(delta, dp.shape))).astype(dtype)
                dq = _accumulate(lambda refs: plgpu.wgmma(refs[0], ds, k_smem.at[slot]), dq)
                plgpu.barrier_arrive(k_free.at[slot])
                return dq

            dq = _zeros((bq, head_dim), plgpu.Layout.WGMMA)
            dq = lax.fori_loop(0, n_free, functools.partial(step, masked=False), dq)
            if causal:
                dq = lax.fori_loop(n_free, n_blocks, functools.partial(step, masked=True), dq)
            # dS is the gradient of the scaled scores: apply the scale once.
            q_smem.at[wg][...] = (dq * sm_scale).astype(dtype)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(q_smem.at[wg], dq_ref.at[b, rows, h])
            plgpu.wait_smem_to_gmem(0)

    scratch = (
        plgpu.SMEM((2, bq, head_dim), dtype, transforms=transforms),
        plgpu.SMEM((2, bq, head_dim), dtype, transforms=transforms),
        plgpu.SMEM((2, bq), jnp.float32),
        plgpu.SMEM((2, bq), jnp.float32),
        plgpu.SMEM((stages, bk, head_dim), dtype, transforms=transforms),
        plgpu.SMEM((stages, bk, head_dim), dtype, transforms=transforms),
        plgpu.Barrier(num_arrivals=4, num_barriers=2),
        plgpu.Barrier(num_barriers=stages),
        plgpu.Barrier(num_barriers=stages),
        plgpu.Barrier(num_arrivals=2, num_barriers=stages),
        plgpu.Barrier(num_arrivals=2, num_barriers=stages),
    )
    out_type = jax.ShapeDtypeStruct(q.shape, dtype)
    return _launch(body, out_type, scratch, _tile_grid(heads, num_tiles, batch), "flash_attention_mgpu_bwd_dq",
                   auto_barriers=_BWD_AUTO_BARRIERS)(
        q, k, v, do, lse, delta)


# ----------------------------------------------------------------------------
# Backward: dK/dV kernel.


def _dkdv_call(q, k, v, do, lse, delta, *, causal: bool, sm_scale: float, seq_len: int,
               blocks: MosaicBlockSizes, dq_acc=None):
    """dK, dV; with `dq_acc` (a float32 `jax.Ref` shaped like q, zeros) also
    dQ / sm_scale, added into `dq_acc` (the fused backward)."""
    batch, padded_len, heads, head_dim = q.shape
    dtype = q.dtype
    fused = dq_acc is not None
    split = fused and blocks.dq_split
    bk, bq = blocks.block_k_dkv, blocks.block_q_dkv
    # dq_split: consumer c computes dQ columns [c * dq_cols, (c + 1) * dq_cols).
    dq_cols = head_dim // 2 if split else head_dim
    if split and (dq_cols * dtype.itemsize) % 128:
        raise ValueError(f"dq_split=True needs head_dim 128 (each consumer's {dq_cols} columns of the keys must be "
                         f"whole 128-byte swizzle rows), got {head_dim=}: use dq_split=False")
    tile = 2 * bk
    num_tiles = padded_len // tile
    # Padded query rows have dO = 0 and delta = 0, so they add nothing to dK
    # or dV: no tail mask, and fully padded blocks are skipped. Padded keys
    # are zero, so their share of dQ (dS K) is zero too.
    num_q_blocks = pl.cdiv(seq_len, bq)
    qk_scale = sm_scale * LOG2_E
    transforms = _smem_transforms(head_dim, dtype.itemsize)
    row = head_dim * dtype.itemsize
    # Fused: both consumers' dS^T, double-buffered (operands of the dQ
    # product), and a float32 dQ tile per consumer (source of the reduce-add)
    # also live in shared memory.
    lag = split and blocks.split_order and blocks.dq_lag
    stagger = fused and blocks.stagger
    ds_bufs = _LAG_DS_BUFFERS if lag else 2
    fixed = 4 * bk * row + (2 * ds_bufs * bk * bq * dtype.itemsize + 2 * bq * dq_cols * 4 if fused else 0)
    # The diagonal block's mask as a shared-memory tile per consumer.
    mask_tile = blocks.mask_tile and causal and bk == bq
    fixed += 2 * bk * bq * dtype.itemsize if mask_tile else 0
    stages = _fit_stages("fused backward" if fused else "dK/dV", blocks.num_stages_bwd, num_q_blocks, fixed,
                         bq * (2 * row + 8))

    def body(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, *refs):
        if fused:
            dq_ref, *refs = refs
        (dk_ref, dv_ref, k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem,
         kv_ready, q_ready, do_ready, q_free, do_free, *extra_scratch) = refs
        n_fused = (5 if stagger else 4) if fused else 0
        fused_scratch, extra_scratch = extra_scratch[:n_fused], extra_scratch[n_fused:]
        tri_smem = extra_scratch[0] if mask_tile else None
        b, h, wg = lax.axis_index("batch"), lax.axis_index("heads"), lax.axis_index("wg")
        t = lax.axis_index("tiles")
        tile_start = t * tile
        if causal:
            # Query blocks before the tile never see its keys. Both consumers
            # walk the same blocks; the first ones straddle the diagonal.
            first = lax.div(tile_start, bq)
            n_masked_end = jnp.minimum(lax.div(tile_start + tile + bq - 1, bq), num_q_blocks)
        else:
            first, n_masked_end = 0, 0
        n_steps = num_q_blocks - first

        @pl.when(wg == 2)
        def _producer():
            plgpu.set_max_registers(_TWO_CONSUMER_REGISTERS - 2 * blocks.bwd_registers, action="decrease")

            def issue(step, slot, wait):
                blk = first + step
                rows = pl.ds(blk * bq, bq)
                _when(wait, lambda: plgpu.barrier_wait(q_free.at[slot]))
                plgpu.copy_gmem_to_smem(q_ref.at[b, rows, h], q_smem.at[slot], q_ready.at[slot])
                plgpu.copy_gmem_to_smem(lse_ref.at[b, h, rows], lse_smem.at[slot], q_ready.at[slot])
                _when(wait, lambda: plgpu.barrier_wait(do_free.at[slot]))
                plgpu.copy_gmem_to_smem(do_ref.at[b, rows, h], do_smem.at[slot], do_ready.at[slot])
                plgpu.copy_gmem_to_smem(delta_ref.at[b, h, rows], delta_smem.at[slot], do_ready.at[slot])

            _drain(_producer_loop(n_steps, stages, issue), stages, (q_free, do_free))

        @pl.when(wg < 2)
        def _consumer():
            plgpu.set_max_registers(blocks.bwd_registers, action="increase")
            key0 = tile_start + wg * bk
            keys = pl.ds(key0, bk)
            ready = kv_ready.at[wg]
            plgpu.copy_gmem_to_smem(k_ref.at[b, keys, h], k_smem.at[wg], ready)
            plgpu.copy_gmem_to_smem(v_ref.at[b, keys, h], v_smem.at[wg], ready)
            plgpu.barrier_wait(ready)
            if mask_tile:
                # The block on the diagonal (query block start == key0):
                # keys [rows] see queries [cols] at or after them.
                zeros = _zeros((bk, bq), plgpu.Layout.WGMMA)
                on_or_after = _iota((bk, bq), 0) <= _iota((bk, bq), 1)
                tri_smem.at[wg][...] = jnp.where(on_or_after, zeros, zeros - jnp.inf).astype(dtype)
                plgpu.commit_smem()

            if fused:
                ds_smem, dq_smem, ds_ready, ds_free, *stagger_bar = fused_scratch
                if stagger:
                    # Consumer 1 starts once consumer 0's first S and dP
                    # are done, so one computes its exponentials while the
                    # other has the tensor cores.
                    _when((wg == 1) & (n_steps > 0), lambda: plgpu.barrier_wait(stagger_bar[0].at[0]))

            def add_dq(dq, blk):
                """Adds dQ of query block `blk` over this CTA's keys (this
                consumer's columns of it with dq_split) to dq_acc:
                registers -> shared memory -> TMA reduce-add."""
                # The previous reduce-add must have read its source.
                plgpu.wait_smem_to_gmem(0, wait_read_only=True)
                dq_smem.at[wg][...] = dq
                plgpu.commit_smem()
                dst = dq_ref.at[b, pl.ds(blk * bq, bq), h]
                if split:
                    dst = dst.at[:, pl.ds(wg * dq_cols, dq_cols)]
                plgpu.copy_smem_to_gmem(dq_smem.at[wg], dst, reduction_op="add")

            def dq_product(acc, buf, cols=slice(None)):
                """dQ of the block in `buf` (or its columns): dS K over both consumers' keys."""
                for c in range(2):
                    plgpu.wgmma(acc, ds_smem.at[buf, c].transpose((1, 0)), k_smem.at[c, :, cols])

            def my_dq_product(acc, buf, reader):
                if split:
                    for half in range(2):
                        _when(wg == half, functools.partial(dq_product, acc, buf, pl.ds(half * dq_cols, dq_cols)))
                else:
                    _when(reader, functools.partial(dq_product, acc, buf))

            # Everything is computed transposed ([keys, queries]) so that dK
            # and dV come out of wgmma with the keys as rows.
            #
            # Fused: both consumers put dS^T of query block i in shared memory
            # (buffer i % 2); consumer i % 2, the block's owner, multiplies
            # both by their keys, so each block's dQ over all 2 * bk keys is
            # one tile and one reduce-add (half the traffic of one per
            # consumer), and the owners alternate. The owner stores that tile
            # and issues its reduce-add during block i + 1's S and dP
            # products, so they overlap the tensor cores.
            #
            # dq_split: both consumers read both dS^T of every block, each
            # for its half of dQ's columns, and add it as soon as it is
            # computed: carrying it over the next S and dP would not fit in
            # registers next to head_dim 128's dK and dV.
            def step(i, carry, *, masked: bool | None, peeled: bool = False):
                """Query block i; `peeled`: the tile's first, run on its own
                with dq_lag or stagger so that the loop needs no branch
                for what only the first step does."""
                dk, dv, *dq_prev = carry  # fused: dQ of the previous block, if this consumer owned it
                slot = lax.rem(i - first, stages)
                plgpu.barrier_wait(q_ready.at[slot])
                plgpu.barrier_wait(do_ready.at[slot])

                def products(s_ref, dp_ref):
                    plgpu.wgmma(s_ref, k_smem.at[wg], q_smem.at[slot].transpose((1, 0)))
                    plgpu.wgmma(dp_ref, v_smem.at[wg], do_smem.at[slot].transpose((1, 0)))
                    if fused and not split:
                        _when((i > first) & (lax.rem(i - 1, 2) == wg), lambda: add_dq(dq_prev[0], i - 1))

                def mask(p_t):
                    keep = key0 + _iota((bk, bq), 0) <= i * bq + _iota((bk, bq), 1)
                    return jnp.where(keep, p_t, 0.0)

                def masked_scores(x):
                    """x = scaled S^T - lse with the causal mask as -inf, by
                    the block's offset from the diagonal (mask_tile)."""
                    d = i * bq - key0  # a multiple of bq: key0 is one
                    branch = jnp.where(d < 0, 0, jnp.where(d == 0, 1, 2))  # before / on / after the diagonal
                    if masked is None:  # one loop: only the blocks that cross the diagonal
                        branch = jnp.where(i < n_masked_end, branch, 2)
                    on_diagonal = lambda x: x + plgpu.load(tri_smem.at[wg], (), layout=plgpu.Layout.WGMMA).astype(
                        jnp.float32)
                    return lax.switch(branch, [lambda x: x - jnp.inf, on_diagonal, lambda x: x], x)

                def load_lse():
                    return plgpu.load(lse_smem.at[slot], (), layout=plgpu.Layout.WGMMA.reduce(0))

                def probabilities(s_t, early_lse=None):
                    lse2 = (load_lse() if early_lse is None else early_lse) * LOG2_E
                    if mask_tile and masked is not False:
                        return jnp.exp2(masked_scores(s_t * qk_scale - _cols(lse2, s_t.shape)))
                    p_t = jnp.exp2(s_t * qk_scale - _cols(lse2, s_t.shape))
                    if masked is None:  # one loop: only the blocks that cross the diagonal take the branch
                        p_t = lax.cond(i < n_masked_end, mask, lambda x: x, p_t)
                    elif masked:
                        p_t = mask(p_t)
                    return p_t

                p_t, dp_t = _scores_and_dp(products, probabilities, (bk, bq), blocks.bwd_overlap,
                                           prefetch=load_lse if blocks.lse_early else None)
                if stagger and peeled:
                    _when(wg == 0, lambda: plgpu.barrier_arrive(stagger_bar[0].at[0]))
                delta = plgpu.load(delta_smem.at[slot], (), layout=plgpu.Layout.WGMMA.reduce(0))

                def grad_scores():
                    return (p_t * (dp_t - _cols(delta, dp_t.shape))).astype(dtype)

                def exchange(ds_t, buf, reader):
                    """Puts this consumer's dS^T of the block in shared memory
                    and, if it reads them in this step (not with dq_lag,
                    which reads them in the next), waits for the other one's."""
                    # The other consumer read this buffer ds_bufs blocks ago:
                    # wait until its dQ product is done with it.
                    reused = i - first >= ds_bufs
                    _when(reused if split else (~reader) & reused, lambda: plgpu.barrier_wait(ds_free.at[buf]))
                    ds_smem.at[buf, wg][...] = ds_t
                    plgpu.commit_smem()
                    plgpu.barrier_arrive(ds_ready.at[buf])
                    if not lag:
                        _when(reader, lambda: plgpu.barrier_wait(ds_ready.at[buf]))

                def buffer():
                    """The block's dS^T buffer, and whether this consumer
                    multiplies its tiles: the owner, or both with dq_split."""
                    buf = lax.rem(i, ds_bufs)
                    return buf, True if split else buf == wg

                if blocks.split_order:
                    buf, reader = buffer()
                    # FA3's step: dV is on the tensor cores during dS and the
                    # exchange, dK during the dQ store.
                    # dq_lag: the dQ product is the previous block's, whose
                    # dS^T the other consumer stored a step ago, so neither
                    # waits here for the other's current block.
                    # The peeled first step has no previous block.
                    prev = lax.rem(i + ds_bufs - 1, ds_bufs)

                    def fa3_step(refs):
                        dv_ref, dk_ref, dq_ref = refs
                        plgpu.wgmma(dv_ref, p_t.astype(dtype), do_smem.at[slot])
                        ds_t = grad_scores()
                        exchange(ds_t, buf, reader)
                        if lag and not peeled:
                            plgpu.barrier_wait(ds_ready.at[prev])
                            my_dq_product(dq_ref, prev, True)
                        elif not lag:
                            my_dq_product(dq_ref, buf, reader)
                        plgpu.wgmma(dk_ref, ds_t, q_smem.at[slot])
                        dq = plgpu.wgmma_accumulator_load(dq_ref, wait_n=1)  # dV and dQ done, dK in flight
                        if lag and not peeled:
                            plgpu.barrier_arrive(ds_free.at[prev])
                            add_dq(dq, i - 1)
                        elif not lag:
                            plgpu.barrier_arrive(ds_free.at[buf])
                            add_dq(dq, i)

                    dv, dk, _ = pl.run_state(fa3_step)(
                        tuple(plgpu.ACC.init(x) for x in (dv, dk, _zeros((bq, dq_cols), plgpu.Layout.WGMMA))))
                    dq = []
                else:
                    ds_t = grad_scores()
                    if fused:
                        buf, reader = buffer()
                        exchange(ds_t, buf, reader)

                    def grads(refs):
                        plgpu.wgmma(refs[0], p_t.astype(dtype), do_smem.at[slot])
                        plgpu.wgmma(refs[1], ds_t, q_smem.at[slot])
                        if fused:
                            my_dq_product(refs[2], buf, reader)

                    # Fused: each block's dQ tile starts from zero; the owner
                    # carries it into the next step, which adds it to dq_acc
                    # (with dq_split each consumer adds its columns now).
                    dq = [_zeros((bq, dq_cols), plgpu.Layout.WGMMA)] if fused else []
                    dv, dk, *dq = _accumulate(grads, dv, dk, *dq)
                    if fused:
                        _when(reader, lambda: plgpu.barrier_arrive(ds_free.at[buf]))
                    if split:
                        add_dq(dq.pop(), i)
                # lse/delta were read with ordinary loads (generic proxy); the
                # next TMA into this slot writes through the async proxy, so
                # fence the two before releasing the slot. (Their values are
                # used by now, so the loads are done; without the fence the
                # backward measured 0.99-1.01x on an H100,
                # results/attention-mgpu-h100/timing/ab-fence-41.log.)
                plgpu.commit_smem()
                plgpu.barrier_arrive(q_free.at[slot])
                plgpu.barrier_arrive(do_free.at[slot])
                return dk, dv, *dq

            carried_dq = [(bq, head_dim)] if fused and not split else []
            carry = tuple(_zeros(shape, plgpu.Layout.WGMMA) for shape in ((bk, head_dim), (bk, head_dim), *carried_dq))
            first_masked = True if causal and blocks.masked_loop else (None if causal else False)
            if lag or stagger:
                # A padded tile past the sequence has no step.
                carry = lax.cond(n_steps > 0, functools.partial(step, first, masked=first_masked, peeled=True),
                                 lambda c: c, carry)
                first_step = first + 1
            else:
                first_step = first
            if causal and blocks.masked_loop:
                carry = lax.fori_loop(first_step, n_masked_end, functools.partial(step, masked=True), carry)
                start, masked = jnp.maximum(n_masked_end, first_step), False
            else:
                start, masked = first_step, first_masked
            dk, dv, *dq = lax.fori_loop(start, num_q_blocks, functools.partial(step, masked=masked), carry)
            last_buf = lax.rem(num_q_blocks - 1, ds_bufs)
            if lag:
                def last_dq():
                    """The last block's dQ columns, which no next step multiplies."""
                    plgpu.barrier_wait(ds_ready.at[last_buf])

                    dq_last = _accumulate(lambda refs: my_dq_product(refs[0], last_buf, True),
                                          _zeros((bq, dq_cols), plgpu.Layout.WGMMA))
                    plgpu.barrier_arrive(ds_free.at[last_buf])
                    add_dq(dq_last, num_q_blocks - 1)

                _when(n_steps > 0, last_dq)
            if fused:
                # The last block's dQ, if carried (zeros if the tile saw no block).
                last_owner = lax.rem(num_q_blocks - 1, 2) == wg
                if not split:
                    _when(last_owner, lambda: add_dq(dq[0], num_q_blocks - 1))
                # dK overwrites this consumer's keys, which the other
                # consumer (the last block's owner, or either with dq_split)
                # multiplies in its dQ product: wait for that to finish.
                readers_left = n_steps > 0 if split else (~last_owner) & (n_steps > 0)
                _when(readers_left, lambda: plgpu.barrier_wait(ds_free.at[last_buf]))
            k_smem.at[wg][...] = (dk * sm_scale).astype(dtype)
            v_smem.at[wg][...] = dv.astype(dtype)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(k_smem.at[wg], dk_ref.at[b, keys, h], commit_group=False)
            plgpu.copy_smem_to_gmem(v_smem.at[wg], dv_ref.at[b, keys, h], commit_group=False)
            plgpu.commit_smem_to_gmem_group()
            plgpu.wait_smem_to_gmem(0)

    scratch = (
        plgpu.SMEM((2, bk, head_dim), dtype, transforms=transforms),
        plgpu.SMEM((2, bk, head_dim), dtype, transforms=transforms),
        plgpu.SMEM((stages, bq, head_dim), dtype, transforms=transforms),
        plgpu.SMEM((stages, bq, head_dim), dtype, transforms=transforms),
        plgpu.SMEM((stages, bq), jnp.float32),
        plgpu.SMEM((stages, bq), jnp.float32),
        plgpu.Barrier(num_arrivals=2, num_barriers=2),
        plgpu.Barrier(num_arrivals=2, num_barriers=stages),
        plgpu.Barrier(num_arrivals=2, num_barriers=stages),
        plgpu.Barrier(num_arrivals=2, num_barriers=stages),
        plgpu.Barrier(num_arrivals=2, num_barriers=stages),
    )
    if fused:
        scratch += (
            # [buffer, consumer]; wgmma needs dS^T and K swizzled alike, and
            # bq rows are >= 128 B, so K's swizzle fits.
            plgpu.SMEM((ds_bufs, 2, bk, bq), dtype, transforms=transforms),
            plgpu.SMEM((2, bq, dq_cols), jnp.float32, transforms=_smem_transforms(dq_cols, 4)),
            plgpu.Barrier(num_arrivals=2, num_barriers=ds_bufs),
            plgpu.Barrier(num_arrivals=2 if split else 1, num_barriers=ds_bufs),
        ) + ((plgpu.Barrier(num_arrivals=1, num_barriers=1),) if stagger else ())
    if mask_tile:
        scratch += (plgpu.SMEM((2, bk, bq), dtype, transforms=transforms),)
    grad = jax.ShapeDtypeStruct(k.shape, dtype)
    name = "flash_attention_mgpu_bwd_fused" if fused else "flash_attention_mgpu_bwd_dkdv"
    launch = _launch(body, (grad, grad), scratch, _tile_grid(heads, num_tiles, batch), name, mutable=fused,
                     auto_barriers=_BWD_AUTO_BARRIERS)
    return launch(q, k, v, do, lse, delta, *((dq_acc,) if fused else ()))


# ----------------------------------------------------------------------------
# Entry points with the contracts of the portable kernels.


def _pad_seq(x: jax.Array, padded_len: int, axis: int) -> jax.Array:
    extra = padded_len - x.shape[axis]
    if extra == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return jnp.pad(x, widths)


def _unpad_seq(x: jax.Array, seq_len: int, axis: int) -> jax.Array:
    return x if x.shape[axis] == seq_len else lax.slice_in_dim(x, 0, seq_len, axis=axis)


def _check_blocks(block_sizes) -> MosaicBlockSizes:
    if not isinstance(block_sizes, MosaicBlockSizes):
        raise ValueError(f"block_sizes={block_sizes!r} must be a MosaicBlockSizes for backend='mosaic'")
    if not AVAILABLE:
        raise ValueError(f"the Mosaic GPU backend is unavailable: {_IMPORT_ERROR}")
    return block_sizes


def mosaic_forward(q, k, v, *, causal: bool, sm_scale: float, block_sizes: MosaicBlockSizes,
                   interpret: bool = False) -> tuple[jax.Array, jax.Array]:
    """(o, lse) like the portable forward. Sequences that are not a multiple of
    `block_sizes.seq_multiple` are zero-padded (one copy) and the padded keys
    masked; o and lse are sliced back."""
    del interpret  # rejected by the dispatcher before we get here
    blocks = _check_blocks(block_sizes)
    seq_len = q.shape[1]
    padded_len = pl.cdiv(seq_len, blocks.seq_multiple) * blocks.seq_multiple
    q, k, v = (_pad_seq(x, padded_len, 1) for x in (q, k, v))
    o, lse = _forward_call(q, k, v, causal=causal, sm_scale=sm_scale, seq_len=seq_len, blocks=blocks)
    return _unpad_seq(o, seq_len, 1), _unpad_seq(lse, seq_len, 2)


def mosaic_backward(q, k, v, o, lse, do, *, causal: bool, sm_scale: float, block_sizes: MosaicBlockSizes,
                    interpret: bool = False) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(dq, dk, dv) like the portable backward."""
    del interpret
    blocks = _check_blocks(block_sizes)
    seq_len = q.shape[1]
    do = do.astype(q.dtype)
    # D = rowsum(dO * O) (FA2 Algorithm 2, line 4): a memory-bound reduction
    # that XLA fuses into one pass; float32 like the statistics it meets.
    delta = jnp.einsum("bshd,bshd->bhs", o.astype(jnp.float32), do.astype(jnp.float32))
    padded_len = pl.cdiv(seq_len, blocks.seq_multiple) * blocks.seq_multiple
    # Padded rows: q = k = v = dO = 0, lse = delta = 0 -> every term they
    # contribute to a real row's gradient is exactly zero (see the kernels).
    q, k, v, do = (_pad_seq(x, padded_len, 1) for x in (q, k, v, do))
    lse, delta = (_pad_seq(x, padded_len, 2) for x in (lse, delta))
    kwargs = dict(causal=causal, sm_scale=sm_scale, seq_len=seq_len, blocks=blocks)
    if blocks.fused_bwd:
        dq_acc = jax.new_ref(jnp.zeros(q.shape, jnp.float32))
        dk, dv = _dkdv_call(q, k, v, do, lse, delta, dq_acc=dq_acc, **kwargs)
        dq = (dq_acc[...] * sm_scale).astype(q.dtype)
    else:
        dq = _dq_call(q, k, v, do, lse, delta, **kwargs)
        dk, dv = _dkdv_call(q, k, v, do, lse, delta, **kwargs)
    return tuple(_unpad_seq(x, seq_len, 1) for x in (dq, dk, dv))
