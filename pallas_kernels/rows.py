"""What the row-wise Pallas kernels of this package share: the choice between the kernels and
their jnp reference, the launch as an op XLA partitions by rows, power-of-two block lengths.

A Pallas call is one custom call to XLA's partitioner, which would gather its operands whole
onto every device. The kernels here work on rows independently (a row's sums in registers,
nothing shared across rows but a weight), so under a sharded `jit` each device can run them
on its own rows. `by_rows` wraps a launch so (`custom_partitioning`): the dims before the
named ones follow the first argument's sharding, the named ones (a row's length, the
sequence, a weight) whole on every device, as a Shardy rule that names them."""

from __future__ import annotations

import functools

import jax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

IMPLEMENTATIONS = ("pallas", "xla")


def choose_implementation(implementation: str | None, *arrays) -> str:
    """The implementation a call runs: "pallas" (the kernels) or "xla" (the jnp reference,
    left to XLA's fusion). None picks the kernels on a GPU and the reference elsewhere and for
    arrays split over a mesh's explicit axes (`jax.make_mesh`'s default), which a Pallas call
    refuses; asking for the kernels on such arrays is one error naming the fix."""
    explicit = [tuple(jax.typeof(a).sharding.spec) for a in arrays
                if a is not None and any(p is not None for p in jax.typeof(a).sharding.spec)]
    if implementation is None:
        implementation = "pallas" if jax.default_backend() == "gpu" and not explicit else "xla"
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"{implementation=} is not one of {IMPLEMENTATIONS}")
    if implementation == "pallas" and explicit:
        raise ValueError(f"implementation='pallas' takes arrays on no mesh or a mesh of automatic axes; these are "
                         f"split over explicit axes {explicit[0]}: use implementation='xla' (or None)")
    return implementation


def _named(factors: str) -> list[str]:
    return [f for f in factors.split() if f != "..."]


def _shardings(mesh, first, first_factors: str, factors: tuple[str, ...]) -> list[NamedSharding]:
    """Per factor string: the first argument's sharding of its leading ("...") dims, the named
    dims whole; a string without "..." (a weight) replicated. `first`: the first argument's
    shape and sharding, as the partitioning callbacks receive it."""
    ndim = len(first.shape)
    lead = (tuple(first.sharding.spec) + (None,) * ndim)[:ndim - len(_named(first_factors))]
    return [NamedSharding(mesh, P(*lead, *[None] * len(_named(f))) if f.startswith("...") else P())
            for f in factors]


@functools.cache
def by_rows(launch, ins: tuple[str, ...], outs: tuple[str, ...]):
    """`launch(*arrays, config)` as an op partitioned by rows. `ins` and `outs` give each
    argument's and result's dims as a sharding rule's factors ("... t d", "d"); every named
    factor stays whole on each device."""
    op = custom_partitioning(launch, static_argnums=(len(ins),))

    def layout(mesh, arg_shapes, factors):
        return _shardings(mesh, arg_shapes[0], ins[0], factors)

    def one_or_tuple(out):
        return out[0] if len(out) == 1 else tuple(out)

    def infer(config, mesh, arg_shapes, result_shape):
        return one_or_tuple(layout(mesh, arg_shapes, outs))

    def partition(config, mesh, arg_shapes, result_shape):
        return (mesh, lambda *arrays: launch(*arrays, config), one_or_tuple(layout(mesh, arg_shapes, outs)),
                tuple(layout(mesh, arg_shapes, ins)))

    # in the order the rule first names them, as the rule's factor indices run
    named = list(dict.fromkeys(f for factors in ins + outs for f in _named(factors)))
    op.def_partition(partition=partition, infer_sharding_from_operands=infer,
                     sharding_rule=", ".join(ins) + " -> " + ", ".join(outs), need_replication_factors=tuple(named))
    return op


def dividing_power_of_two(n: int, cap: int) -> int:
    """The largest power of two <= cap that divides n: a Triton-lowered block's length along
    an axis of n elements."""
    p = 1
    while p * 2 <= cap and n % (p * 2) == 0:
        p *= 2
    return p
