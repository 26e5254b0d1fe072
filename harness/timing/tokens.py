"""The token batch both backends train on."""

from __future__ import annotations

import numpy as np


def make_tokens(vocab_size: int, batch: int, ctx: int, seed: int) -> np.ndarray:
    """(batch, ctx + 1) token ids; inputs are [:, :-1] and next-token targets [:, 1:]."""
    return np.random.default_rng(seed).integers(0, vocab_size, size=(batch, ctx + 1), dtype=np.int64)
