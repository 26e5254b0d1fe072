"""The public attention API: `flash_attention`, backend dispatch and the custom_vjp.

Two kernel families are registered in `FAMILIES`: "triton" (the portable
FlashAttention-2 kernels, `pallas_kernels.triton`) and "mosaic" (the Hopper
FlashAttention-3-style kernels, `pallas_kernels.hopper`). `resolve_backend`
is the one place that chooses between them; validation, default block sizes
and the forward/backward wiring are the same for both.

Batch and heads are independent, and XLA cannot split a kernel call over devices: on arrays
split over several, it would gather q, k and v and compute the whole batch's attention on
each. With a mesh of several devices set (`jax.set_mesh`), the kernels therefore run under
`jax.shard_map`, each device on its own sequences (the batch split over every axis of the
mesh). Each kernel is still lowered once however many layers call it, where partitioning each
call (`custom_partitioning`) lowered it again per call site at compile time.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable

import jax
from jax.sharding import PartitionSpec as P

from pallas_kernels import hopper
from pallas_kernels.hopper import MosaicBlockSizes
from pallas_kernels.triton import (
    MAX_HEAD_DIM,
    SUPPORTED_DTYPES,
    BlockSizes,
    triton_backward,
    triton_forward,
)

__all__ = [
    "BACKENDS",
    "FAMILIES",
    "KernelFamily",
    "default_block_sizes",
    "flash_attention",
    "flash_attention_with_lse",
    "resolve_backend",
]


@dataclasses.dataclass(frozen=True)
class KernelFamily:
    """What the dispatcher needs of one family of kernels."""

    forward: Callable[..., tuple[jax.Array, jax.Array]]
    backward: Callable[..., tuple[jax.Array, jax.Array, jax.Array]]
    default_block_sizes: Callable[..., object]  # (head_dim, seq_len, causal)
    block_sizes_type: type
    # Why this family cannot run the inputs here (None if it can).
    unsupported_reason: Callable[..., str | None]


def _shared(fn: Callable) -> Callable:
    """`fn` under its own jit: a model that calls attention in every layer then
    lowers each kernel once, as one function that every layer calls, instead of
    once per call site (the Mosaic GPU lowering takes ~0.3-1 s per kernel)."""
    return jax.jit(fn, static_argnames=("causal", "sm_scale", "block_sizes", "interpret"))


FAMILIES: dict[str, KernelFamily] = {
    "triton": KernelFamily(_shared(triton_forward), _shared(triton_backward), BlockSizes.get_default, BlockSizes,
                           lambda q, *, interpret: None),
    "mosaic": KernelFamily(_shared(hopper.mosaic_forward), _shared(hopper.mosaic_backward),
                           MosaicBlockSizes.get_default, MosaicBlockSizes, hopper.unsupported_reason),
}
# The values of `backend`: "auto" and every family's name.
BACKENDS: tuple[str, ...] = ("auto", *FAMILIES)


def default_block_sizes(backend: str, head_dim: int, seq_len: int | None = None,
                        causal: bool | None = None) -> BlockSizes | MosaicBlockSizes:
    """The block sizes `backend` ("triton" or "mosaic") runs with by default
    for this head_dim, sequence length and causality."""
    return FAMILIES[backend].default_block_sizes(head_dim, seq_len, causal)


def resolve_backend(backend: str | None, q: jax.Array | None = None, block_sizes: object = None,
                    interpret: bool = False) -> str:
    """Chooses the kernel family.

    "auto" (or None) takes the Hopper kernels ("mosaic") when they can run the
    inputs: a compute capability 9.x GPU, bfloat16/float16, a supported
    head_dim, not interpret mode. Everything else (float32, other GPUs, CPU
    interpret mode, other head dims) falls back to the portable "triton"
    kernels. Block sizes of one family select that family. A forced backend
    that cannot run the inputs raises a ValueError with the reason.
    """
    if backend is not None and backend != "auto" and backend not in FAMILIES:
        raise ValueError(f"unknown {backend=}; valid choices: None, {', '.join(map(repr, BACKENDS))}")
    if backend is None or backend == "auto":
        chosen = [name for name, b in FAMILIES.items() if isinstance(block_sizes, b.block_sizes_type)]
        if chosen:
            backend = chosen[0]
        elif q is not None and FAMILIES["mosaic"].unsupported_reason(q, interpret=interpret) is None:
            return "mosaic"
        else:
            return "triton"
    if q is not None:
        reason = FAMILIES[backend].unsupported_reason(q, interpret=interpret)
        if reason is not None:
            raise ValueError(f"backend={backend!r} cannot run these inputs: {reason}")
    return backend


def _check_inputs(q: jax.Array, k: jax.Array, v: jax.Array, sm_scale: float | None) -> float:
    """Validates shapes and dtypes; returns the softmax scale to use."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.ndim != 4:
            raise ValueError(f"{name}.ndim={x.ndim} must be 4 ([batch, seq, heads, head_dim])")
    if not q.shape == k.shape == v.shape:
        raise ValueError(f"q, k and v must have the same shape, got {q.shape=}, {k.shape=}, {v.shape=}")
    if not q.dtype == k.dtype == v.dtype:
        raise ValueError(f"q, k and v must have the same dtype, got {q.dtype=}, {k.dtype=}, {v.dtype=}")
    if q.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"dtype={q.dtype} must be one of {', '.join(map(str, SUPPORTED_DTYPES))}")
    batch, seq_len, heads, head_dim = q.shape
    if min(batch, seq_len, heads) < 1:
        raise ValueError(f"batch, seq and heads must be >= 1, got {q.shape=}")
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"{head_dim=} must be between 1 and {MAX_HEAD_DIM}")
    if sm_scale is None:
        return 1.0 / math.sqrt(head_dim)
    if not isinstance(sm_scale, (int, float)) or not math.isfinite(sm_scale) or sm_scale <= 0:
        raise ValueError(f"{sm_scale=} must be a finite positive Python float")
    return float(sm_scale)


