"""The parameters, and each AdamW moment, as a few arrays laid out like the parameters.

A jitted call's host work grows with the arrays it takes and returns: on the model's arrays
the fused step of `large` takes 984 and returns 982, and a synchronized step waits for that
work before its first kernel. `FlatLayout` concatenates the parameters (all one dtype) in their tree's
order into a few one-dimensional arrays, each of at most `MAX_LEAVES` consecutive
parameters, and splits such arrays back; the session's fused step on one device, and the
replicated one on several, take their state that way (`JaxSession.fused_step`). Inside a
jitted program the split is a set of slices that XLA fuses into the casts reading them, and
autodiff through it concatenates the gradients.

Why a few arrays and not one: the AdamW update of one array reads the concatenation of
all the gradients, and XLA's GPU fusions take a bounded number of operands, so a
concatenation of the 327 gradients of `large` is cut into partial concatenations, each
written out and read again before the update. With at most `MAX_LEAVES` gradients per
array, each array's concatenation fuses whole into its update: one kernel per array
reading the gradients, parameters and moments once.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

MAX_LEAVES = 64  # parameters per array: their gradients' concatenation fits one GPU fusion


@dataclasses.dataclass(frozen=True)
class FlatLayout:
    """Where each parameter lies in the arrays: its tree, the shapes in leaf order, and the
    leaves each array holds (`groups`, as [start, stop) leaf indices)."""

    treedef: object
    shapes: tuple[tuple[int, ...], ...]
    dtype: object
    groups: tuple[tuple[int, int], ...]
    kinds: tuple = ()  # each array's kind, where the layout was cut by kinds (`of`)

    @classmethod
    def of(cls, params, max_leaves: int | None = None, kinds=None) -> FlatLayout:
        """The layout of `params`; with `kinds` (a tree like `params` of hashable labels), an
        array also ends wherever the next leaf's label differs, so that each array holds one
        kind of parameter (`kinds` then gives each array's label)."""
        max_leaves = MAX_LEAVES if max_leaves is None else max_leaves
        if max_leaves < 1:
            raise ValueError(f"max_leaves={max_leaves} must be at least 1")
        leaves, treedef = jax.tree.flatten(params)
        dtypes = {jnp.dtype(a.dtype) for a in leaves}
        if len(dtypes) != 1:
            raise ValueError(f"one array needs one dtype; the parameters have {sorted(map(str, dtypes))}")
        labels = treedef.flatten_up_to(kinds) if kinds is not None else [None] * len(leaves)
        groups, start = [], 0
        for i in range(1, len(leaves) + 1):
            if i == len(leaves) or i - start == max_leaves or labels[i] != labels[start]:
                groups.append((start, i))
                start = i
        return cls(treedef, tuple(tuple(a.shape) for a in leaves), dtypes.pop(), tuple(groups),
                   tuple(labels[a] for a, _ in groups) if kinds is not None else ())

    def sizes(self) -> tuple[int, ...]:
        """Elements of each array."""
        return tuple(sum(math.prod(s) for s in self.shapes[a:b]) for a, b in self.groups)

    @property
    def size(self) -> int:
        return sum(self.sizes())

    def spec(self) -> tuple[jax.ShapeDtypeStruct, ...]:
        return tuple(jax.ShapeDtypeStruct((n,), self.dtype) for n in self.sizes())

    def ravel(self, tree) -> tuple[jax.Array, ...]:
        leaves, treedef = jax.tree.flatten(tree)
        if treedef != self.treedef:
            raise ValueError("the tree is not laid out like the parameters")
        return tuple(jnp.concatenate([jnp.ravel(x) for x in leaves[a:b]]) for a, b in self.groups)

    def unravel(self, flats) -> object:
        leaves = []
        for (a, b), flat in zip(self.groups, flats, strict=True):
            ends = np.cumsum([math.prod(s) for s in self.shapes[a:b]])[:-1]
            leaves += [p.reshape(s) for p, s in zip(jnp.split(flat, ends), self.shapes[a:b], strict=True)]
        return self.treedef.unflatten(leaves)

    def _like(self, tree) -> bool:
        return jax.tree.structure(tree) == self.treedef

    def _is_flat(self, value) -> bool:
        return (type(value) is tuple and len(value) == len(self.groups)
                and all(tuple(getattr(x, "shape", ())) == (n,) for x, n in zip(value, self.sizes(), strict=True)))

    def ravel_all(self, tree):
        """`tree` (the optimizer state, say) with every subtree laid out like the parameters
        as this layout's arrays; the rest (a step count) as it is."""
        return jax.tree.map(lambda t: self.ravel(t) if self._like(t) else t, tree, is_leaf=self._like)

    def unravel_all(self, tree):
        """The inverse of `ravel_all`."""
        return jax.tree.map(lambda t: self.unravel(t) if self._is_flat(t) else t, tree, is_leaf=self._is_flat)
