"""Jitted programs traced and called with the session's mesh set (`jax.set_mesh`).

Code a program traces can then split its own work by device: the Pallas attention kernels
run under `jax.shard_map` over the mesh set (`pallas_kernels.attention`), where XLA, which
cannot split a kernel call, would gather their inputs onto every device.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
from jax.sharding import Mesh


class OnMesh:
    """A jitted function whose calls, lowerings and shape evaluations run with `mesh` set;
    anything else (the compilation cache's size, ...) is the jitted function's. Inside another
    trace (`jax.eval_shape` of it, say) the mesh cannot be set again: take `eval_shape` here."""

    def __init__(self, jitted: Callable, mesh: Mesh) -> None:
        self._jitted, self._mesh = jitted, mesh

    def __call__(self, *args, **kwargs):
        with jax.set_mesh(self._mesh):
            return self._jitted(*args, **kwargs)

    def lower(self, *args, **kwargs):
        with jax.set_mesh(self._mesh):
            return self._jitted.lower(*args, **kwargs)

    def eval_shape(self, *args, **kwargs):
        with jax.set_mesh(self._mesh):
            return self._jitted.eval_shape(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._jitted, name)


def jit_on(mesh: Mesh | None, **options) -> Callable[..., Callable]:
    """`jax.jit` with `options`, and with `mesh` set around each call where there is one."""
    def jit(fn: Callable, **kwargs) -> Callable:
        jitted = jax.jit(fn, **options, **kwargs)
        return jitted if mesh is None else OnMesh(jitted, mesh)
    return jit
