"""The answer of a compare report, from its summary: which backend is fastest per step and
by how much, against the noise; how near each comes to the device's peak; parity; and what
makes the figures doubtful (failed runs, noisy timings)."""

from __future__ import annotations

from harness.common.answer import NOISE_WORDS, Finding, overlap, speed
from harness.timing.compare_render import noise_warnings, parity_verdict

RULES = ("each backend's step is its median step time (JAX's fused step against the torch backends' step); "
         "beyond the noise where the two p10-p90 step ranges do not overlap; MFU against the device's dense peak "
         "for the dtype")


def _steps(summary: dict) -> dict[str, dict]:
    """Each finished backend's step phase: the fused step where it ran one."""
    out = {}
    for backend, r in summary["runs"].items():
        phases = r.get("phases") or {} if r.get("status") == "ok" else {}
        if p := phases.get("fused_step") or phases.get("step"):
            out[backend] = p
    return out


def compare_findings(summary: dict) -> list[Finding]:
    out = [Finding("failed", f"{b} FAILED: {r['error']['message']}", "Failed runs")
           for b, r in summary["runs"].items() if r.get("status") != "ok"]
    steps = _steps(summary)
    if steps:
        best = min(steps, key=lambda b: steps[b]["median_ms"])
        fast = steps[best]
        spread = lambda p: (p["p10_ms"], p["p90_ms"]) if p.get("p10_ms") is not None else None  # noqa: E731
        others = [f"{speed(p['median_ms'], fast['median_ms'])} than {b}, "
                  f"{NOISE_WORDS[overlap(spread(p), spread(fast))]}" for b, p in steps.items() if b != best]
        text = f"{best} is fastest: {fast['median_ms']:.1f} ms per step"
        out.append(Finding("speed", text + ("; " + "; ".join(others) if others else ""), "the table"))
        if mfu := [(b, p["mfu"]) for b, p in steps.items() if p.get("mfu")]:
            out.append(Finding("peak", "MFU per step: " + ", ".join(f"{b} {m:.1%}" for b, m in
                                                                    sorted(mfu, key=lambda x: -x[1])), "the table"))
    out.append(Finding("parity", f"parity: {parity_verdict(summary.get('parity'))}", "Parity"))
    if noisy := noise_warnings(summary):
        out.append(Finding("doubt", f"noisy timings: {noisy[0]}" + (f" (and {len(noisy) - 2} more)"
                                                                    if len(noisy) > 2 else ""),
                           "Warning: noisy timings"))
    firsts = {b: r["first_step"]["time_to_first_step_ms"] / 1e3 for b, r in summary["runs"].items()
              if r.get("status") == "ok" and (r.get("first_step") or {}).get("time_to_first_step_ms")}
    if firsts:
        out.append(Finding("steps", "time to first step (build, compile, first run): "
                           + ", ".join(f"{b} {s:.1f} s" for b, s in firsts.items()), "the table"))
    return out
