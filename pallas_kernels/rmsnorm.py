"""RMSNorm fused with the residual add before it, forward and backward, as JAX Pallas kernels.

A pre-norm block adds each sublayer's output to the float32 residual stream and normalizes
the sum for the next sublayer's matmuls. XLA runs that as separate passes over the stream:
forward, the add with the row's sum of squares, then the scaling and the cast; backward, the
row dot product, the weight's column sum and the elementwise gradient, each reading the
float32 rows again. Each kernel here is one pass: a program holds whole rows, so the sum of
squares (forward) and the row dot product (backward) are reductions in registers, and each
row of the stream is read from memory once per direction.

    h = x + delta                        (in x's dtype: the residual stream)
    y = h * rsqrt(mean(h^2) + eps) * w  (in the matmuls' dtype)

Rows are independent, so under a sharded `jit` the kernels are partitioned by rows
(`custom_partitioning`): each device runs them on its own rows, and XLA sums the weight's
gradient over devices (a mesh of automatic axes, as `jax.sharding.Mesh` makes; Pallas refuses
explicit ones). They are written against Pallas's Triton lowering, whose tiles have
power-of-two sizes; a row of any width is held as a few power-of-two column chunks
(1280 = 1024 + 256).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.custom_partitioning import custom_partitioning
from jax.experimental.pallas import triton as plgpu
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from pallas_kernels.reference import add_rms_norm_reference

__all__ = ["NormBlocks", "add_rms_norm"]

IMPLEMENTATIONS = ("pallas", "xla")


@dataclasses.dataclass(frozen=True, slots=True)
class NormBlocks:
    """Rows per program and launch parameters.

    Attributes:
      rows_fwd: rows each forward program normalizes.
      rows_bwd: rows the backward holds in registers at a time.
      steps_bwd: row groups each backward program walks through, accumulating its part of
        the weight's gradient (one partial sum per rows_bwd * steps_bwd rows goes to memory).
      num_warps_fwd, num_warps_bwd: warps per program.
      num_stages_bwd: Triton's software pipelining of the backward's loop over row groups.
      min_programs_bwd: the backward walks fewer row groups per program (halving steps_bwd)
        while its rows would fill fewer programs than this: at a small batch, one one-warp
        program per SM or less leaves each SM waiting on memory latency.

    Rows per program shrink to the largest power of two that divides the row count. The
    defaults give each row one warp: its sums are then warp shuffles, with no shared-memory
    round trip and no barrier between the warps of a program.
    """

    rows_fwd: int = 1
    rows_bwd: int = 1
    steps_bwd: int = 32
    num_warps_fwd: int = 1
    num_warps_bwd: int = 1
    num_stages_bwd: int = 1
    min_programs_bwd: int = 1024


def _chunks(width: int) -> tuple[tuple[int, int], ...]:
    """(start, size) column chunks covering `width`, each a power of two, largest first."""
    chunks, start = [], 0
    for bit in reversed(range(width.bit_length())):
        if width >> bit & 1:
            chunks.append((start, 1 << bit))
            start += 1 << bit
    return tuple(chunks)


def _dividing_power_of_two(n: int, cap: int) -> int:
    """The largest power of two <= cap that divides n."""
    p = 1
    while p * 2 <= cap and n % (p * 2) == 0:
        p *= 2
    return p


# -- kernels --------------------------------------------------------------------------------

def _fwd_kernel(*refs, eps: float, has_delta: bool):
    if has_delta:
        x_ref, delta_ref, w_ref, h_ref, y_ref, rstd_ref = refs
    else:
        x_ref, w_ref, y_ref, rstd_ref = refs
    width = x_ref.shape[-1]
    rows, sum_sq = [], None
    for start, size in _chunks(width):
        cols = pl.ds(start, size)
        h = x_ref[:, cols]
        if has_delta:  # the add in float32, rounded to the stream's dtype as `x + delta` is
            h = (h.astype(jnp.float32) + delta_ref[:, cols].astype(jnp.float32)).astype(h_ref.dtype)
            h_ref[:, cols] = h
        h = h.astype(jnp.float32)
        rows.append(h)
        part = jnp.sum(h * h, axis=1)
        sum_sq = part if sum_sq is None else sum_sq + part
    rstd = lax.rsqrt(sum_sq / width + eps)
    rstd_ref[...] = rstd
    for (start, size), h in zip(_chunks(width), rows):
        cols = pl.ds(start, size)
        w = w_ref[cols].astype(jnp.float32)
        y_ref[:, cols] = (h * rstd[:, None] * w[None, :]).astype(y_ref.dtype)


def _bwd_kernel(*refs, rows: int, steps: int, has_ddelta: bool):
    h_ref, rstd_ref, w_ref, dy_ref, dh_ref, dx_ref, *rest = refs
    ddelta_ref = rest.pop(0) if has_ddelta else None
    (dw_ref,) = rest
    width = h_ref.shape[-1]
    chunks = _chunks(width)

    def body(step, dw_parts):
        r = pl.ds(step * rows, rows)
        rstd = rstd_ref[r][:, None]
        normed, scaled, dot, new_parts = [], [], None, []
        for (start, size), dw in zip(chunks, dw_parts):
            cols = pl.ds(start, size)
            n = h_ref[r, cols].astype(jnp.float32) * rstd
            dy = dy_ref[r, cols].astype(jnp.float32)
            g = dy * w_ref[cols].astype(jnp.float32)[None, :]
            part = jnp.sum(g * n, axis=1)
            dot = part if dot is None else dot + part
            normed.append(n)
            scaled.append(g)
            new_parts.append(dw + jnp.sum(dy * n, axis=0))
        mean_dot = (dot / width)[:, None]
        for (start, size), n, g in zip(chunks, normed, scaled):
            cols = pl.ds(start, size)
            # d/dh of h * rstd: rstd * (g - n * mean(g * n)), g the gradient times the weight
            dh = rstd * (g - n * mean_dot) + dh_ref[r, cols].astype(jnp.float32)
            dx_ref[r, cols] = dh.astype(dx_ref.dtype)
            if has_ddelta:
                ddelta_ref[r, cols] = dh.astype(ddelta_ref.dtype)
        return tuple(new_parts)

    zeros = tuple(jnp.zeros((size,), jnp.float32) for _, size in chunks)
    dw_parts = lax.fori_loop(0, steps, body, zeros)
    for (start, size), dw in zip(chunks, dw_parts):
        dw_ref[pl.ds(start, size)] = dw


# -- launches on local (unsharded) arrays ---------------------------------------------------

def _forward(x, delta, w, *, eps, out_dtype, blocks, interpret):
    """(h, y, rstd) for rows [..., width]; h is x itself when there is no delta."""
    lead, width = x.shape[:-1], x.shape[-1]
    n = x.size // width
    rows = _dividing_power_of_two(n, blocks.rows_fwd)
    row_block = pl.BlockSpec((rows, width), lambda i: (i, 0))
    stat_block = pl.BlockSpec((rows,), lambda i: (i,))
    whole_w = pl.BlockSpec((width,), lambda i: (0,))
    has_delta = delta is not None
    inputs = [x.reshape(n, width)] + ([delta.reshape(n, width)] if has_delta else []) + [w]
    out_shape = ([jax.ShapeDtypeStruct((n, width), x.dtype)] if has_delta else []) + [
        jax.ShapeDtypeStruct((n, width), out_dtype), jax.ShapeDtypeStruct((n,), jnp.float32)]
    outs = pl.pallas_call(
        functools.partial(_fwd_kernel, eps=eps, has_delta=has_delta),
        grid=(n // rows,),
        in_specs=[row_block] * (2 if has_delta else 1) + [whole_w],
        out_specs=[row_block] * (2 if has_delta else 1) + [stat_block],
        out_shape=out_shape,
        compiler_params=plgpu.CompilerParams(num_warps=blocks.num_warps_fwd, num_stages=1),
        interpret=interpret,
        name="add_rms_norm_fwd" if has_delta else "rms_norm_fwd",
    )(*inputs)
    h, y, rstd = outs if has_delta else (x.reshape(n, width), *outs)
    return h.reshape(x.shape), y.reshape(x.shape), rstd.reshape(lead)


def _bwd_rows(x_shape, blocks) -> tuple[int, int]:
    """(rows, steps) of a backward program: its rows lie in one [..., T, width] slab's T, and
    steps shrink until the programs number at least `min_programs_bwd` (or steps is 1)."""
    seq = x_shape[-2] if len(x_shape) >= 2 else 1
    total = math.prod(x_shape[:-1])
    rows = _dividing_power_of_two(seq, blocks.rows_bwd)
    steps = _dividing_power_of_two(seq // rows, blocks.steps_bwd)
    while steps > 1 and total // (rows * steps) < blocks.min_programs_bwd:
        steps //= 2
    return rows, steps


def _backward(h, rstd, w, dy, dh, *, ddelta_dtype, blocks, interpret):
    """(dx, d delta, dw_partial), d delta only where `ddelta_dtype` asks for a copy of dx in
    another dtype; dw_partial [..., T // (rows * steps), width] sums to dw."""
    width = h.shape[-1]
    n = h.size // width
    rows, steps = _bwd_rows(h.shape, blocks)
    per_program = rows * steps
    row_block = pl.BlockSpec((per_program, width), lambda i: (i, 0))
    stat_block = pl.BlockSpec((per_program,), lambda i: (i,))
    inputs = [h.reshape(n, width), rstd.reshape(n), w, dy.reshape(n, width), dh.reshape(n, width)]
    in_specs = [row_block, stat_block, pl.BlockSpec((width,), lambda i: (0,)), row_block, row_block]
    out_shape = [jax.ShapeDtypeStruct((n, width), h.dtype)]
    if ddelta_dtype is not None:
        out_shape.append(jax.ShapeDtypeStruct((n, width), ddelta_dtype))
    out_shape.append(jax.ShapeDtypeStruct((n // per_program, width), jnp.float32))
    outs = pl.pallas_call(
        functools.partial(_bwd_kernel, rows=rows, steps=steps, has_ddelta=ddelta_dtype is not None),
        grid=(n // per_program,),
        in_specs=in_specs,
        out_specs=[row_block] * (len(out_shape) - 1) + [pl.BlockSpec((None, width), lambda i: (i, 0))],
        out_shape=out_shape,
        compiler_params=plgpu.CompilerParams(num_warps=blocks.num_warps_bwd, num_stages=blocks.num_stages_bwd),
        interpret=interpret,
        name="add_rms_norm_bwd",
    )(*inputs)
    return (*(o.reshape(h.shape) for o in outs[:-1]), outs[-1].reshape(*h.shape[:-2], -1, width))


# -- partitioning by rows -------------------------------------------------------------------

# What each argument or result of a launch is, as a sharding rule's factors: rows [..., T, width],
# per-row stats [..., T], the weight [width], the weight's partial sums [..., T / block, width].
_FACTORS = {"r": "... t d", "s": "... t", "w": "d", "p": "... b d"}


def _layout_shardings(mesh, x_sharding, ndim: int, kinds: str) -> list[NamedSharding]:
    """Shardings for `kinds`: x's sharding of the dims before [T, width], T and width whole."""
    spec = (tuple(x_sharding.spec) + (None,) * ndim)[:ndim - 2]
    full = {"r": P(*spec, None, None), "s": P(*spec, None), "w": P(), "p": P(*spec, None, None)}
    return [NamedSharding(mesh, full[k]) for k in kinds]


def _fold_partials(partials: jax.Array, rows: int) -> jax.Array:
    """The weight's partial sums [..., b, width] summed in adjacent groups to [..., rows, width].

    A device's share of the rows is fewer than the whole batch's, so `_bwd_rows` may give its
    backward programs fewer row groups each (more programs, more partial sums) than the
    unpartitioned shape XLA planned the result for; the counts are powers of two apart."""
    b, width = partials.shape[-2:]
    if b == rows:
        return partials
    if b % rows:
        raise ValueError(f"{b} partial sums per slab do not fold into the planned {rows}")
    return partials.reshape(*partials.shape[:-2], rows, b // rows, width).sum(axis=-2)


@functools.cache
def _by_rows(launch, ins: str, outs: str):
    """`launch(*arrays, config)` as an op that XLA partitions by rows: each device runs it on
    its own rows, T and width whole on every device."""
    op = custom_partitioning(launch, static_argnums=(len(ins),))

    def shardings(mesh, arg_shapes, kinds):
        x = arg_shapes[0]
        return _layout_shardings(mesh, x.sharding, len(x.shape), kinds)

    def infer(config, mesh, arg_shapes, result_shape):
        out = shardings(mesh, arg_shapes, outs)
        return out[0] if len(out) == 1 else tuple(out)

    def partition(config, mesh, arg_shapes, result_shape):
        out = shardings(mesh, arg_shapes, outs)
        results = result_shape if isinstance(result_shape, (tuple, list)) else (result_shape,)
        partial_rows = [r.shape[-2] if k == "p" else None for k, r in zip(outs, results)]

        def local(*arrays):
            got = launch(*arrays, config)
            if len(outs) == 1:
                return got
            return tuple(a if n is None else _fold_partials(a, n) for a, n in zip(got, partial_rows))

        return mesh, local, out[0] if len(out) == 1 else tuple(out), tuple(shardings(mesh, arg_shapes, ins))

    rule = ", ".join(_FACTORS[k] for k in ins) + " -> " + ", ".join(_FACTORS[k] for k in outs)
    op.def_partition(partition=partition, infer_sharding_from_operands=infer, sharding_rule=rule,
                     need_replication_factors=("t", "d", "b") if "p" in outs else ("t", "d"))
    return op


@dataclasses.dataclass(frozen=True)
class _Config:
    eps: float
    out_dtype: jnp.dtype
    has_delta: bool
    ddelta_dtype: jnp.dtype | None  # delta's dtype where it is not the stream's: its gradient a copy
    blocks: NormBlocks
    interpret: bool


def _launch_fwd(*arrays):
    *arrays, config = arrays
    x, delta, w = arrays if len(arrays) == 3 else (arrays[0], None, arrays[1])
    h, y, rstd = _forward(x, delta, w, eps=config.eps, out_dtype=config.out_dtype, blocks=config.blocks,
                          interpret=config.interpret)
    return (h, y, rstd) if delta is not None else (y, rstd)


def _launch_bwd(h, rstd, w, dy, dh, config):
    return _backward(h, rstd, w, dy, dh, ddelta_dtype=config.ddelta_dtype, blocks=config.blocks,
                     interpret=config.interpret)


# -- differentiation ------------------------------------------------------------------------

def _explicitly_sharded(a: jax.Array) -> bool:
    """Whether `a`'s type carries a split over a mesh's explicit axes (`jax.make_mesh`'s
    default), which a Pallas call refuses."""
    return any(p is not None for p in jax.typeof(a).sharding.spec)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _add_rms_norm(x, delta, w, config):
    return _add_rms_norm_fwd(x, delta, w, config)[0]


def _add_rms_norm_fwd(x, delta, w, config):
    if delta is None:
        y, rstd = _by_rows(_launch_fwd, "rw", "rs")(x, w, config)
        h = x
    else:
        h, y, rstd = _by_rows(_launch_fwd, "rrw", "rrs")(x, delta, w, config)
    return (h, y), (h, rstd, w)


def _add_rms_norm_bwd(config, residuals, cotangents):
    h, rstd, w = residuals
    dh, dy = cotangents
    separate = config.ddelta_dtype is not None
    outs = _by_rows(_launch_bwd, "rswrr", "rrp" if separate else "rp")(h, rstd, w, dy, dh, config)
    dx, dw_partial = outs[0], outs[-1]
    ddelta = outs[1] if separate else (dx if config.has_delta else None)
    dw = jnp.sum(dw_partial, axis=tuple(range(dw_partial.ndim - 1))).astype(w.dtype)
    return dx, ddelta, dw


_add_rms_norm.defvjp(_add_rms_norm_fwd, _add_rms_norm_bwd)


def add_rms_norm(x: jax.Array, delta: jax.Array | None, w: jax.Array, *, eps: float,
                 out_dtype: jnp.dtype | None = None, implementation: str | None = None,
                 blocks: NormBlocks | None = None, interpret: bool = False) -> tuple[jax.Array, jax.Array]:
    """(h, y): h = x + delta in x's dtype (x itself when delta is None), y = RMSNorm(h) * w.

    Args:
      x: the residual stream, [..., T, width] (at least two dims).
      delta: the sublayer output to add, shaped like x, any float dtype; or None.
      w: the norm's weight, [width].
      eps: added to the mean of squares.
      out_dtype: y's dtype (the next matmul's); x's dtype if None.
      implementation: "pallas" (the kernels), "xla" (the jnp reference, left to XLA's
        fusion), or None: the kernels on a GPU, the reference elsewhere and for arrays split
        over a mesh's explicit axes.
      blocks: rows per program and launch parameters; `NormBlocks()` if None.
      interpret: run the kernels in the Pallas interpreter (works on CPU).

    Differentiable in x, delta and w. The statistics are float32 whatever the dtypes.
    """
    if x.ndim < 2 or w.shape != x.shape[-1:] or (delta is not None and delta.shape != x.shape):
        raise ValueError(f"add_rms_norm takes x [..., T, width] (at least two dims), delta shaped like x "
                         f"and w [width]; got "
                         f"x {x.shape}, delta {None if delta is None else delta.shape}, w {w.shape}")
    explicit = [tuple(jax.typeof(a).sharding.spec) for a in (x, delta) if a is not None and _explicitly_sharded(a)]
    if implementation is None:
        implementation = "pallas" if jax.default_backend() == "gpu" and not explicit else "xla"
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"{implementation=} is not one of {IMPLEMENTATIONS}")
    if implementation == "pallas" and explicit:
        raise ValueError(f"implementation='pallas' takes arrays on no mesh or a mesh of automatic axes; these are "
                         f"split over explicit axes {explicit[0]}: use implementation='xla' (or None)")
    out_dtype = jnp.dtype(out_dtype or x.dtype)
    if implementation == "xla":
        return add_rms_norm_reference(x, delta, w, eps=eps, out_dtype=out_dtype)
    separate = delta is not None and jnp.dtype(delta.dtype) != jnp.dtype(x.dtype)
    config = _Config(float(eps), out_dtype, delta is not None, jnp.dtype(delta.dtype) if separate else None,
                     blocks or NormBlocks(), bool(interpret))
    return _add_rms_norm(x, delta, w, config)
