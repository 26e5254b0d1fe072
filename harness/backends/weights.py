"""The weights every backend starts from: torch_impl's initialisation on CPU with the run's
seed (JAX converts them), so that the backends compare one model, not two draws of it."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch_impl
    from harness.config import ModelConfig


def init_model(config: ModelConfig, seed: int) -> torch_impl.TransformerLM:
    """torch_impl.TransformerLM(config) initialised on CPU from `seed`."""
    import torch

    import torch_impl

    torch.manual_seed(seed)
    return torch_impl.TransformerLM(config)
