"""The gap by layer: where both runs recorded layers (`harness.run --layer-ranges` under
nsys), each phase's GPU time per canonical layer (`harness.trace.analyses.layers`) for A and B,
B - A, and the same aggregated by kind (all attention, all FFNs, all norms, embedding,
head, loss, outside the layers), so that a diff across frameworks reads "FFN: -12 ms"."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from harness.trace.analyses.layers import KINDS, OUTSIDE, layer_kind

KIND_NAMES = {"embedding": "embedding", "attn": "attention", "ffn": "FFN", "norm": "norms", "head": "head",
              "loss": "loss", "outside": "outside layers"}
MOVES = 3


@dataclass
class LayerRow:
    name: str  # a canonical layer, OUTSIDE, or a kind's name in `kinds`
    a_ms: float
    b_ms: float

    @property
    def delta_ms(self) -> float:
        return self.b_ms - self.a_ms


@dataclass
class LayerPhase:
    """One phase's GPU time per layer (model order) and per kind (KINDS order), A and B."""

    phase: str
    layers: list[LayerRow] = field(default_factory=list)
    kinds: list[LayerRow] = field(default_factory=list)


def _order(name: str) -> tuple:
    """Model order: embedding, blocks by index and sub-module, final norm, head, loss, outside."""
    m = re.fullmatch(r"layers\.(\d+)\.(\w+)", name)
    if m:
        return (1, int(m.group(1)), ("ln1", "attn", "ln2", "ffn").index(m.group(2)))
    top = ("token_embeddings", "", "ln_final", "lm_head", "loss", OUTSIDE)
    return (top.index(name) if name in top else len(top), 0, 0)


def diff_layers(a: dict[str, dict[str, float]] | None, b: dict[str, dict[str, float]] | None) -> list[LayerPhase]:
    """Per phase both sides have: the layer rows and the kind rows (ms per step); [] unless
    both runs carry layers (phase -> canonical layer -> ns per step)."""
    if not a or not b:
        return []
    out = []
    for phase in [p for p in a if p in b]:
        names = sorted(set(a[phase]) | set(b[phase]), key=_order)
        rows = [LayerRow(n, a[phase].get(n, 0.0) / 1e6, b[phase].get(n, 0.0) / 1e6) for n in names]
        kinds = {k: LayerRow(KIND_NAMES[k], 0.0, 0.0) for k in KINDS}
        for r in rows:
            k = kinds[layer_kind(r.name)]
            k.a_ms += r.a_ms
            k.b_ms += r.b_ms
        out.append(LayerPhase(phase, rows, [k for k in kinds.values() if k.a_ms or k.b_ms]))
    return out


def largest_moves(phases: list[LayerPhase], n: int = MOVES) -> list[tuple[str, LayerRow]]:
    """The `n` (phase, layer) rows with the largest |B - A|, largest first."""
    rows = [(p.phase, r) for p in phases for r in p.layers]
    return sorted(rows, key=lambda pr: -abs(pr[1].delta_ms))[:n]


def layer_sentences(phases: list[LayerPhase]) -> list[str]:
    """The three largest layer moves, and the gap by kind over the phases together."""
    if not phases:
        return []
    moves = [f"{phase} {r.name} {r.delta_ms:+.3f} ms ({r.a_ms:.3f} -> {r.b_ms:.3f})"
             for phase, r in largest_moves(phases)]
    totals: dict[str, float] = {}
    for p in phases:
        for k in p.kinds:
            totals[k.name] = totals.get(k.name, 0.0) + k.delta_ms
    kinds = ", ".join(f"{name}: {ms:+.3f} ms" for name, ms in sorted(totals.items(), key=lambda kv: -abs(kv[1])))
    return [f"Layers that moved most: {'; '.join(moves)}.",
            f"By kind of layer ({' + '.join(p.phase for p in phases)}): {kinds}."]
