"""The answer of a scaling table (`harness.timing.scaling.scaling_rows`): per group of
runs, the efficiency at its largest device count, on the synchronized step and in a loop,
and the phase that grew most; then which group scales best and what the table doubts."""

from __future__ import annotations

from harness.common.answer import Finding

RULES = ("efficiency is tokens/s at N over N x tokens/s at N = 1 with the per-device batch fixed; the synchronized "
         "step is each run's slowest rank's median, the loop step the same step run back to back; a loop step "
         "slower than the synchronized one, or from a flagged overhead check, gives no loop efficiency")


def _pct(x: float | None) -> str:
    return f"{x:.1%}" if x is not None else "-"


def scaling_findings(rows: list[dict]) -> list[Finding]:
    out = []
    tops = {}
    for r in rows:
        key = (r["backend"], r["parallel"], tuple(r["shape"].values()))
        if r["n"] > 1 and (key not in tops or r["n"] > tops[key]["n"]):
            tops[key] = r
    for r in tops.values():
        if r["efficiency"] is None:
            out.append(Finding("scaling", f"{r['backend']} ({r['parallel']}) at N = {r['n']}: no efficiency (no "
                               "one-device run of that shape and settings)", "the table"))
            continue
        text = (f"{r['backend']} ({r['parallel']}) at N = {r['n']}: {_pct(r['efficiency'])} efficiency on the "
                f"synchronized step ({r['step_ms']:.1f} ms), {_pct(r['loop_efficiency'])} in a loop")
        growth = (r.get("growth") or {}).get("phases") or {}
        if growth:
            phase = max(growth, key=growth.get)
            text += f"; the step grew {r['growth']['step']:+.1f} ms, most in the {phase} ({growth[phase]:+.1f} ms)"
        out.append(Finding("scaling", text, "the table; where the step grows"))
    judged = [r for r in tops.values() if r["efficiency"] is not None]
    if len(judged) > 1:
        best = max(judged, key=lambda r: r["loop_efficiency"] or r["efficiency"])
        out.insert(0, Finding("scaling", f"best: {best['backend']} ({best['parallel']}), "
                              f"{_pct(best['loop_efficiency'] or best['efficiency'])} at N = {best['n']}", "the table"))
    if doubts := [r for r in rows if r.get("loop_doubt")]:
        out.append(Finding("doubt", f"{len(doubts)} loop step{'s' if len(doubts) > 1 else ''} not used: "
                           + "; ".join(f"{r['backend']} N = {r['n']}: {r['loop_doubt']}" for r in doubts[:2]),
                           "the table (*)"))
    return out
