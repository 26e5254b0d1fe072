"""The fused residual-add + RMSNorm kernels against the jnp reference: values and gradients in
the Pallas interpreter on CPU, the row partitioning on two host devices, the lowering for a GPU.

Both sides compute in float32 and differ only in the order of their sums: the row's sum of
squares and the backward's row dot product over `width` terms, the weight's gradient over the
N rows. A float32 sum of n terms is off by at most n * eps / 2 of the sum of magnitudes, so
the gradients are compared with atol (width + N) * eps times the largest reference entry. A
result rounded to bfloat16 may round the other way: one bfloat16 ulp, 2^-7 relative."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import on_two_host_devices
from flax import nnx

import jax_impl
from harness.config import get_config
from pallas_kernels import rmsnorm
from pallas_kernels.reference import add_rms_norm_reference
from pallas_kernels.rmsnorm import NormBlocks, add_rms_norm

ROOT = Path(__file__).resolve().parent.parent
EPS32 = float(np.finfo(np.float32).eps)
BF16_ULP = 2.0 ** -7
# Two rows per group and two groups per backward program, so short inputs still take several
# programs and the loop over row groups.
SMALL = NormBlocks(rows_fwd=2, rows_bwd=2, steps_bwd=2, min_programs_bwd=1)


def _inputs(shape, delta_dtype, seed=0):
    k = jax.random.split(jax.random.key(seed), 3)
    x = jax.random.normal(k[0], shape, jnp.float32)
    delta = None if delta_dtype is None else jax.random.normal(k[1], shape, jnp.float32).astype(delta_dtype)
    w = 1 + 0.1 * jax.random.normal(k[2], shape[-1:], jnp.float32)
    return x, delta, w


def _vjp(fn, x, delta, w, out_dtype, seed=1):
    """(h, y) and the gradients of x, delta and w for random cotangents of h and y."""
    k = jax.random.split(jax.random.key(seed), 2)
    ch = jax.random.normal(k[0], x.shape, jnp.float32)
    cy = jax.random.normal(k[1], x.shape, jnp.float32).astype(out_dtype)
    (h, y), pullback = jax.vjp(lambda x, delta, w: fn(x, delta, w), x, delta, w)
    return h, y, pullback((ch, cy))


def _close(got, want, *, rtol, sums):
    want = np.asarray(want, np.float64)
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=rtol,
                               atol=sums * EPS32 * float(np.abs(want).max()))


# Every pair of delta and output dtype once; each width (two chunks, three chunks with an odd
# row count, one chunk) with two deltas. The first is the model's case on a GPU.
CASES = [((2, 16, 80), jnp.bfloat16, jnp.bfloat16), ((2, 16, 80), None, jnp.float32),
         ((1, 7, 100), jnp.float32, jnp.float32), ((1, 7, 100), jnp.bfloat16, jnp.float32),
         ((3, 8, 128), None, jnp.bfloat16), ((3, 8, 128), jnp.float32, jnp.bfloat16)]


@pytest.mark.parametrize("shape, delta_dtype, out_dtype", CASES,
                         ids=[f"{s}-{getattr(d, '__name__', d)}-{o.__name__}" for s, d, o in CASES])
def test_kernels_match_the_reference(shape, delta_dtype, out_dtype):
    x, delta, w = _inputs(shape, delta_dtype)
    kernel = functools.partial(add_rms_norm, eps=1e-5, out_dtype=out_dtype, implementation="pallas",
                               blocks=SMALL, interpret=True)
    reference = functools.partial(add_rms_norm_reference, eps=1e-5, out_dtype=out_dtype)
    h, y, grads = jax.jit(lambda x, d, w: _vjp(kernel, x, d, w, out_dtype))(x, delta, w)
    h_ref, y_ref, grads_ref = jax.jit(lambda x, d, w: _vjp(reference, x, d, w, out_dtype))(x, delta, w)

    width, rows = shape[-1], int(np.prod(shape[:-1]))
    rounding = BF16_ULP if out_dtype == jnp.bfloat16 else 0.0
    np.testing.assert_array_equal(np.asarray(h), np.asarray(h_ref))  # the same add, rounded alike
    assert h.dtype == x.dtype and y.dtype == jnp.dtype(out_dtype)
    _close(y.astype(jnp.float32), y_ref.astype(jnp.float32), rtol=rounding, sums=width)
    dx, ddelta, dw = grads
    dx_ref, ddelta_ref, dw_ref = grads_ref
    _close(dx, dx_ref, rtol=0.0, sums=width)
    _close(dw, dw_ref, rtol=0.0, sums=width + rows)
    if delta is None:
        assert ddelta is None
    else:
        assert ddelta.dtype == delta.dtype
        _close(ddelta.astype(jnp.float32), ddelta_ref.astype(jnp.float32),
               rtol=BF16_ULP if delta.dtype == jnp.bfloat16 else 0.0, sums=width)


def test_chunks_cover_any_width_in_powers_of_two():
    assert rmsnorm._chunks(1280) == ((0, 1024), (1024, 256))
    assert rmsnorm._chunks(100) == ((0, 64), (64, 32), (96, 4))
    for width in range(1, 300):
        chunks = rmsnorm._chunks(width)
        assert sum(size for _, size in chunks) == width
        assert all(size & (size - 1) == 0 for _, size in chunks)
        assert [start for start, _ in chunks] == list(np.cumsum([0] + [s for _, s in chunks[:-1]]))


def test_backward_programs_walk_fewer_row_groups_at_small_batches():
    """The backward's programs take steps_bwd row groups each, fewer while the programs would
    number under min_programs_bwd: `large`'s rows at batch 32 keep the 32 groups of the
    defaults (1024 programs), at batch 4 take 4 (1024 programs), at ctx 256 batch 4 one."""
    blocks = NormBlocks()
    assert rmsnorm._bwd_rows((32, 1024, 1280), blocks) == (1, 32)
    assert rmsnorm._bwd_rows((48, 1024, 1280), blocks) == (1, 32)
    assert rmsnorm._bwd_rows((4, 1024, 1280), blocks) == (1, 4)
    assert rmsnorm._bwd_rows((4, 256, 1280), blocks) == (1, 1)
    # steps stay a divisor of the rows of T a program walks; rows per group as before
    assert rmsnorm._bwd_rows((1, 24, 8), NormBlocks(rows_bwd=2, steps_bwd=8, min_programs_bwd=3)) == (2, 4)
    assert rmsnorm._bwd_rows((1, 24, 8), NormBlocks(rows_bwd=2, steps_bwd=8, min_programs_bwd=4)) == (2, 2)
    assert rmsnorm._bwd_rows((1, 24, 8), NormBlocks(rows_bwd=2, steps_bwd=8, min_programs_bwd=1)) == (2, 4)


def test_kernels_lower_for_a_gpu_at_the_large_models_width():
    """The Triton lowering takes only power-of-two tiles: the large model's rows (1280 wide)
    in both directions, lowered for CUDA without a GPU."""
    config = get_config("large")
    rows = jax.ShapeDtypeStruct((2, 64, config.d_model), jnp.float32)
    half = jax.ShapeDtypeStruct(rows.shape, jnp.bfloat16)
    w = jax.ShapeDtypeStruct((config.d_model,), jnp.float32)
    stats = jax.ShapeDtypeStruct(rows.shape[:-1], jnp.float32)
    blocks = NormBlocks()
    fwd = functools.partial(rmsnorm._forward, eps=1e-5, out_dtype=jnp.bfloat16, blocks=blocks, interpret=False)
    bwd = functools.partial(rmsnorm._backward, ddelta_dtype=jnp.bfloat16, blocks=blocks, interpret=False)
    for fn, args in ((fwd, (rows, half, w)), (bwd, (rows, stats, w, half, rows))):
        text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
        assert "__gpu$xla.gpu.triton" in text or "triton_kernel_call" in text


def test_model_on_the_kernels_matches_the_model_on_xla(monkeypatch):
    """The tiny model's loss and gradients with its norms on the kernels (as on a GPU) against
    the same model on the reference: the first block's norm has no delta, the final norm's
    sum is unused."""
    config = get_config("tiny")
    model = jax_impl.TransformerLM(config, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model, nnx.Param)
    tokens = jax.random.randint(jax.random.key(2), (2, 17), 0, config.vocab_size)

    def loss(params):
        logits = nnx.merge(graphdef, params)(tokens[:, :-1])
        return jax_impl.cross_entropy_loss(logits, tokens[:, 1:])

    want, want_grads = jax.jit(jax.value_and_grad(loss))(params)
    monkeypatch.setattr(jax_impl.model, "add_rms_norm",
                        functools.partial(add_rms_norm, implementation="pallas", blocks=SMALL, interpret=True))
    got, got_grads = jax.jit(jax.value_and_grad(loss))(params)
    np.testing.assert_allclose(float(got), float(want), rtol=64 * EPS32)
    assert jax.tree.structure(got_grads) == jax.tree.structure(want_grads)
    for g, w_ in zip(jax.tree.leaves(got_grads), jax.tree.leaves(want_grads)):
        # a gradient passes through both blocks' norms: width terms per row sum, tokens per column
        _close(g, w_, rtol=0.0, sums=4 * (config.d_model + tokens.size))


_SHARDED = r"""
import json, re, jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from pallas_kernels.rmsnorm import NormBlocks, _bwd_rows, add_rms_norm
BLOCKS = NormBlocks(rows_fwd=2, rows_bwd=2, steps_bwd=2, min_programs_bwd=8)
k = jax.random.split(jax.random.key(0), 3)
x = jax.random.normal(k[0], (4, 8, 96), jnp.float32)
d = jax.random.normal(k[1], (4, 8, 96), jnp.float32).astype(jnp.bfloat16)
w = 1 + 0.1 * jax.random.normal(k[2], (96,), jnp.float32)
def loss(x, d, w):
    h, y = add_rms_norm(x, d, w, eps=1e-5, out_dtype=jnp.bfloat16, implementation="pallas",
                        blocks=BLOCKS, interpret=True)
    return jnp.sum(h * h) + jnp.sum(jnp.sin(y.astype(jnp.float32))), y
