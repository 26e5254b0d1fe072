"""SwiGLU's elementwise work inside the epilogues of its GEMMs, for Hopper GPUs.

The FFN y = (silu(x W1^T) * (x W3^T)) W2^T leaves XLA two elementwise passes over
[tokens, d_ff] arrays: the forward reads h1 = x W1^T and h3 = x W3^T to write the gate
g = silu(h1) * h3, and the backward reads dg = dy W2, h1 and h3 to write dh1 and dh3. Here
each pass rides on the GEMM before it, while the tile is still in registers:

- `gate_up(x, w1, w3)` -> (h1, h3, g): both up-projections in one kernel, two accumulators
  per consumer, g computed from them in the epilogue. h1 and h3 are written for the
  backward, as the remat policy of the plain model keeps them.
- `gate_down(dy, w2, h1, h3)` -> (dh1, dh3, g): dg = dy W2 with the gate's backward in the
  epilogue, whose h1 and h3 tiles are fetched by TMA while the K loop runs; g is
  recomputed there for W2's gradient, so the backward keeps no g of its own.

Both are persistent GEMMs: one program per SM walks output tiles (d_ff fastest, so the
programs running at once share x's rows through L2), a producer warpgroup streams the
K blocks of x and the weights into a ring, and two consumer warpgroups each own 64 rows
of the 128-row tile. The epilogue's stores go out by TMA while the next tile's K loop
runs. The references are `pallas_kernels.swiglu.gate_up_reference` and
`gate_down_reference`.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax

from pallas_kernels.hopper.pipeline import (
    LOG2_E,
    accumulate,
    drain,
    launch,
    pl,
    plgpu,
    producer_loop,
    smem_transforms,
    zeros_f32,
)
from pallas_kernels.hopper.tiles import REGISTERS

CONSUMERS = 2
EPI_ROWS = 64  # rows of a tile's epilogue at a time (its buffers' height)


@dataclasses.dataclass(frozen=True)
class GemmTiles:
    """rows: of a tile per consumer warpgroup; tile_n: columns of a tile (per B operand);
    stages: K blocks in the ring; bufs: epilogue buffers per consumer; tile_k: the K block
    (each consumer waits for its products once per block, or with in_flight for the previous
    block's once this one's are issued, releasing that block's ring slot then)."""

    rows: int = 64
    tile_n: int = 128
    stages: int = 3
    bufs: int = 2
    tile_k: int = 64
    in_flight: bool = False  # a K block's products stay in flight while the next block's are issued
    pingpong: bool = False  # each consumer owns whole tiles (`rows` high), alternating with the other
    joint: bool = False  # the Bs ([N, K]) share one accumulator, tile_n // len(bs) columns each


UP_TILES = GemmTiles()
DOWN_TILES = GemmTiles(stages=4)
TILE_M = max(t.rows for t in (UP_TILES, DOWN_TILES)) * CONSUMERS
TILE_N = max(t.tile_n for t in (UP_TILES, DOWN_TILES))
TILE_K = max(t.tile_k for t in (UP_TILES, DOWN_TILES))
CONSUMER_REGISTERS, PRODUCER_REGISTERS = REGISTERS[CONSUMERS]


def shape_reason(tokens: int, d_model: int, d_ff: int) -> str | None:
    """Why the kernels cannot take these sizes, or None."""
    for name, size, multiple in (("tokens", tokens, TILE_M), ("d_ff", d_ff, TILE_N), ("d_model", d_model, TILE_K)):
        if size % multiple:
            return f"{name}={size} is not a multiple of {multiple}"
    return None


def _num_sms() -> int:
    count = getattr(jax.devices()[0], "core_count", None)
    return int(count) if count else 132


def _sigmoid(a: jax.Array) -> jax.Array:
    return 1.0 / (1.0 + jnp.exp2(a * -LOG2_E))


def _gemm_call(a, bs, *, transpose_b: bool, n_out: int, epilogue, epi_inputs=(), name: str, tiles: GemmTiles):
    """Persistent GEMM of a [M, K] against each B in `bs` ([N, K] if transpose_b, else
    [K, N]), one float32 accumulator per B. `epilogue(accs, io)` stores a tile's outputs,
    EPI_ROWS rows at a time (`io`: the tile's place, its buffers, and `io.inputs(chunk)`, the
    tiles of `epi_inputs` ([M, N] arrays) for a chunk, in `bufs`; the first chunk's are fetched
    by TMA while the tile's K loop runs, later ones once the previous chunk's stores have read
    the buffers)."""
    ROWS, TILE_N, TILE_K, STAGES = tiles.rows, tiles.tile_n, tiles.tile_k, tiles.stages  # noqa: N806
    # Ping-pong: consumer c takes the program's items c, c + 2, ...; the ring holds their K blocks
    # in item order, so one consumer's K loop starts as the other's ends and its epilogue runs
    # under the other's K loop. Otherwise both consumers split each tile by rows.
    # Each consumer waits for every phase of the ready barriers it uses (a waiter tracks their
    # phase by counting its own waits), so under ping-pong each owner has its own.
    A_PARTS = 1 if tiles.pingpong else CONSUMERS  # noqa: N806
    OWNERS = CONSUMERS if tiles.pingpong else 1  # noqa: N806
    TILE_M = ROWS * A_PARTS  # noqa: N806
    m, k = a.shape
    n = bs[0].shape[0] if transpose_b else bs[0].shape[1]
    dtype = a.dtype
    n_b, n_in = len(bs), len(epi_inputs)
    assert transpose_b or not tiles.joint
    n_acc = 1 if tiles.joint else n_b
    OUT_N = TILE_N // n_b if tiles.joint else TILE_N  # noqa: N806  (columns of each output's tile)
    n_m, n_n, n_k = m // TILE_M, n // OUT_N, k // TILE_K
    n_tiles = n_m * n_n
    n_programs = min(n_tiles, _num_sms())
    a_tf = smem_transforms(TILE_K, dtype.itemsize)
    b_tf = smem_transforms(TILE_K if transpose_b else TILE_N, dtype.itemsize)
    out_tf = smem_transforms(OUT_N, dtype.itemsize)
    b_tile = (TILE_N, TILE_K) if transpose_b else (TILE_K, TILE_N)

    def body(*refs):
        a_ref, b_refs = refs[0], refs[1:1 + n_b]
        in_refs = refs[1 + n_b:1 + n_b + n_in]
        rest = refs[1 + n_b + n_in:]
        out_refs, rest = rest[:n_out], rest[n_out:]
        a_smem, b_smem, bufs, a_ready, b_ready, free, in_ready = rest
        wg = lax.axis_index("wg")
        program = lax.axis_index("programs")
        n_items = lax.div(n_tiles - program + n_programs - 1, n_programs)

        def coords(i):
            t = program + i * n_programs
            return lax.div(t, n_n), lax.rem(t, n_n)

        @pl.when(wg == CONSUMERS)
        def _producer():
            plgpu.set_max_registers(PRODUCER_REGISTERS, action="decrease")

            def issue(step, slot, wait):
                item = lax.div(step, n_k)
                tm, tn = coords(item)
                kk = lax.rem(step, n_k)
                owner = lax.rem(item, CONSUMERS) if tiles.pingpong else 0
                if wait:  # producer_loop passes a Python bool when it starts at step 0
                    plgpu.barrier_wait(free.at[slot])
                for c in range(A_PARTS):
                    plgpu.copy_gmem_to_smem(a_ref.at[pl.ds(tm * TILE_M + c * ROWS, ROWS), pl.ds(kk * TILE_K, TILE_K)],
                                            a_smem.at[slot, c], a_ready.at[(slot * OWNERS + owner) * A_PARTS + c])
                for j, b_ref in enumerate(b_refs):
                    src = (b_ref.at[pl.ds(tn * OUT_N, OUT_N), pl.ds(kk * TILE_K, TILE_K)] if transpose_b
                           else b_ref.at[pl.ds(kk * TILE_K, TILE_K), pl.ds(tn * TILE_N, TILE_N)])
                    dst = b_smem.at[slot, 0, pl.ds(j * OUT_N, OUT_N)] if tiles.joint else b_smem.at[slot, j]
                    plgpu.copy_gmem_to_smem(src, dst, b_ready.at[(slot * OWNERS + owner) * n_b + j])

            n_steps = n_items * n_k
            producer_loop(n_steps, STAGES, issue)
            drain(n_steps, STAGES, (free,))

        @pl.when(wg < CONSUMERS)
        def _consumer():
            plgpu.set_max_registers(CONSUMER_REGISTERS, action="increase")

            a_part, owner = (0, wg) if tiles.pingpong else (wg, 0)

            def run_tile(j, _):
                i = j * CONSUMERS + wg if tiles.pingpong else j
                tm, tn = coords(i)
                row0, cols = tm * TILE_M + a_part * ROWS, pl.ds(tn * OUT_N, OUT_N)

                def fetch(chunk):
                    # The previous stores must have read the buffers before they are refilled.
                    plgpu.wait_smem_to_gmem(0, wait_read_only=True)
                    for j, in_ref in enumerate(in_refs):
                        plgpu.copy_gmem_to_smem(in_ref.at[pl.ds(row0 + chunk * EPI_ROWS, EPI_ROWS), cols],
                                                bufs.at[wg, j], in_ready.at[wg * n_in + j])

                def inputs(chunk):
                    if chunk > 0:
                        fetch(chunk)
                    for j in range(n_in):
                        plgpu.barrier_wait(in_ready.at[wg * n_in + j])
                    return [plgpu.load(bufs.at[wg, j], (), layout=plgpu.Layout.WGMMA).astype(jnp.float32)
                            for j in range(n_in)]

                if n_in:
                    fetch(0)

                def ring(kk):
                    return lax.rem(i * n_k + kk, STAGES)

                def products(kk, acc_refs):
                    """Waits for K block kk and issues its products into acc_refs."""
                    slot = ring(kk)
                    plgpu.barrier_wait(a_ready.at[(slot * OWNERS + owner) * A_PARTS + a_part])
                    for j in range(n_b):
                        plgpu.barrier_wait(b_ready.at[(slot * OWNERS + owner) * n_b + j])
                    for j, acc_ref in enumerate(acc_refs):
                        b = b_smem.at[slot, j]
                        plgpu.wgmma(acc_ref, a_smem.at[slot, a_part], b.transpose((1, 0)) if transpose_b else b)

                zeros = zeros_f32((ROWS, TILE_N), plgpu.Layout.WGMMA)
                if tiles.in_flight:
                    def k_loop(acc_refs):
                        def k_step(kk, _):
                            products(kk, acc_refs)
                            plgpu.wgmma_wait(n_acc)  # block kk - 1's products are done
                            pl.when(kk > 0)(lambda: plgpu.barrier_arrive(free.at[ring(kk - 1)]))

                        lax.fori_loop(0, n_k, k_step, None)
                        plgpu.wgmma_wait(0)
                        plgpu.barrier_arrive(free.at[ring(n_k - 1)])

                    accs = pl.run_state(k_loop)(tuple(plgpu.ACC.init(zeros) for _ in range(n_acc)))
                else:
                    def k_step(kk, accs):
                        out = accumulate(functools.partial(products, kk), *accs)
                        plgpu.barrier_arrive(free.at[ring(kk)])
                        return out if n_acc > 1 else (out,)

                    accs = lax.fori_loop(0, n_k, k_step, (zeros,) * n_acc)
                if tiles.joint:
                    accs = tuple(accs[0][:, j * OUT_N:(j + 1) * OUT_N] for j in range(n_b))
                io = EpilogueIO(wg, row0, cols, out_refs, bufs, inputs)
                for chunk in range(ROWS // EPI_ROWS):
                    part = slice(chunk * EPI_ROWS, (chunk + 1) * EPI_ROWS)
                    epilogue(tuple(acc[part] if ROWS > EPI_ROWS else acc for acc in accs), io, chunk)
                return 0

            mine = lax.div(n_items - wg + CONSUMERS - 1, CONSUMERS) if tiles.pingpong else n_items
            lax.fori_loop(0, mine, run_tile, 0)
            plgpu.wait_smem_to_gmem(0, wait_read_only=True)

    n_bufs = max(tiles.bufs, n_in)
    scratch = (
        plgpu.SMEM((STAGES, A_PARTS, ROWS, TILE_K), dtype, transforms=a_tf),
        plgpu.SMEM((STAGES, n_acc, *b_tile), dtype, transforms=b_tf),
        plgpu.SMEM((CONSUMERS, n_bufs, EPI_ROWS, OUT_N), dtype, transforms=out_tf),
        plgpu.Barrier(num_barriers=STAGES * OWNERS * A_PARTS),
        plgpu.Barrier(num_barriers=STAGES * OWNERS * n_b),
        plgpu.Barrier(num_arrivals=A_PARTS, num_barriers=STAGES),
        plgpu.Barrier(num_barriers=max(1, CONSUMERS * n_in)),
    )
    out_type = tuple(jax.ShapeDtypeStruct((m, n), dtype) for _ in range(n_out))
    call = launch(body, out_type, scratch, (n_programs,), name, auto_barriers=True, consumers=CONSUMERS,
                  grid_names=("programs",))
    return call(a, *bs, *epi_inputs)


@dataclasses.dataclass(frozen=True)
class EpilogueIO:
    """What an epilogue needs of its tile: the consumer, its first row and the columns, the
    outputs, the buffers, and `inputs(chunk)` (see _gemm_call)."""

    wg: object
    row0: object
    cols: object
    outs: tuple
    bufs: object
    inputs: object

    def store(self, idx: int, value, out: int, chunk: int) -> None:
        rows = pl.ds(self.row0 + chunk * EPI_ROWS, EPI_ROWS)
        _store(self.bufs, self.wg, idx, value, self.outs[out].at[rows, self.cols])


def _store(bufs, wg, idx: int, value, ref) -> None:
    """Stores the `idx`th output of a chunk through the consumer's buffers, each refilled
    once its previous store has read it (at 0: once the previous chunk's stores have)."""
    n_bufs = bufs.shape[1]
    buf = bufs.at[wg, idx % n_bufs]
    if idx == 0 or idx >= n_bufs:
        plgpu.wait_smem_to_gmem(0 if idx == 0 else n_bufs - 1, wait_read_only=True)
    buf[...] = value
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(buf, ref)


def _up_epilogue(accs, io: EpilogueIO, chunk: int):
    # h1 and h3 go out before g is computed, so that the accumulators are dead by then.
    dtype = io.outs[0].dtype
    h1 = accs[0].astype(dtype)
    io.store(0, h1, 0, chunk)
    h3 = accs[1].astype(dtype)
    io.store(1, h3, 1, chunk)
    a = h1.astype(jnp.float32)
    io.store(2, (a * _sigmoid(a) * h3.astype(jnp.float32)).astype(dtype), 2, chunk)


def _down_epilogue(accs, io: EpilogueIO, chunk: int):
    (dg,) = accs
    h1, h3 = io.inputs(chunk)
    sig = _sigmoid(h1)
    silu = h1 * sig
    dtype = io.outs[0].dtype
    dh1 = (dg * h3 * sig * (1.0 + h1 * (1.0 - sig))).astype(dtype)
    dh3 = (dg * silu).astype(dtype)
    g = (silu * h3).astype(dtype)
    for idx, value in enumerate((dh1, dh3, g)):
        io.store(idx, value, idx, chunk)


@jax.jit
def gate_up(x: jax.Array, w1: jax.Array, w3: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """x [M, D], w1 and w3 [F, D] (as stored) -> h1 = x w1^T, h3 = x w3^T, g = silu(h1) * h3,
    each [M, F] in x's dtype; g from the float32 accumulators rounded as h1 and h3 are."""
    return _gemm_call(x, (w1, w3), transpose_b=True, n_out=3, epilogue=_up_epilogue, name="swiglu_gate_up",
                      tiles=UP_TILES)


@jax.jit
def gate_down(dy: jax.Array, w2: jax.Array, h1: jax.Array, h3: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """dy [M, D], w2 [D, F] (as stored), h1 and h3 [M, F] -> (dh1, dh3, g): the gate's
    gradient dg = dy w2 taken through g = silu(h1) * h3, and g itself, in dy's dtype."""
    return _gemm_call(dy, (w2,), transpose_b=False, n_out=3, epilogue=_down_epilogue, epi_inputs=(h1, h3),
                      name="swiglu_gate_down", tiles=DOWN_TILES)

