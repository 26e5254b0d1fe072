"""The answer of a compare report, from its summary: which backend is fastest per step and
by how much, against the noise; how near each comes to the device's peak, and under a
profiler where the rest of its step went in points of MFU; parity; and what
makes the figures doubtful (failed runs, noisy timings). The parity and noise verdicts the
report's sections print live here too."""

from __future__ import annotations

from harness.common.answer import NOISE_WORDS, Finding, overlap, speed
from harness.common.documents import runs_of, whole_step
from harness.common.stats import NOISY_SPREAD
from harness.diffs.throughput import MFU_PARTS
from harness.reports.run import clock_text

RULES = ("each backend's step is its median step time (JAX's fused step against the torch backends' step); "
         "beyond the noise where the two p10-p90 step ranges do not overlap; MFU against the device's dense peak "
         "for the dtype")


def parity_verdict(parity: dict | None) -> str:
    if parity is None:
        return "not run"
    if parity.get("ok") is None:
        return f"could not run: {parity.get('error')}"
    worst = parity["worst"]
    detail = ", ".join(f"{q} {w['rel_err']:.1e} (bound {w['tol']:.0e})" for q, w in worst.items())
    batch = f" at reduced batch {parity['batch']}" if parity.get("reduced_batch") else ""
    return f"{'PASS' if parity['ok'] else 'FAIL'}{batch}: worst relative errors {detail}"


def noise_warnings(summary: dict) -> list[str]:
    """Why the ratios between backends are not to be trusted, one line per noisy run (a step
    spread beyond `NOISY_SPREAD`, or instrumented steps faster than plain ones in every
    overhead round), then the verdict; empty where every run timed steadily."""
    lines = []
    for backend, r in runs_of(summary).items():
        if not r.ok:
            continue
        for name in ("step", "fused_step"):
            p = r.phases.get(name)
            if p and p.get("p10_ms") and p["p90_ms"] > NOISY_SPREAD * p["p10_ms"]:
                low, high = p.get("min_ms", p["p10_ms"]), p.get("max_ms", p["p90_ms"])
                lines.append(f"{backend}: {name} times range {low:.1f}-{high:.1f} ms, p90 "
                             f"{p['p90_ms'] / p['p10_ms']:.1f}x p10")
        ov = r.get("overhead") or {}
        if ov.get("round_ratios") and max(ov["round_ratios"]) < 1:
            lines.append(f"{backend}: instrumented steps ran faster than plain ones in every overhead round")
    if not lines:
        return []
    return [*lines, "the machine was busy or unsteady while this ran: the ratios between backends and the "
                    "instrumentation overhead are not to be trusted; rerun on an idle machine"]


def attribution_note(summary: dict) -> str | None:
    """What the times of an --annotate-attention comparison are not (None for other runs)."""
    if not any(r.options.get("annotate_attention") for r in runs_of(summary).values()):
        return None
    return ("attribution run (--annotate-attention): it synchronizes inside attention and JAX runs the step op by "
            "op, so these times are not speed figures and the ratios between backends compare nothing; run "
            "without it for speed")


def _steps(summary: dict) -> dict[str, dict]:
    """Each finished backend's step phase: the fused step where it ran one."""
    out = {}
    for backend, r in runs_of(summary).items():
        phases = r.phases if r.ok else {}
        if p := phases.get("fused_step") or phases.get("step"):
            out[backend] = p
    return out


def clock_texts(summary: dict) -> dict[str, str]:
    """Per finished backend whose step's GPU clock was sampled, that clock in words
    (`harness.reports.run.clock_text`, of the fused step where it ran one)."""
    out = {}
    for backend, r in runs_of(summary).items():
        clocks = (r.get("gpu_clocks") or {}) if r.ok else {}
        phases = clocks.get("phases") or {}
        name = whole_step(phases)
        times = (r.phases.get(name) or {}).get("times_ms") if r.ok else None
        if (rec := phases.get(name)) and (text := clock_text(rec, clocks.get("boost_mhz"), times)):
            out[backend] = text
    return out


def compare_findings(summary: dict) -> list[Finding]:
    runs = runs_of(summary)
    out = [Finding("failed", f"{b} FAILED: {r.message}", "Failed runs") for b, r in runs.items() if not r.ok]
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
    if points := {b: r.get("mfu_points") for b, r in runs.items() if r.ok and r.get("mfu_points")}:
        out.append(Finding("peak", "the profiled step in points of 100: " + "; ".join(
            f"{b} MFU {p['MFU']:.1f}, " + ", ".join(f"{k} {p[k]:.1f}" for k in MFU_PARTS[1:] if round(p[k], 1))
            for b, p in points.items()), "Kernel breakdown"))
    if clocks := clock_texts(summary):
        out.append(Finding("peak", "GPU clock over the measured steps: " + "; ".join(
            f"{b} {text}" for b, text in clocks.items()), "the table"))
    out.append(Finding("parity", f"parity: {parity_verdict(summary.get('parity'))}", "Parity"))
    if noisy := noise_warnings(summary):
        out.append(Finding("doubt", f"noisy timings: {noisy[0]}" + (f" (and {len(noisy) - 2} more)"
                                                                    if len(noisy) > 2 else ""),
                           "Warning: noisy timings"))
    firsts = {b: r.get("first_step")["time_to_first_step_ms"] / 1e3 for b, r in runs.items()
              if r.ok and (r.get("first_step") or {}).get("time_to_first_step_ms")}
    if firsts:
        out.append(Finding("steps", "time to first step (build, compile, first run): "
                           + ", ".join(f"{b} {s:.1f} s" for b, s in firsts.items()), "the table"))
    return out
