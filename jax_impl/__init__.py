"""Flax NNX implementation of the Transformer LM and AdamW."""

from jax_impl.model import TransformerLM, cross_entropy_loss
from jax_impl.optimizer import adamw

__all__ = ["TransformerLM", "adamw", "cross_entropy_loss"]
