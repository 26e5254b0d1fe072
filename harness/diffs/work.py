"""Whether the two sides of a diff did the same work, before any ratio is set between them.

A diff's ratio means "B runs A's work faster" only where both sides ran the same program
on the same data. Where the documents say what each side computed, their FLOPs per device
of the compared step (or, without FLOPs, the model, ctx, batch and mode a forced diff
let through) must agree. Where only the profiles say it, the kinds of kernels that follow
from the model rather than from how a framework fuses it must agree: a side that spends a
tenth or more of its compute (GPU time less communication) in GEMMs, convolutions,
pooling or embedding lookups while the other spends under 1% in them ran another model (a
recommendation model's embedding tables against a transformer's matmuls, a ResNet's
convolutions). Attention, optimizer, elementwise, reduction, copy and communication
kernels are left out: fusion (XLA's fused step folds the optimizer into its fusions), the
attention kernel chosen and the number of devices change them for the same model.
"""

from __future__ import annotations

from harness import backends
from harness.diffs.inputs import PhaseProfile, Run
from harness.diffs.throughput import doc_field
from harness.trace.kernels import Category

# Kernel categories that follow from the model and the kind of step, not from fusion.
WORK_CATEGORIES = (Category.GEMM, Category.CONVOLUTION, Category.POOLING, Category.EMBEDDING)
PRESENT, ABSENT = 0.10, 0.01  # share of a side's compute: runs them / does not
FLOPS_TOLERANCE = 0.01
WORK_FIELDS = ("model", "ctx", "batch", "mode")


def _flops_per_device(run: Run, phase: str) -> float | None:
    """The FLOPs of `phase` per device that a run document recorded (a data-parallel JAX
    document from before the per-device figures summed its devices' work)."""
    flops = doc_field(run.doc, ("phases", phase, "flops"))
    if not flops:
        return None
    n = int(doc_field(run.doc, ("data_parallel", "n")) or 1)
    backend = doc_field(run.doc, ("options", "backend"))
    summed = n > 1 and "figures" not in run.doc and backend in backends.names() and backends.get(backend).one_process
    return flops / n if summed else flops


def _shares(p: PhaseProfile) -> dict[str, float]:
    """Each category's share of a phase's GPU time less communication."""
    compute = sum(v for c, v in p.categories.items() if c != Category.COMMUNICATION.value)
    return {c: v / compute for c, v in p.categories.items()} if compute else {}


def different_work(a: Run, b: Run, pair: tuple[str, str, str] | None, fields: dict[str, tuple]) -> list[str]:
    """What shows that A and B did different work in the compared step `pair` (name, A's
    phase, B's phase), one clause each; empty where nothing does (module docstring)."""
    out = []
    if pair is not None:
        fa, fb = _flops_per_device(a, pair[1]), _flops_per_device(b, pair[2])
        if fa and fb and abs(fa - fb) > FLOPS_TOLERANCE * max(fa, fb):
            out.append(f"{a.label}'s {pair[1]} computes {fa / 1e12:.3g} TFLOP per device, {b.label}'s {pair[2]} "
                       f"{fb / 1e12:.3g}")
    if not out:
        unlike = [f"{k} ({va} vs {vb})" for k in WORK_FIELDS if (v := fields.get(k)) and None not in v
                  and (va := v[0]) != (vb := v[1])]
        if unlike:
            out.append(f"they differ in {', '.join(unlike)}")
    pa = (a.phases or {}).get(pair[1]) if pair else None
    pb = (b.phases or {}).get(pair[2]) if pair else None
    if pa is None or pb is None or Category.GRAPH.value in pa.categories or Category.GRAPH.value in pb.categories:
        return out  # no kernels to compare, or whole CUDA graphs whose kernels are unknown
    sa, sb = _shares(pa), _shares(pb)
    for category in WORK_CATEGORIES:
        x, y = sa.get(category.value, 0.0), sb.get(category.value, 0.0)
        if max(x, y) >= PRESENT and min(x, y) < ABSENT:
            out.append(f"{category.value} kernels are {x:.1%} of {a.label}'s compute and {y:.1%} of {b.label}'s")
    return out
