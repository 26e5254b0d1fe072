"""The layer vocabulary both frameworks' layer attribution speaks.

Canonical layer names: ``token_embeddings``, ``layers.{i}.ln1``, ``layers.{i}.attn``,
``layers.{i}.ln2``, ``layers.{i}.ffn``, ``ln_final``, ``lm_head`` and the harness's
``loss``. Sub-module granularity stops there (an attention's q_proj folds into
``layers.{i}.attn``); work inside a block but outside its sub-modules (the residual adds)
has no canonical name.
"""

from __future__ import annotations

import re

BLOCK_PARTS = ("ln1", "attn", "ln2", "ffn")
TOP_LEVEL = ("token_embeddings", "ln_final", "lm_head", "loss")


def canonical_layer(path: str) -> str | None:
    """The canonical layer of a module or scope path, dotted or slashed, from either
    framework (``layers.3.attn.q_proj``, ``layers/3/attn``, ``layers.3/attn/dot_general``);
    None when the path names no layer."""
    parts = [p for p in re.split(r"[./]", path) if p]
    for i, part in enumerate(parts):
        if part in TOP_LEVEL:
            return part
        if part == "layers" and i + 1 < len(parts) and parts[i + 1].isdigit():
            sub = parts[i + 2] if i + 2 < len(parts) else None
            return f"layers.{int(parts[i + 1])}.{sub}" if sub in BLOCK_PARTS else None
    return None
