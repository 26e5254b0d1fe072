"""Sections of the kernel report beyond the per-profile tables: the cross-rank tables
(`harness.trace.analyses.ranks.cross_rank`) and HTA's figures per column
(`harness.trace.analyses.gpu_time`)."""

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
        out += _communication(t)
    return out


def _communication(t: dict) -> list[str]:
    """Per rank (and kind of step): communication, hidden and exposed ms per measured step,
    the exposed share of the step; then the transfer/waiting split where the ranks' clocks
    are one."""
    rows = []
    for r, c in t["communication"].items():
        share = f"{c['hidden_share']:.1%}" if c["hidden_share"] is not None else "-"
        per = c.get("per_step") or {}
        for name, p in per.items():
            rows.append([f"rank{r}", name, f"{p['communication_ms']:.3f}",
                         f"{p['communication_ms'] - p['exposed_ms']:.3f}", f"{p['exposed_ms']:.3f}", share,
                         f"{p['exposed_share_of_step']:.1%}" if p["exposed_share_of_step"] is not None else "-",
                         str(c["step_ranges"])])
        if not per:  # no step ranges: the whole profile
            rows.append([f"rank{r}", "whole profile", f"{c['communication_ms']:.3f}", f"{c['hidden_ms']:.3f}",
                         f"{c['exposed_ms']:.3f}", share, "-", "-"])
    out = ["Communication kernels (NCCL, collectives) of the measured steps (those of the per-step figures above), "
           "per step: hidden = under compute kernels on the device's other streams; exposed = the rest, which the "
           "step waits for.", "",
           *markdown_table(["rank", "step", "comm ms/step", "hidden ms/step", "exposed ms/step", "hidden",
                            "exposed share of the step", "measured steps"], rows), ""]
    if t.get("split"):
        from harness.trace.analyses.collectives import format_split

        out += ["Transfer and waiting: the k-th collective of each kind aligned across the ranks on the clock they "
                "share; the part of a rank's collective before the last rank's starts is waiting for that rank, the "
                "rest transfer.", "", "```", *format_split(t["split"]), "```", ""]
    return out


def render_gpu_time(figures: Sequence[dict]) -> list[str]:
    """Markdown lines: temporal breakdown, overlap, launch statistics and queue length per column."""
    if not figures:
        return []
    scope = figures[0]["scope"]
    what = ("HTA's scope (`--scope hta`): the last ProfilerStep and GPU activities launched outside the trace left "
            "out where there are two steps or more, synchronization records on streams counted, µs as HTA rounds "
            "them" if scope == "hta" else "every GPU activity of the profile (`--scope all`; "
            "`--scope hta` gives HTA's figures exactly)")
    rows = []
    for f in figures:
        t, span = f["temporal"], f["temporal"]["kernel_time_us"] or float("nan")
        launch, queue = f["launch"], f["queue"]
        rows.append([f["label"], str(f["activities"]), f"{span / 1e3:.3f}",
                     *(f"{t[k] / span:.1%}" for k in ("compute_time_us", "non_compute_time_us", "idle_time_us")),
                     f"{f['overlap']:.2%}" if f["overlap"] is not None else "-",
                     f"{launch['launch_delay_sum_us'] / launch['events']:.1f}" if launch else "-",
                     f"{launch['gpu_shorter_than_cpu']}" if launch else "-",
                     f"{max(q['max'] for q in queue.values())}" if queue else "-"])
    return ["## GPU time (Holistic Trace Analysis's definitions)", "",
            f"Over {what}. Compute: kernels other than communication; non-compute: communication, memcpys and "
            "memsets; idle: no GPU activity. Overlap: the share of communication time with a compute kernel running. "
            "Launch delay: GPU start minus the end of its launch call; short: kernels that ran shorter than their "
            "launch call. Queue: the most launches waiting on one stream (needs launch records: torch.profiler).", "",
            *markdown_table(["profile", "activities", "span ms", "compute", "non-compute", "idle", "overlap",
                             "mean launch delay µs", "short kernels", "max queue"], rows), ""]
