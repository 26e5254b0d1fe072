"""The Hopper (Pallas Mosaic GPU) FlashAttention kernels and their dispatch.

CPU part (always runs): block-size validation, the dispatcher's choices for
faked devices and dtypes, and lowering of every kernel to Mosaic GPU MLIR for
the CUDA platform (layout inference, shared-memory layout and barrier counts
are all checked at lowering time, without a GPU).

GPU part (skipped unless the first JAX device is a compute capability 9.x
GPU): the correctness sweep of the portable kernel run on the Mosaic kernels,
a comparison with torch SDPA on identical inputs, and a repeatability check
(a result that changes between identical runs means a race).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import math
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from harness.attention.tune import UNSPLIT_BWD
from pallas_kernels import MosaicBlockSizes, flash_attention, flash_attention_with_lse, mha_reference, reference_lse
from pallas_kernels import flash_attention_mgpu as mgpu
from tests.test_flash_attention import TOLERANCES, Case, errors, make_inputs, rel_err

# The module, not the function of the same name that the package exports.
fa = importlib.import_module("pallas_kernels.flash_attention")


def on_hopper() -> bool:
    device = jax.devices()[0]
    return device.platform == "gpu" and str(getattr(device, "compute_capability", "")).startswith("9.")


needs_hopper = pytest.mark.skipif(not on_hopper(), reason="needs a compute capability 9.x (Hopper) GPU")
HOPPER = types.SimpleNamespace(platform="gpu", compute_capability="9.0", device_kind="NVIDIA H100 80GB HBM3")
AMPERE = types.SimpleNamespace(platform="gpu", compute_capability="8.0", device_kind="NVIDIA A100-SXM4-80GB")


def _zeros(dtype="bfloat16", head_dim=64, seq=16):
    return jnp.zeros((1, seq, 1, head_dim), dtype)


# ----------------------------------------------------------------------------
# CPU: configuration and dispatch.


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"block_q": 96}, "block_q=96 must be 64 or 128"),
        ({"block_k_dkv": 32}, "block_k_dkv=32 must be 64 or 128"),
        ({"block_k": 100}, "block_k=100 must be 64, 128, 192 or 256"),
        ({"block_q_dkv": 512}, "block_q_dkv=512 must be 64, 128, 192 or 256"),
        ({"num_stages": 0}, "num_stages=0 must be an integer between 1 and 8"),
        ({"overlap": True, "paired": True}, "choose one"),
        ({"pingpong": False, "paired": True}, "also set pingpong=True"),
        ({"consumers": 4}, r"consumers=4 must be one of \(2, 3\)"),
        ({"consumers": 3, "block_q": 128}, "use block_q=64"),
        ({"dq_split": True}, "also set fused_bwd=True"),
        ({"fused_bwd": True, "split_order": True}, "also set fused_bwd=True and dq_split=True"),
        ({"lse_early": True, "bwd_overlap": False}, "needs bwd_overlap=True"),
        ({"bwd_registers": 248}, "bwd_registers=248 must be a multiple of 8 that leaves the producer 24-256"),
        ({"bwd_registers": 236}, "128 to 240"),
        ({"bwd_registers": 120}, "128 to 240"),
    ],
)
def test_block_sizes_validate(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        MosaicBlockSizes(**kwargs)


def test_seq_multiple() -> None:
    assert MosaicBlockSizes().seq_multiple == 128
    assert MosaicBlockSizes(block_k=192).seq_multiple == 384
    # Three 64-row forward consumers idle (or clamp) past the end of their
    # last tile: no 192-row padding.
    assert MosaicBlockSizes(consumers=3).seq_multiple == 128
    for head_dim in (64, 80, 128):
        assert isinstance(MosaicBlockSizes.get_default(head_dim), MosaicBlockSizes)


def test_default_backward_depends_on_length() -> None:
    """head_dim <= 64: the two kernels (128-query dK/dV steps) up to
    FUSED_BWD_MIN_SEQ, the fused kernel (64-query steps) above it and when
    the length is not known; head_dim 128: the two kernels at every length."""
    limit = mgpu.FUSED_BWD_MIN_SEQ
    for seq in (1, 1024, limit):
        short = MosaicBlockSizes.get_default(64, seq)
        assert (short.fused_bwd, short.block_q_dkv) == (False, 128)
    for seq in (limit + 1, 16384, None):
        long_ = MosaicBlockSizes.get_default(64, seq)
        assert (long_.fused_bwd, long_.block_q_dkv) == (True, 64)
    # The backward and the forward's consumers change at the limit, nothing else.
    assert dataclasses.replace(MosaicBlockSizes.get_default(64, limit), fused_bwd=True, block_q_dkv=64,
                               consumers=3) == MosaicBlockSizes.get_default(64)


def test_default_head_dim_128_backward_depends_on_causal_and_length() -> None:
    """head_dim 128: the fused kernel with dQ split by columns in FA3's step
    order, except causal up to FUSED_BWD128_CAUSAL_MIN_SEQ (and causal
    unknown counts as causal); the forward's tiles do not change; both
    read the diagonal's mask from a tile (mask_tile). Other
    head dims above 64 cannot split dQ and keep the two kernels."""
    limit = mgpu.FUSED_BWD128_CAUSAL_MIN_SEQ
    fused = dict(fused_bwd=True, dq_split=True, split_order=True, masked_loop=False)
    # The causal fused kernel loads lse early, with 240 registers per
    # consumer; the non-causal one lags its dQ product and staggers its consumers.
    early = dict(lse_early=True, bwd_registers=240)
    lagged = dict(dq_lag=True, stagger=True)
    two = MosaicBlockSizes.get_default(128, limit, causal=True)
    assert not two.fused_bwd and not two.lse_early and two.bwd_registers == 232
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
    """head_dim <= 64: two forward consumers (128-row tiles) up to
    THREE_CONSUMERS_MIN_SEQ, three (192-row tiles) above it and when the
    length is not known, and non-causal from
    THREE_CONSUMERS_NON_CAUSAL_MIN_SEQ; head_dim 128: two at every length."""
    limit, non_causal = mgpu.THREE_CONSUMERS_MIN_SEQ, mgpu.THREE_CONSUMERS_NON_CAUSAL_MIN_SEQ
    lengths = (1, 1000, non_causal - 1, non_causal, limit, limit + 1, 16384, None)
    for causal in (True, None):
        assert [MosaicBlockSizes.get_default(64, seq, causal).consumers for seq in lengths] == [
            2, 2, 2, 2, 2, 3, 3, 3]
    assert [MosaicBlockSizes.get_default(64, seq, False).consumers for seq in lengths] == [2, 2, 2, 3, 3, 3, 3, 3]
    assert {MosaicBlockSizes.get_default(128, seq).consumers for seq in (1024, 4096, None)} == {2}


def test_default_forward_is_persistent_at_every_length() -> None:
    """Every head_dim's default forward is persistent whatever the length,
    and at head_dim 128 the forward's tiles do not depend on the length
    (only the causal backward does, above)."""
    lengths = (1, 1024, 2048, 2049, 16384, None)
    assert all(MosaicBlockSizes.get_default(d, seq, causal=c).persistent
               for d in (64, 80, 128) for seq in lengths for c in (True, False, None))
    forward_fields = ("block_q", "block_k", "num_stages", "pingpong", "paired", "overlap", "consumers", "persistent")
    assert {tuple(getattr(MosaicBlockSizes.get_default(128, seq, causal=c), f) for f in forward_fields)
            for seq in lengths for c in (True, False)} == {
        tuple(getattr(MosaicBlockSizes.get_default(128), f) for f in forward_fields)}


@pytest.mark.skipif(not mgpu.AVAILABLE, reason="jax.experimental.pallas.mosaic_gpu is not importable")
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
    got = mgpu.unsupported_reason(_zeros(dtype, head_dim), interpret=interpret, device=device)
    if reason is None:
        assert got is None
    else:
        assert reason in got


def _pretend_mosaic_runs(monkeypatch) -> None:
    """Makes the dispatcher believe it is on a Hopper GPU (for bf16/fp16)."""
    def reason(q, *, interpret):
        return mgpu.unsupported_reason(q, interpret=interpret, device=HOPPER)

    monkeypatch.setitem(fa._BACKENDS, "mosaic", dataclasses.replace(fa._BACKENDS["mosaic"], unsupported_reason=reason))


@pytest.mark.skipif(not mgpu.AVAILABLE, reason="jax.experimental.pallas.mosaic_gpu is not importable")
def test_auto_picks_mosaic_on_hopper(monkeypatch) -> None:
    _pretend_mosaic_runs(monkeypatch)
    assert fa._resolve_backend(None, _zeros("bfloat16")) == "mosaic"
    assert fa._resolve_backend("auto", _zeros("float16", 80)) == "mosaic"
    # Fallbacks under auto: float32, unsupported head_dim, interpret mode,
    # and the portable family's block sizes.
    assert fa._resolve_backend("auto", _zeros("float32")) == "triton"
    assert fa._resolve_backend("auto", _zeros("bfloat16", 256)) == "triton"
    assert fa._resolve_backend("auto", _zeros("bfloat16"), interpret=True) == "triton"
    assert fa._resolve_backend("auto", _zeros("bfloat16"), fa.BlockSizes()) == "triton"
    assert fa._resolve_backend("triton", _zeros("bfloat16")) == "triton"
    # The default tiles follow the inputs' length, and at head_dim 128 also
    # whether the attention is causal.
    for head_dim, seq, causal, fused in ((64, 1024, True, False), (64, 4096, True, True), (128, 1024, False, True),
                                         (128, 1024, True, False), (128, 4096, True, True)):
        x = _zeros("bfloat16", head_dim, seq=seq)
        assert fa._prepare(x, x, x, causal, None, None, None, False)[2].fused_bwd is fused, (head_dim, seq, causal)
    # Forcing the Hopper kernels with inputs they cannot run names the reason.
    with pytest.raises(ValueError, match="backend='mosaic' cannot run these inputs: dtype=float32"):
        fa._resolve_backend("mosaic", _zeros("float32"))


def test_cpu_dispatch_falls_back() -> None:
    """On this (non-Hopper) machine auto uses the portable kernel and forcing
    the Hopper kernel raises a ValueError that says why."""
    if on_hopper():
        pytest.skip("runs on a machine without a Hopper GPU")
    q = _zeros("bfloat16")
    assert fa._resolve_backend(None, q) == "triton"
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
    runs = _runs(mgpu._list_schedule([1.0] * n_work, n_programs))
    assert runs == [list(range(p, n_work, n_programs)) for p in range(n_programs)]


def test_list_schedule_balances_grouped_causal_tiles() -> None:
    """Causal tiles of 64 heads x 32 tiles, in groups of 8 heads longest
    first (head_dim 128, seq 4096): list scheduling leaves the busiest of 132
    programs within 0.2% of the mean, where the snake over the same order
    gave 1.68x the mean, which is the 0.58-0.61x measured when the causal
    forward was grouped under it."""
    n_heads, num_tiles, n_programs = 64, 32, 132
    order = mgpu._work_order(n_heads, num_tiles, group=8, causal=True)
    cost = [int(code) % num_tiles + 2 for code in order]  # t + 1 key blocks, plus one

    def busiest_over_mean(runs):
        totals = [sum(cost[i] for i in run) for run in runs]
        assert sorted(i for run in runs for i in run) == list(range(len(order)))
        return max(totals) / (sum(totals) / n_programs)

    assert busiest_over_mean(_runs(mgpu._list_schedule(cost, n_programs))) < 1.002
    assert busiest_over_mean(_snake(len(order), n_programs)) > 1.6


def test_head_group_fits_l2_and_divides() -> None:
    """As many heads as fit the L2 working set, but a divisor of their count."""
    mib = 2**20
    assert mgpu._head_group(64, 2 * mib) == 8  # head_dim 128, seq 4096: 2 MiB of K/V per head
    assert mgpu._head_group(12, 2 * mib) == 6
    assert mgpu._head_group(7, 2 * mib) == 7
    assert mgpu._head_group(64, 64 * mib) == 1
    assert mgpu._head_group(512, mib // 4) == 64


def test_work_order_covers_the_grid_in_groups() -> None:
    """Each (batch x head, tile) exactly once, heads in groups of `group`,
    causal tiles longest first within a group and the others in order."""
    n_heads, num_tiles, group = 12, 5, 4
    for causal in (True, False):
        order = [divmod(int(code), num_tiles) for code in mgpu._work_order(n_heads, num_tiles, group=group,
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
    group = mgpu._head_group(batch * heads, bytes_per_head)

    def key_blocks(t):
        return t + 1 if causal else num_tiles

    table = mgpu._forward_schedule(batch, heads, num_tiles, n_programs, causal=causal, key_blocks=key_blocks,
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
    """group_heads=False, the head_dim 128 non-causal default up to
    ONE_HEAD_AT_A_TIME_MAX_SEQ: at seq 1024 (16 x 16 heads, 8 tiles each) the
    132 programs work on 17 heads at a time, all tiles of each in the same
    wave, where the grouped order (groups of 32 heads, each group's tiles
    over two waves) has up to 64."""
    batch, heads, num_tiles, n_programs = 16, 16, 8, 132
    bytes_per_head = 2 * 1024 * 256

    def key_blocks(t):
        return num_tiles

    def table(group_heads):
        return mgpu._forward_schedule(batch, heads, num_tiles, n_programs, causal=False, key_blocks=key_blocks,
                                      bytes_per_head=bytes_per_head, group_heads=group_heads)

    assert _busiest_heads_at_once(table(False), batch * heads, num_tiles, key_blocks) == 17
    assert _busiest_heads_at_once(table(True), batch * heads, num_tiles, key_blocks) == 64
    limit = mgpu.ONE_HEAD_AT_A_TIME_MAX_SEQ
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
        return mgpu._forward_tile_cost(t, tile=tile, block_k=bk, num_k_blocks=num_k_blocks, padded_len=seq,
                                       causal=causal, idle_past_end=idle)

    assert cost(num_tiles - 1, True) == cost(num_tiles - 1, False) * (seq % tile) / tile
    assert [cost(t, True) for t in range(num_tiles - 1)] == [cost(t, False) for t in range(num_tiles - 1)]

    def imbalance(idle):
        table = mgpu._forward_schedule(16384 // seq, 32, num_tiles, n_programs, causal=causal,
                                       key_blocks=lambda t: cost(t, idle), bytes_per_head=2 * seq * 128)
        loads = [sum(cost(int(c) % num_tiles, True) + 1 for c in row[1:1 + row[0]]) for row in table]
        return max(loads) / np.mean(loads)

    assert imbalance(True) < 1.02
    assert imbalance(False) > 1.04


def _cuda_launch_grids(lowered) -> list[tuple[int, ...]]:
    """The CUDA grid (x, y, z) of every Mosaic GPU kernel in a lowered
    program, read from the kernels' serialized MLIR."""
    from jax._src.interpreters import mlir
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
        with context:
            for inner in walk(ir.Module.parse(module).operation):
                if inner.name.endswith("gpu.launch"):
                    # Operands: async token, then grid x, y, z, block x, y, z.
                    grids.append(tuple(ir.IntegerAttr(value.owner.attributes["value"]).value
                                       for value in list(inner.operands)[1:4]))
    return grids


