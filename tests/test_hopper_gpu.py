"""The Hopper (Pallas Mosaic GPU) kernels on a Hopper GPU (skipped elsewhere):
the correctness sweep of the portable kernels run on the Mosaic kernels, every
shipped schedule over it, a comparison with torch SDPA on identical inputs,
and repeatability (a result that changes between identical runs means a race).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from harness.attention.tune import UNSPLIT_BWD
from pallas_kernels import (
    MosaicBlockSizes,
    attention,
    flash_attention,
    flash_attention_with_lse,
    hopper,
    mha_reference,
    reference_lse,
    resolve_backend,
)
from pallas_kernels.hopper.tiles import BLOCK_Q
from tests.test_flash_attention import TOLERANCES, Case, errors, make_inputs, rel_err
from tests.test_hopper import on_hopper

needs_hopper = pytest.mark.skipif(not on_hopper(), reason="needs a compute capability 9.x (Hopper) GPU")
pytestmark = pytest.mark.gpu

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
# A second configuration over a few of the same shapes: turns, three
# stages and 128-row streamed tiles at every head_dim.
ALT_BLOCKS = MosaicBlockSizes(num_stages=3, block_k_dq=128, block_q_dkv=128)


def _mosaic_errors(case: Case, blocks=None) -> dict[str, float]:
    """errors() of the portable test module, with the Hopper kernels forced
    (`blocks`: a MosaicBlockSizes, or a function of head_dim giving one)."""
    case = dataclasses.replace(case, blocks=None)
    original = attention.FAMILIES["mosaic"].default_block_sizes
    q = make_inputs(case)[0]
    assert resolve_backend("mosaic", q) == "mosaic"

    def forced(head_dim, seq_len=None, causal=None):
        if callable(blocks):
            return blocks(head_dim)
        return blocks or original(head_dim, seq_len, causal)

    attention.FAMILIES["mosaic"] = dataclasses.replace(attention.FAMILIES["mosaic"], default_block_sizes=forced)
    try:
        # Auto must route bf16/fp16 on Hopper to the Mosaic kernels, so the
        # portable test helper (which passes no backend) exercises them.
        return errors(case, interpret=False)
    finally:
        attention.FAMILIES["mosaic"] = dataclasses.replace(attention.FAMILIES["mosaic"], default_block_sizes=original)


@needs_hopper
@pytest.mark.parametrize("case", GPU_CASES, ids=str)
def test_gpu_matches_reference(case: Case) -> None:
    errs = _mosaic_errors(case)
    tol = TOLERANCES[(case.dtype, "gpu")]
    assert all(math.isfinite(e) for e in errs.values()), errs
    assert max(errs.values()) <= tol, f"{case}: {errs} exceed {tol}"


@needs_hopper
@pytest.mark.parametrize("case", [Case(9, 2000, 1, 64, True, "bfloat16", None), Case(5, 4000, 1, 128, False, "bfloat16", None),
                                  Case(50, 384, 1, 64, True, "float16", None)], ids=str)
def test_gpu_past_one_wave_matches_reference(case: Case) -> None:
    """Batches whose backward tiles fill more than one wave of programs launch
    tiles first (tile_grid): the fused backward at 9 x 16 and 5 x 32 tiles of
    128 keys, ragged, and the two kernels at 50 x 3."""
    tiles = -(-case.seq // hopper.SEQ_MULTIPLE)
    assert case.batch * tiles > 132
    test_gpu_matches_reference(case)


@needs_hopper
@pytest.mark.parametrize("case", [GPU_CASES[3], GPU_CASES[6], GPU_CASES[8], GPU_CASES[11]], ids=str)
def test_gpu_alt_blocks_match_reference(case: Case) -> None:
    errs = _mosaic_errors(case, ALT_BLOCKS)
    tol = TOLERANCES[(case.dtype, "gpu")]
    assert max(errs.values()) <= tol, f"{case}: {errs} exceed {tol}"


# The forward schedules, each over the whole sweep (each head_dim's default
# tiles with the schedule changed): each consumer overlapping its own matmuls
# and softmax (head_dim > 64), also staggered (head_dim 128); round-robin
# turns with two and three consumers (head_dim 64; three: 192 query rows per
# CTA, at most lengths the last tile's extra consumers idle); one head at a
# time (short non-causal head_dim 128); K/V multicast to clusters of two CTAs
# (non-causal cases with an even number of tiles; the others run without).
FORWARD_VARIANTS = {
    "overlap": dict(consumers=2, overlap=True, fwd_stagger=False),
    "overlap-stagger": dict(consumers=2, overlap=True, fwd_stagger=True),
    "roundrobin": dict(consumers=2, overlap=False, fwd_stagger=False),
    "roundrobin-consumers3": dict(consumers=3, overlap=False, fwd_stagger=False),
    "one-head-at-a-time": dict(group_heads=False),
    "multicast": dict(kv_multicast=True),
    "multicast-consumers3": dict(consumers=3, overlap=False, fwd_stagger=False, kv_multicast=True),
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


# The backward schedules over the whole sweep, whatever the head_dim's
# default: the fused kernel (dQ added up across key tiles with TMA
# reduce-add, one owner per query block) and the two kernels; the fused
# kernel with 128-query steps (a 128-row dQ tile) and with dQ split by
# columns between the consumers, lagged or not; lse loaded early.
# UNSPLIT_BWD: the schedules without dQ split by columns (the head_dim 128
# default has it).
BACKWARD_VARIANTS = {
    "fused": dict(UNSPLIT_BWD, fused_bwd=True),
    "two-kernels": dict(UNSPLIT_BWD, fused_bwd=False),
    "fused-q128": dict(UNSPLIT_BWD, fused_bwd=True, block_q_dkv=128),
    "fused-split": dict(fused_bwd=True, dq_split=True, dq_lag=False),
    "fused-split-lag": dict(fused_bwd=True, dq_split=True, dq_lag=True),
    "fused-split-lse-early": dict(fused_bwd=True, dq_split=True, dq_lag=False, mask_tile=True, lse_early=True),
    "fused-lse-early": dict(UNSPLIT_BWD, fused_bwd=True, lse_early=True),
    "two-kernels-lse-early": dict(UNSPLIT_BWD, fused_bwd=False, lse_early=True),
}


@needs_hopper
@pytest.mark.parametrize("case", GPU_CASES, ids=str)
@pytest.mark.parametrize("variant", BACKWARD_VARIANTS)
def test_gpu_backward_variants_match_reference(variant: str, case: Case) -> None:
    if variant == "fused-q128" and case.head_dim > 64:
        pytest.skip("128-query fused steps need more shared memory than head_dim > 64 leaves")
    if variant.startswith("fused-split") and case.head_dim != 128:
        pytest.skip("dq_split needs head_dim 128")
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
    assert blocks.block_q_dkv == 64  # square steps: the switch applies
    kw = dict(causal=True, sm_scale=1 / math.sqrt(case.head_dim), block_sizes=blocks)
    o, lse = jax.jit(lambda q, k, v: hopper.mosaic_forward(q, k, v, **kw))(q, k, v)

    def grads(tile: bool):
        kw_here = dict(kw, block_sizes=dataclasses.replace(blocks, mask_tile=tile))
        got = jax.jit(lambda *x: hopper.mosaic_backward(*x, **kw_here))(q, k, v, o, lse, do)
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
    blocks = MosaicBlockSizes(consumers=3, num_stages=3)
    padded = -(-case.seq // hopper.SEQ_MULTIPLE) * hopper.SEQ_MULTIPLE
    assert padded % (3 * BLOCK_Q) != 0  # the last tile has consumers past the end
    kw = dict(causal=case.causal, sm_scale=1 / math.sqrt(case.head_dim), block_sizes=blocks)
    forward = jax.jit(lambda *x: hopper.mosaic_forward(*x, **kw))
    o, lse = forward(q, k, v)
    tol = TOLERANCES[(case.dtype, "gpu")]
    assert rel_err(o, mha_reference(q, k, v, causal=case.causal)) <= tol
    assert rel_err(lse, reference_lse(q, k, causal=case.causal)) <= tol
    for a, b in zip((o, lse), forward(q, k, v)):
        np.testing.assert_array_equal(np.asarray(a.astype(jnp.float32)), np.asarray(b.astype(jnp.float32)))


@needs_hopper
@pytest.mark.parametrize(("head_dim", "changes"), [(64, {}), (128, {}), (128, dict(dq_lag=True)),
                                                   (128, dict(UNSPLIT_BWD, fused_bwd=True)),
                                                   (128, dict(UNSPLIT_BWD, fused_bwd=False))],
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
    assert resolve_backend(None, q) == "triton"
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
