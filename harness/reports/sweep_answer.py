"""The answer of a sweep report, from its analysis (`harness.sweeps.analysis.analyze`):
how the two frameworks' steps compare over the cells, the best MFU per backend, what
mixed precision gains, where the backward/forward regime changes, and the cells that
failed."""

from __future__ import annotations

import statistics

from harness.common.answer import Finding
from harness.sweeps.analysis import STATUS_TEXT

RULES = ("ratios are medians of one cell over the other (JAX's fused step against torch's step); a regime is the "
         "backward/forward ratio: memory-bound below 1.35x, compute-bound from 1.7x; MFU per device against the "
         "datasheet peak for the dtype")


def _spread(values: list[float]) -> str:
    """"0.25x (median; 0.16-0.37x over 7 cells)"."""
    return (f"{statistics.median(values):.2f}x (median; {min(values):.2f}-{max(values):.2f}x over {len(values)} "
            f"cell{'s' if len(values) > 1 else ''})")


def sweep_findings(data: dict) -> list[Finding]:
    out = []
    pairs = dict.fromkeys((r["backend"], r["reference"]) for r in data["ratios"])
    for (over, under), dtype in ((p, d) for p in pairs for d in sorted({r["dtype"] for r in data["ratios"]})):
        ratios = [r["fused_step"] or r["step"] for r in data["ratios"] if r["dtype"] == dtype
                  and r["backend"] == over and (r["fused_step"] or r["step"])]
        if ratios:
            faster = sum(x < 1 for x in ratios)
            out.append(Finding("speed", f"{dtype}: {over}'s step takes {_spread(ratios)} the time of {under}'s; "
                               f"{over} is faster in {faster} of {len(ratios)}", "Phase times"))
    if data["best"]:
        best = ", ".join((f"{b['backend']} {b['dtype']} {b['mfu']:.1%}" if b["mfu"] is not None else
                          f"{b['backend']} {b['dtype']} {b['tflops']:.2f} TFLOP/s")
                         + (f" (at {b['sm_mhz']:.0f} MHz: {b['mfu_at_clock']:.1%} at that clock)"
                            if b.get("sm_mhz") and b.get("mfu_at_clock") else "") for b in data["best"])
        out.append(Finding("peak", f"best whole-step MFU per device: {best}", "Best MFU per backend"))
    by_backend: dict[tuple[str, str], list[float]] = {}
    for r in data["speedups"]:
        if x := (r["fused_step"] or r["step"]):
            by_backend.setdefault((r["backend"], r["dtype"]), []).append(x)
    for (backend, dtype), xs in by_backend.items():
        out.append(Finding("precision", f"{backend} {dtype} runs its step {_spread(xs)} as fast as in fp32",
                           "Mixed vs full precision"))
    changes = [n for n in data["bound_notes"] if n["first"] != n["last"]]
    if data["bound_notes"]:
        out.append(Finding("regime", f"backward/forward regime changes with context in {len(changes)} of "
                           f"{len(data['bound_notes'])} series"
                           + (": " + ", ".join(f"{n['backend']} {n['dtype']} {n['model']} ({n['first']} -> "
                                               f"{n['last']})" for n in changes[:3]) if changes else ""),
                           "Backward / forward"))
    if data["failed"]:
        kinds: dict[str, list[str]] = {}
        for c in data["failed"]:
            kinds.setdefault(STATUS_TEXT.get(c["status"], c["status"]), []).append(c["key"])
        out.append(Finding("failed", "; ".join(f"{len(keys)} cell{'s' if len(keys) > 1 else ''} {what}: "
                                               + ", ".join(keys[:3]) + (" ..." if len(keys) > 3 else "")
                                               for what, keys in kinds.items()), "Failed cells"))
    return out
