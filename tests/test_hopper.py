"""The Hopper (Pallas Mosaic GPU) kernels on CPU: block-size validation and
the table of defaults, the dispatcher's choices for faked devices and dtypes,
the persistent forward's schedule, and lowering of every kernel to Mosaic GPU
MLIR for the CUDA platform (layout inference, shared-memory layout and
barrier counts are all checked at lowering time, without a GPU). The GPU
tests are in test_hopper_gpu.py.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import (
    BlockSizes,
    MosaicBlockSizes,
    attention,
    flash_attention,
    hopper,
    resolve_backend,
)
from pallas_kernels.hopper import forward, pipeline
from pallas_kernels.hopper.tiles import BLOCK_K, BLOCK_K_DKV, BLOCK_Q_DQ, DEFAULTS


def on_hopper() -> bool:
    device = jax.devices()[0]
    return device.platform == "gpu" and str(getattr(device, "compute_capability", "")).startswith("9.")


HOPPER = types.SimpleNamespace(platform="gpu", compute_capability="9.0", device_kind="NVIDIA H100 80GB HBM3")
AMPERE = types.SimpleNamespace(platform="gpu", compute_capability="8.0", device_kind="NVIDIA A100-SXM4-80GB")


def _zeros(dtype="bfloat16", head_dim=64, seq=16):
    return jnp.zeros((1, seq, 1, head_dim), dtype)


# ----------------------------------------------------------------------------
# CPU: configuration and dispatch.


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"block_k_dq": 100}, "block_k_dq=100 must be 64 or 128"),
        ({"block_q_dkv": 512}, "block_q_dkv=512 must be 64 or 128"),
        ({"num_stages": 0}, "num_stages=0 must be an integer between 1 and 8"),
        ({"consumers": 4}, r"consumers=4 must be one of \(2, 3\)"),
        ({"consumers": 3, "overlap": True}, "use overlap=False"),
        ({"fwd_stagger": True}, "also set overlap=True"),
        ({"dq_split": True}, "also set fused_bwd=True"),
        ({"fused_bwd": True, "dq_lag": True}, "also set fused_bwd=True and dq_split=True"),
    ],
)
def test_block_sizes_validate(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        MosaicBlockSizes(**kwargs)


def test_seq_multiple_holds_every_tile() -> None:
    """Every default's backward tiles divide the padded length (a CTA owns
    two consumers' rows), and so do the forward's key blocks."""
    for *_, blocks in DEFAULTS:
        for rows in (BLOCK_K, 2 * BLOCK_Q_DQ, blocks.block_k_dq, 2 * BLOCK_K_DKV, blocks.block_q_dkv):
            assert hopper.SEQ_MULTIPLE % rows == 0, (blocks, rows)


def test_defaults_cover_every_supported_shape() -> None:
    """The table has a row for every supported head_dim, either causality
    and every length, and an unknown length or causality counts as long and
    causal."""
    for head_dim in hopper.SUPPORTED_HEAD_DIMS:
        for causal in (True, False):
            for seq in (1, 127, 1000, 1023, 1024, 1025, 2048, 2049, 100_000):
                assert isinstance(MosaicBlockSizes.get_default(head_dim, seq, causal), MosaicBlockSizes)
        assert MosaicBlockSizes.get_default(head_dim) == MosaicBlockSizes.get_default(head_dim, 10**9, True)
    with pytest.raises(ValueError, match="head_dim=256 must be at most 128"):
        MosaicBlockSizes.get_default(256)


def test_default_backward_depends_on_length() -> None:
    """head_dim <= 64: the two kernels (128-query dK/dV steps) up to
    FUSED_BWD_MIN_SEQ, the fused kernel (64-query steps) above it and when
    the length is not known; head_dim 128: the two kernels at every length."""
    limit = 1024
    for seq in (1, 1024, limit):
        short = MosaicBlockSizes.get_default(64, seq)
        assert (short.fused_bwd, short.block_q_dkv) == (False, 128)
    for seq in (limit + 1, 16384, None):
        long_ = MosaicBlockSizes.get_default(64, seq)
        assert (long_.fused_bwd, long_.block_q_dkv) == (True, 64)
    # The backward and the forward's consumers change at the limit, nothing else.
    assert dataclasses.replace(MosaicBlockSizes.get_default(64, limit), fused_bwd=True, block_q_dkv=64,
                               consumers=3) == MosaicBlockSizes.get_default(64, 4096)


def test_default_kv_multicast_from_long_sequences() -> None:
    """K/V multicast is set from seq 4096 at head_dim 128 (non-causal) and above 4096 at head_dim
    64, where the forward multicasts only when not causal; nothing else changes with it."""
    assert [MosaicBlockSizes.get_default(128, seq, causal=False).kv_multicast for seq in (1024, 2048, 2049, 16384)] == [
        False, False, True, True]
    assert [MosaicBlockSizes.get_default(64, seq).kv_multicast for seq in (1024, 4096, 4097, None)] == [
        False, False, True, True]
    assert not any(MosaicBlockSizes.get_default(128, seq, causal=True).kv_multicast for seq in (1024, 16384, None))
    assert dataclasses.replace(MosaicBlockSizes.get_default(64, 4096), kv_multicast=True) == MosaicBlockSizes.get_default(64)


def test_default_head_dim_128_backward_depends_on_causal_and_length() -> None:
    """head_dim 128: the fused kernel with dQ split by columns, except causal
    up to seq 1024 (and causal unknown counts as causal); the forward's tiles
    do not change; both read the diagonal's mask from a tile (mask_tile).
    Other head dims above 64 cannot split dQ and keep the two kernels."""
    limit = 1024
    fused = dict(fused_bwd=True, dq_split=True)
    # The causal fused kernel loads lse early; the non-causal one lags its dQ product.
    early = dict(lse_early=True)
    lagged = dict(dq_lag=True)
    two = MosaicBlockSizes.get_default(128, limit, causal=True)
    assert not two.fused_bwd and not two.lse_early
    for seq, causal in ((1024, False), (limit, False), (limit + 1, True), (16384, None), (None, None), (None, True)):
        got = MosaicBlockSizes.get_default(128, seq, causal=causal)
        want = dataclasses.replace(two, **fused, **(early if causal is not False else lagged))
        # (group_heads, the forward's order, has its own test)
        assert dataclasses.replace(got, group_heads=True) == want, (seq, causal)
    for seq, causal in ((1024, True), (limit, None)):
        assert MosaicBlockSizes.get_default(128, seq, causal=causal) == two, (seq, causal)
    assert not any(MosaicBlockSizes.get_default(d, None, causal=False).fused_bwd for d in (80, 96, 112))
    # The causal steps read the diagonal's mask from a tile at head_dim 128 only.
    assert two.mask_tile and MosaicBlockSizes.get_default(128, 16384, causal=True).mask_tile
    assert not any(MosaicBlockSizes.get_default(d, seq, causal=True).mask_tile for d in (64, 80) for seq in (1024, 16384))
    # The forward's consumers start half a step apart at head_dim 128 only.
    assert all(MosaicBlockSizes.get_default(128, seq, causal=c).fwd_stagger
               for seq in (1024, 4096, None) for c in (True, False, None))
    assert not any(MosaicBlockSizes.get_default(d, 4096, causal=c).fwd_stagger for d in (64, 80, 96) for c in (True, False))


def test_default_forward_consumers_depend_on_length() -> None:
    """head_dim <= 64: two forward consumers (128-row tiles) up to seq 1024,
    three (192-row tiles) above it and when the length is not known, and
    non-causal from 1024; head_dim 128: two at every length."""
    limit, non_causal = 1024, 1024
    lengths = (1, 1000, non_causal - 1, non_causal, limit, limit + 1, 16384, None)
    for causal in (True, None):
        assert [MosaicBlockSizes.get_default(64, seq, causal).consumers for seq in lengths] == [
            2, 2, 2, 2, 2, 3, 3, 3]
    assert [MosaicBlockSizes.get_default(64, seq, False).consumers for seq in lengths] == [2, 2, 2, 3, 3, 3, 3, 3]
    assert {MosaicBlockSizes.get_default(128, seq).consumers for seq in (1024, 4096, None)} == {2}


def test_default_head_dim_128_forward_does_not_depend_on_length() -> None:
    """At head_dim 128 the forward's tiles and schedule do not depend on the
    length or causality (only its head order and the backward do)."""
    lengths = (1, 1024, 2048, 2049, 16384, None)
    forward_fields = ("num_stages", "overlap", "fwd_stagger", "consumers")
    assert {tuple(getattr(MosaicBlockSizes.get_default(128, seq, causal=c), f) for f in forward_fields)
            for seq in lengths for c in (True, False)} == {
        tuple(getattr(MosaicBlockSizes.get_default(128), f) for f in forward_fields)}


@pytest.mark.skipif(not hopper.AVAILABLE, reason="jax.experimental.pallas.mosaic_gpu is not importable")
@pytest.mark.parametrize(
    ("dtype", "head_dim", "device", "interpret", "reason"),
    [
        ("bfloat16", 64, HOPPER, False, None),
        ("float16", 80, HOPPER, False, None),
        ("bfloat16", 128, HOPPER, False, None),
        ("float32", 64, HOPPER, False, "dtype=float32"),
        ("bfloat16", 256, HOPPER, False, "head_dim=256"),
        ("bfloat16", 72, HOPPER, False, "head_dim=72"),
        ("bfloat16", 64, AMPERE, False, "not a Hopper GPU"),
        ("bfloat16", 64, HOPPER, True, "interpret=True"),
    ],
)
def test_unsupported_reason(dtype, head_dim, device, interpret, reason) -> None:
    got = hopper.unsupported_reason(_zeros(dtype, head_dim), interpret=interpret, device=device)
    if reason is None:
        assert got is None
    else:
        assert reason in got


def _pretend_mosaic_runs(monkeypatch) -> None:
    """Makes the dispatcher believe it is on a Hopper GPU (for bf16/fp16)."""
    def reason(q, *, interpret):
        return hopper.unsupported_reason(q, interpret=interpret, device=HOPPER)

    monkeypatch.setitem(attention.FAMILIES, "mosaic",
                        dataclasses.replace(attention.FAMILIES["mosaic"], unsupported_reason=reason))


@pytest.mark.skipif(not hopper.AVAILABLE, reason="jax.experimental.pallas.mosaic_gpu is not importable")
def test_auto_picks_mosaic_on_hopper(monkeypatch) -> None:
    _pretend_mosaic_runs(monkeypatch)
    assert resolve_backend(None, _zeros("bfloat16")) == "mosaic"
    assert resolve_backend("auto", _zeros("float16", 80)) == "mosaic"
    # Fallbacks under auto: float32, unsupported head_dim, interpret mode,
    # and the portable family's block sizes.
    assert resolve_backend("auto", _zeros("float32")) == "triton"
    assert resolve_backend("auto", _zeros("bfloat16", 256)) == "triton"
    assert resolve_backend("auto", _zeros("bfloat16"), interpret=True) == "triton"
    assert resolve_backend("auto", _zeros("bfloat16"), BlockSizes()) == "triton"
    assert resolve_backend("triton", _zeros("bfloat16")) == "triton"
    # The default tiles follow the inputs' length, and at head_dim 128 also
    # whether the attention is causal.
    for head_dim, seq, causal, fused in ((64, 1024, True, False), (64, 4096, True, True), (128, 1024, False, True),
                                         (128, 1024, True, False), (128, 4096, True, True)):
        x = _zeros("bfloat16", head_dim, seq=seq)
        assert attention._prepare(x, x, x, causal, None, None, None, False)[2].fused_bwd is fused, (head_dim, seq, causal)
    # Forcing the Hopper kernels with inputs they cannot run names the reason.
    with pytest.raises(ValueError, match="backend='mosaic' cannot run these inputs: dtype=float32"):
        resolve_backend("mosaic", _zeros("float32"))


def test_cpu_dispatch_falls_back() -> None:
    """On this (non-Hopper) machine auto uses the portable kernel and forcing
    the Hopper kernel raises a ValueError that says why."""
    if on_hopper():
        pytest.skip("runs on a machine without a Hopper GPU")
    q = _zeros("bfloat16")
    assert resolve_backend(None, q) == "triton"
    with pytest.raises(ValueError, match="backend='mosaic' cannot run these inputs"):
        flash_attention(q, q, q, backend="mosaic")
    with pytest.raises(ValueError, match="backend='mosaic'"):
        flash_attention(q, q, q, block_sizes=MosaicBlockSizes())
    with pytest.raises(ValueError, match="must be a BlockSizes or None for backend 'triton'"):
        flash_attention(q, q, q, backend="triton", block_sizes=MosaicBlockSizes(), interpret=True)
    with pytest.raises(ValueError, match="backend='cuda'.*'auto', 'triton', 'mosaic'"):
        flash_attention(q, q, q, backend="cuda")
    # The auto path still computes (portable kernel, interpreted on CPU).
    out = flash_attention(q, q, q, interpret=True)
    assert out.shape == q.shape


def _runs(table):
    """A schedule table's rows as the lists of items each program runs."""
    return [list(row[1:1 + row[0]]) for row in table]