def _prepare(q, k, v, causal, sm_scale, block_sizes, backend, interpret):
    scale = _check_inputs(q, k, v, sm_scale)
    name = resolve_backend(backend, q, block_sizes, interpret)
    expected = FAMILIES[name].block_sizes_type
    if block_sizes is None:
        block_sizes = FAMILIES[name].default_block_sizes(q.shape[-1], q.shape[1], bool(causal))
    elif not isinstance(block_sizes, expected):
        raise ValueError(f"block_sizes={block_sizes!r} must be a {expected.__name__} or None for backend {name!r}")
    return name, scale, block_sizes


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6, 7))
def _attention(q, k, v, causal, sm_scale, block_sizes, interpret, backend):
    return FAMILIES[backend].forward(q, k, v, causal=causal, sm_scale=sm_scale,
                                      block_sizes=block_sizes, interpret=interpret)[0]


def _attention_fwd(q, k, v, causal, sm_scale, block_sizes, interpret, backend):
    o, lse = FAMILIES[backend].forward(q, k, v, causal=causal, sm_scale=sm_scale,
                                        block_sizes=block_sizes, interpret=interpret)
    return o, (q, k, v, o, lse)


def _attention_bwd(causal, sm_scale, block_sizes, interpret, backend, residuals, do):
    q, k, v, o, lse = residuals
    return FAMILIES[backend].backward(q, k, v, o, lse, do, causal=causal, sm_scale=sm_scale,
                                       block_sizes=block_sizes, interpret=interpret)


_attention.defvjp(_attention_fwd, _attention_bwd)


def _per_device(fn: Callable, batch: int, outs: int) -> Callable:
    """`fn(q, k, v)` under `jax.shard_map` over the mesh set, the batch split over all its axes,
    when one of several devices is set and divides the batch; else `fn` itself (also inside a
    caller's own `shard_map`, where the arrays are already one device's)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1 or batch % mesh.size or mesh.manual_axes:
        return fn
    split = P(tuple(mesh.axis_names))
    return jax.shard_map(fn, mesh=mesh, in_specs=(split,) * 3, out_specs=split if outs == 1 else (split,) * outs,
                         check_vma=False)


def flash_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    causal: bool = True,
    sm_scale: float | None = None,
    block_sizes: BlockSizes | None = None,
    interpret: bool = False,
    backend: str | None = None,
) -> jax.Array:
    """Fused multi-head attention, differentiable w.r.t. q, k and v.

    Args:
      q, k, v: [batch, seq, heads, head_dim] arrays of one dtype (float32,
        bfloat16 or float16) and one shape; head_dim <= 256, any seq >= 1.
      causal: mask keys after each query position.
      sm_scale: softmax scale (a positive Python float); 1/sqrt(head_dim) if None.
      block_sizes: tiles and launch parameters (a BlockSizes for "triton", a
        MosaicBlockSizes for "mosaic"); the chosen backend's defaults if None.
        Under "auto", passing one selects its family.
      interpret: run the kernels in the Pallas interpreter (works on CPU;
        always the "triton" kernels).
      backend: None or "auto" (Hopper kernels on compute capability 9.x for
        bfloat16/float16 and head_dim in hopper.SUPPORTED_HEAD_DIMS, the
        portable kernels otherwise), "triton" (the
        portable Pallas GPU lowering) or "mosaic" (the Hopper kernels; a
        ValueError says why if they cannot run the inputs).

    Returns:
      o, shaped and typed like q. Float32 inputs run on the "triton" kernels
      with TF32 tensor-core products on GPU (as XLA does at default
      precision); accumulation is float32.
    """
    name, scale, block_sizes = _prepare(q, k, v, causal, sm_scale, block_sizes, backend, interpret)
    attend = functools.partial(_attention, causal=bool(causal), sm_scale=scale, block_sizes=block_sizes,
                               interpret=bool(interpret), backend=name)
    return _per_device(attend, q.shape[0], 1)(q, k, v)


def flash_attention_with_lse(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    causal: bool = True,
    sm_scale: float | None = None,
    block_sizes: BlockSizes | None = None,
    interpret: bool = False,
    backend: str | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Forward pass only: (o, lse), lse = log(sum(exp(scaled scores))) per row,
    shaped [batch, heads, seq], float32. Use `flash_attention` for gradients."""
    name, scale, block_sizes = _prepare(q, k, v, causal, sm_scale, block_sizes, backend, interpret)
    forward = functools.partial(FAMILIES[name].forward, causal=bool(causal), sm_scale=scale, block_sizes=block_sizes,
                                interpret=bool(interpret))
    return _per_device(lambda q, k, v: tuple(forward(q, k, v)), q.shape[0], 2)(q, k, v)
