"""The Hopper backward: dQ, dK, dV from the forward's o and lse (FA3 §3.3).

P is recomputed from the saved log-sum-exp (FA2 Algorithm 2). Two schedules:

- two kernels, dQ (one query tile per CTA, streaming K/V) and dK/dV (one key
  tile per CTA, streaming Q/dO/lse/delta), so no atomics: S and dP are
  computed twice per block pair (7 matmuls);
- one fused kernel (dK/dV's CTAs) that also multiplies dS by its keys and
  adds that share of dQ into a float32 buffer with TMA reduce-adds (FA3's
  backward, 5 matmuls). At head_dim 128 (`dq_split`) each consumer computes
  half of dQ's columns, each step issues dV before the dS^T exchange and dK
  over the dQ store, and `dq_lag` lets a step multiply the previous block's
  dS^T, with the consumers half a step apart.

Everything in the dK/dV kernels is computed transposed ([keys, queries]) so
that dK and dV come out of wgmma with the keys as rows. Padded rows have
q = k = v = dO = 0 and lse = delta = 0, so every term they contribute to a
real row's gradient is exactly zero: no tail masks.

The backward kernels launch without Pallas's automatic warpgroup barriers:
each thread arrives on the ring's release barriers itself (which releases its
own reads of lse and delta); commit_smem and wait_smem_to_gmem carry a
warpgroup barrier, which orders the dS^T and dQ tiles' stores before the TMA
and wgmma that read them; a consumer writes dS^T only once every thread of
both consumers has released its earlier use; and dK, dV (dQ in the dQ
kernel) overwrite operand tiles only after a wgmma issued later has
completed, which no warp can see before every warp issued it.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from pallas_kernels.hopper.pipeline import (
    LOG2_E,
    accumulate,
    along_cols,
    along_rows,
    check_blocks,
    drain,
    fit_stages,
    iota,
    kv_producer,
    launch,
    longest_first,
    pad_seq,
    pl,
    plgpu,
    producer_loop,
    query_tile_key_blocks,
    smem_transforms,
    tile_grid,
    unpad_seq,
    when,
    zeros_f32,
)
from pallas_kernels.hopper.tiles import (
    BLOCK_K_DKV,
    BLOCK_Q_DQ,
    LSE_EARLY_REGISTERS,
    NUM_STAGES_BWD,
    REGISTERS,
    MosaicBlockSizes,
    padded_length,
)


def scores_and_dp(issue, probabilities, shape, prefetch=None):
    """Runs `issue(s_ref, dp_ref)`, which issues the backward's two score
    products S and dP (wgmma, in this order), and returns
    (probabilities(S), dP): the exponentials are computed once S is done,
    while dP is still on the tensor cores. `prefetch()`, if given, runs right
    after the products are issued, so its shared-memory loads are in flight
    with them, and its result is passed to `probabilities` as a second
    argument."""
    zeros = zeros_f32(shape, plgpu.Layout.WGMMA)

    def body(refs):
        s_ref, dp_ref, p_ref = refs
        issue(s_ref, dp_ref)
        fetched = () if prefetch is None else (prefetch(),)
        p_ref[...] = probabilities(plgpu.wgmma_accumulator_load(s_ref, wait_n=1), *fetched)

    _, dp, p = pl.run_state(body)((plgpu.ACC.init(zeros), plgpu.ACC.init(zeros), zeros))
    return p, dp


def _dq_call(q, k, v, do, lse, delta, *, causal: bool, sm_scale: float, seq_len: int, blocks: MosaicBlockSizes):
    batch, padded_len, heads, head_dim = q.shape
    dtype = q.dtype
    bq, bk = BLOCK_Q_DQ, blocks.block_k_dq
    consumer_registers, producer_registers = REGISTERS[2]
    tile = 2 * bq
    num_tiles = padded_len // tile
    # Padded keys are zero, so their dS * K terms vanish: no tail mask needed,
    # and fully padded blocks are skipped.
    num_k_blocks = pl.cdiv(seq_len, bk)
    row = head_dim * dtype.itemsize
    stages = fit_stages("dQ", NUM_STAGES_BWD, num_k_blocks, 2 * bq * (2 * row + 8), 2 * bk * row)
    qk_scale = sm_scale * LOG2_E
    transforms = smem_transforms(head_dim, dtype.itemsize)

    def body(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dq_ref, q_smem, do_smem, lse_smem, delta_smem,
             k_smem, v_smem, row_ready, k_ready, v_ready, k_free, v_free):
        b, h, wg = lax.axis_index("batch"), lax.axis_index("heads"), lax.axis_index("wg")
        t = longest_first(lax.axis_index("tiles"), num_tiles, causal)
        tile_start, n_blocks, n_free = query_tile_key_blocks(t, tile, bk, num_k_blocks, causal,
                                                              unmasked=num_k_blocks)

        @pl.when(wg == 2)
        def _producer():
            plgpu.set_max_registers(producer_registers, action="decrease")
            n = kv_producer(k_ref, v_ref, k_smem, v_smem, k_ready, v_ready, k_free, v_free, b=b, h=h,
                             block_k=bk, n_blocks=n_blocks, num_stages=stages)
            drain(n, stages, (k_free, v_free))

        @pl.when(wg < 2)
        def _consumer():
            plgpu.set_max_registers(consumer_registers, action="increase")
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
                    p = jnp.exp2(s * qk_scale - along_rows(lse2, s.shape))
                    if masked:
                        keep = j * bk + iota((bq, bk), 1) <= row0 + iota((bq, bk), 0)
                        # where(), not a multiply: a masked exp2 may overflow to inf.
                        p = jnp.where(keep, p, 0.0)
                    return p

                p, dp = scores_and_dp(products, probabilities, (bq, bk))
                plgpu.barrier_arrive(v_free.at[slot])
                ds = (p * (dp - along_rows(delta, dp.shape))).astype(dtype)
                dq = accumulate(lambda refs: plgpu.wgmma(refs[0], ds, k_smem.at[slot]), dq)
                plgpu.barrier_arrive(k_free.at[slot])
                return dq

            dq = zeros_f32((bq, head_dim), plgpu.Layout.WGMMA)
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
    return launch(body, out_type, scratch, name="flash_attention_mgpu_bwd_dq", auto_barriers=False,
                  **tile_grid(heads, num_tiles, batch))(q, k, v, do, lse, delta)


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
    bk, bq = BLOCK_K_DKV, blocks.block_q_dkv
    consumer_registers, producer_registers = LSE_EARLY_REGISTERS if blocks.lse_early else REGISTERS[2]
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
    transforms = smem_transforms(head_dim, dtype.itemsize)
    row = head_dim * dtype.itemsize
    # Fused: both consumers' dS^T, double-buffered (operands of the dQ
    # product), and a float32 dQ tile per consumer (source of the reduce-add)
    # also live in shared memory. With dq_lag two buffers still suffice: a
    # consumer stores block i's tile once both consumers' dQ products of
    # block i - 2 are done, which with the stagger they finished a step earlier.
    lag = split and blocks.dq_lag
    ds_bufs = 2
    fixed = 4 * bk * row + (2 * ds_bufs * bk * bq * dtype.itemsize + 2 * bq * dq_cols * 4 if fused else 0)
    # The diagonal block's mask as a shared-memory tile per consumer.
    mask_tile = blocks.mask_tile and causal and bk == bq
    fixed += 2 * bk * bq * dtype.itemsize if mask_tile else 0
    stages = fit_stages("fused backward" if fused else "dK/dV", NUM_STAGES_BWD, num_q_blocks, fixed,
                         bq * (2 * row + 8))

    def body(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, *refs):
        if fused:
            dq_ref, *refs = refs
        (dk_ref, dv_ref, k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem,
         kv_ready, q_ready, do_ready, q_free, do_free, *extra_scratch) = refs
        n_fused = (5 if lag else 4) if fused else 0
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
            plgpu.set_max_registers(producer_registers, action="decrease")

            def issue(step, slot, wait):
                blk = first + step
                rows = pl.ds(blk * bq, bq)
                when(wait, lambda: plgpu.barrier_wait(q_free.at[slot]))
                plgpu.copy_gmem_to_smem(q_ref.at[b, rows, h], q_smem.at[slot], q_ready.at[slot])
                plgpu.copy_gmem_to_smem(lse_ref.at[b, h, rows], lse_smem.at[slot], q_ready.at[slot])
                when(wait, lambda: plgpu.barrier_wait(do_free.at[slot]))
                plgpu.copy_gmem_to_smem(do_ref.at[b, rows, h], do_smem.at[slot], do_ready.at[slot])
                plgpu.copy_gmem_to_smem(delta_ref.at[b, h, rows], delta_smem.at[slot], do_ready.at[slot])

            drain(producer_loop(n_steps, stages, issue), stages, (q_free, do_free))

        @pl.when(wg < 2)
        def _consumer():
            plgpu.set_max_registers(consumer_registers, action="increase")
            key0 = tile_start + wg * bk
            keys = pl.ds(key0, bk)
            ready = kv_ready.at[wg]
            plgpu.copy_gmem_to_smem(k_ref.at[b, keys, h], k_smem.at[wg], ready)
            plgpu.copy_gmem_to_smem(v_ref.at[b, keys, h], v_smem.at[wg], ready)
            plgpu.barrier_wait(ready)
            if mask_tile:
                # The block on the diagonal (query block start == key0):
                # keys [rows] see queries [cols] at or after them.
                zeros = zeros_f32((bk, bq), plgpu.Layout.WGMMA)
                on_or_after = iota((bk, bq), 0) <= iota((bk, bq), 1)
                tri_smem.at[wg][...] = jnp.where(on_or_after, zeros, zeros - jnp.inf).astype(dtype)
                plgpu.commit_smem()

            if fused:
                ds_smem, dq_smem, ds_ready, ds_free, *stagger_bar = fused_scratch
                if lag:
                    # Consumer 1 starts once consumer 0's first S and dP
                    # are done, so one computes its exponentials while the
                    # other has the tensor cores.
                    when((wg == 1) & (n_steps > 0), lambda: plgpu.barrier_wait(stagger_bar[0].at[0]))

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
                        when(wg == half, functools.partial(dq_product, acc, buf, pl.ds(half * dq_cols, dq_cols)))
                else:
                    when(reader, functools.partial(dq_product, acc, buf))

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
                with dq_lag so that the loop needs no branch
                for what only the first step does."""
                dk, dv, *dq_prev = carry  # fused: dQ of the previous block, if this consumer owned it
                slot = lax.rem(i - first, stages)
                plgpu.barrier_wait(q_ready.at[slot])
                plgpu.barrier_wait(do_ready.at[slot])

                def products(s_ref, dp_ref):
                    plgpu.wgmma(s_ref, k_smem.at[wg], q_smem.at[slot].transpose((1, 0)))
                    plgpu.wgmma(dp_ref, v_smem.at[wg], do_smem.at[slot].transpose((1, 0)))
                    if fused and not split:
                        when((i > first) & (lax.rem(i - 1, 2) == wg), lambda: add_dq(dq_prev[0], i - 1))

                def mask(p_t):
                    keep = key0 + iota((bk, bq), 0) <= i * bq + iota((bk, bq), 1)
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
                        return jnp.exp2(masked_scores(s_t * qk_scale - along_cols(lse2, s_t.shape)))
                    p_t = jnp.exp2(s_t * qk_scale - along_cols(lse2, s_t.shape))
                    if masked is None:  # one loop: only the blocks that cross the diagonal take the branch
                        p_t = lax.cond(i < n_masked_end, mask, lambda x: x, p_t)
                    elif masked:
                        p_t = mask(p_t)
                    return p_t

                p_t, dp_t = scores_and_dp(products, probabilities, (bk, bq),
                                          prefetch=load_lse if blocks.lse_early else None)
                if lag and peeled:
                    when(wg == 0, lambda: plgpu.barrier_arrive(stagger_bar[0].at[0]))
                delta = plgpu.load(delta_smem.at[slot], (), layout=plgpu.Layout.WGMMA.reduce(0))

                def grad_scores():
                    return (p_t * (dp_t - along_cols(delta, dp_t.shape))).astype(dtype)

                def exchange(ds_t, buf, reader):
                    """Puts this consumer's dS^T of the block in shared memory
                    and, if it reads them in this step (not with dq_lag,
                    which reads them in the next), waits for the other one's."""
                    # The other consumer read this buffer ds_bufs blocks ago:
                    # wait until its dQ product is done with it.
                    reused = i - first >= ds_bufs
                    when(reused if split else (~reader) & reused, lambda: plgpu.barrier_wait(ds_free.at[buf]))
                    ds_smem.at[buf, wg][...] = ds_t
                    plgpu.commit_smem()
                    plgpu.barrier_arrive(ds_ready.at[buf])
                    if not lag:
                        when(reader, lambda: plgpu.barrier_wait(ds_ready.at[buf]))

                def buffer():
                    """The block's dS^T buffer, and whether this consumer
                    multiplies its tiles: the owner, or both with dq_split."""
                    buf = lax.rem(i, ds_bufs)
                    return buf, True if split else buf == wg

                if split:
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
                        tuple(plgpu.ACC.init(x) for x in (dv, dk, zeros_f32((bq, dq_cols), plgpu.Layout.WGMMA))))
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
                    # carries it into the next step, which adds it to dq_acc.
                    dq = [zeros_f32((bq, dq_cols), plgpu.Layout.WGMMA)] if fused else []
                    dv, dk, *dq = accumulate(grads, dv, dk, *dq)
                    if fused:
                        when(reader, lambda: plgpu.barrier_arrive(ds_free.at[buf]))
                # lse/delta were read with ordinary loads (generic proxy); the
                # next TMA into this slot writes through the async proxy, so
                # fence the two before releasing the slot.
                plgpu.commit_smem()
                plgpu.barrier_arrive(q_free.at[slot])
                plgpu.barrier_arrive(do_free.at[slot])
                return dk, dv, *dq

            carried_dq = [(bq, head_dim)] if fused and not split else []
            shapes = ((bk, head_dim), (bk, head_dim), *carried_dq)
            carry = tuple(zeros_f32(shape, plgpu.Layout.WGMMA) for shape in shapes)
            # Causal: the blocks that cross the diagonal run in a loop of their
            # own, masked, before the rest; with dq_split in one loop, the mask
            # under a branch that only those blocks take (two loops hold two
            # sets of loop invariants, which spilled there).
            masked_loop = causal and not split
            first_masked = True if masked_loop else (None if causal else False)
            if lag:
                # A padded tile past the sequence has no step.
                carry = lax.cond(n_steps > 0, functools.partial(step, first, masked=first_masked, peeled=True),
                                 lambda c: c, carry)
                first_step = first + 1
            else:
                first_step = first
            if masked_loop:
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

                    dq_last = accumulate(lambda refs: my_dq_product(refs[0], last_buf, True),
                                          zeros_f32((bq, dq_cols), plgpu.Layout.WGMMA))
                    plgpu.barrier_arrive(ds_free.at[last_buf])
                    add_dq(dq_last, num_q_blocks - 1)

                when(n_steps > 0, last_dq)
            if fused:
                # The last block's dQ, if carried (zeros if the tile saw no block).
                last_owner = lax.rem(num_q_blocks - 1, 2) == wg
                if not split:
                    when(last_owner, lambda: add_dq(dq[0], num_q_blocks - 1))
                # dK overwrites this consumer's keys, which the other
                # consumer (the last block's owner, or either with dq_split)
                # multiplies in its dQ product: wait for that to finish.
                readers_left = n_steps > 0 if split else (~last_owner) & (n_steps > 0)
                when(readers_left, lambda: plgpu.barrier_wait(ds_free.at[last_buf]))
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
            plgpu.SMEM((2, bq, dq_cols), jnp.float32, transforms=smem_transforms(dq_cols, 4)),
            plgpu.Barrier(num_arrivals=2, num_barriers=ds_bufs),
            plgpu.Barrier(num_arrivals=2 if split else 1, num_barriers=ds_bufs),
        ) + ((plgpu.Barrier(num_arrivals=1, num_barriers=1),) if lag else ())
    if mask_tile:
        scratch += (plgpu.SMEM((2, bk, bq), dtype, transforms=transforms),)
    grad = jax.ShapeDtypeStruct(k.shape, dtype)
    name = "flash_attention_mgpu_bwd_fused" if fused else "flash_attention_mgpu_bwd_dkdv"
    call = launch(body, (grad, grad), scratch, name=name, auto_barriers=False, mutable=fused,
                  **tile_grid(heads, num_tiles, batch))
    return call(q, k, v, do, lse, delta, *((dq_acc,) if fused else ()))


