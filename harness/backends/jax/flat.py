"""The parameters, and each AdamW moment, as one array laid out like the parameters.

A jitted call's host work grows with the arrays it takes and returns: the fused step of
`large` takes 984 and returns 982, and a synchronized step waits for that work before its
first kernel. `FlatLayout` concatenates the parameters (all one dtype) into one array in
their tree's order and splits such an array back; the session's fused step on one device
takes its state that way (`JaxSession.fused_step`). Inside a jitted program the split is a
set of slices that XLA fuses into the casts reading them, and autodiff through it
concatenates the gradients.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class FlatLayout:
    """Where each parameter lies in the one array: its tree, and the shapes in leaf order."""

    treedef: object
    shapes: tuple[tuple[int, ...], ...]
    dtype: object

    @classmethod
    def of(cls, params) -> FlatLayout:
        leaves, treedef = jax.tree.flatten(params)
        dtypes = {jnp.dtype(a.dtype) for a in leaves}
        if len(dtypes) != 1:
            raise ValueError(f"one array needs one dtype; the parameters have {sorted(map(str, dtypes))}")
        return cls(treedef, tuple(tuple(a.shape) for a in leaves), dtypes.pop())

    @property
    def size(self) -> int:
        return sum(math.prod(s) for s in self.shapes)

    def spec(self) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct((self.size,), self.dtype)

    def ravel(self, tree) -> jax.Array:
        leaves, treedef = jax.tree.flatten(tree)
        if treedef != self.treedef:
            raise ValueError("the tree is not laid out like the parameters")
        return jnp.concatenate([jnp.ravel(a) for a in leaves])

    def unravel(self, flat: jax.Array):
        ends = np.cumsum([math.prod(s) for s in self.shapes])[:-1]
        parts = jnp.split(flat, ends)
        return self.treedef.unflatten([p.reshape(s) for p, s in zip(parts, self.shapes, strict=True)])

    def _like(self, tree) -> bool:
        return jax.tree.structure(tree) == self.treedef

    def ravel_all(self, tree):
        """`tree` (the optimizer state, say) with every subtree laid out like the parameters
        as one array; the rest (a step count) as it is."""
        return jax.tree.map(lambda t: self.ravel(t) if self._like(t) else t, tree, is_leaf=self._like)

    def unravel_all(self, tree):
        """The inverse of `ravel_all`: every array of the flat size split back."""
        return jax.tree.map(lambda a: self.unravel(a) if tuple(a.shape) == (self.size,) else a, tree)
