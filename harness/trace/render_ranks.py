"""The cross-rank section of the kernel report (`harness.trace.analyses.ranks.cross_rank`)."""

from __future__ import annotations

from collections.abc import Sequence

from harness.common.tables import markdown_table


def render_ranks(tables: Sequence[dict]) -> list[str]:
    """Markdown lines: per rank set, the per-phase medians per rank, the stragglers, and
    communication per rank (hidden under compute, exposed)."""
    out: list[str] = []
    for t in tables:
        ranks = t["ranks"]
        out += [f"## Ranks of `{t['name']}`", "", f"Ranks from {t['rank_source']}. Each rank's kernels and ranges are "
                "its own process's; medians over each rank's measured steps.", ""]
        rows = []
        for phase, per_rank in t["phases"].items():
            for metric, key in (("GPU ms/step (median)", "gpu_ms"), ("range ms/step (median)", "range_ms")):
                rows.append([phase, metric, *(f"{per_rank[r][key]:.3f}" if r in per_rank else "-" for r in ranks)])
        out += [*markdown_table(["phase", "metric", *(f"rank{r}" for r in ranks)], rows), ""]
        if t["straggler"]:
            rows = [[phase, f"rank{s['rank']}", f"{s['range_ms']:.3f}", f"rank{s['fastest_rank']}",
                     f"{s['ratio']:.3f}" if s["ratio"] else "-"] for phase, s in t["straggler"].items()]
            out += ["Stragglers (the rank with the longest median range per phase):", "",
                    *markdown_table(["phase", "slowest", "range ms", "fastest", "slowest/fastest"], rows), ""]
        rows = [[f"rank{r}", f"{c['communication_ms']:.3f}", f"{c['hidden_ms']:.3f}", f"{c['exposed_ms']:.3f}",
                 f"{c['hidden_share']:.1%}" if c["hidden_share"] is not None else "-", str(c["step_ranges"] or "whole")]
                for r, c in t["communication"].items()]
        out += ["Communication kernels (NCCL, collectives) in the step ranges, summed over the steps: hidden = under "
                "compute kernels on the device's other streams.", "",
                *markdown_table(["rank", "comm ms", "hidden ms", "exposed ms", "hidden", "step ranges"], rows), ""]
    return out
