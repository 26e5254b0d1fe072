"""The Hopper forward: o and lse for one (q, k, v), FA3 Algorithm 1.

One CTA per SM (a persistent grid) walks its row of a static schedule of
query tiles: a few heads at a time, so their K/V stays in L2, causal tiles
longest first within them, balanced by list scheduling. Each tile is
`consumers` x BLOCK_Q query rows; the producer streams BLOCK_K-key blocks of
K and V into a ring that runs on across tiles, and the next tile's q loads
while the current one computes. The consumers either take turns on the
tensor cores (FA3 §3.1 ping-pong, as a round robin) or each overlap their
softmax with the previous block's P V (FA3 §3.2). With `kv_multicast` (not
causal), CTAs run in clusters of two on two tiles of one head, and each
producer loads half of every K/V block into both CTAs' rings (FA3's TMA
multicast).

Scores live in base 2 with the softmax scale and log2(e) folded into one
multiply; causal loops are split into an unmasked and a masked part.
"""

from __future__ import annotations

import functools
import heapq

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from pallas_kernels.hopper.pipeline import (
    CLUSTER,
    LN_2,
    LOG2_E,
    accumulate,
    along_rows,
    check_blocks,
    consumer_key_blocks,
    drain,
    fit_stages,
    iota,
    kv_producer,
    launch,
    num_sms,
    pad_seq,
    pl,
    plgpu,
    query_tile_key_blocks,
    smem_transforms,
    unpad_seq,
    when,
    zeros_f32,
)
from pallas_kernels.hopper.tiles import BLOCK_K, BLOCK_Q, REGISTERS, MosaicBlockSizes, padded_length

# Bytes of streamed K/V that the programs of a persistent grid running at once
# should share: a fraction of the 50 MiB L2 of an H100, leaving room for the
# queries and outputs passing through it.
_L2_WORKING_SET = 16 * 2**20


