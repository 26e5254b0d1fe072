"""Layers: the canonical layer names both frameworks' kernels are attributed to, and the
per-layer kernel time of each phase.

Both model files name their modules alike (`token_embeddings`, `layers.{i}` holding `ln1`,
`attn`, `ln2`, `ffn`, then `ln_final`, `lm_head`; the harness adds `loss`). A kernel's
layer is one of the canonical names `token_embeddings`, `layers.{i}.ln1`,
`layers.{i}.attn`, `layers.{i}.ln2`, `layers.{i}.ffn`, `ln_final`, `lm_head`, `loss`, or
`OUTSIDE` for the kernels of a phase that fall in none (the residual adds between
sub-modules, work of the phase outside the model). Sub-modules below these fold in
(`layers.3.attn.q_proj` is `layers.3.attn`).

torch records its layers as NVTX ranges `layer:<module path>` (`LAYER_RANGE_PREFIX`),
pushed from module hooks; a kernel belongs to the innermost such range around its launch
call on the launching thread (`layer_labels`). JAX maps kernels to its named scopes through
XLA's metadata and yields the same per-kernel labels. `layer_totals` turns either into
nanoseconds per step per phase and layer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from harness.common.layer_names import LAYER_RANGE_PREFIX, canonical_layer
from harness.trace.analyses import attribution as attr
from harness.trace.profile import KernelTable, Range

OUTSIDE = "(outside layers)"
# Layer kinds for aggregate tables, in report order; `layer_kind` maps a canonical name.
KINDS = ("embedding", "attn", "ffn", "norm", "head", "loss", "outside")



def layer_kind(name: str) -> str:
    """The kind (one of KINDS) of a canonical layer name or OUTSIDE."""
    if name == OUTSIDE:
        return "outside"
    sub = name.rpartition(".")[2]
    return {"token_embeddings": "embedding", "lm_head": "head", "loss": "loss", "attn": "attn", "ffn": "ffn",
            "ln1": "norm", "ln2": "norm", "ln_final": "norm"}.get(sub, "outside")


def layer_labels(kernels: KernelTable, ranges: Sequence[Range]) -> np.ndarray:
    """Each kernel's canonical layer (object array; OUTSIDE where none): the innermost
    `layer:` range containing its launch call on the launching thread (CUPTI correlation).

    By launch, not by execution: the layer ranges do not end in a synchronization, so a
    kernel runs after its range has closed. Only the launching thread's ranges count: the
    forward's ranges are pushed on the main thread, the backward's on autograd's thread,
    and a range of one thread says nothing about the other's launches. A range whose
    path has no canonical name (a whole block, `layers.3`) labels its own kernels OUTSIDE."""
    layered = [r for r in ranges if r.name.startswith(LAYER_RANGE_PREFIX)]
    names = np.array([canonical_layer(r.name) or OUTSIDE for r in layered] + [OUTSIDE], dtype=object)
    inner = attr.by_launch(kernels, layered, any_thread=False)
    return names[inner]  # -1 picks the trailing OUTSIDE


def layer_totals(table: KernelTable, phase_ranges: Mapping[str, Sequence[Range]],
                 labels: np.ndarray) -> dict[str, dict[str, float]]:
    """Phase -> canonical layer -> ns per step, most time first.

    `phase_ranges`: per phase, its measured instances (one range per step; the per-step
    divisor is their number). A kernel counts in a phase when its execution interval lies
    inside one of them, which is sound for the harness's phases: each ends in a device
    synchronization. `labels`: one canonical name (or OUTSIDE) per kernel of `table`. Every
    kernel of a phase lands in exactly one layer, so a phase's layers sum to its kernel
    total."""
    labels = np.asarray(labels, dtype=object)
    if len(labels) != len(table):
        raise ValueError(f"labels: {len(labels)} for {len(table)} kernels; give one label per kernel")
    out: dict[str, dict[str, float]] = {}
    uniq, code = np.unique(labels.astype(str), return_inverse=True)
    dur = table.duration.astype(np.float64)
    for phase, insts in phase_ranges.items():
        if not insts:
            continue
        mask = np.zeros(len(table), bool)
        for r in insts:
            lo, hi = np.searchsorted(table.start, r.start, "left"), np.searchsorted(table.start, r.end, "right")
            mask[lo:hi] |= table.end[lo:hi] <= r.end
        ns = np.bincount(code[mask], weights=dur[mask], minlength=len(uniq)) / len(insts)
        out[phase] = {str(uniq[i]): float(ns[i]) for i in np.argsort(-ns, kind="stable") if ns[i]}
    return out


LAYER_PHASES = ("forward", "backward")


def measured_layer_phases(ranges: Sequence[Range], root: np.ndarray, warm: np.ndarray,
                          first: set[int]) -> dict[str, list[Range]]:
    """The measured `forward` and `backward` ranges of the `step` roots: where layers are counted."""
    out: dict[str, list[Range]] = {name: [] for name in LAYER_PHASES}
    for i, r in enumerate(ranges):
        if r.name in out and root[i] >= 0 and not warm[i] and root[i] not in first \
                and ranges[root[i]].name == "step":
            out[r.name].append(r)
    return {name: insts for name, insts in out.items() if insts}
