"""The answer of an attention benchmark's table (`harness.bench_attention`): for each
implementation that is not a reference, in how many cell-passes it is at least as fast as
the fastest reference, and its slowest cell; the highest throughput of each pass; cells
that failed. Read from the rows alone, as the table is."""

from __future__ import annotations

from collections.abc import Sequence

from harness.attention.catalog import BEST_REF_IMPLS, PASSES, cell_key
from harness.common.answer import Finding, overlap

PASS_NAMES = {"fwd": "forward", "bwd": "backward", "fwd_bwd": "forward+backward"}
RULES = (f"references: {', '.join(BEST_REF_IMPLS)}; at least as fast where the fastest reference's time over "
         "this one's is >= 1 (xbest); slower beyond the noise where, in addition, the two repeats' ranges do not "
         "overlap; TFLOP/s by the table's FLOP convention")


def _cell(row: dict) -> str:
    return (f"{row['batch']}x{row['heads']}x{row['seq']}x{row['head_dim']} "
            f"{'causal' if row['causal'] else 'non-causal'}")


def bench_findings(rows: Sequence[dict]) -> list[Finding]:
    """The findings (module docstring), most telling first."""
    ok = [r for r in rows if r["status"] == "ok"]
    by_cell = {(cell_key(r), r["impl"]): r for r in ok}
    findings = []
    for impl in dict.fromkeys(r["impl"] for r in ok if r["impl"] not in BEST_REF_IMPLS):
        scored = [(r, p, r[f"{p}_speedup_vs_best"]) for r in ok if r["impl"] == impl for p in PASSES
                  if r.get(f"{p}_speedup_vs_best") is not None]
        if not scored:
            continue
        at_least = sum(x >= 1 for _, _, x in scored)
        slower = 0
        for r, p, x in scored:
            ref = by_cell.get((cell_key(r), r.get(f"{p}_best_ref")))
            if x < 1 and ref and overlap(r.get(f"{p}_ms_spread"), ref.get(f"{p}_ms_spread")) is False:
                slower += 1
        worst_row, worst_pass, worst = min(scored, key=lambda s: s[2])
        findings.append(Finding(
            "kernel", f"{impl}: at least as fast as the fastest reference in {at_least} of {len(scored)} cell-passes, "
            f"slower beyond the noise in {slower}; its lowest: {PASS_NAMES[worst_pass]} at {worst:.2f}x "
            f"({_cell(worst_row)}, against {worst_row[f'{worst_pass}_best_ref']})", "xbest columns"))
    for p in PASSES:
        best = max((r for r in ok if r.get(f"{p}_tflops")), key=lambda r: r[f"{p}_tflops"], default=None)
        if best:
            findings.append(Finding("throughput", f"highest {PASS_NAMES[p]} throughput: "
                                    f"{best[f'{p}_tflops']:.0f} TFLOP/s, {best['impl']} at {_cell(best)}",
                                    "TFLOP/s columns"))
    failed = [r for r in rows if r["status"] != "ok"]
    if failed:
        findings.append(Finding("failed", f"{len(failed)} of {len(rows)} rows did not run: "
                                + "; ".join(f"{r['impl']} {_cell(r)}: {r['status']}" for r in failed[:3])
                                + ("; ..." if len(failed) > 3 else ""), "status column"))
    return findings