def mosaic_backward(q, k, v, o, lse, do, *, causal: bool, sm_scale: float, block_sizes: MosaicBlockSizes,
                    interpret: bool = False) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(dq, dk, dv) like the portable backward."""
    del interpret
    blocks = check_blocks(block_sizes)
    seq_len = q.shape[1]
    do = do.astype(q.dtype)
    # D = rowsum(dO * O) (FA2 Algorithm 2, line 4): a memory-bound reduction
    # that XLA fuses into one pass; float32 like the statistics it meets.
    delta = jnp.einsum("bshd,bshd->bhs", o.astype(jnp.float32), do.astype(jnp.float32))
    padded_len = padded_length(seq_len)
    q, k, v, do = (pad_seq(x, padded_len, 1) for x in (q, k, v, do))
    lse, delta = (pad_seq(x, padded_len, 2) for x in (lse, delta))
    kwargs = dict(causal=causal, sm_scale=sm_scale, seq_len=seq_len, blocks=blocks)
    if blocks.fused_bwd:
        dq_acc = jax.new_ref(jnp.zeros(q.shape, jnp.float32))
        dk, dv = _dkdv_call(q, k, v, do, lse, delta, dq_acc=dq_acc, **kwargs)
        dq = (dq_acc[...] * sm_scale).astype(q.dtype)
    else:
        dq = _dq_call(q, k, v, do, lse, delta, **kwargs)
        dk, dv = _dkdv_call(q, k, v, do, lse, delta, **kwargs)
    return tuple(unpad_seq(x, seq_len, 1) for x in (dq, dk, dv))