@pytest.mark.skipif(not mgpu.AVAILABLE, reason="jax.experimental.pallas.mosaic_gpu is not importable")
def test_tile_grids_launch_batch_then_tiles_then_heads() -> None:
    """Mosaic GPU launches a Pallas grid reversed. Every one-program-per-tile
    kernel (the forward grid, dQ, dK/dV, the fused backward) must come out
    as CUDA grid (batch, tiles, heads): batch fastest, then tiles, so the
    programs running at once share a few heads' blocks (_tile_grid). The
    persistent forward is one row of programs."""
    batch, seq, heads, head_dim = 3, 512, 5, 64
    x = jax.ShapeDtypeStruct((batch, seq, heads, head_dim), jnp.bfloat16)
    lse = jax.ShapeDtypeStruct((batch, heads, seq), jnp.float32)
    tiles = seq // 128  # 2 x 64 rows per program, forward and backward
    kwargs = dict(causal=True, sm_scale=0.125)
    for fused in (False, True):
        blocks = MosaicBlockSizes(persistent=False, fused_bwd=fused)
        fwd = jax.jit(functools.partial(mgpu.mosaic_forward, block_sizes=blocks, **kwargs))
        bwd = jax.jit(functools.partial(mgpu.mosaic_backward, block_sizes=blocks, **kwargs))
        grids = (_cuda_launch_grids(fwd.trace(x, x, x).lower(lowering_platforms=("cuda",)))
                 + _cuda_launch_grids(bwd.trace(x, x, x, x, lse, x).lower(lowering_platforms=("cuda",))))
        assert grids == [(batch, tiles, heads)] * (2 if fused else 3)
    persistent = jax.jit(functools.partial(mgpu.mosaic_forward, block_sizes=MosaicBlockSizes(persistent=True),
                                           **kwargs))
    assert _cuda_launch_grids(persistent.trace(x, x, x).lower(lowering_platforms=("cuda",))) == [
        (min(batch * heads * tiles, 132), 1, 1)]


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


