"""The scaling tables as markdown: step time, tokens/s, MFU and efficiency per device count
(`format_scaling`), and where each data-parallel step grew from one device (`format_growth`),
from the rows `harness.timing.scaling.scaling_rows` computes."""

from __future__ import annotations

from harness.common.tables import markdown_table
from harness.timing.scaling import PHASES
from harness.timing.timer import OVERHEAD_STEPS


def format_growth(rows: list[dict]) -> str:
    """Where each data-parallel row's step grew from its one-device run, ms, beside the
    time the ranks waited for each other and the all-reduce alone on the link."""
    body = []
    for r in rows:
        g = r.get("growth")
        if not g:
            continue
        ms = lambda v: f"{v:+.1f}" if v is not None else "-"  # noqa: E731
        body.append([r["backend"], r["parallel"], r["n"], r["phase"], ms(g["step"]),
                     *(ms(g["phases"].get(p)) for p in PHASES),
                     f"{r['waiting_ms']:.1f}" if r["waiting_ms"] is not None else "-",
                     f"{r['link_ms']:.1f}" if r["link_ms"] is not None else "-"])
    if not body:
        return ""
    header = ["backend", "parallel", "N", "step", "step +ms", *(f"{p} +ms" for p in PHASES),
              "waiting ms/step", "all-reduce alone ms"]
    note = ("+ms: the step and each phase against the one-device run of the row's group (the slowest rank's "
            "medians; JAX's fused step is one range, without phases); waiting: the mean per rank and step of "
            "the time a rank's backward began before the last rank's (host timings, where the run made them); "
            "all-reduce alone: the gradients' all-reduce timed by itself on the run's link before its steps.")
    return "\n".join(["Where the step grows from one device:", "", *markdown_table(header, body), "", note]) + "\n"


def format_scaling(rows: list[dict]) -> str:
    """The rows as a markdown table, the shape of each group in its backend cell."""
    body = []
    for r in rows:
        s = r["shape"]
        eff = f"{100 * r['efficiency']:.1f}%" if r["efficiency"] is not None else "-"
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "-"
        loop = f"{r['loop_ms']:.3f}{' *' if r.get('loop_doubt') else ''}" if r.get("loop_ms") else "-"
        loop_eff = f"{100 * r['loop_efficiency']:.1f}%" if r.get("loop_efficiency") is not None else "-"
        body.append([r["backend"], f"{s['model']} ctx {s['ctx']} batch {s['batch']}/device {s['dtype']} "
                     f"{s['attention']} {s['device']}", r["parallel"], r["n"], r["phase"], f"{r['step_ms']:.3f}",
                     f"{r['tokens_per_s']:.0f}", mfu, eff, loop, loop_eff])
    header = ["backend", "run", "parallel", "N", "step", "step ms", "tokens/s (job)", "MFU per device", "efficiency",
              "loop step ms", "loop efficiency"]
    note = ("efficiency: tokens/s at N over N x tokens/s at N = 1, the per-device batch fixed; "
            "step: each run's fastest whole step (JAX's fused_step where faster), the slowest rank's median; "
            "efficiency -: no one-device run of that backend and shape under the same compiler settings; "
            "loop step: the same step run back to back with one synchronization per round of "
            f"{OVERHEAD_STEPS} steps (at most; the overhead check's rounds, median of the round means, the slowest "
            "rank's where each rank kept its own, else rank 0's), as a training loop runs it; "
            "loop efficiency: the one-device loop step over the loop step at N; "
            "*: a loop step slower than the synchronized step, or from an overhead check that flagged itself: the "
            "host was busier during the check than during the measured steps, and no loop efficiency is taken "
            "from it")
    return "\n".join([*markdown_table(header, body), "", note]) + "\n"