step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))
mesh = Mesh(np.array(jax.devices()[:2]), ("data",))
rows = NamedSharding(mesh, P("data"))
(l1, y1), g1 = step(x, d, w)
xs, ds = jax.device_put(x, rows), jax.device_put(d, rows)
(l2, y2), g2 = step(xs, ds, w)
hlo = step.lower(xs, ds, w).compile().as_text()
# the weight split too, as --parallel fsdp splits the parameters: what gets gathered
ws = jax.device_put(w, rows)
fsdp = step.lower(xs, ds, ws).compile().as_text()
print(json.dumps({"steps": [_bwd_rows(a.shape, BLOCKS)[1] for a in (x, x[:2])],
                  "gathered_under_fsdp": re.findall(r"= (\S+) all-gather\(", fsdp),
                  "devices": len(jax.devices()), "rows_axis": [y2.sharding.spec[0], g2[0].sharding.spec[0], g2[1].sharding.spec[0]],
                  "all_gather": "all-gather" in hlo, "all_reduce": "all-reduce" in hlo,
                  "loss": [float(l1), float(l2)], "y": float(jnp.max(jnp.abs(y1.astype(jnp.float32) - y2.astype(jnp.float32)))),
                  "grads": [float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32))) / jnp.max(jnp.abs(a.astype(jnp.float32))))
                            for a, b in zip(g1, g2)]}))
