"""How a model layer is named, in the ranges the backends emit and in the analyses that read
them: the `layer:` prefix of a layer range, and the one canonical name of a layer whatever
framework's module or scope path it comes from."""

from __future__ import annotations

import re

LAYER_RANGE_PREFIX = "layer:"

_SUB = re.compile(r"(?:^|\.)layers[._](\d+)\.(ln1|attn|ln2|ffn)(?=\.|$)")
_TOP = re.compile(r"(?:^|\.)(token_embeddings|ln_final|lm_head|loss)(?=\.|$)")


def canonical_layer(path: str) -> str | None:
    """The canonical layer of a module or scope path of either framework, None if none.

    Accepts dotted and slashed paths and a mix (`layers.3.attn.q_proj`, `layers/3/attn`,
    `layers.3/attn`, `jit(step)/transpose(jvp(TransformerLM))/layers/3/ffn/w1/dot_general`),
    with or without the `layer:` prefix; the outermost layer named in the path wins."""
    text = path.removeprefix(LAYER_RANGE_PREFIX).replace("/", ".")
    hits = [(m.start(), f"layers.{m.group(1)}.{m.group(2)}") for m in _SUB.finditer(text)]
    hits += [(m.start(), m.group(1)) for m in _TOP.finditer(text)]
    return min(hits)[1] if hits else None
