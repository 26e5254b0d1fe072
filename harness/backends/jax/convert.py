"""Weight conversion between the PyTorch and Flax models.

Both models name their parameters alike ("layers.3.attn.q_proj.weight") and store them
in the same layout, so conversion is a copy by name; any mismatch of names or shapes is
an error rather than a silent partial copy.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx


def jax_param_dict(model: nnx.Module) -> dict[str, jax.Array]:
    """Flax parameters keyed by dotted torch-style names."""
    flat = nnx.to_flat_state(nnx.state(model, nnx.Param))
    return {".".join(str(k) for k in path): var[...] for path, var in flat}


def _check_same_keys(src: dict, dst: dict, direction: str) -> None:
    if src.keys() != dst.keys():
        missing, extra = sorted(dst.keys() - src.keys()), sorted(src.keys() - dst.keys())
        raise ValueError(f"{direction}: parameter names differ; missing {missing[:5]}, unexpected {extra[:5]}")


def torch_to_jax(torch_model: torch.nn.Module, jax_model: nnx.Module) -> None:
    """Copy every parameter of `torch_model` into `jax_model` (in place); `jax_model` may
    hold shapes alone (built under `nnx.eval_shape`), which the copy makes concrete."""
    # Copies: on CPU, JAX may alias a suitably aligned NumPy buffer instead of copying it,
    # and torch's in-place optimizer would then change the JAX parameters too.
    src = {k: v.detach().to("cpu", torch.float32).numpy().copy() for k, v in torch_model.state_dict().items()}
    state = nnx.state(jax_model, nnx.Param)
    flat = nnx.to_flat_state(state)
    dst = {".".join(str(k) for k in path): var for path, var in flat}
    _check_same_keys(src, dst, "torch_to_jax")
    for name, var in dst.items():
        value, like = src[name], var.get_raw_value()  # an array, or its shape alone (nnx.eval_shape)
        if value.shape != like.shape:
            raise ValueError(f"torch_to_jax: {name} has shape {value.shape} in torch, {like.shape} in jax")
        var.set_value(jnp.array(value, dtype=like.dtype, copy=True))
    nnx.update(jax_model, state)


def jax_to_torch(jax_model: nnx.Module, torch_model: torch.nn.Module) -> None:
    """Copy every parameter of `jax_model` into `torch_model` (in place)."""
    src = jax_param_dict(jax_model)
    dst = dict(torch_model.state_dict())
    _check_same_keys(src, dst, "jax_to_torch")
    with torch.no_grad():
        for name, tensor in dst.items():
            value = np.array(src[name], dtype=np.float32)  # a writable copy
            if value.shape != tuple(tensor.shape):
                raise ValueError(f"jax_to_torch: {name} has shape {value.shape} in jax, {tuple(tensor.shape)} in torch")
            tensor.copy_(torch.from_numpy(value))
