"""PyTorch implementation of the Transformer LM and AdamW."""

from torch_impl.model import TransformerLM, cross_entropy_loss
from torch_impl.optimizer import AdamW

__all__ = ["TransformerLM", "AdamW", "cross_entropy_loss"]
