"""Run documents written before today's per-device figures, brought to today's units."""

from __future__ import annotations

import copy

from harness import backends
from harness.common.documents import RunDocument

PER_DEVICE = ("per-device figures recomputed: this run predates them (JAX's TFLOP/s and peak were summed over its "
              "devices, a torch rank's tokens/s counted its own rows only)")


def per_device_run(doc: dict) -> dict:
    """A run document in today's units (`harness.timing.runner.FIGURES`): a data-parallel
    run written before them gets JAX's FLOPs, TFLOP/s and peak divided by N (MFU, a
    ratio of the two, is unchanged) and a torch rank's tokens/s multiplied by N (the
    whole job's rows). Documents that carry `figures`, and one-device runs, come back as
    they are; nothing is changed in place."""
    from harness.timing.runner import FIGURES

    n = (doc.get("data_parallel") or {}).get("n") or (doc.get("options") or {}).get("data_parallel") or 1
    if not RunDocument.from_dict(doc, need_schema=False).ok or "figures" in doc or n == 1:
        return doc
    new = copy.deepcopy(doc)
    backend = new["options"]["backend"]
    # one process over every device summed its devices' work (JAX); a rank counted its own rows
    jax = backend in backends.names() and backends.get(backend).one_process
    records = [new["phases"], *(r["phases"] for r in new.get("ranks", []))]
    for rec in (p for phases in records for p in phases.values()):
        if jax:
            rec["flops"] = rec["flops"] // n if rec.get("flops") else rec.get("flops")
            rec["tflops"] = rec["tflops"] / n if rec.get("tflops") else rec.get("tflops")
        elif rec.get("tokens_per_s"):
            rec["tokens_per_s"] *= n
    if jax and new.get("peak_tflops"):
        new["peak_tflops"] /= n
    new["figures"] = FIGURES
    new["upgraded"] = PER_DEVICE
    return new