"""


def test_kernels_run_on_each_devices_rows():
    """Batch-sharded inputs on two host devices: each device normalizes its own rows (no
    all-gather; with the weight split as under FSDP, the weight alone is gathered), XLA sums
    the weight's gradient (an all-reduce), and the numbers are the one-device numbers up to
    the order of that sum. A device's half of the rows fills fewer backward programs, so its
    programs walk fewer row groups than the whole batch's would: its extra partial sums of the
    weight's gradient fold into the count XLA planned for."""
    proc = on_two_host_devices(_SHARDED)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["devices"] == 2
    assert got["steps"] == [2, 1]  # the whole batch's programs walk two row groups, a device's one
    assert got["rows_axis"] == ["data"] * 3  # y, dx and d delta stay split by rows
    assert not got["all_gather"] and got["all_reduce"]
    assert got["gathered_under_fsdp"] == ["f32[96]{0}"]  # a split weight is gathered, never the rows
    assert got["y"] == 0.0  # rows are normalized alike wherever they run
    # the loss and the weight's gradient are summed in another order across devices: 32 rows
    np.testing.assert_allclose(got["loss"][1], got["loss"][0], rtol=64 * EPS32)
    assert max(got["grads"]) <= (96 + 32) * EPS32


@pytest.mark.parametrize("call, message", [
    (lambda x, w: add_rms_norm(x, None, w[:-1], eps=1e-5), "w [width]"),
    (lambda x, w: add_rms_norm(x[0, 0], None, w, eps=1e-5), "at least"),
    (lambda x, w: add_rms_norm(x, x[:1], w, eps=1e-5), "delta shaped like x"),
    (lambda x, w: add_rms_norm(x, None, w, eps=1e-5, implementation="cuda"), "implementation='cuda'"),
])
def test_bad_arguments_name_what_is_wrong(call, message):
    x, _, w = _inputs((2, 4, 16), None)
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        call(x, w)