def _snake(n_work, n_programs):
    """The fixed snake pattern the persistent forward used before list
    scheduling: round i hands items [i P, (i + 1) P) out, every other round
    in reverse."""
    runs = [[] for _ in range(n_programs)]
    for w in range(n_work):
        r, k = divmod(w, n_programs)
        runs[k if r % 2 == 0 else n_programs - 1 - k].append(w)
    return runs


@pytest.mark.parametrize(("n_work", "n_programs"), [(352, 132), (3072, 132), (265, 132), (7, 7), (3, 5)])
def test_list_schedule_of_equal_items_is_round_robin(n_work, n_programs) -> None:
    """Equal costs: program p runs items p, p + P, p + 2P, ... in order, so
    every item runs exactly once and counts differ by at most one."""
    runs = _runs(forward.list_schedule([1.0] * n_work, n_programs))
    assert runs == [list(range(p, n_work, n_programs)) for p in range(n_programs)]


def test_list_schedule_balances_grouped_causal_tiles() -> None:
    """Causal tiles of 64 heads x 32 tiles, in groups of 8 heads longest
    first (head_dim 128, seq 4096): list scheduling leaves the busiest of 132
    programs within 0.2% of the mean, where the snake over the same order
    gave 1.68x the mean, which is the 0.58-0.61x measured when the causal
    forward was grouped under it."""
    n_heads, num_tiles, n_programs = 64, 32, 132
    order = forward.work_order(n_heads, num_tiles, group=8, causal=True)
    cost = [int(code) % num_tiles + 2 for code in order]  # t + 1 key blocks, plus one

    def busiest_over_mean(runs):
        totals = [sum(cost[i] for i in run) for run in runs]
        assert sorted(i for run in runs for i in run) == list(range(len(order)))
        return max(totals) / (sum(totals) / n_programs)

    assert busiest_over_mean(_runs(forward.list_schedule(cost, n_programs))) < 1.002
    assert busiest_over_mean(_snake(len(order), n_programs)) > 1.6