def head_group(n_heads: int, bytes_per_head: int) -> int:
    """The largest divisor of n_heads (batch x heads) whose heads' streamed
    blocks fit in _L2_WORKING_SET, at least 1."""
    limit = max(1, _L2_WORKING_SET // bytes_per_head)
    return max(d for d in range(1, min(n_heads, limit) + 1) if n_heads % d == 0)


def work_order(n_heads: int, num_tiles: int, *, group: int, causal: bool) -> np.ndarray:
    """The persistent forward's work items, bh * num_tiles + tile for each
    (batch x head bh, query tile), in the order they are handed out: groups
    of `group` heads, each group's tiles by rank (longest first when causal)
    with its heads innermost. Programs running at once then stream the K/V
    of about `group` heads, which stay in L2."""
    bh = np.arange(n_heads).reshape(n_heads // group, 1, group)
    rank = np.arange(num_tiles).reshape(1, num_tiles, 1)
    tile = num_tiles - 1 - rank if causal else rank
    return (bh * num_tiles + tile).reshape(-1)


def list_schedule(costs, n_programs: int) -> np.ndarray:
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


def forward_schedule(batch: int, heads: int, num_tiles: int, n_programs: int, *, causal: bool, key_blocks,
                     bytes_per_head: int, group_heads: bool = True) -> np.ndarray:
    """The persistent forward's schedule: list_schedule's table with each
    item replaced by its work code (bh * num_tiles + tile, work_order).
    `key_blocks(t)`: query tile t's work in key blocks (tile_cost);
    a tile is estimated to cost that plus one (its q load, pipeline fill and
    store)."""
    group = head_group(batch * heads, bytes_per_head) if group_heads else 1
    order = work_order(batch * heads, num_tiles, group=group, causal=causal)
    table = list_schedule([key_blocks(int(code) % num_tiles) + 1 for code in order], n_programs)
    table[:, 1:] = order[table[:, 1:]]
    return table


def tile_cost(t: int, *, tile: int, block_k: int, num_k_blocks: int, padded_len: int, causal: bool,
              idle_past_end: bool) -> float:
    """The schedule's estimate of query tile t's work, in key blocks: those
    it visits (query_tile_key_blocks' count, on Python ints), scaled by the
    share of its consumers that compute when those past the end idle. A
    half diagonal block counts as a whole one (a finer estimate measured
    the same)."""
    n = min(-(-(t + 1) * tile // block_k), num_k_blocks) if causal else num_k_blocks
    if idle_past_end:
        n *= min(tile, padded_len - t * tile) / tile  # whole consumers: padded_len is a multiple of block_q
    return n


def _forward_call(q, k, v, *, causal: bool, sm_scale: float, seq_len: int, blocks: MosaicBlockSizes):
    batch, padded_len, heads, head_dim = q.shape
    dtype = q.dtype
    bq, bk, n_wg = BLOCK_Q, BLOCK_K, blocks.consumers
    consumer_registers, producer_registers = REGISTERS[n_wg]
    tile = n_wg * bq
    # The last tile may reach past the sequence (192-row tiles over 1024 rows):
    # its consumers that would start past the end take the last block_q rows
    # instead (their q loads stay in bounds) and every consumer still runs the
    # shared K/V loop; they idle or recompute those rows (idle_past_end).
    num_tiles = pl.cdiv(padded_len, tile)
    # Key blocks holding at least one real key; fully padded blocks are skipped.
    num_k_blocks = pl.cdiv(seq_len, bk)
    row = head_dim * dtype.itemsize
    # Where the consumers do not divide the sequence (three consumers' 192-row
    # tiles over 1024 rows), a consumer whose rows of the last tile start past
    # the end walks the ring without computing or storing.
    idle_past_end = padded_len % tile != 0
    # Causal, with turns: a consumer whose rows all lie in the first half of
    # their diagonal key block (row0 % bk + bq <= bk / 2) runs that block on
    # its first half only; the second half is masked for every one of its rows.
    half_diagonal = causal and not blocks.overlap
    # kv_multicast: CTAs run in clusters of two, on query tiles 2p and 2p + 1
    # of one head, which stream the same key blocks (not causal); the
    # schedule's items are then such pairs, one per cluster.
    cluster = 2 if blocks.as_run(seq_len, causal).kv_multicast else 1
    pairs = num_tiles // cluster
    # One program (cluster) per SM walks its row of a static schedule (a few
    # heads at a time, balanced by list scheduling), with two query/output
    # buffers so the next tile's q loads while this one computes, and one K/V
    # ring across tiles.
    n_programs = min(pairs * batch * heads, num_sms() // cluster)

    def key_blocks(p):
        return max(tile_cost(cluster * p + c, tile=tile, block_k=bk, num_k_blocks=num_k_blocks,
                             padded_len=padded_len, causal=causal, idle_past_end=idle_past_end)
                   for c in range(cluster))

    schedule = jnp.asarray(forward_schedule(batch, heads, pairs, n_programs, causal=causal,
                                            key_blocks=key_blocks, bytes_per_head=2 * padded_len * row,
                                            group_heads=blocks.group_heads))
    stages = fit_stages("forward", blocks.num_stages, num_k_blocks, 2 * n_wg * bq * (row + 4), 2 * bk * row)
    qk_scale = sm_scale * LOG2_E
    transforms = smem_transforms(head_dim, dtype.itemsize)
    overlap = blocks.overlap
    pingpong = not overlap
    # fwd_stagger: consumer c > 0 waits once, for c - 1's first scores (on
    # the turn barriers, which the overlapped schedule leaves unused).
    stagger = blocks.fwd_stagger
    # Block 0 of the overlapped schedule runs alone, masked wherever any block may need it.
    first_masked = causal or seq_len % bk != 0

    def body(q_ref, k_ref, v_ref, schedule_ref, o_ref, lse_ref, q_smem, k_smem, v_smem, lse_smem, q_ready, k_ready,
             v_ready, k_free, v_free, turn):
        wg = lax.axis_index("wg")
        program = lax.axis_index("programs")
        member = lax.axis_index(CLUSTER) if cluster > 1 else 0
        n_items = schedule_ref[program, 0]

        def coords(i):
            code = schedule_ref[program, 1 + i]
            bh = lax.div(code, pairs)
            return lax.div(bh, heads), lax.rem(bh, heads), lax.rem(code, pairs) * cluster + member

        def tile_blocks(t):
            # Only a ragged tail key block needs a mask when not causal.
            return query_tile_key_blocks(t, tile, bk, num_k_blocks, causal, unmasked=seq_len // bk)

        def for_each_tile(fn, init):
            """fn(i, ring steps so far) -> ring steps after tile i, over this program's tiles."""
            return lax.fori_loop(0, n_items, fn, init)

        @pl.when(wg == n_wg)
        def _producer():
            plgpu.set_max_registers(producer_registers, action="decrease")

            def produce(i, steps):
                b, h, t = coords(i)
                return kv_producer(k_ref, v_ref, k_smem, v_smem, k_ready, v_ready, k_free, v_free, b=b, h=h,
                                    block_k=bk, n_blocks=tile_blocks(t)[1], num_stages=stages, start=steps,
                                    multicast=cluster > 1)

            drain(for_each_tile(produce, 0), stages, (k_free, v_free))

        @pl.when(wg < n_wg)
        def _consumer():
            plgpu.set_max_registers(consumer_registers, action="increase")

            # Ping-pong (FA3 §3.1) as a round robin: a consumer takes its turn
            # before it issues its matmuls and hands it to the next consumer
            # once they are issued, so while one runs its matmuls the others
            # run their softmax. One token circulates: turn[i] is
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
                buf = lax.rem(i, 2)

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
                    cols = j * bk + iota((bq, keys), 1)
                    return cols <= row0 + iota((bq, keys), 0) if causal else cols < seq_len

                def softmax_update(s, m, l, j, masked: bool):
                    if masked:
                        s = jnp.where(keep(j, s.shape[1]), s, -jnp.inf)
                    # m is kept in scaled base-2 units: p = exp2(s * c - m) is one
                    # FMA and one MUFU op per score (FA3 §3.3 / FA2 §3.1.1).
                    m_new = jnp.maximum(m, s.max(axis=1) * qk_scale)
                    alpha = jnp.exp2(m - m_new)
                    p = jnp.exp2(s * qk_scale - along_rows(m_new, s.shape))
                    return m_new, alpha, l * alpha + p.sum(axis=1), p

                def step(j, carry, *, masked: bool, keys: int = bk):
                    """One key block with turns; with keys < bk only its first
                    `keys` keys (the rest are masked for every row: half_diagonal)."""
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
                    acc = acc * along_rows(alpha, acc.shape)
                    p = p.astype(dtype)
                    plgpu.barrier_wait(v_ready.at[slot])
                    take_turn()
                    acc = accumulate(lambda refs: plgpu.wgmma(refs[0], p, v_block), acc)
                    plgpu.barrier_arrive(v_free.at[slot])
                    return acc, m_new, l

                def overlapped_step(j, carry, *, masked: bool):
                    # Enters with P of block j-1 (not yet multiplied by V) and
                    # acc rescaled to its running max. Issues S_j = Q K_j^T and
                    # then P_{j-1} V_{j-1}, waits only for S_j, and runs the
                    # softmax of block j while P_{j-1} V_{j-1} is in flight
                    # (FA3 §3.2). acc is rescaled once that is done.
                    acc, m, l, p_prev = carry
                    slot, prev = ring(j), ring(j - 1)
                    plgpu.barrier_wait(k_ready.at[slot])
                    plgpu.barrier_wait(v_ready.at[prev])

                    def products(refs):
                        acc_ref, s_ref, m_ref, l_ref, alpha_ref, p_ref = refs
                        plgpu.wgmma(s_ref, q_tile, k_smem.at[slot].transpose((1, 0)))
                        plgpu.wgmma(acc_ref, p_prev, v_smem.at[prev])
                        s = plgpu.wgmma_accumulator_load(s_ref, wait_n=1)  # S_j done, P V may still run
                        plgpu.barrier_arrive(k_free.at[slot])
                        m_ref[...], alpha_ref[...], l_ref[...], p_ref[...] = softmax_update(
                            s, m_ref[...], l_ref[...], j, masked)

                    s0 = zeros_f32((bq, bk), plgpu.Layout.WGMMA)
                    acc, _, m, l, alpha, p = pl.run_state(products)(
                        (plgpu.ACC.init(acc), plgpu.ACC.init(s0), m, l, m, s0))
                    # P_{j-1} V_{j-1} has completed here. The barrier keeps the
                    # conversion of P_j, whose registers may be those P_{j-1}
                    # was read from, after that wait: if it came before, ptxas
                    # would serialize every wgmma of the kernel (C7513).
                    acc, p = lax.optimization_barrier((acc, p))
                    plgpu.barrier_arrive(v_free.at[prev])
                    return acc * along_rows(alpha, acc.shape), m, l, p.astype(dtype)

                def store(acc, m, l):
                    # Every row (padded ones too: their q is zero) saw at least
                    # key 0, so l > 0 and both outputs are finite. The output
                    # goes out through q's buffer (q is no longer needed).
                    o = acc * along_rows(1.0 / l, acc.shape)
                    q_tile[...] = o.astype(dtype)
                    lse_tile[...] = m * LN_2 + jnp.log(l)
                    plgpu.commit_smem()
                    plgpu.copy_smem_to_gmem(q_tile, o_ref.at[b, pl.ds(row0, bq), h], commit_group=False)
                    plgpu.copy_smem_to_gmem(lse_tile, lse_ref.at[b, h, pl.ds(row0, bq)], commit_group=False)
                    plgpu.commit_smem_to_gmem_group()

                acc0 = zeros_f32((bq, head_dim), plgpu.Layout.WGMMA)
                m0 = plgpu.layout_cast(jnp.full((bq,), -jnp.inf, jnp.float32), plgpu.Layout.WGMMA.reduce(1))
                l0 = zeros_f32((bq,), plgpu.Layout.WGMMA.reduce(1))
                # Causal: the tile's key blocks run up to its last row's
                # diagonal; this consumer's own rows need fewer (my_end) and
                # fewer masks (my_free). It computes those, stores its
                # output, then walks the rest of the ring without computing:
                # it still observes every barrier phase and takes its turns,
                # so the others' hand-offs stay paired: n_blocks + 1 turns
                # per tile.
                my_free, my_end = consumer_key_blocks(row0, bq, bk, n_free, n_blocks, causal)
                if idle_past_end:
                    my_end = jnp.where(past_end(i), 0, my_end)
                    my_free = jnp.minimum(my_free, my_end)
                if overlap:
                    # Block 0's scores and softmax start the pipeline; the
                    # last block's P V ends it.
                    first = ring(0)
                    if stagger:
                        # Consumer c > 0 starts once consumer c - 1's first scores are done.
                        when(jnp.logical_and(wg > 0, i == 0), lambda: plgpu.barrier_wait(turn.at[wg]))
                    plgpu.barrier_wait(k_ready.at[first])

                    def first_scores(ref):
                        plgpu.wgmma(ref, q_tile, k_smem.at[first].transpose((1, 0)))
                        return ref[...]

                    s = pl.run_scoped(first_scores, plgpu.ACC((bq, bk), jnp.float32))
                    plgpu.barrier_arrive(k_free.at[first])
                    if stagger:
                        when(jnp.logical_and(wg + 1 < n_wg, i == 0), lambda: plgpu.barrier_arrive(turn.at[wg + 1]))
                    m, _, l, p = softmax_update(s, m0, l0, 0, first_masked)
                    carry = (acc0, m, l, p.astype(dtype))
                    carry = lax.fori_loop(1, my_free, functools.partial(overlapped_step, masked=False), carry)
                    acc, m, l, p = lax.fori_loop(jnp.maximum(my_free, 1), my_end,
                                                 functools.partial(overlapped_step, masked=True), carry)
                    last = ring(my_end - 1)
                    plgpu.barrier_wait(v_ready.at[last])
                    acc = accumulate(lambda refs: plgpu.wgmma(refs[0], p, v_smem.at[last]), acc)
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
                    when(jnp.logical_not(past_end(i)), lambda: store(acc, m, l))
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
                when(wg == n_wg - 1, lambda: plgpu.barrier_arrive(turn.at[0]))
            load_q(0, 0)
            for_each_tile(run_tile, 0)
            # The stores must have read shared memory before the CTA exits
            # (their writes to global memory complete on their own).
            plgpu.wait_smem_to_gmem(0, wait_read_only=True)

    # A slot is refilled once every consumer that reads it has released it:
    # with multicast, the consumers of both CTAs of the cluster.
    free = (plgpu.ClusterBarrier(collective_axes=(CLUSTER,), num_arrivals=n_wg, num_barriers=stages)
            if cluster > 1 else plgpu.Barrier(num_arrivals=n_wg, num_barriers=stages))
    scratch = (
        plgpu.SMEM((2 * n_wg, bq, head_dim), dtype, transforms=transforms),
        plgpu.SMEM((stages, bk, head_dim), dtype, transforms=transforms),
        plgpu.SMEM((stages, bk, head_dim), dtype, transforms=transforms),
        plgpu.SMEM((2 * n_wg, bq), jnp.float32),
        plgpu.Barrier(num_barriers=2 * n_wg),
        plgpu.Barrier(num_barriers=stages),
        plgpu.Barrier(num_barriers=stages),
        *[free] * 2,
        plgpu.Barrier(num_barriers=n_wg),
    )
    out_type = (jax.ShapeDtypeStruct(q.shape, dtype), jax.ShapeDtypeStruct((batch, heads, padded_len), jnp.float32))
    # The forward keeps Pallas's automatic warpgroup barriers (see launch).
    return launch(body, out_type, scratch, (n_programs,), "flash_attention_mgpu_fwd", auto_barriers=True,
                  consumers=n_wg, grid_names=("programs",), cluster=cluster)(q, k, v, schedule)


def mosaic_forward(q, k, v, *, causal: bool, sm_scale: float, block_sizes: MosaicBlockSizes,
                   interpret: bool = False) -> tuple[jax.Array, jax.Array]:
    """(o, lse) like the portable forward. Sequences that are not a multiple of
    SEQ_MULTIPLE are zero-padded (one copy) and the padded keys masked; o and
    lse are sliced back."""
    del interpret  # rejected by the dispatcher before we get here
    blocks = check_blocks(block_sizes)
    seq_len = q.shape[1]
    padded_len = padded_length(seq_len)
    q, k, v = (pad_seq(x, padded_len, 1) for x in (q, k, v))
    o, lse = _forward_call(q, k, v, causal=causal, sm_scale=sm_scale, seq_len=seq_len, blocks=blocks)
    return unpad_seq(o, seq_len, 1), unpad_seq(lse, seq_len, 2)