# (shape, causal, blocks, whether half_diagonal changes the forward kernel).
HALF_DIAGONAL_CASES = [
    ((2, 1024, 2, 64), True, MosaicBlockSizes.get_default(64, 1024, True), True),  # two consumers
    ((2, 2048, 2, 64), True, MosaicBlockSizes.get_default(64, 2048, True), True),  # three
    ((1, 300, 1, 64), True, MosaicBlockSizes(persistent=False), True),  # one program per tile
    ((2, 1024, 2, 64), False, MosaicBlockSizes.get_default(64, 1024, False), False),  # no diagonal
    ((2, 1024, 2, 128), True, MosaicBlockSizes.get_default(128, 1024, True), False),  # overlap: no turns
    ((1, 300, 1, 64), True, MosaicBlockSizes(paired=True), False),
    ((1, 300, 1, 64), True, MosaicBlockSizes(block_k=64), False),  # 64-key steps: rows fill the diagonal block
]


@pytest.mark.skipif(not mgpu.AVAILABLE, reason="jax.experimental.pallas.mosaic_gpu is not importable")
@pytest.mark.parametrize(("shape", "causal", "blocks", "changes"), HALF_DIAGONAL_CASES, ids=str)
def test_half_diagonal_changes_only_the_causal_turn_taking_forward(shape, causal, blocks, changes) -> None:
    """half_diagonal applies to the causal forward with turns and 128-key
    steps, where a 64-row consumer's diagonal block is half masked, and
    there the kernel still lowers for CUDA (the half block is a slice of the
    swizzled K and V tiles)."""
    x = jax.ShapeDtypeStruct(shape, jnp.bfloat16)

    def fwd(half: bool):
        kw = dict(causal=causal, sm_scale=1 / math.sqrt(shape[-1]),
                  block_sizes=dataclasses.replace(blocks, half_diagonal=half))
        return jax.jit(lambda q, k, v: mgpu.mosaic_forward(q, k, v, **kw))

    off, on = (str(jax.make_jaxpr(fwd(half))(x, x, x)) for half in (False, True))
    assert (on != off) == changes
    assert "mosaic_gpu" in fwd(True).trace(x, x, x).lower(lowering_platforms=("cuda",)).as_text()


@pytest.mark.skipif(not mgpu.AVAILABLE, reason="jax.experimental.pallas.mosaic_gpu is not importable")
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "two-kernels"])
def test_lse_early_and_bwd_registers_change_only_the_dkdv_kernels(fused: bool) -> None:
    """lse_early and bwd_registers are the dK/dV and fused backward's: the
    forward and the dQ kernel trace as before, those kernels do not, and
    they still lower for CUDA (the producer then runs on 24 registers)."""
    x = jax.ShapeDtypeStruct((1, 512, 2, 128), jnp.bfloat16)
    lse = jax.ShapeDtypeStruct((1, 2, 512), jnp.float32)
    base = dataclasses.replace(MosaicBlockSizes.get_default(128, 512, causal=True), fused_bwd=fused,
                               dq_split=fused, split_order=fused, masked_loop=not fused)
    registers = dataclasses.replace(base, bwd_registers=240)
    early = dataclasses.replace(registers, lse_early=True)
    kwargs = dict(causal=True, sm_scale=0.1)

    def kernels(blocks, which):
        fn = mgpu.mosaic_forward if which == "fwd" else mgpu.mosaic_backward
        args = (x, x, x) if which == "fwd" else (x, x, x, x, lse, x)
        jaxpr = jax.make_jaxpr(functools.partial(fn, block_sizes=blocks, **kwargs))(*args).jaxpr
        return {name: str(eqn) for name, eqn in _kernel_eqns(jaxpr)}

    assert kernels(base, "fwd") == kernels(early, "fwd")
    before, middle, after = kernels(base, "bwd"), kernels(registers, "bwd"), kernels(early, "bwd")
    dkdv = "flash_attention_mgpu_bwd_fused" if fused else "flash_attention_mgpu_bwd_dkdv"
    assert set(before) == set(middle) == set(after) == ({dkdv} if fused else {dkdv, "flash_attention_mgpu_bwd_dq"})
    # Each field on its own changes the kernel.
    assert len({before[dkdv], middle[dkdv], after[dkdv]}) == 3
    if not fused:
        assert before["flash_attention_mgpu_bwd_dq"] == after["flash_attention_mgpu_bwd_dq"]
    bwd = jax.jit(functools.partial(mgpu.mosaic_backward, block_sizes=early, **kwargs))
    assert "mosaic_gpu" in bwd.trace(x, x, x, x, lse, x).lower(lowering_platforms=("cuda",)).as_text()