def test_head_group_fits_l2_and_divides() -> None:
    """As many heads as fit the L2 working set, but a divisor of their count."""
    mib = 2**20
    assert forward.head_group(64, 2 * mib) == 8  # head_dim 128, seq 4096: 2 MiB of K/V per head
    assert forward.head_group(12, 2 * mib) == 6
    assert forward.head_group(7, 2 * mib) == 7
    assert forward.head_group(64, 64 * mib) == 1
    assert forward.head_group(512, mib // 4) == 64


def test_work_order_covers_the_grid_in_groups() -> None:
    """Each (batch x head, tile) exactly once, heads in groups of `group`,
    causal tiles longest first within a group and the others in order."""
    n_heads, num_tiles, group = 12, 5, 4
    for causal in (True, False):
        order = [divmod(int(code), num_tiles) for code in forward.work_order(n_heads, num_tiles, group=group,
                                                                          causal=causal)]
        assert sorted(order) == [(bh, t) for bh in range(n_heads) for t in range(num_tiles)]
        for g in range(n_heads // group):
            part = order[g * group * num_tiles:(g + 1) * group * num_tiles]
            assert {bh for bh, _ in part} == set(range(g * group, (g + 1) * group))
            tiles = [t for _, t in part]
            assert tiles == sorted(tiles, reverse=causal)


@pytest.mark.parametrize(("batch", "heads", "num_tiles", "causal"), [(4, 16, 32, True), (4, 16, 32, False),
                                                                     (1, 32, 86, True), (2, 3, 5, True)])
def test_forward_schedule_streams_few_heads_at_once(batch, heads, num_tiles, causal) -> None:
    """The persistent forward's schedule runs every (batch, head, tile) once,
    and, replayed on its own cost estimates, the programs running at any
    moment work on at most two head groups (whose K/V fits L2), where one
    longest-first order over all heads had every head's K/V streaming."""
    n_programs, tile = 132, 128
    bytes_per_head = 2 * num_tiles * tile * 256
    group = forward.head_group(batch * heads, bytes_per_head)

    def key_blocks(t):
        return t + 1 if causal else num_tiles

    table = forward.forward_schedule(batch, heads, num_tiles, n_programs, causal=causal, key_blocks=key_blocks,
                                   bytes_per_head=bytes_per_head)
    busiest = _busiest_heads_at_once(table, batch * heads, num_tiles, key_blocks)
    assert busiest <= 2 * group
    if batch * heads > 2 * group:
        assert busiest < min(n_programs, batch * heads)


def _busiest_heads_at_once(table, n_heads: int, num_tiles: int, key_blocks) -> int:
    """Replays a forward schedule on its cost estimates (key blocks plus one
    per tile) after checking that it runs every (head, tile) once; returns
    the most heads whose tiles run at one moment."""
    runs = [[divmod(int(code), num_tiles) for code in run] for run in _runs(table)]
    assert sorted(x for run in runs for x in run) == [(bh, t) for bh in range(n_heads) for t in range(num_tiles)]
    spans = []  # (start, end, head) of every item on its program's timeline
    for run in runs:
        clock = 0
        for bh, t in run:
            spans.append((clock, clock + key_blocks(t) + 1, bh))
            clock += key_blocks(t) + 1
    end = max(e for _, e, _ in spans)
    return max(len({bh for s, e, bh in spans if s <= x < e}) for x in np.linspace(0, end, 64, endpoint=False))


def test_forward_schedule_one_head_at_a_time() -> None:
    """group_heads=False, the head_dim 128 non-causal default up to seq 2048: at seq 1024 (16 x 16 heads, 8 tiles each) the
    132 programs work on 17 heads at a time, all tiles of each in the same
    wave, where the grouped order (groups of 32 heads, each group's tiles
    over two waves) has up to 64."""
    batch, heads, num_tiles, n_programs = 16, 16, 8, 132
    bytes_per_head = 2 * 1024 * 256

    def key_blocks(t):
        return num_tiles

    def table(group_heads):
        return forward.forward_schedule(batch, heads, num_tiles, n_programs, causal=False, key_blocks=key_blocks,
                                      bytes_per_head=bytes_per_head, group_heads=group_heads)

    assert _busiest_heads_at_once(table(False), batch * heads, num_tiles, key_blocks) == 17
    assert _busiest_heads_at_once(table(True), batch * heads, num_tiles, key_blocks) == 64
    limit = 2048
    assert [MosaicBlockSizes.get_default(128, seq, causal=c).group_heads
            for seq, c in ((1024, False), (limit, False), (2 * limit, False), (1024, True), (1024, None))] == [
        False, False, True, True, True]
    assert all(MosaicBlockSizes.get_default(64, seq, causal=False).group_heads for seq in (1024, 4096))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seq", [1024, 2048])
def test_forward_schedule_counts_idle_consumers(seq, causal) -> None:
    """Three consumers (192-row tiles) over a length they do not divide: the
    last tile's consumers past the end idle, and its estimated cost is the
    share of consumers that compute. Scheduled by those costs, the busiest
    of 132 programs (in those costs, plus one per tile) is within 2% of the
    mean at the FA3 shapes; scheduled as if every tile were whole, it is
    4-12% above it, and the saved work shortens nothing."""
    tile, bk, n_programs = 192, 128, 132
    num_tiles, num_k_blocks = -(-seq // tile), seq // bk

    def cost(t, idle):
        return forward.tile_cost(t, tile=tile, block_k=bk, num_k_blocks=num_k_blocks, padded_len=seq,
                                       causal=causal, idle_past_end=idle)

    assert cost(num_tiles - 1, True) == cost(num_tiles - 1, False) * (seq % tile) / tile
    assert [cost(t, True) for t in range(num_tiles - 1)] == [cost(t, False) for t in range(num_tiles - 1)]

    def imbalance(idle):
        table = forward.forward_schedule(16384 // seq, 32, num_tiles, n_programs, causal=causal,
                                       key_blocks=lambda t: cost(t, idle), bytes_per_head=2 * seq * 128)
        loads = [sum(cost(int(c) % num_tiles, True) + 1 for c in row[1:1 + row[0]]) for row in table]
        return max(loads) / np.mean(loads)

    assert imbalance(True) < 1.02
    assert imbalance(False) > 1.04


def _cuda_launch_grids(lowered) -> list[tuple[int, ...]]:
    """The CUDA grid (x, y, z) of every Mosaic GPU kernel in a lowered
    program, read from the kernels' serialized MLIR."""
    return [grid for grid, _ in _cuda_launches(lowered)]


def _cuda_launches(lowered) -> list[tuple[tuple[int, ...], tuple[int, ...] | None]]:
    """The CUDA grid (x, y, z) and cluster (x, y, z; None: no clusters) of every Mosaic GPU
    kernel in a lowered program, read from the kernels' serialized MLIR."""
    from jax._src.interpreters import mlir
    from jax._src.lib import mosaic_gpu_dialect
    from jax._src.lib.mlir import ir

    def walk(op):
        for region in op.regions:
            for block in region:
                for inner in block.operations:
                    yield inner
                    yield from walk(inner)

    grids = []
    for op in walk(lowered.compiler_ir("stablehlo").operation):
        if op.name != "stablehlo.custom_call" or "mosaic_gpu" not in str(op.attributes["call_target_name"]):
            continue
        module = bytes(ir.StringAttr(op.attributes["mhlo.backend_config"]["module"]).value_bytes)
        context = mlir.make_ir_context()
        context.allow_unregistered_dialects = True
        # The kernels' memrefs may hold Mosaic GPU's own types, which parse only with its dialect.
        mosaic_gpu_dialect.register_dialect(context)
        with context:
            for inner in walk(ir.Module.parse(module).operation):
                if inner.name.endswith("gpu.launch"):
                    # Operands: async token, grid x, y, z, block x, y, z, with clusters
                    # cluster x, y, z, then the dynamic shared memory size.
                    sizes = [ir.IntegerAttr(value.owner.attributes["value"]).value
                             for value in list(inner.operands)[1:-1]]
                    grids.append((tuple(sizes[:3]), tuple(sizes[6:9]) if len(sizes) == 9 else None))
    return grids


@pytest.mark.skipif(not hopper.AVAILABLE, reason="jax.experimental.pallas.mosaic_gpu is not importable")
def test_tile_grids_launch_batch_then_tiles_then_heads() -> None:
    """Mosaic GPU launches a Pallas grid reversed. Every backward kernel (dQ,
    dK/dV, the fused one) must come out as CUDA grid (batch, tiles, heads):
    batch fastest, then tiles, so the programs running at once share a few
    heads' blocks (tile_grid). The persistent forward is one row of programs.
    Past one wave of programs (132 SMs when lowered without a GPU) tiles
    run fastest: CUDA grid (tiles, batch, heads)."""
    heads, head_dim = 5, 64
    lse_of = lambda x: jax.ShapeDtypeStruct((x.shape[0], heads, x.shape[1]), jnp.float32)  # noqa: E731
    kwargs = dict(causal=True, sm_scale=0.125)
    x = jax.ShapeDtypeStruct((3, 512, heads, head_dim), jnp.bfloat16)
    fwd = jax.jit(functools.partial(hopper.mosaic_forward, block_sizes=MosaicBlockSizes(), **kwargs))
    assert _cuda_launch_grids(fwd.trace(x, x, x).lower(lowering_platforms=("cuda",))) == [(min(3 * heads * 4, 132), 1, 1)]
    # 2 x 64 rows per program: 3 x 4 tiles in one wave; 33 x 4 = 132 still one; 19 x 8 = 152 past it.
    for batch, seq, tiles_first in ((3, 512, False), (33, 512, False), (19, 1024, True)):
        x = jax.ShapeDtypeStruct((batch, seq, heads, head_dim), jnp.bfloat16)
        tiles = seq // 128
        for fused in (False, True):
            bwd = jax.jit(functools.partial(hopper.mosaic_backward, block_sizes=MosaicBlockSizes(fused_bwd=fused),
                                            **kwargs))
            grids = _cuda_launch_grids(bwd.trace(x, x, x, x, lse_of(x), x).lower(lowering_platforms=("cuda",)))
            expected = (tiles, batch, heads) if tiles_first else (batch, tiles, heads)
            assert grids == [expected] * (1 if fused else 2), (batch, seq, fused)


@pytest.mark.skipif(not hopper.AVAILABLE, reason="jax.experimental.pallas.mosaic_gpu is not importable")
@pytest.mark.parametrize(("causal", "seq", "cluster"), [(False, 512, 2), (True, 512, 1), (False, 640, 1)])
def test_kv_multicast_launches_clusters_of_two_where_tiles_pair(causal, seq, cluster) -> None:
    """With kv_multicast the forward runs in clusters of two CTAs, one pair of a head's query
    tiles per cluster: 4 tiles of 128 rows per head pair up; causal tiles (whose key blocks
    differ) and a head of 5 tiles run one CTA per tile as before. Read from the CUDA launch."""
    batch, heads = 3, 5
    x = jax.ShapeDtypeStruct((batch, seq, heads, 64), jnp.bfloat16)
    fwd = jax.jit(functools.partial(hopper.mosaic_forward, block_sizes=MosaicBlockSizes(kv_multicast=True),
                                    causal=causal, sm_scale=0.125))
    launches = _cuda_launches(fwd.trace(x, x, x).lower(lowering_platforms=("cuda",)))
    assert launches == [((batch * heads * seq // 128, 1, 1), (cluster, 1, 1) if cluster > 1 else None)]


def _kernel_eqns(jaxpr) -> list[tuple[str, object]]:
    """(kernel name, equation) of each Mosaic GPU kernel in a traced jaxpr."""
    found = []
    for eqn in jaxpr.eqns:
        if "compiler_params" in eqn.params and "name" in eqn.params:
            found.append((eqn.params["name"], eqn))
        for value in eqn.params.values():
            inner = getattr(value, "jaxpr", value)
            if hasattr(inner, "eqns"):
                found += _kernel_eqns(inner)
    return found


def _kernel_compiler_params(jaxpr) -> list[tuple[str, object]]:
    """(kernel name, compiler parameters) of each Mosaic GPU kernel in a traced jaxpr."""
    return [(name, eqn.params["compiler_params"]) for name, eqn in _kernel_eqns(jaxpr)]


@pytest.mark.skipif(not hopper.AVAILABLE, reason="jax.experimental.pallas.mosaic_gpu is not importable")
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "two-kernels"])
def test_lse_early_changes_only_the_dkdv_kernels(fused: bool) -> None:
    """lse_early is the dK/dV and fused backward's: the forward and the dQ
    kernel trace as before, those kernels do not, and they still lower for
    CUDA (the producer then runs on 24 registers)."""
    x = jax.ShapeDtypeStruct((1, 512, 2, 128), jnp.bfloat16)
    lse = jax.ShapeDtypeStruct((1, 2, 512), jnp.float32)
    base = dataclasses.replace(MosaicBlockSizes.get_default(128, 512, causal=True), fused_bwd=fused, dq_split=fused)
    early = dataclasses.replace(base, lse_early=True)
    kwargs = dict(causal=True, sm_scale=0.1)

    def kernels(blocks, which):
        fn = hopper.mosaic_forward if which == "fwd" else hopper.mosaic_backward
        args = (x, x, x) if which == "fwd" else (x, x, x, x, lse, x)
        jaxpr = jax.make_jaxpr(functools.partial(fn, block_sizes=blocks, **kwargs))(*args).jaxpr
        return {name: str(eqn) for name, eqn in _kernel_eqns(jaxpr)}

    assert kernels(base, "fwd") == kernels(early, "fwd")
    before, after = kernels(base, "bwd"), kernels(early, "bwd")
    dkdv = "flash_attention_mgpu_bwd_fused" if fused else "flash_attention_mgpu_bwd_dkdv"
    assert set(before) == set(after) == ({dkdv} if fused else {dkdv, "flash_attention_mgpu_bwd_dq"})
    assert before[dkdv] != after[dkdv]
    if not fused:
        assert before["flash_attention_mgpu_bwd_dq"] == after["flash_attention_mgpu_bwd_dq"]
    bwd = jax.jit(functools.partial(hopper.mosaic_backward, block_sizes=early, **kwargs))
    assert "mosaic_gpu" in bwd.trace(x, x, x, x, lse, x).lower(lowering_platforms=("cuda",)).as_text()


@pytest.mark.skipif(not hopper.AVAILABLE, reason="jax.experimental.pallas.mosaic_gpu is not importable")
def test_only_the_backward_kernels_drop_automatic_barriers() -> None:
    """The backward kernels are built without Pallas's automatic warpgroup
    barriers (their hazards are ordered by the kernels' own barriers), the
    forward with them."""
    x = jax.ShapeDtypeStruct((1, 512, 2, 128), jnp.bfloat16)
    lse = jax.ShapeDtypeStruct((1, 2, 512), jnp.float32)
    kwargs = dict(causal=True, sm_scale=0.1)
    params = []
    # The forward twice; the two-kernel and the fused backward.
    for blocks in (MosaicBlockSizes(), MosaicBlockSizes(fused_bwd=True, dq_split=True)):
        fwd = jax.make_jaxpr(functools.partial(hopper.mosaic_forward, block_sizes=blocks, **kwargs))(x, x, x)
        bwd = jax.make_jaxpr(functools.partial(hopper.mosaic_backward, block_sizes=blocks, **kwargs))(x, x, x, x, lse, x)
        params += _kernel_compiler_params(fwd.jaxpr) + _kernel_compiler_params(bwd.jaxpr)
    assert len(params) == 5
    assert {(name, p.unsafe_no_auto_barriers) for name, p in params} == {
        ("flash_attention_mgpu_fwd", False), ("flash_attention_mgpu_bwd_dq", True),
        ("flash_attention_mgpu_bwd_dkdv", True), ("flash_attention_mgpu_bwd_fused", True)}
    assert all(p.approx_math for _, p in params)


@pytest.mark.parametrize(("seq", "bq", "consumers", "bk"), [(1024, 64, 3, 128), (1000, 64, 3, 128),
                                                       (4096, 64, 2, 128), (520, 64, 2, 128)])
def test_consumer_key_blocks_skip_only_masked_work(seq, bq, consumers, bk) -> None:
    """Causal forward: of its tile's key blocks, a consumer runs without a
    mask exactly those below all of its rows' diagonals and skips exactly
    those above all of them; every key it needs stays in [0, end)."""
    tile, num_k_blocks = consumers * bq, -(-seq // bk)
    padded = -(-seq // 128) * 128
    skipped = total = 0
    for t in range(-(-padded // tile)):
        tile_start, n_blocks, n_free = (int(x) for x in pipeline.query_tile_key_blocks(
            jnp.int32(t), tile, bk, num_k_blocks, True, unmasked=num_k_blocks))
        for wg in range(consumers):
            row0 = min(tile_start + wg * bq, padded - bq)  # as the kernel clamps them
            free, end = (int(x) for x in pipeline.consumer_key_blocks(jnp.int32(row0), bq, bk, jnp.int32(n_free),
                                                                   jnp.int32(n_blocks), True))
            assert n_free <= free < end <= n_blocks
            rows = np.arange(row0, row0 + bq)
            for j in range(n_blocks):
                keys = np.arange(j * bk, (j + 1) * bk)
                needed = keys[None, :] <= rows[:, None]
                assert needed.all() == (j < free), (t, wg, j)
                assert (not needed.any()) == (j >= end), (t, wg, j)
            skipped += n_blocks - end
            total += n_blocks
    # Three 64-row consumers on 128-key blocks skip some blocks; two consumers
    # whose tile is one key block wide have none to skip.
    assert (skipped > 0) == (consumers * bq > bk)
    # Not causal: the tile's own counts.
    assert pipeline.consumer_key_blocks(jnp.int32(64), 64, 128, 7, 8, False) == (7, 8)


# Shapes that exercise every static branch of the kernels: ragged and exact
# lengths, causal and not, head_dim 64/80/128, both dtypes, every schedule.
LOWERING_CASES = [
    # K/V multicast to clusters of two: overlapped (a ragged tail) and three consumers.
    ((2, 1000, 2, 128), False, "bfloat16", MosaicBlockSizes(overlap=True, fwd_stagger=True, kv_multicast=True)),
    ((1, 1500, 2, 64), False, "float16", MosaicBlockSizes(consumers=3, kv_multicast=True)),
    ((1, 256, 2, 64), True, "bfloat16", None),
    ((1, 256, 2, 128), False, "float16", None),
    ((2, 200, 1, 80), True, "bfloat16", None),
    ((1, 300, 1, 80), False, "float16", None),
    ((1, 17, 1, 64), False, "bfloat16", None),
    # Round-robin turns at head_dim 128, and 128-row streamed tiles.
    ((1, 520, 1, 128), True, "bfloat16", MosaicBlockSizes(num_stages=3, block_k_dq=128, block_q_dkv=128)),
    # The forward with each consumer overlapping its own matmuls and softmax,
    # and with its consumers started half a step apart.
    ((1, 256, 2, 64), True, "bfloat16", MosaicBlockSizes(overlap=True, num_stages=3)),
    ((1, 300, 1, 80), False, "float16", MosaicBlockSizes(overlap=True)),
    ((1, 17, 1, 128), True, "bfloat16", MosaicBlockSizes(overlap=True)),
    ((1, 300, 2, 128), False, "bfloat16", MosaicBlockSizes(overlap=True, fwd_stagger=True)),
    ((1, 520, 1, 64), True, "float16", MosaicBlockSizes(overlap=True, fwd_stagger=True, num_stages=3)),
    # Three forward consumers (192-row tiles, the last one's consumers past
    # the end idle).
    ((2, 1024, 2, 64), True, "bfloat16", MosaicBlockSizes(consumers=3, num_stages=3)),
    ((1, 300, 1, 80), False, "float16", MosaicBlockSizes(consumers=3)),
    ((1, 520, 1, 64), True, "float16", MosaicBlockSizes(consumers=3, group_heads=False)),
    # The fused backward (dQ by TMA reduce-add) at other head dims and with
    # 128-query steps.
    ((1, 300, 2, 128), False, "float16", MosaicBlockSizes(fused_bwd=True)),
    ((2, 200, 1, 64), True, "bfloat16", MosaicBlockSizes(fused_bwd=True, block_q_dkv=128)),
    ((2, 200, 1, 80), True, "bfloat16", MosaicBlockSizes(fused_bwd=True)),
    # ... with dQ split by columns between the consumers (head_dim 128), and lagged.
    ((2, 200, 1, 128), True, "bfloat16", MosaicBlockSizes(fused_bwd=True, dq_split=True)),
    ((1, 300, 2, 128), False, "float16", MosaicBlockSizes(fused_bwd=True, dq_split=True)),
    ((2, 200, 1, 128), True, "bfloat16", MosaicBlockSizes(fused_bwd=True, dq_split=True, dq_lag=True)),
    ((1, 300, 2, 128), False, "float16", MosaicBlockSizes(fused_bwd=True, dq_split=True, dq_lag=True)),
    # lse loaded while S and dP run, and the diagonal's mask from a tile.
    ((2, 200, 1, 128), True, "bfloat16", MosaicBlockSizes(lse_early=True, mask_tile=True)),
    ((2, 1000, 1, 64), True, "bfloat16", MosaicBlockSizes(fused_bwd=True, lse_early=True)),
]


@pytest.mark.skipif(not hopper.AVAILABLE, reason="jax.experimental.pallas.mosaic_gpu is not importable")
@pytest.mark.parametrize(("shape", "causal", "dtype", "blocks"), LOWERING_CASES, ids=str)
def test_kernels_lower_for_cuda(shape, causal, dtype, blocks) -> None:
    """Forward and backward lower to Mosaic GPU for the CUDA platform. This
    runs Mosaic's layout inference and shared-memory allocation, so shape,
    layout and shared-memory errors show up here without a GPU."""
    blocks = blocks or MosaicBlockSizes.get_default(shape[-1])
    x = jax.ShapeDtypeStruct(shape, jnp.dtype(dtype))
    lse = jax.ShapeDtypeStruct((shape[0], shape[2], shape[1]), jnp.float32)
    kwargs = dict(causal=causal, sm_scale=1 / math.sqrt(shape[-1]), block_sizes=blocks)
    fwd = jax.jit(functools.partial(hopper.mosaic_forward, **kwargs))
    bwd = jax.jit(functools.partial(hopper.mosaic_backward, **kwargs))
    texts = [fwd.trace(x, x, x).lower(lowering_platforms=("cuda",)).as_text(),
             bwd.trace(x, x, x, x, lse, x).lower(lowering_platforms=("cuda",)).as_text()]
    assert all("mosaic_gpu" in t for t in texts)


# Backward schedules with and without mask_tile:
# (shape, causal, blocks, whether mask_tile changes the kernel).
MASK_TILE_CASES = [
    ((2, 200, 1, 128), True, MosaicBlockSizes(fused_bwd=True, dq_split=True), True),
    ((2, 1000, 1, 64), True, MosaicBlockSizes(fused_bwd=True), True),
    ((1, 300, 2, 128), True, MosaicBlockSizes(), True),
    ((2, 200, 1, 64), True, MosaicBlockSizes(fused_bwd=True, block_q_dkv=128), False),  # 64 keys, 128 queries
    ((1, 300, 2, 128), False, MosaicBlockSizes(fused_bwd=True, dq_split=True), False),
]


@pytest.mark.skipif(not hopper.AVAILABLE, reason="jax.experimental.pallas.mosaic_gpu is not importable")
@pytest.mark.parametrize(("shape", "causal", "blocks", "changes"), MASK_TILE_CASES, ids=str)
def test_mask_tile_lowers_and_changes_only_square_causal_steps(shape, causal, blocks, changes) -> None:
    """With the diagonal's mask read from a shared-memory tile, the causal
    backward kernels still lower for CUDA; mask_tile changes exactly the
    causal kernels with square steps (BLOCK_K_DKV == block_q_dkv)."""
    x = jax.ShapeDtypeStruct(shape, jnp.bfloat16)
    lse = jax.ShapeDtypeStruct((shape[0], shape[2], shape[1]), jnp.float32)

    def bwd(tile: bool):
        blocks_here = dataclasses.replace(blocks, mask_tile=tile)
        return lambda *a: hopper.mosaic_backward(*a, causal=causal, sm_scale=1 / math.sqrt(shape[-1]),
                                                 block_sizes=blocks_here)

    off, on = (str(jax.make_jaxpr(bwd(tile))(x, x, x, x, lse, x)) for tile in (False, True))
    assert (on != off) == changes
    text = jax.jit(bwd(True)).trace(x, x, x, x, lse, x).lower(lowering_platforms=("cuda",)).as_text()
    assert "mosaic_gpu" in text


@pytest.mark.skipif(not hopper.AVAILABLE, reason="jax.experimental.pallas.mosaic_gpu is not importable")
def test_dq_lag_changes_only_the_fused_kernel() -> None:
    """dq_lag changes the split fused backward and not the forward."""
    x = jax.ShapeDtypeStruct((1, 300, 2, 128), jnp.bfloat16)
    lse = jax.ShapeDtypeStruct((1, 2, 300), jnp.float32)
    kw = dict(causal=False, sm_scale=0.1)
    variants = (MosaicBlockSizes(fused_bwd=True, dq_split=True), MosaicBlockSizes(fused_bwd=True, dq_split=True,
                                                                                 dq_lag=True))
    off, on = (str(jax.make_jaxpr(lambda *a, b=b: hopper.mosaic_backward(*a, block_sizes=b, **kw))(
        x, x, x, x, lse, x)) for b in variants)
    assert on != off
    off, on = (str(jax.make_jaxpr(lambda *a, b=b: hopper.mosaic_forward(*a, block_sizes=b, **kw))(x, x, x))
               for b in variants)
    assert on == off


@pytest.mark.skipif(not hopper.AVAILABLE, reason="jax.experimental.pallas.mosaic_gpu is not importable")
def test_fwd_stagger_changes_only_the_forward() -> None:
    """fwd_stagger changes the overlapped forward and no backward kernel."""
    x = jax.ShapeDtypeStruct((1, 300, 2, 128), jnp.bfloat16)
    lse = jax.ShapeDtypeStruct((1, 2, 300), jnp.float32)
    kw = dict(causal=True, sm_scale=0.1)
    variants = (MosaicBlockSizes(overlap=True), MosaicBlockSizes(overlap=True, fwd_stagger=True))
    off, on = (str(jax.make_jaxpr(lambda *a, b=b: hopper.mosaic_forward(*a, block_sizes=b, **kw))(x, x, x))
               for b in variants)
    assert on != off
    off, on = (str(jax.make_jaxpr(lambda *a, b=b: hopper.mosaic_backward(*a, block_sizes=b, **kw))(x, x, x, x, lse, x))
               for b in variants)
    assert on == off


@pytest.mark.skipif(not hopper.AVAILABLE, reason="jax.experimental.pallas.mosaic_gpu is not importable")
def test_tiles_beyond_shared_memory_name_the_fix() -> None:
    """The fused backward at head_dim 128 with 128-query steps needs more
    shared memory than an SM has (321 KiB): a ValueError that names the
    kernel, the need, the limit and the fix, raised at trace time."""
    x = jax.ShapeDtypeStruct((1, 256, 1, 128), jnp.bfloat16)
    lse = jax.ShapeDtypeStruct((1, 1, 256), jnp.float32)
    bwd = jax.jit(functools.partial(hopper.mosaic_backward, causal=True, sm_scale=0.1,
                                    block_sizes=MosaicBlockSizes(fused_bwd=True, block_q_dkv=128)))
    need = r"fused backward: tiles need 328704 bytes of shared memory \(limit 224256\); use smaller blocks"
    with pytest.raises(ValueError, match=need):
        bwd.trace(x, x, x, x, lse, x)


@pytest.mark.skipif(not hopper.AVAILABLE, reason="jax.experimental.pallas.mosaic_gpu is not importable")
def test_dq_split_needs_head_dim_128() -> None:
    """Half of head_dim 64 is 32 key columns, less than one 128-byte swizzle
    row, which wgmma cannot take as an operand: a ValueError naming the fix."""
    x = jax.ShapeDtypeStruct((1, 256, 1, 64), jnp.bfloat16)
    lse = jax.ShapeDtypeStruct((1, 1, 256), jnp.float32)
    bwd = jax.jit(functools.partial(hopper.mosaic_backward, causal=False, sm_scale=0.1,
                                    block_sizes=MosaicBlockSizes(fused_bwd=True, dq_split=True)))
    with pytest.raises(ValueError, match=r"dq_split=True needs head_dim 128 .*got head_dim=64: use dq_split=False"):
        bwd.trace(x, x, x, x, lse, x)
