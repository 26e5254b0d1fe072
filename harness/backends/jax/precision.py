"""The JAX session's precision: XLA's matmul precision, and the parameters as the model sees them.

Under bf16 the float32 master weights of every matmul are cast to bf16 inside the jitted step,
so their gradients are bf16 in the backward before the cast back; the other parameters (norms,
the embedding) stay float32 throughout.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def set_matmul_precision(dtype: str) -> None:
    jax.config.update("jax_default_matmul_precision", "highest" if dtype == "fp32" else None)


def compute_params(params, dtype: str):
    """The parameters as the model sees them: bf16 matmul weights under "bf16"."""
    if dtype != "bf16":
        return params

    def cast(path, p):
        is_embedding = any(getattr(k, "key", None) == "token_embeddings" for k in path)
        return p.astype(jnp.bfloat16) if p.ndim == 2 and not is_embedding else p

    return jax.tree_util.tree_map_with_path(cast, params)


def sum_dtypes(params, dtype: str):
    """Each parameter's dtype as the model sees it (`compute_params`), as a tree like `params`:
    the dtype its gradient has in the backward, before the cast back to the parameter's."""
    return jax.tree.map(lambda a: jnp.dtype(a.dtype).name, jax.eval_shape(lambda p: compute_params(p, dtype), params))