@pytest.mark.skipif(not mgpu.AVAILABLE, reason="jax.experimental.pallas.mosaic_gpu is not importable")
def test_only_the_backward_kernels_drop_automatic_barriers() -> None:
    """The backward kernels are built without Pallas's automatic warpgroup
    barriers (1.02-1.05x on an H100; their hazards are ordered by the
    kernels' own barriers), the forward with them (0.95-0.98x without)."""
    x = jax.ShapeDtypeStruct((1, 512, 2, 128), jnp.bfloat16)
    lse = jax.ShapeDtypeStruct((1, 2, 512), jnp.float32)
    kwargs = dict(causal=True, sm_scale=0.1)
    params = []
    # The one-program-per-tile and the persistent forward; the two-kernel and the fused backward.
    for blocks in (MosaicBlockSizes(), MosaicBlockSizes(persistent=True, fused_bwd=True, dq_split=True,
                                                        split_order=True)):
        fwd = jax.make_jaxpr(functools.partial(mgpu.mosaic_forward, block_sizes=blocks, **kwargs))(x, x, x)
        bwd = jax.make_jaxpr(functools.partial(mgpu.mosaic_backward, block_sizes=blocks, **kwargs))(x, x, x, x, lse, x)
        params += _kernel_compiler_params(fwd.jaxpr) + _kernel_compiler_params(bwd.jaxpr)
    assert len(params) == 5
    assert {(name, p.unsafe_no_auto_barriers) for name, p in params} == {
        ("flash_attention_mgpu_fwd", False), ("flash_attention_mgpu_bwd_dq", True),
        ("flash_attention_mgpu_bwd_dkdv", True), ("flash_attention_mgpu_bwd_fused", True)}
    assert all(p.approx_math for _, p in params)


@pytest.mark.parametrize(("seq", "bq", "consumers", "bk"), [(1024, 64, 3, 128), (1000, 64, 3, 128),
                                                       (4096, 64, 2, 128), (520, 128, 2, 64)])