_EXPLICIT = r"""
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
from pallas_kernels import rmsnorm
jax.default_backend = lambda: "gpu"  # the choice a GPU makes; nothing here runs a kernel
mesh = jax.make_mesh((2,), ("data",))  # explicit axes
x = jax.device_put(jnp.ones((2, 4, 16)), NamedSharding(mesh, P("data")))
w = jnp.ones((16,))
norm = lambda x, **kw: rmsnorm.add_rms_norm(x, None, w, eps=1e-5, **kw)
print("pallas_call" in str(jax.make_jaxpr(norm)(jnp.ones((2, 4, 16)))))
print("pallas_call" in str(jax.make_jaxpr(norm)(x)), float(jax.jit(norm)(x)[1].sum()))
try:
    jax.make_jaxpr(lambda x: norm(x, implementation="pallas"))(x)
except ValueError as e:
    print(e)
"""


def test_arrays_split_over_explicit_axes_take_the_reference():
    """Pallas refuses arrays split over a mesh's explicit axes: the default choice on a GPU
    takes the reference for them (the kernels for unsplit arrays), and asking for the kernels
    is one line naming the fix."""
    proc = on_two_host_devices(_EXPLICIT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[0] == "True"  # unsplit: the kernels
    used_kernels, total = lines[1].split()
    assert used_kernels == "False"  # split: the reference; its 2 x 4 x 16 ones each normalized to 1/sqrt(1 + eps)
    np.testing.assert_allclose(float(total), 128 / np.sqrt(1 + 1e-5), rtol=128 * EPS32)
    assert lines[2] == ("implementation='pallas' takes arrays on no mesh or a mesh of automatic axes; these are "
                        "split over explicit axes ('data', None, None): use implementation='xla' (or None)")


_IN_SHARD_MAP = r"""
import json, jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, PartitionSpec as P
from pallas_kernels.rmsnorm import add_rms_norm
mesh = Mesh(np.array(jax.devices()[:2]), ("data",))
x, d = jax.random.normal(jax.random.key(0), (2, 4, 64, 128), jnp.float32)
w = 1 + 0.1 * jax.random.normal(jax.random.key(1), (128,), jnp.float32)
def loss(x, d, w):
    h, y = add_rms_norm(x, d, w, eps=1e-5, out_dtype=jnp.bfloat16, implementation="pallas", interpret=True)
    return jnp.sum(y.astype(jnp.float32) ** 2) + jnp.sum(h * h)
def local(x, d, w):
    l, (dx, dd, dw) = jax.value_and_grad(loss, argnums=(0, 1, 2))(x, d, w)
    return jax.lax.psum(l, "data"), dx, dd, jax.lax.psum(dw, "data")
with jax.set_mesh(mesh):
    got = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P("data"), P("data"), P()),
                                out_specs=(P(), P("data"), P("data"), P()), check_vma=False))(x, d, w)
l, g = jax.value_and_grad(loss, argnums=(0, 1, 2))(x, d, w)
rel = lambda a, b: float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))
print(json.dumps({"loss": [float(got[0]), float(l)], "dx": rel(got[1], g[0]), "dd": rel(got[2], g[1]),
                  "dw": rel(got[3], g[2])}))
"""


def test_kernels_inside_a_caller_s_shard_map_take_each_devices_rows():
    """Called inside the caller's `shard_map` over two host devices (as a step that sums its own
    gradients runs the model), the kernels run on the device's rows as given: its rows' gradients
    are the one-device ones exactly, and the weight's gradient summed over the devices and the
    loss are the one-device ones up to the order of that sum (float32, a few hundred rows)."""
    proc = on_two_host_devices(_IN_SHARD_MAP)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["dx"] == 0.0 and got["dd"] == 0.0
    np.testing.assert_allclose(got["loss"][0], got["loss"][1], rtol=512 * EPS32)
    assert got["dw"] <= 512 * EPS32
