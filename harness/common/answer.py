""""The answer": the few findings every report opens with, and the rules that make them.

A finding is one sentence with its number and the section of the report to read next.
Tools derive findings from the analyses they already ran; this module holds what makes the
same finding read the same in every tool: the thresholds (stated under the findings), the
phrases for each kind of finding, and the markdown of the section.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MAX_FINDINGS = 12
HOST_BOUND = 0.5  # the GPU computes less than this share of the step: the host sets the pace
GPU_BOUND = 0.85  # ... at least this share: the GPU's own work sets the pace
STRAGGLER = 1.05  # slowest over fastest rank's step time beyond this: a straggler
OUTLIER_STEPS = 1.2  # a step's mean time over its median beyond this: outlier steps
LEAD_SHARE = 0.01  # the GPU waiting this share of the step for its first kernel is said in the answer
DOUBT_SHARE = 0.05  # kernel time outside every range beyond this share: attribution is in doubt
NOISE_WORDS = {True: "inside the noise (the p10-p90 ranges overlap)", False: "beyond the noise",
               None: "noise unknown (no timer spread on one side)"}

RULES = (f"host-bound where the GPU computes (busy, less exposed communication) under {HOST_BOUND:.0%} of the "
         f"step, GPU-bound from {GPU_BOUND:.0%}; a straggler where the slowest rank's median step is over "
         f"{STRAGGLER:.2f}x the fastest's; outlier steps where a step's mean time is over {OUTLIER_STEPS:.1f}x its "
         f"median; categories listed down to 10% of the step")


@dataclass(frozen=True)
class Finding:
    """One line of the answer: `text` says what, with its number; `see` where to read on."""

    topic: str
    text: str
    see: str = ""


def speed(a_ms: float, b_ms: float) -> str:
    """B against A as a speed ratio and the time saved or added: "5.07x faster (80.3% less time)"."""
    if not (a_ms > 0 and b_ms > 0) or a_ms == b_ms:
        return "the same time" if a_ms == b_ms else "no ratio (a time is zero or missing)"
    if b_ms < a_ms:
        return f"{a_ms / b_ms:.2f}x faster ({(a_ms - b_ms) / a_ms:.1%} less time, {a_ms - b_ms:.3f} ms)"
    return f"{b_ms / a_ms:.2f}x slower ({(b_ms - a_ms) / a_ms:.1%} more time, {b_ms - a_ms:.3f} ms)"


def overlap(a: tuple[float, float] | None, b: tuple[float, float] | None) -> bool | None:
    """Whether two p10-p90 ranges overlap (None: a side has no spread)."""
    return None if not (a and b) else a[0] <= b[1] and b[0] <= a[1]


def bound(compute_share: float) -> str:
    """The verdict word for the share of the step the GPU spends computing."""
    if compute_share < HOST_BOUND:
        return "host-bound"
    return "GPU-bound" if compute_share >= GPU_BOUND else "partly host-bound"


def bound_text(who: str, step_ms: float, busy_ms: float, exposed_ms: float, lead_ms: float | None = None) -> str:
    """"rank1: host-bound: its GPU computes 12.7% of the step (19.1 of 150.4 ms) ...": the
    busy time less the exposed communication, against the step's wall time; where the GPU
    waits more than `LEAD_SHARE` of the step for its first kernel (`lead_ms`), that wait."""
    compute = max(min(busy_ms, step_ms) - exposed_ms, 0.0)
    share = compute / step_ms if step_ms else 0.0
    text = f"{who}: {bound(share)}: its GPU computes {share:.1%} of the step ({compute:.1f} of {step_ms:.1f} ms)"
    if exposed_ms > 0.05 * step_ms:
        text += f"; {exposed_ms / step_ms:.1%} of the step is exposed communication"
    if lead_ms is not None and lead_ms > LEAD_SHARE * step_ms:
        text += f"; it waits {lead_ms:.1f} ms of it for the host to launch the step's first kernel"
    return text


def categories_text(who: str, shares: Sequence[tuple[str, float]], top: tuple[str, float] | None = None) -> str:
    """"torch: the step is gemm 45.0%, attention 20.1%; top kernel `x` (12.0%)": the
    categories at or above 10% of the step's GPU time, the largest first."""
    held = [f"{name} {share:.1%}" for name, share in shares if share >= 0.1] or \
           [f"{name} {share:.1%}" for name, share in shares[:1]]
    text = f"{who}: the step is " + ", ".join(held) + " of GPU time"
    return text + (f"; top kernel `{top[0]}` ({top[1]:.1%})" if top else "")


def answer_markdown(findings: Sequence[Finding], rules: str = RULES) -> list[str]:
    """The section: at most `MAX_FINDINGS` lines, then the rules the verdicts follow."""
    lines = ["## The answer", ""]
    for f in findings[:MAX_FINDINGS]:
        lines.append(f"- {f.text}" + (f" (see: {f.see})" if f.see else ""))
    if len(findings) > MAX_FINDINGS:
        lines.append(f"- ... {len(findings) - MAX_FINDINGS} more findings in the sections below")
    return [*lines, "", f"Rules: {rules}.", ""]