def test_consumer_key_blocks_skip_only_masked_work(seq, bq, consumers, bk) -> None:
    """Causal forward: of its tile's key blocks, a consumer runs without a
    mask exactly those below all of its rows' diagonals and skips exactly
    those above all of them; every key it needs stays in [0, end)."""
    tile, num_k_blocks = consumers * bq, -(-seq // bk)
    padded = -(-seq // 128) * 128
    skipped = total = 0
    for t in range(-(-padded // tile)):
        tile_start, n_blocks, n_free = (int(x) for x in mgpu._query_tile_key_blocks(
            jnp.int32(t), tile, bk, num_k_blocks, True, unmasked=num_k_blocks))
        for wg in range(consumers):
            row0 = min(tile_start + wg * bq, padded - bq)  # as the kernel clamps them (overlap, paired)
            free, end = (int(x) for x in mgpu._consumer_key_blocks(jnp.int32(row0), bq, bk, jnp.int32(n_free),
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
    assert mgpu._consumer_key_blocks(jnp.int32(64), 64, 128, 7, 8, False) == (7, 8)


# Shapes that exercise every static branch of the three kernels: ragged and
# exact lengths, causal and not, head_dim 64/80/128, both dtypes, two block
# configurations (the second: 128-row warpgroup tiles, 3 stages, 64-key steps).
LOWERING_CASES = [
    ((1, 256, 2, 64), True, "bfloat16", None),
    ((1, 256, 2, 128), False, "float16", None),
    ((2, 200, 1, 80), True, "bfloat16", None),
    ((1, 300, 1, 80), False, "float16", None),
    ((1, 17, 1, 64), False, "bfloat16", None),
    ((1, 520, 1, 128), True, "bfloat16",
     MosaicBlockSizes(block_q=128, block_k=64, num_stages=3, block_q_dq=128, block_k_dq=128, block_k_dkv=128,
                      num_stages_bwd=3, pingpong=False)),
    # The forward with each consumer overlapping its own matmuls and softmax.
    ((1, 256, 2, 64), True, "bfloat16", MosaicBlockSizes(pingpong=False, overlap=True, num_stages=3)),
    ((1, 300, 1, 80), False, "float16", MosaicBlockSizes(pingpong=False, overlap=True)),
    ((1, 17, 1, 128), True, "bfloat16", MosaicBlockSizes(pingpong=False, overlap=True, block_k=64)),
    # Ping-pong turns that issue P V and the next S together.
    ((1, 256, 2, 64), True, "bfloat16", MosaicBlockSizes(paired=True, num_stages=3)),
    ((1, 300, 1, 80), False, "float16", MosaicBlockSizes(paired=True)),
    ((1, 17, 1, 128), True, "bfloat16", MosaicBlockSizes(paired=True, block_k=64)),
    ((1, 256, 2, 128), False, "bfloat16", MosaicBlockSizes(overlap=True)),
    ((1, 520, 1, 64), True, "float16", MosaicBlockSizes(overlap=True, consumers=3, persistent=True)),
    ((2, 1024, 2, 64), True, "bfloat16", MosaicBlockSizes(consumers=3, paired=True, persistent=True)),
    ((1, 520, 1, 128), False, "bfloat16", MosaicBlockSizes(paired=True, persistent=True)),
    # Three forward consumers (192-row tiles, the last one's consumers past
    # the end idle), with their round-robin turns, and clamped onto the last
    # rows in the overlapped schedule.
    ((2, 1024, 2, 64), True, "bfloat16", MosaicBlockSizes(consumers=3, num_stages=3)),
    ((1, 300, 1, 80), False, "float16", MosaicBlockSizes(consumers=3)),
    ((1, 256, 1, 64), False, "bfloat16", MosaicBlockSizes(consumers=3, pingpong=False, overlap=True)),
    # The fused backward (dQ by TMA reduce-add); the head_dim 64 default
    # uses it, so here the other head dims and 128-query steps.
    ((1, 300, 2, 128), False, "float16", MosaicBlockSizes(fused_bwd=True)),
    ((2, 200, 1, 64), True, "bfloat16", MosaicBlockSizes(fused_bwd=True, block_q_dkv=128)),
    ((2, 200, 1, 80), True, "bfloat16", MosaicBlockSizes(fused_bwd=True)),
    # ... with dQ split by columns between the consumers (head_dim 128).
    ((2, 200, 1, 128), True, "bfloat16", MosaicBlockSizes(fused_bwd=True, dq_split=True)),
    ((1, 300, 2, 128), False, "float16", MosaicBlockSizes(fused_bwd=True, dq_split=True)),
    # ... in FA3's step order (dV before the exchange, dK over the dQ store).
    ((2, 200, 1, 128), True, "bfloat16", MosaicBlockSizes(fused_bwd=True, dq_split=True, split_order=True)),
    ((1, 300, 2, 128), False, "float16", MosaicBlockSizes(fused_bwd=True, dq_split=True, split_order=True)),
    # ... with the consumers half a step apart, each multiplying the previous
    # block's dS^T for dQ (the first step peeled out of the loop).
    ((2, 200, 1, 128), True, "bfloat16", MosaicBlockSizes(fused_bwd=True, dq_split=True, split_order=True,
                                                          dq_lag=True, stagger=True)),
    ((1, 300, 2, 128), False, "float16", MosaicBlockSizes(fused_bwd=True, dq_split=True, split_order=True,
                                                          dq_lag=True)),
    ((2, 1000, 1, 64), True, "bfloat16", MosaicBlockSizes(fused_bwd=True, stagger=True)),
    # Causal backward in one loop (the diagonal's mask under a branch).
    ((2, 200, 1, 128), True, "bfloat16", MosaicBlockSizes(fused_bwd=True, dq_split=True, split_order=True,
                                                          masked_loop=False)),
    ((2, 1000, 1, 64), True, "float16", MosaicBlockSizes(fused_bwd=True, masked_loop=False)),
    ((1, 300, 2, 128), True, "bfloat16", MosaicBlockSizes(masked_loop=False)),
    # Backward consumers that wait for S and dP together (bwd_overlap=False),
    # in each backward schedule.
    ((2, 200, 1, 128), True, "bfloat16", MosaicBlockSizes(bwd_overlap=False)),
    ((1, 300, 2, 64), False, "float16", MosaicBlockSizes(bwd_overlap=False, fused_bwd=True)),
    ((2, 200, 1, 128), True, "bfloat16", MosaicBlockSizes(bwd_overlap=False, fused_bwd=True, dq_split=True)),
    # The persistent forward (one program per SM walking tiles), each schedule.
    ((2, 1024, 2, 64), True, "bfloat16", MosaicBlockSizes(consumers=3, persistent=True)),
    ((1, 300, 2, 128), False, "float16", MosaicBlockSizes(persistent=True)),
    ((1, 520, 1, 80), True, "bfloat16", MosaicBlockSizes(persistent=True, pingpong=False, overlap=True)),
    # ... with the forward's consumers started half a step apart.
    ((1, 300, 2, 128), False, "bfloat16", MosaicBlockSizes(persistent=True, pingpong=False, overlap=True,
                                                           fwd_stagger=True)),
    ((1, 520, 1, 64), True, "float16", MosaicBlockSizes(consumers=3, pingpong=False, overlap=True,
                                                        fwd_stagger=True)),
]


@pytest.mark.skipif(not mgpu.AVAILABLE, reason="jax.experimental.pallas.mosaic_gpu is not importable")
@pytest.mark.parametrize(("shape", "causal", "dtype", "blocks"), LOWERING_CASES, ids=str)
def test_kernels_lower_for_cuda(shape, causal, dtype, blocks) -> None:
    """Forward and backward lower to Mosaic GPU for the CUDA platform. This
    runs Mosaic's layout inference and shared-memory allocation, so shape,
    layout and shared-memory errors show up here without a GPU."""
    blocks = blocks or MosaicBlockSizes.get_default(shape[-1])
    x = jax.ShapeDtypeStruct(shape, jnp.dtype(dtype))
    lse = jax.ShapeDtypeStruct((shape[0], shape[2], shape[1]), jnp.float32)
    kwargs = dict(causal=causal, sm_scale=1 / math.sqrt(shape[-1]), block_sizes=blocks)
    fwd = jax.jit(functools.partial(mgpu.mosaic_forward, **kwargs))
    bwd = jax.jit(functools.partial(mgpu.mosaic_backward, **kwargs))
    texts = [fwd.trace(x, x, x).lower(lowering_platforms=("cuda",)).as_text(),
             bwd.trace(x, x, x, x, lse, x).lower(lowering_platforms=("cuda",)).as_text()]
    assert all("mosaic_gpu" in t for t in texts)


# Backward schedules with and without mask_tile:
# (shape, causal, blocks, whether mask_tile changes the kernel).
MASK_TILE_CASES = [
    ((2, 200, 1, 128), True, MosaicBlockSizes(fused_bwd=True, dq_split=True, split_order=True, masked_loop=False), True),
    ((2, 1000, 1, 64), True, MosaicBlockSizes(fused_bwd=True, masked_loop=False), True),
    ((2, 1000, 1, 64), True, MosaicBlockSizes(fused_bwd=True), True),
    ((1, 300, 2, 128), True, MosaicBlockSizes(), True),
    ((1, 300, 2, 128), True, MosaicBlockSizes(masked_loop=False), True),
    ((2, 200, 1, 64), True, MosaicBlockSizes(fused_bwd=True, block_q_dkv=128), False),  # 64 keys, 128 queries
    ((1, 300, 2, 128), False, MosaicBlockSizes(fused_bwd=True, dq_split=True, split_order=True), False),
]


@pytest.mark.skipif(not mgpu.AVAILABLE, reason="jax.experimental.pallas.mosaic_gpu is not importable")
@pytest.mark.parametrize(("shape", "causal", "blocks", "changes"), MASK_TILE_CASES, ids=str)
def test_mask_tile_lowers_and_changes_only_square_causal_steps(shape, causal, blocks, changes) -> None:
    """With the diagonal's mask read from a shared-memory tile, the causal
    backward kernels still lower for CUDA; mask_tile changes exactly the
    causal kernels with square steps (block_k_dkv == block_q_dkv)."""
    x = jax.ShapeDtypeStruct(shape, jnp.bfloat16)
    lse = jax.ShapeDtypeStruct((shape[0], shape[2], shape[1]), jnp.float32)

    def bwd(tile: bool):
        blocks_here = dataclasses.replace(blocks, mask_tile=tile)
        return lambda *a: mgpu.mosaic_backward(*a, causal=causal, sm_scale=1 / math.sqrt(shape[-1]),
                                               block_sizes=blocks_here)

    off, on = (str(jax.make_jaxpr(bwd(tile))(x, x, x, x, lse, x)) for tile in (False, True))
    assert (on != off) == changes
    text = jax.jit(bwd(True)).trace(x, x, x, x, lse, x).lower(lowering_platforms=("cuda",)).as_text()
    assert "mosaic_gpu" in text


# (blocks, the switches turned on, whether they change the backward): dq_lag
# applies to the split_order fused kernel only, stagger to every fused one.
LAG_STAGGER_CASES = [
    (MosaicBlockSizes(fused_bwd=True, dq_split=True, split_order=True), dict(dq_lag=True), True),
    (MosaicBlockSizes(fused_bwd=True, dq_split=True, split_order=True), dict(stagger=True), True),
    (MosaicBlockSizes(fused_bwd=True), dict(stagger=True), True),
    (MosaicBlockSizes(fused_bwd=True, dq_split=True), dict(dq_lag=True), False),
    (MosaicBlockSizes(fused_bwd=True), dict(dq_lag=True), False),
    (MosaicBlockSizes(), dict(dq_lag=True, stagger=True), False),
]


@pytest.mark.skipif(not mgpu.AVAILABLE, reason="jax.experimental.pallas.mosaic_gpu is not importable")
@pytest.mark.parametrize(("blocks", "switches", "changes"), LAG_STAGGER_CASES, ids=str)
def test_lag_and_stagger_change_only_the_fused_kernels(blocks, switches, changes) -> None:
    """dq_lag and stagger change exactly the backward kernels they apply to;
    the others ignore them (the same jaxpr, so the same kernels)."""
    x = jax.ShapeDtypeStruct((1, 300, 2, 128), jnp.bfloat16)
    lse = jax.ShapeDtypeStruct((1, 2, 300), jnp.float32)

    def bwd(b):
        return lambda *a: mgpu.mosaic_backward(*a, causal=False, sm_scale=0.1, block_sizes=b)

    variants = (blocks, dataclasses.replace(blocks, **switches))
    off, on = (str(jax.make_jaxpr(bwd(b))(x, x, x, x, lse, x)) for b in variants)
    assert (on != off) == changes


# (blocks, whether fwd_stagger changes the forward): it applies to the
# overlapped forward without turns, persistent or not, and to nothing else.
FWD_STAGGER_CASES = [
    (MosaicBlockSizes(pingpong=False, overlap=True, persistent=True), True),
    (MosaicBlockSizes(pingpong=False, overlap=True), True),
    (MosaicBlockSizes(pingpong=True, overlap=True, persistent=True), False),
    (MosaicBlockSizes(pingpong=True, paired=True), False),
    (MosaicBlockSizes(), False),
]


@pytest.mark.skipif(not mgpu.AVAILABLE, reason="jax.experimental.pallas.mosaic_gpu is not importable")
@pytest.mark.parametrize(("blocks", "changes"), FWD_STAGGER_CASES, ids=str)
def test_fwd_stagger_changes_only_the_overlapped_forward(blocks, changes) -> None:
    """fwd_stagger changes the forward kernels it applies to and no backward
    kernel (the same jaxpr where it is ignored)."""
    x = jax.ShapeDtypeStruct((1, 300, 2, 128), jnp.bfloat16)
    lse = jax.ShapeDtypeStruct((1, 2, 300), jnp.float32)
    kw = dict(causal=True, sm_scale=0.1)
    variants = (blocks, dataclasses.replace(blocks, fwd_stagger=True))
    off, on = (str(jax.make_jaxpr(lambda *a, b=b: mgpu.mosaic_forward(*a, block_sizes=b, **kw))(x, x, x))
               for b in variants)
    assert (on != off) == changes
    off, on = (str(jax.make_jaxpr(lambda *a, b=b: mgpu.mosaic_backward(*a, block_sizes=b, **kw))(x, x, x, x, lse, x))
               for b in variants)
    assert on == off


@pytest.mark.skipif(not mgpu.AVAILABLE, reason="jax.experimental.pallas.mosaic_gpu is not importable")
def test_tiles_beyond_shared_memory_name_the_fix() -> None:
    """The fused backward at head_dim 128 with 128-query steps needs more
    shared memory than an SM has (321 KiB): a ValueError that names the
    kernel, the need, the limit and the fix, raised at trace time."""
    x = jax.ShapeDtypeStruct((1, 256, 1, 128), jnp.bfloat16)
    lse = jax.ShapeDtypeStruct((1, 1, 256), jnp.float32)
    bwd = jax.jit(functools.partial(mgpu.mosaic_backward, causal=True, sm_scale=0.1,
                                    block_sizes=MosaicBlockSizes(fused_bwd=True, block_q_dkv=128)))
    need = r"fused backward: tiles need 328704 bytes of shared memory \(limit 224256\); use smaller blocks"
    with pytest.raises(ValueError, match=need):
        bwd.trace(x, x, x, x, lse, x)


@pytest.mark.skipif(not mgpu.AVAILABLE, reason="jax.experimental.pallas.mosaic_gpu is not importable")
def test_dq_split_needs_head_dim_128() -> None:
    """Half of head_dim 64 is 32 key columns, less than one 128-byte swizzle
    row, which wgmma cannot take as an operand: a ValueError naming the fix."""
    x = jax.ShapeDtypeStruct((1, 256, 1, 64), jnp.bfloat16)
    lse = jax.ShapeDtypeStruct((1, 1, 256), jnp.float32)
    bwd = jax.jit(functools.partial(mgpu.mosaic_backward, causal=False, sm_scale=0.1,
                                    block_sizes=MosaicBlockSizes(fused_bwd=True, dq_split=True)))
    with pytest.raises(ValueError, match=r"dq_split=True needs head_dim 128 .*got head_dim=64: use dq_split=False"):
        bwd.trace(x, x, x, x, lse, x)


# ----------------------------------------------------------------------------
# GPU (Hopper): correctness.

# The portable kernel's sweep (bf16/fp16 cases; its float32 cases are covered
# by test_float32_falls_back) plus lengths that cross many key blocks and the
# pipeline's ring several times, with a ragged tail.
GPU_CASES = [
    Case(1, 1, 1, 64, True, "bfloat16", None),
    Case(1, 17, 1, 80, False, "bfloat16", None),
    Case(1, 128, 2, 64, True, "bfloat16", None),
    Case(2, 200, 1, 128, True, "bfloat16", None),
    Case(1, 200, 1, 64, False, "float16", None),
    Case(1, 513, 1, 64, True, "bfloat16", None),
    Case(1, 513, 2, 80, False, "float16", None),
    Case(1, 256, 1, 128, True, "float16", None),
    Case(2, 1000, 2, 80, True, "bfloat16", None),
    Case(1, 2048, 2, 128, False, "bfloat16", None),
    Case(1, 1500, 2, 64, False, "float16", None),
    Case(1, 4096, 1, 64, True, "float16", None),
    # head_dim 128 at long lengths.
    Case(1, 4100, 2, 128, True, "bfloat16", None),
    Case(1, 4096, 1, 128, False, "float16", None),
]
# A second tile configuration over a few of the same shapes.
ALT_BLOCKS = MosaicBlockSizes(block_q=128, block_k=64, num_stages=3, block_q_dq=128, block_k_dq=128,
                              block_k_dkv=128, block_q_dkv=64, num_stages_bwd=3, pingpong=False)


def _mosaic_errors(case: Case, blocks=None) -> dict[str, float]:
    """errors() of the portable test module, with the Hopper kernels forced
    (`blocks`: a MosaicBlockSizes, or a function of head_dim giving one)."""
    case = dataclasses.replace(case, blocks=None)
    original = fa._BACKENDS["mosaic"].default_block_sizes
    q = make_inputs(case)[0]
    assert fa._resolve_backend("mosaic", q) == "mosaic"

    def forced(head_dim, seq_len=None, causal=None):
        if callable(blocks):
            return blocks(head_dim)
        return blocks or original(head_dim, seq_len, causal)

    fa._BACKENDS["mosaic"] = dataclasses.replace(fa._BACKENDS["mosaic"], default_block_sizes=forced)
    try:
        # Auto must route bf16/fp16 on Hopper to the Mosaic kernels, so the
        # portable test helper (which passes no backend) exercises them.
        return errors(case, interpret=False)
    finally:
        fa._BACKENDS["mosaic"] = dataclasses.replace(fa._BACKENDS["mosaic"], default_block_sizes=original)


@needs_hopper
@pytest.mark.parametrize("case", GPU_CASES, ids=str)
def test_gpu_matches_reference(case: Case) -> None:
    errs = _mosaic_errors(case)
    tol = TOLERANCES[(case.dtype, "gpu")]
    assert all(math.isfinite(e) for e in errs.values()), errs
    assert max(errs.values()) <= tol, f"{case}: {errs} exceed {tol}"


@needs_hopper
@pytest.mark.parametrize("case", [GPU_CASES[3], GPU_CASES[6], GPU_CASES[8], GPU_CASES[11]], ids=str)
def test_gpu_alt_blocks_match_reference(case: Case) -> None:
    errs = _mosaic_errors(case, ALT_BLOCKS)
    tol = TOLERANCES[(case.dtype, "gpu")]
    assert max(errs.values()) <= tol, f"{case}: {errs} exceed {tol}"


# Alternative forward schedules, each over the whole sweep (each head_dim's
# default tiles with the schedule changed): each consumer overlapping its own
# matmuls and softmax (the head_dim 128 default), with and without turns;
# round-robin turns (the head_dim 64 default); turns that issue P V and the
# next block's S together (also on the plain grid); three consumers (192 query rows per
# CTA; at most lengths the last tile's extra consumers idle, or with the
# overlapped schedule are clamped onto the last rows); the persistent grid (one program per SM walking tiles, the K/V
# ring and the turn token running on across tiles), with two and three
# consumers; causal consumers multiplying their whole diagonal key block
# (half_diagonal=False).
FORWARD_VARIANTS = {
    "overlap": dict(pingpong=False, overlap=True),
    "overlap-pingpong": dict(pingpong=True, overlap=True),
    "overlap-stagger": dict(pingpong=False, overlap=True, fwd_stagger=True),
    "overlap-stagger-grid": dict(pingpong=False, overlap=True, fwd_stagger=True, persistent=False),
    "roundrobin": dict(pingpong=True, overlap=False),
    "paired": dict(pingpong=True, overlap=False, paired=True),
    "paired-grid": dict(pingpong=True, overlap=False, paired=True, persistent=False),
    "consumers3": dict(consumers=3),
    "persistent": dict(persistent=True),
    "persistent-consumers3": dict(persistent=True, consumers=3),
    "full-diagonal": dict(half_diagonal=False),
}


@needs_hopper
@pytest.mark.parametrize("case", GPU_CASES, ids=str)
@pytest.mark.parametrize("variant", FORWARD_VARIANTS)
def test_gpu_forward_variants_match_reference(variant: str, case: Case) -> None:
    _assert_variant_matches(case, FORWARD_VARIANTS[variant])


def _assert_variant_matches(case: Case, changes: dict) -> None:
    """The sweep case with `changes` applied to its head_dim's default tiles
    matches the reference to the dtype's tolerance."""
    errs = _mosaic_errors(case, lambda d: dataclasses.replace(MosaicBlockSizes.get_default(d), **changes))
    tol = TOLERANCES[(case.dtype, "gpu")]
    assert all(math.isfinite(e) for e in errs.values()), errs
    assert max(errs.values()) <= tol, f"{case}: {errs} exceed {tol}"


# Both backward schedules over the whole sweep, whatever the head_dim's
# default: the fused kernel (dQ added up across key tiles with TMA
# reduce-add, one owner per query block) and the two kernels; plus the fused
# kernel with 128-query steps (a 128-row dQ tile, a one-stage ring) and with
# dQ split by columns between the consumers; and both schedules with
# consumers that wait for S and dP together (bwd_overlap=False).
# UNSPLIT_BWD: the schedules without dQ split by columns (the head_dim 128
# default has it).
BACKWARD_VARIANTS = {
    "fused": dict(UNSPLIT_BWD, fused_bwd=True),
    "two-kernels": dict(UNSPLIT_BWD, fused_bwd=False),
    "fused-q128": dict(UNSPLIT_BWD, fused_bwd=True, block_q_dkv=128),
    "fused-split": dict(UNSPLIT_BWD, fused_bwd=True, dq_split=True),
    "fused-split-order": dict(fused_bwd=True, dq_split=True, split_order=True, masked_loop=True),
    "fused-split-order-one-loop": dict(fused_bwd=True, dq_split=True, split_order=True, masked_loop=False),
    "fused-split-order-lag": dict(fused_bwd=True, dq_split=True, split_order=True, dq_lag=True),
    "fused-split-order-lag-stagger": dict(fused_bwd=True, dq_split=True, split_order=True, masked_loop=True,
                                          dq_lag=True, stagger=True),
    "fused-stagger": dict(UNSPLIT_BWD, fused_bwd=True, stagger=True),
    "fused-one-loop": dict(UNSPLIT_BWD, fused_bwd=True, masked_loop=False),
    "fused-lse-early": dict(UNSPLIT_BWD, fused_bwd=True, lse_early=True, bwd_registers=240),
    "fused-split-order-lse-early": dict(fused_bwd=True, dq_split=True, split_order=True, masked_loop=False,
                                        mask_tile=True, lse_early=True, bwd_registers=240),
    "two-kernels-lse-early": dict(UNSPLIT_BWD, fused_bwd=False, lse_early=True, bwd_registers=240),
    "two-kernels-one-loop": dict(UNSPLIT_BWD, fused_bwd=False, masked_loop=False),
    "fused-serial": dict(UNSPLIT_BWD, fused_bwd=True, bwd_overlap=False),
    "two-kernels-serial": dict(UNSPLIT_BWD, fused_bwd=False, bwd_overlap=False),
}


@needs_hopper
@pytest.mark.parametrize("case", GPU_CASES, ids=str)
@pytest.mark.parametrize("variant", BACKWARD_VARIANTS)
def test_gpu_backward_variants_match_reference(variant: str, case: Case) -> None:
    if variant == "fused-q128" and case.head_dim > 64:
        pytest.skip("128-query fused steps need more shared memory than head_dim > 64 leaves")
    if variant.startswith("fused-split") and case.head_dim != 128:
        pytest.skip("dq_split needs head_dim 128")
    if variant.endswith("one-loop") and not case.causal:
        pytest.skip("masked_loop changes causal kernels only")
    _assert_variant_matches(case, BACKWARD_VARIANTS[variant])


@needs_hopper
@pytest.mark.parametrize("case", [Case(2, 200, 1, 128, True, "bfloat16", None), Case(1, 4100, 2, 128, True, "bfloat16", None),
                                  Case(2, 1000, 2, 80, True, "bfloat16", None), Case(1, 1500, 2, 64, True, "float16", None)],
                         ids=str)
@pytest.mark.parametrize("changes", [{}, dict(UNSPLIT_BWD, fused_bwd=False)], ids=["default", "two-kernels"])
def test_gpu_mask_tile_gives_the_same_gradients(case: Case, changes: dict) -> None:
    """mask_tile adds 0 or -inf to the scores where the index mask zeroes
    their exponentials: dK and dV (and the two kernels' dQ) are
    bit-identical; the fused dQ within its add-order rounding."""
    q, k, v, do = make_inputs(case)
    blocks = dataclasses.replace(MosaicBlockSizes.get_default(case.head_dim, case.seq, True), **changes)
    assert blocks.block_k_dkv == blocks.block_q_dkv  # square steps: the switch applies
    kw = dict(causal=True, sm_scale=1 / math.sqrt(case.head_dim), block_sizes=blocks)
    o, lse = jax.jit(lambda q, k, v: mgpu.mosaic_forward(q, k, v, **kw))(q, k, v)

    def grads(tile: bool):
        kw_here = dict(kw, block_sizes=dataclasses.replace(blocks, mask_tile=tile))
        got = jax.jit(lambda *x: mgpu.mosaic_backward(*x, **kw_here))(q, k, v, o, lse, do)
        return [np.asarray(g.astype(jnp.float32)) for g in got]

    want, got = grads(False), grads(True)
    for name, a, b in zip(("dq", "dk", "dv"), want, got):
        if name == "dq" and blocks.fused_bwd:
            np.testing.assert_allclose(b, a, rtol=2.0 ** -7, atol=1e-6, err_msg=name)
        else:
            np.testing.assert_array_equal(a, b, err_msg=name)


@needs_hopper
@pytest.mark.parametrize("case", [Case(2, 1024, 2, 64, True, "bfloat16", None), Case(2, 1024, 2, 64, False, "bfloat16", None),
                                  Case(1, 900, 3, 64, True, "float16", None), Case(1, 2048, 2, 64, False, "bfloat16", None)],
                         ids=str)
def test_gpu_consumers_past_the_end_idle(case: Case) -> None:
    """Three consumers over a length they do not divide (the last tile's
    consumers past the end idle while the rows' owner computes them): o and
    lse match the float32 reference, and two runs are bit-identical (a
    missing store or a race would show in either)."""
    q, k, v, _ = make_inputs(case)
    blocks = MosaicBlockSizes(consumers=3, persistent=True, num_stages=3)
    padded = -(-case.seq // blocks.seq_multiple) * blocks.seq_multiple
    assert padded % (3 * blocks.block_q) != 0  # the last tile has consumers past the end
    kw = dict(causal=case.causal, sm_scale=1 / math.sqrt(case.head_dim), block_sizes=blocks)
    forward = jax.jit(lambda *x: mgpu.mosaic_forward(*x, **kw))
    o, lse = forward(q, k, v)
    tol = TOLERANCES[(case.dtype, "gpu")]
    assert rel_err(o, mha_reference(q, k, v, causal=case.causal)) <= tol
    assert rel_err(lse, reference_lse(q, k, causal=case.causal)) <= tol
    for a, b in zip((o, lse), forward(q, k, v)):
        np.testing.assert_array_equal(np.asarray(a.astype(jnp.float32)), np.asarray(b.astype(jnp.float32)))


@needs_hopper
@pytest.mark.parametrize("case", [Case(2, 1024, 2, 64, True, "bfloat16", None), Case(1, 2048, 2, 64, True, "float16", None),
                                  Case(1, 900, 3, 64, True, "bfloat16", None), Case(1, 300, 1, 64, True, "float16", None)],
                         ids=str)
def test_gpu_half_diagonal_gives_the_same_outputs(case: Case) -> None:
    """A consumer that multiplies only the unmasked half of its diagonal key
    block drops products whose probabilities are exactly zero: o and lse are
    those of the whole block bit for bit, and match the float32 reference."""
    q, k, v, _ = make_inputs(case)
    blocks = MosaicBlockSizes.get_default(case.head_dim, case.seq, True)

    def forward(half: bool):
        kw = dict(causal=True, sm_scale=1 / math.sqrt(case.head_dim),
                  block_sizes=dataclasses.replace(blocks, half_diagonal=half))
        return jax.jit(lambda *x: mgpu.mosaic_forward(*x, **kw))(q, k, v)

    (o_full, lse_full), (o, lse) = forward(False), forward(True)
    tol = TOLERANCES[(case.dtype, "gpu")]
    assert rel_err(o, mha_reference(q, k, v, causal=True)) <= tol
    assert rel_err(lse, reference_lse(q, k, causal=True)) <= tol
    for a, b in zip((o_full, lse_full), (o, lse)):
        np.testing.assert_array_equal(np.asarray(a.astype(jnp.float32)), np.asarray(b.astype(jnp.float32)))


@needs_hopper
@pytest.mark.parametrize(("head_dim", "changes"), [(64, {}), (128, {}), (128, dict(UNSPLIT_BWD, fused_bwd=True, dq_split=True)),
                                                   (128, dict(dq_lag=True, stagger=True)),
                                                   (128, dict(masked_loop=True)), (128, dict(UNSPLIT_BWD, fused_bwd=False))],
                         ids=str)
def test_gpu_repeatable(head_dim: int, changes: dict) -> None:
    """Identical inputs give bit-identical o, dK and dV across runs (a
    moving result would mean a race), with the head_dim's default tiles and
    with each backward schedule at 128. dQ is bit-identical from the
    two-kernel backward; the fused one adds float32 shares in whatever order
    the TMA reduce-adds land, so its dQ may differ by a rounding of the bf16
    result, and no more."""
    case = Case(2, 1000, 4, head_dim, True, "bfloat16", None)
    q, k, v, do = make_inputs(case)
    blocks = dataclasses.replace(MosaicBlockSizes.get_default(head_dim), **changes)
    f = jax.jit(lambda q, k, v, do: jax.vjp(lambda *x: flash_attention(*x, backend="mosaic", block_sizes=blocks),
                                            q, k, v))
    fused = blocks.fused_bwd
    first = None
    for _ in range(5):
        o, vjp = f(q, k, v, do)
        got = [np.asarray(x.astype(jnp.float32)) for x in (o, *vjp(do))]
        if first is None:
            first = got
        for name, a, b in zip(("o", "dq", "dk", "dv"), first, got):
            if name == "dq" and fused:
                # One bf16 rounding step: 2^-8 of the value, elementwise.
                np.testing.assert_allclose(b, a, rtol=2.0 ** -7, atol=1e-6, err_msg=name)
            else:
                np.testing.assert_array_equal(a, b, err_msg=name)


@needs_hopper
def test_float32_falls_back() -> None:
    q, k, v, _ = make_inputs(Case(1, 64, 1, 64, True, "float32"))
    assert fa._resolve_backend(None, q) == "triton"
    with pytest.raises(ValueError, match="dtype=float32"):
        flash_attention(q, k, v, backend="mosaic")
    o = flash_attention(q, k, v)
    assert rel_err(o, mha_reference(q, k, v)) < TOLERANCES[("float32", "gpu")]


@needs_hopper
@pytest.mark.parametrize(("seq", "head_dim", "causal", "dtype"),
                         [(1024, 64, True, "bfloat16"), (777, 128, False, "float16"), (2048, 80, True, "bfloat16"),
                          (2048, 128, True, "bfloat16")])
def test_gpu_matches_torch_sdpa(seq, head_dim, causal, dtype) -> None:
    """Same inputs through torch SDPA and the Mosaic kernel: outputs and
    gradients agree to the dtype's tolerance."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device")
    import torch.nn.functional as F

    case = Case(2, seq, 4, head_dim, causal, dtype, None)
    q, k, v, do = make_inputs(case)
    o, vjp = jax.vjp(lambda *x: flash_attention(*x, causal=causal, backend="mosaic"), q, k, v)
    ours = [o, *vjp(do)]

    def to_torch(x):  # [B, S, H, D] -> [B, H, S, D], same bits
        return torch.from_numpy(np.asarray(x.astype(jnp.float32))).to("cuda", getattr(torch, dtype)).transpose(1, 2)

    tq, tk, tv = (to_torch(x).requires_grad_() for x in (q, k, v))
    to = F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)
    theirs = [to, *torch.autograd.grad(to, (tq, tk, tv), to_torch(do))]
    tol = TOLERANCES[(dtype, "gpu")]
    for name, a, b in zip(("o", "dq", "dk", "dv"), ours, theirs):
        b = b.detach().transpose(1, 2).float().cpu().numpy()
        err = rel_err(a, b)
        assert err <= tol, f"{name}: relative difference {err:.2e} from torch SDPA exceeds {tol}"


@needs_hopper
def test_with_lse_matches_reference() -> None:
    q, k, _, _ = make_inputs(Case(1, 300, 2, 128, True, "bfloat16"))
    o, lse = flash_attention_with_lse(q, k, k, backend="mosaic")
    assert o.shape == q.shape and lse.shape == (1, 2, 300)
    assert rel_err(lse, reference_lse(q, k)) < 1e-3
