"""FlashAttention-2 (forward and backward) as JAX Pallas kernels.

Layout is [batch, seq, heads, head_dim] for q, k, v, o and their gradients;
the log-sum-exp residual is [batch, heads, seq] in float32.

The kernels follow the FlashAttention-2 paper (Dao, 2023,
https://arxiv.org/abs/2307.08691); section numbers in comments refer to it.
They are written against Pallas's portable GPU lowering (the Triton lowering),
so they run on Ampere, Ada and Hopper, and in interpret mode on CPU.

`pallas_kernels.attention` registers them as the "triton" backend and owns
validation and the custom_vjp; the Hopper kernels (`pallas_kernels.hopper`)
are the other backend.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

__all__ = ["MAX_HEAD_DIM", "SUPPORTED_DTYPES", "BlockSizes", "triton_backward", "triton_forward"]

LOG2_E = math.log2(math.e)
LN_2 = math.log(2.0)
MAX_HEAD_DIM = 256
# Triton's tensor-core dot needs every dimension of a tile to be >= 16.
_MIN_BLOCK = 16
SUPPORTED_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


@dataclasses.dataclass(frozen=True, slots=True)
class BlockSizes:
    """Tile sizes and the launch parameters tuned together with them.

    Attributes:
      block_q, block_k: query / key rows per tile in the forward kernel.
      block_q_dkv, block_k_dkv: tiles of the dK/dV kernel (one program owns a
        key block and loops over query blocks).
      block_q_dq, block_k_dq: tiles of the dQ kernel (one program owns a query
        block and loops over key blocks).
      num_warps_fwd, num_stages_fwd, num_warps_bwd, num_stages_bwd: Triton
        launch parameters (warps per program, software-pipelining depth).

    Every block size must be a power of two >= 16. Blocks longer than the
    (power-of-two-rounded) sequence are shrunk at launch time.
    """

    block_q: int = 128
    block_k: int = 64
    block_q_dkv: int = 64
    block_k_dkv: int = 64
    block_q_dq: int = 64
    block_k_dq: int = 64
    num_warps_fwd: int = 8
    num_stages_fwd: int = 4
    num_warps_bwd: int = 4
    num_stages_bwd: int = 3

    def __post_init__(self) -> None:
        for field in _BLOCK_FIELDS:
            value = getattr(self, field)
            if not isinstance(value, int) or value < _MIN_BLOCK or value & (value - 1):
                raise ValueError(f"{field}={value!r} must be a power of two >= {_MIN_BLOCK}")
        for field in ("num_warps_fwd", "num_stages_fwd", "num_warps_bwd", "num_stages_bwd"):
            value = getattr(self, field)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{field}={value!r} must be a positive integer")

    @classmethod
    def get_default(cls, head_dim: int, seq_len: int | None = None, causal: bool | None = None) -> BlockSizes:
        """Defaults for the Triton kernels, tuned on an H200 in bfloat16;
        `fitted` shrinks them where shared memory is short (and adapts them
        to seq_len, so it is not needed here). They do not depend on `causal`."""
        del seq_len, causal
        if _padded_head_dim(head_dim) <= 64:
            return cls()
        return cls(num_stages_fwd=3, block_k_dkv=128, block_q_dq=128, num_warps_bwd=8)

    def fitted(self, seq_len: int, head_dim: int, itemsize: int, shared_memory: int | None) -> BlockSizes:
        """Adapts the blocks to one problem and device.

        Blocks longer than the power-of-two-rounded sequence are shrunk. If
        `shared_memory` (bytes per program) is given, pipelining depth and
        then the streamed tiles are reduced until the estimated footprint fits:
        each kernel keeps its resident tiles plus `num_stages` copies of the
        tiles streamed through its loop (this matches Triton's allocation for
        the forward kernel exactly, and is a lower bound for the backward).
        """
        cap = max(_MIN_BLOCK, pl.next_power_of_2(seq_len))
        blocks = dataclasses.replace(self, **{f: min(getattr(self, f), cap) for f in _BLOCK_FIELDS})
        if shared_memory is None:
            return blocks
        row_bytes = _padded_head_dim(head_dim) * itemsize
        # Per kernel: (resident tile field, tiles resident, streamed tile field, stages field).
        # The forward keeps q; dK/dV keeps k and v; dQ keeps q and dO. Each
        # streams two tiles per step (k, v or q, dO).
        kernels = [
            ("block_q", 1, "block_k", "num_stages_fwd"),
            ("block_k_dkv", 2, "block_q_dkv", "num_stages_bwd"),
            ("block_q_dq", 2, "block_k_dq", "num_stages_bwd"),
        ]
        for resident, n_resident, streamed, stages in kernels:
            while True:
                r, st, n = getattr(blocks, resident), getattr(blocks, streamed), getattr(blocks, stages)
                if row_bytes * (n_resident * r + n * 2 * st) <= shared_memory:
                    break
                if n > 2:
                    change = {stages: n - 1}
                elif st > _MIN_BLOCK:
                    change = {streamed: st // 2}
                elif r > _MIN_BLOCK:
                    change = {resident: r // 2}
                else:
                    break
                blocks = dataclasses.replace(blocks, **change)
        return blocks


_BLOCK_FIELDS = ("block_q", "block_k", "block_q_dkv", "block_k_dkv", "block_q_dq", "block_k_dq")
# Usable shared memory per program by compute capability (bytes), with ~10%
# left for Triton's own scratch; smaller parts (sm_86, sm_89) use the fallback.
_SHARED_MEMORY = {"8.0": 147_000, "8.7": 147_000, "9.0": 204_000}
_SHARED_MEMORY_FALLBACK = 89_000


def _shared_memory_budget(interpret: bool) -> int | None:
    if interpret:
        return None
    capability = getattr(jax.devices()[0], "compute_capability", None)
    return _SHARED_MEMORY.get(capability, _SHARED_MEMORY_FALLBACK)


def _padded_head_dim(head_dim: int) -> int:
    return max(_MIN_BLOCK, pl.next_power_of_2(head_dim))


# ----------------------------------------------------------------------------
# Tile helpers shared by the kernels. Inside a kernel, every tensor ref is the
# [seq_len, padded_head_dim] slab of one (batch, head); rows past seq_len and
# columns past head_dim are outside the array, so loads mask them to zero and
# stores skip them. Masks are only built when the shapes need them (static).


def _tile_mask(start, size: int, seq_len: int, head_dim: int, padded_dim: int, check_rows: bool):
    mask = None
    if check_rows:
        mask = (start + jnp.arange(size) < seq_len)[:, None]
    if head_dim != padded_dim:
        cols = (jnp.arange(padded_dim) < head_dim)[None, :]
        mask = cols if mask is None else mask & cols
    return mask


def _load_tile(ref, start, size: int, *, head_dim: int, check_rows: bool) -> jax.Array:
    seq_len, padded_dim = ref.shape
    mask = _tile_mask(start, size, seq_len, head_dim, padded_dim, check_rows)
    tile = ref.at[pl.ds(start, size), :]
    if mask is None:
        return plgpu.load(tile)
    return plgpu.load(tile, mask=mask, other=0.0)


def _store_tile(ref, start, value: jax.Array, *, head_dim: int, check_rows: bool) -> None:
    seq_len, padded_dim = ref.shape
    size = value.shape[0]
    mask = _tile_mask(start, size, seq_len, head_dim, padded_dim, check_rows)
    plgpu.store(ref.at[pl.ds(start, size), :], value.astype(ref.dtype), mask=mask)


def _load_row_stat(ref, start, size: int, *, check_rows: bool) -> jax.Array:
    """Loads `size` entries of a per-row float32 statistic (lse or delta)."""
    tile = ref.at[pl.ds(start, size)]
    if not check_rows:
        return plgpu.load(tile)
    return plgpu.load(tile, mask=start + jnp.arange(size) < ref.shape[0], other=0.0)


def _store_row_stat(ref, start, value: jax.Array, *, check_rows: bool) -> None:
    mask = start + jnp.arange(value.shape[0]) < ref.shape[0] if check_rows else None
    plgpu.store(ref.at[pl.ds(start, value.shape[0])], value, mask=mask)


def _dot(a: jax.Array, b: jax.Array, *, trans_b: bool = False) -> jax.Array:
    """a @ b (or a @ b.T) with float32 accumulation (TF32 inputs for float32)."""
    dims = (((1,), (1 if trans_b else 0,)), ((), ()))
    return lax.dot_general(a, b, dims, preferred_element_type=jnp.float32)


def _key_block_ranges(q_start, seq_len: int, block_q: int, block_k: int, causal: bool):
    """Key-block loop bounds for one query block: [0, mid) unmasked, [mid, end) masked.

    Causal: key blocks entirely above the diagonal are never visited (the loop
    stops at `end`), and only the blocks straddling the diagonal pay for a mask
    (FlashAttention-2 §3.1.1, "causal masking"). Non-causal: only a ragged tail
    block needs a mask.
    """
    num_k_blocks = pl.cdiv(seq_len, block_k)
    if not causal:
        return seq_len // block_k, num_k_blocks
    mid = lax.div(q_start, block_k)
    end = jnp.minimum(lax.div(q_start + block_q + block_k - 1, block_k), num_k_blocks)
    return mid, end


def _query_block_order(num_q_blocks: int, causal: bool):
    """Query block handled by this program. Causal rows near the end of the
    sequence see the most keys, so they are launched first; the short blocks
    then fill the last wave (a longest-job-first order, cf. §3.2)."""
    index = pl.program_id(0)
    return num_q_blocks - 1 - index if causal else index


# ----------------------------------------------------------------------------
# Forward (FlashAttention-2 Algorithm 1).


def _fwd_kernel(q_ref, k_ref, v_ref, o_ref, lse_ref, *, sm_scale: float, causal: bool,
                block_q: int, block_k: int, head_dim: int):
    seq_len, padded_dim = q_ref.shape
    q_start = _query_block_order(pl.cdiv(seq_len, block_q), causal) * block_q
    q_ragged = seq_len % block_q != 0
    k_ragged = seq_len % block_k != 0
    q = _load_tile(q_ref, q_start, block_q, head_dim=head_dim, check_rows=q_ragged)
    rows = q_start + jnp.arange(block_q)
    # Scores live in the base-2 domain, exp(x) = exp2(x * log2(e)), so the
    # softmax scale and the change of base fold into one multiply.
    qk_scale = sm_scale * LOG2_E

    def body(kb, carry, *, masked: bool):
        acc, m_prev, l_prev = carry
        k_start = kb * block_k
        k = _load_tile(k_ref, k_start, block_k, head_dim=head_dim, check_rows=masked and k_ragged)
        v = _load_tile(v_ref, k_start, block_k, head_dim=head_dim, check_rows=masked and k_ragged)
        s = _dot(q, k, trans_b=True)
        if masked:
            cols = k_start + jnp.arange(block_k)
            keep = cols[None, :] <= rows[:, None] if causal else cols[None, :] < seq_len
            # -inf is safe: every row has seen at least one unmasked key by the
            # time a fully masked row-tile can occur, so m stays finite.
            s = jnp.where(keep, s, -jnp.inf)
        # Online softmax (§3.1.1): keep the running max m and the running
        # (unnormalised) sum l; rescale the accumulator only by exp(m_old - m_new).
        m_new = jnp.maximum(m_prev, jnp.max(s, axis=1) * qk_scale)
        p = jnp.exp2(s * qk_scale - m_new[:, None])
        alpha = jnp.exp2(m_prev - m_new)
        l_new = l_prev * alpha + jnp.sum(p, axis=1)
        acc = acc * alpha[:, None] + _dot(p.astype(v.dtype), v)
        return acc, m_new, l_new

    carry = (
        jnp.zeros((block_q, padded_dim), jnp.float32),
        jnp.full((block_q,), -jnp.inf, jnp.float32),
        jnp.zeros((block_q,), jnp.float32),
    )
    mid, end = _key_block_ranges(q_start, seq_len, block_q, block_k, causal)
    carry = lax.fori_loop(0, mid, functools.partial(body, masked=False), carry)
    acc, m, l = lax.fori_loop(mid, end, functools.partial(body, masked=True), carry)
    # §3.1.1: divide by the softmax denominator once, after the last key block,
    # instead of renormalising the output at every step.
    _store_tile(o_ref, q_start, acc / l[:, None], head_dim=head_dim, check_rows=q_ragged)
    # §3.1.1: only the log-sum-exp L = m + log(l) is kept for the backward pass
    # (instead of both m and l). Stored in natural-log units.
    _store_row_stat(lse_ref, q_start, (m + jnp.log2(l)) * LN_2, check_rows=q_ragged)


# ----------------------------------------------------------------------------
# Backward (FlashAttention-2 Algorithm 2), split in three kernels: the row
# statistic D, then dK/dV (parallel over key blocks) and dQ (parallel over
# query blocks). Splitting dQ from dK/dV avoids the atomic adds of §3.2 at the
# cost of recomputing P twice.


def _bwd_preprocess_kernel(o_ref, do_ref, delta_ref, *, block_q: int, head_dim: int):
    seq_len = o_ref.shape[0]
    q_start = pl.program_id(0) * block_q
    ragged = seq_len % block_q != 0
    o = _load_tile(o_ref, q_start, block_q, head_dim=head_dim, check_rows=ragged)
    do = _load_tile(do_ref, q_start, block_q, head_dim=head_dim, check_rows=ragged)
    # Algorithm 2, line 4: D_i = rowsum(dO_i * O_i) (= rowsum(dP_i * P_i)).
    delta = jnp.sum(o.astype(jnp.float32) * do.astype(jnp.float32), axis=1)
    _store_row_stat(delta_ref, q_start, delta, check_rows=ragged)


def _bwd_dkdv_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref, *,
                     sm_scale: float, causal: bool, block_q: int, block_k: int, head_dim: int):
    seq_len = q_ref.shape[0]
    k_start = pl.program_id(0) * block_k
    k_ragged = seq_len % block_k != 0
    # Rows past seq_len load q = dO = lse = D = 0, which makes their P^T dO and
    # dS^T Q terms exactly zero, so ragged query tiles need no score mask.
    q_ragged = seq_len % block_q != 0
    k = _load_tile(k_ref, k_start, block_k, head_dim=head_dim, check_rows=k_ragged)
    v = _load_tile(v_ref, k_start, block_k, head_dim=head_dim, check_rows=k_ragged)
    keys = k_start + jnp.arange(block_k)
    qk_scale = sm_scale * LOG2_E

    # Everything is computed transposed ([block_k, block_q]) so that each
    # product below is a plain or B-transposed dot, with no register transposes.
    def body(qb, carry, *, masked: bool):
        dk, dv = carry
        q_start = qb * block_q
        q = _load_tile(q_ref, q_start, block_q, head_dim=head_dim, check_rows=q_ragged)
        do = _load_tile(do_ref, q_start, block_q, head_dim=head_dim, check_rows=q_ragged)
        lse = _load_row_stat(lse_ref, q_start, block_q, check_rows=q_ragged) * LOG2_E
        delta = _load_row_stat(delta_ref, q_start, block_q, check_rows=q_ragged)
        # Recompute P from the saved log-sum-exp (Algorithm 2, lines 11-13):
        # no max/sum reductions are needed in the backward pass.
        p_t = jnp.exp2(_dot(k, q, trans_b=True) * qk_scale - lse[None, :])
        if masked:
            rows = q_start + jnp.arange(block_q)
            p_t = jnp.where(keys[:, None] <= rows[None, :], p_t, 0.0)
        dv = dv + _dot(p_t.astype(do.dtype), do)
        dp_t = _dot(v, do, trans_b=True)
        ds_t = p_t * (dp_t - delta[None, :])
        dk = dk + _dot(ds_t.astype(q.dtype), q)
        return dk, dv

    padded_dim = q_ref.shape[1]
    carry = (jnp.zeros((block_k, padded_dim), jnp.float32), jnp.zeros((block_k, padded_dim), jnp.float32))
    num_q_blocks = pl.cdiv(seq_len, block_q)
    if causal:
        # Query blocks entirely before this key block see none of it: skipped.
        # Blocks that straddle the diagonal are masked, the rest are not.
        start = lax.div(k_start, block_q)
        mid = jnp.minimum(lax.div(k_start + block_k + block_q - 1, block_q), num_q_blocks)
        carry = lax.fori_loop(start, mid, functools.partial(body, masked=True), carry)
    else:
        mid = 0
    dk, dv = lax.fori_loop(mid, num_q_blocks, functools.partial(body, masked=False), carry)
    # dS = P * (dP - D) is the gradient w.r.t. the *scaled* scores, so the
    # softmax scale is applied once here rather than per tile.
    _store_tile(dk_ref, k_start, dk * sm_scale, head_dim=head_dim, check_rows=k_ragged)
    _store_tile(dv_ref, k_start, dv, head_dim=head_dim, check_rows=k_ragged)


def _bwd_dq_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dq_ref, *,
                   sm_scale: float, causal: bool, block_q: int, block_k: int, head_dim: int):
    seq_len, padded_dim = q_ref.shape
    q_start = _query_block_order(pl.cdiv(seq_len, block_q), causal) * block_q
    q_ragged = seq_len % block_q != 0
    k_ragged = seq_len % block_k != 0
    q = _load_tile(q_ref, q_start, block_q, head_dim=head_dim, check_rows=q_ragged)
    do = _load_tile(do_ref, q_start, block_q, head_dim=head_dim, check_rows=q_ragged)
    lse = _load_row_stat(lse_ref, q_start, block_q, check_rows=q_ragged) * LOG2_E
    delta = _load_row_stat(delta_ref, q_start, block_q, check_rows=q_ragged)
    rows = q_start + jnp.arange(block_q)
    qk_scale = sm_scale * LOG2_E

    def body(kb, dq, *, masked: bool):
        k_start = kb * block_k
        k = _load_tile(k_ref, k_start, block_k, head_dim=head_dim, check_rows=masked and k_ragged)
        v = _load_tile(v_ref, k_start, block_k, head_dim=head_dim, check_rows=masked and k_ragged)
        p = jnp.exp2(_dot(q, k, trans_b=True) * qk_scale - lse[:, None])
        if masked:
            cols = k_start + jnp.arange(block_k)
            keep = cols[None, :] <= rows[:, None] if causal else cols[None, :] < seq_len
            # where() (not a multiply) so an overflowing exp2 on a masked key
            # cannot turn into inf * 0 = NaN.
            p = jnp.where(keep, p, 0.0)
        ds = p * (_dot(do, v, trans_b=True) - delta[:, None])
        return dq + _dot(ds.astype(k.dtype), k)

    mid, end = _key_block_ranges(q_start, seq_len, block_q, block_k, causal)
    dq = jnp.zeros((block_q, padded_dim), jnp.float32)
    dq = lax.fori_loop(0, mid, functools.partial(body, masked=False), dq)
    dq = lax.fori_loop(mid, end, functools.partial(body, masked=True), dq)
    _store_tile(dq_ref, q_start, dq * sm_scale, head_dim=head_dim, check_rows=q_ragged)


# ----------------------------------------------------------------------------
# Launchers for the Triton kernels.


def _slab_spec(seq_len: int, padded_dim: int) -> pl.BlockSpec:
    """One (batch, head) slab of a [batch, seq, heads, head_dim] array; the
    last dimension is padded to a power of two and masked inside the kernel."""
    return pl.BlockSpec((None, seq_len, None, padded_dim), lambda i, b, h: (b, 0, h, 0))


def _row_stat_spec(seq_len: int) -> pl.BlockSpec:
    """One (batch, head) row of a [batch, heads, seq] float32 statistic."""
    return pl.BlockSpec((None, None, seq_len), lambda i, b, h: (b, h, 0))


def triton_forward(q: jax.Array, k: jax.Array, v: jax.Array, *, causal: bool, sm_scale: float,
                   block_sizes: BlockSizes, interpret: bool) -> tuple[jax.Array, jax.Array]:
    """(o, lse): FlashAttention-2 Algorithm 1, one program per (query block, batch, head)."""
    batch, seq_len, heads, head_dim = q.shape
    padded_dim = _padded_head_dim(head_dim)
    blocks = block_sizes.fitted(seq_len, head_dim, q.dtype.itemsize, _shared_memory_budget(interpret))
    kernel = functools.partial(_fwd_kernel, sm_scale=sm_scale, causal=causal, block_q=blocks.block_q,
                               block_k=blocks.block_k, head_dim=head_dim)
    slab, row = _slab_spec(seq_len, padded_dim), _row_stat_spec(seq_len)
    return pl.pallas_call(
        kernel,
        grid=(pl.cdiv(seq_len, blocks.block_q), batch, heads),
        in_specs=[slab, slab, slab],
        out_specs=[slab, row],
        out_shape=[
            jax.ShapeDtypeStruct(q.shape, q.dtype),
            jax.ShapeDtypeStruct((batch, heads, seq_len), jnp.float32),
        ],
        compiler_params=plgpu.CompilerParams(num_warps=blocks.num_warps_fwd, num_stages=blocks.num_stages_fwd),
        interpret=interpret,
        name="flash_attention_fwd",
    )(q, k, v)


def triton_backward(q: jax.Array, k: jax.Array, v: jax.Array, o: jax.Array, lse: jax.Array,
                    do: jax.Array, *, causal: bool, sm_scale: float, block_sizes: BlockSizes,
                    interpret: bool) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(dq, dk, dv): FlashAttention-2 Algorithm 2 as three kernels (D, dK/dV, dQ)."""
    batch, seq_len, heads, head_dim = q.shape
    padded_dim = _padded_head_dim(head_dim)
    blocks = block_sizes.fitted(seq_len, head_dim, q.dtype.itemsize, _shared_memory_budget(interpret))
    slab, row = _slab_spec(seq_len, padded_dim), _row_stat_spec(seq_len)
    params = plgpu.CompilerParams(num_warps=blocks.num_warps_bwd, num_stages=blocks.num_stages_bwd)
    do = do.astype(q.dtype)

    preprocess_block = blocks.block_q
    delta = pl.pallas_call(
        functools.partial(_bwd_preprocess_kernel, block_q=preprocess_block, head_dim=head_dim),
        grid=(pl.cdiv(seq_len, preprocess_block), batch, heads),
        in_specs=[slab, slab],
        out_specs=row,
        out_shape=jax.ShapeDtypeStruct((batch, heads, seq_len), jnp.float32),
        compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=1),
        interpret=interpret,
        name="flash_attention_bwd_preprocess",
    )(o, do)

    common = dict(sm_scale=sm_scale, causal=causal, head_dim=head_dim)
    dk, dv = pl.pallas_call(
        functools.partial(_bwd_dkdv_kernel, block_q=blocks.block_q_dkv, block_k=blocks.block_k_dkv, **common),
        grid=(pl.cdiv(seq_len, blocks.block_k_dkv), batch, heads),
        in_specs=[slab, slab, slab, slab, row, row],
        out_specs=[slab, slab],
        out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
        compiler_params=params,
        interpret=interpret,
        name="flash_attention_bwd_dkdv",
    )(q, k, v, do, lse, delta)

    dq = pl.pallas_call(
        functools.partial(_bwd_dq_kernel, block_q=blocks.block_q_dq, block_k=blocks.block_k_dq, **common),
        grid=(pl.cdiv(seq_len, blocks.block_q_dq), batch, heads),
        in_specs=[slab, slab, slab, slab, row, row],
        out_specs=slab,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        compiler_params=params,
        interpret=interpret,
        name="flash_attention_bwd_dq",
    )(q, k, v, do, lse, delta)
    return dq, dk, dv
