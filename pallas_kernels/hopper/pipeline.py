"""Pieces the Hopper kernels share: shared-memory layout, the producer's ring,
the launch with its warpgroups, and the helpers the consumers use.

Every kernel is one CTA of a producer warpgroup that only issues TMA copies
into a ring of swizzled shared-memory slots and two or three consumer
warpgroups that run `wgmma` and the softmax (FA3 §3.1, warp specialization).
Each ring slot has a "ready" barrier (the TMA arrives on it) and a "free"
barrier (every consumer arrives once it is done with the slot).

This module imports on any machine: without `mosaic_gpu` (older jax, or a
build without it) `AVAILABLE` is False and `unsupported_reason` says why.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

from pallas_kernels.hopper.tiles import (
    SUPPORTED_HEAD_DIMS,
    MosaicBlockSizes,
)

try:  # Mosaic GPU is optional: CPU-only installs and older jax lack parts of it.
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    _ = (plgpu.kernel, plgpu.wgmma, plgpu.Barrier, plgpu.ACC, plgpu.SwizzleTransform, plgpu.Layout.WGMMA)
    _IMPORT_ERROR: Exception | None = None
except Exception as exc:  # noqa: BLE001 -- any failure means "not available"
    plgpu = None
    _IMPORT_ERROR = exc

AVAILABLE = _IMPORT_ERROR is None

LOG2_E = math.log2(math.e)
LN_2 = math.log(2.0)
SUPPORTED_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def unsupported_reason(q: jax.Array, *, interpret: bool = False, device=None) -> str | None:
    """Why the Mosaic kernels cannot run these inputs here, or None if they can.

    Under backend="auto" any reason means "use the portable kernels"; with
    backend="mosaic" it becomes the ValueError. `device` defaults to the
    first JAX device (where the kernels would run)."""
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


def smem_transforms(head_dim: int, itemsize: int) -> tuple:
    """Tiling + swizzle for a [rows, head_dim] tile in shared memory.

    The widest swizzle (128 B) whose atom divides a row is used, so wgmma and
    TMA see conflict-free banks. head_dim 80 (160-byte rows) gets the 32-byte
    swizzle instead of being padded to 128 columns."""
    row_bytes = head_dim * itemsize
    for swizzle in (128, 64, 32):
        if row_bytes % swizzle == 0:
            return plgpu.TilingTransform((8, swizzle // itemsize)), plgpu.SwizzleTransform(swizzle)
    raise ValueError(f"{head_dim=} must be a multiple of {32 // itemsize} for the Mosaic kernels")


# Shared memory per CTA on sm_90 (227 KiB), less room for Mosaic's own
# scratch (cross-warp reductions) and the barriers.
_SMEM_LIMIT = 232_448 - 8_192


def fit_stages(kernel: str, requested: int, useful: int, fixed_bytes: int, per_stage_bytes: int) -> int:
    """Pipeline depth: as requested, but no deeper than the number of steps
    and shallow enough for shared memory; ValueError if even 1 does not fit."""
    stages = max(1, min(requested, useful))
    while stages > 1 and fixed_bytes + stages * per_stage_bytes > _SMEM_LIMIT:
        stages -= 1
    if fixed_bytes + stages * per_stage_bytes > _SMEM_LIMIT:
        raise ValueError(f"{kernel}: tiles need {fixed_bytes + per_stage_bytes} bytes of shared memory "
                         f"(limit {_SMEM_LIMIT}); use smaller blocks")
    return stages


def when(cond, fn) -> None:
    """pl.when that also accepts a Python bool (static loop bounds)."""
    if isinstance(cond, bool):
        if cond:
            fn()
        return
    pl.when(cond)(fn)


def zeros_f32(shape, layout) -> jax.Array:
    return plgpu.layout_cast(jnp.zeros(shape, jnp.float32), layout)


def along_rows(x: jax.Array, shape) -> jax.Array:
    """Broadcast a per-row vector along the columns of `shape`."""
    return lax.broadcast_in_dim(x, shape, [0])


def along_cols(x: jax.Array, shape) -> jax.Array:
    """Broadcast a per-column vector along the rows of `shape`."""
    return lax.broadcast_in_dim(x, shape, [1])


def iota(shape, dim) -> jax.Array:
    return plgpu.broadcasted_iota(jnp.int32, shape, dim, layout=plgpu.Layout.WGMMA)


def accumulate(fn, *initial):
    """Runs `fn` on wgmma accumulators that start at `initial` (register
    arrays) and returns their final values; one wgmma wait at the end."""
    out = pl.run_state(fn)(tuple(plgpu.ACC.init(x) for x in initial))
    return out if len(initial) > 1 else out[0]


# The cluster axis of kernels launched in clusters (launch's `cluster`).
CLUSTER = "cluster"


def compiler_params(auto_barriers: bool):
    # approx_math: exp2/log use the MUFU approximations (ex2.approx), which is
    # what makes the softmax cheap enough to hide behind the matmuls.
    return plgpu.CompilerParams(approx_math=True, unsafe_no_auto_barriers=not auto_barriers)


TILE_GRID_NAMES = ("heads", "tiles", "batch")


def num_sms(default: int = 132) -> int:
    """Streaming multiprocessors of the first device (the persistent forward's
    grid, the backward's launch order); `default` (an H100 SXM) where the
    count is unknown (CPU lowering)."""
    device = jax.devices()[0]
    count = getattr(device, "core_count", None) if device.platform == "gpu" else None
    return int(count) if count else default


def tile_grid(heads: int, num_tiles: int, batch: int) -> dict:
    """Grid and grid names (launch's keywords) of the kernels with one program
    per (head, tile, batch), in the launch order that keeps the programs
    running at once on the tiles of a few (batch, head) pairs, whose streamed
    blocks they then share through L2 (spread over every head they read
    several times more DRAM).

    Mosaic GPU launches a Pallas grid reversed: its last axis becomes CUDA's
    x, the fastest in launch order. Where batch x tiles fits one wave of
    programs, batch runs fastest, then tiles, then heads: the wave holds
    whole (batch, head) pairs either way, and a causal wave starts every
    batch's longest tiles first. Beyond one wave (long sequences at a large
    batch) tiles run fastest, then batch: batch first would spread each
    wave over every batch, a few tiles each."""
    if batch * num_tiles > num_sms():
        return {"grid": (heads, batch, num_tiles), "grid_names": ("heads", "batch", "tiles")}
    return {"grid": (heads, num_tiles, batch), "grid_names": TILE_GRID_NAMES}


def launch(body, out_type, scratch, grid: tuple, name: str, *, auto_barriers: bool, consumers: int = 2,
           grid_names: tuple = TILE_GRID_NAMES, mutable: bool = False, cluster: int = 1):
    """One program per grid point (by default tile_grid's) with `consumers`
    consumer warpgroups (`wg` 0 .. consumers - 1) and the producer
    (`wg` == consumers). Mosaic GPU launches the grid's last axis fastest.

    auto_barriers: Pallas puts a warpgroup barrier before and after every
    store from registers to shared memory and around every scoped region, so
    that the code reads as if each warpgroup ran in lockstep. The backward
    kernels launch without them: every hazard they guard against is ordered
    there by the kernels' own barriers (mbarrier arrivals per thread, the
    warpgroup barrier in commit_smem and wait_smem_to_gmem, wgmma waits).
    The forward keeps them (it measured slower without).

    mutable: some operands are `jax.Ref`s the kernel writes in place. That
    takes `pl.kernel` itself: `plgpu.kernel` wraps the call in a custom_vmap,
    which does not pass refs through.

    cluster: CTAs per cluster (axis CLUSTER), each grid point one cluster."""
    clusters = {"cluster": (cluster,), "cluster_names": (CLUSTER,)} if cluster > 1 else {}
    if not mutable:
        return plgpu.kernel(body, out_type=out_type, scratch_types=scratch, grid=grid,
                            grid_names=grid_names, num_threads=consumers + 1, thread_name="wg",
                            compiler_params=compiler_params(auto_barriers), kernel_name=name, **clusters)
    mesh = plgpu.Mesh(grid=grid, grid_names=grid_names, num_threads=consumers + 1, thread_name="wg", **clusters)

    def with_scratch(*refs):
        pl.run_scoped(functools.partial(body, *refs), *scratch, collective_axes="wg")

    return pl.kernel(with_scratch, out_type=out_type, mesh=mesh, compiler_params=compiler_params(auto_barriers),
                     name=name)


def kv_producer(k_ref, v_ref, k_smem, v_smem, k_ready, v_ready, k_free, v_free, *, b, h, block_k: int,
                 n_blocks, num_stages: int, start=0, multicast: bool = False):
    """Producer warpgroup of the kernels that stream key/value blocks (forward, dQ):
    TMA copies of each block's K and V into the ring, each slot refilled once all
    consumers have released it. `start`: ring steps issued before (earlier
    tiles of a persistent program); returns the count after this tile.

    multicast: the CTAs of a cluster (axis CLUSTER) stream the same blocks in
    step; each copies its share of a block into every CTA's ring, and the
    release barriers (ClusterBarriers) count the consumers of the whole cluster."""
    collective = {"collective_axes": CLUSTER} if multicast else {}

    def issue(step, slot, wait):
        rows = pl.ds(step * block_k, block_k)
        when(wait, lambda: plgpu.barrier_wait(k_free.at[slot]))
        plgpu.copy_gmem_to_smem(k_ref.at[b, rows, h], k_smem.at[slot], k_ready.at[slot], **collective)
        when(wait, lambda: plgpu.barrier_wait(v_free.at[slot]))
        plgpu.copy_gmem_to_smem(v_ref.at[b, rows, h], v_smem.at[slot], v_ready.at[slot], **collective)

    return producer_loop(n_blocks, num_stages, issue, start=start)


def longest_first(t, num_tiles: int, causal: bool):
    """Causal tiles run longest (most keys) first, so short ones fill the last wave."""
    return num_tiles - 1 - t if causal else t


def query_tile_key_blocks(t, tile: int, block_k: int, num_k_blocks: int, causal: bool, *, unmasked: int):
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


def consumer_key_blocks(row0, rows: int, block_k: int, n_free, n_blocks, causal: bool):
    """(unmasked, end): of its tile's key blocks, how many a consumer whose
    rows start at `row0` runs without a mask, and where its blocks end.
    Causal: blocks before the one holding row0 are below every one of its
    rows' diagonals, and blocks past the one holding its last row are above
    all of them (fully masked: they would add exactly zero). Otherwise the
    tile's own counts."""
    if not causal:
        return n_free, n_blocks
    return lax.div(row0, block_k), jnp.minimum(lax.div(row0 + rows - 1, block_k) + 1, n_blocks)


def producer_loop(n_steps, num_stages: int, issue, *, start=0):
    """Producer warpgroup: fill the ring, then refill each slot as soon as the
    consumers release it. `issue(step, slot, wait)` starts the copies of one
    step into `slot`, first waiting for the slot's release by the consumers
    if `wait` (a Python or traced bool) is true. `start` counts the ring steps
    issued before this loop (earlier tiles of a persistent program); returns
    the count after it."""
    if isinstance(start, int) and start == 0:
        for step in range(num_stages):  # empty ring: nothing to wait for
            when(step < n_steps, functools.partial(issue, step, step, False))

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


def drain(n_steps, num_stages: int, frees) -> None:
    """Producer, before exiting: wait for the release of each slot's last
    step (of `n_steps` issued in all), so every phase of the release barriers
    `frees` is observed before the CTA exits."""

    def drain(step, _):
        slot = lax.rem(step, num_stages)
        for free in frees:
            plgpu.barrier_wait(free.at[slot])

    lax.fori_loop(jnp.maximum(n_steps - num_stages, 0), n_steps, drain, None)


def pad_seq(x: jax.Array, padded_len: int, axis: int) -> jax.Array:
    extra = padded_len - x.shape[axis]
    if extra == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return jnp.pad(x, widths)


def unpad_seq(x: jax.Array, seq_len: int, axis: int) -> jax.Array:
    return x if x.shape[axis] == seq_len else lax.slice_in_dim(x, 0, seq_len, axis=axis)


def check_blocks(block_sizes) -> MosaicBlockSizes:
    """The block sizes, if the Mosaic kernels can take them here."""
    if not isinstance(block_sizes, MosaicBlockSizes):
        raise ValueError(f"block_sizes={block_sizes!r} must be a MosaicBlockSizes for backend='mosaic'")
    if not AVAILABLE:
        raise ValueError(f"the Mosaic GPU backend is unavailable: {_IMPORT_ERROR}")
    return block_sizes

