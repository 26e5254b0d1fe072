"""Scaling table: step time, tokens/s and scaling efficiency of one backend over device counts.

Runs at N = 1, 2, 4, 8 (harness.run result documents) keep the per-device batch fixed, so
ideal (weak) scaling multiplies tokens/s by N: efficiency = tokens/s at N / (N x tokens/s
at N = 1). The step of a data-parallel run is its slowest rank's median `step`
(`data_parallel.step_ms`); a one-device run's is its median `step`. Rows group by backend,
data-parallel flavour and the shape of the run (model, ctx, per-device batch, dtype,
attention, device); a group without an N = 1 run has no efficiency.
"""

from __future__ import annotations

from collections import defaultdict

from harness.common.tables import markdown_table

_SHAPE = ("model", "ctx", "batch", "dtype", "attention", "device")


def step_figures(doc: dict) -> tuple[int, float, float]:
    """(devices, step ms, global tokens/s) of an ok result document."""
    o, dp = doc["options"], doc.get("data_parallel")
    n = dp["n"] if dp else 1
    step_ms = dp["step_ms"] if dp else doc["phases"]["step"]["median_ms"]
    return n, step_ms, n * o["batch"] * o["ctx"] / (step_ms / 1e3)


def scaling_rows(docs: list[dict]) -> list[dict]:
    """One row per run that finished: its group, N, step ms, tokens/s and efficiency
    (None without an N = 1 run of the group), sorted by group then N."""
    groups: dict[tuple, dict[int, dict]] = defaultdict(dict)
    for doc in docs:
        if doc.get("status") != "ok":
            continue
        o = doc["options"]
        n, step_ms, tps = step_figures(doc)
        parallel = o.get("parallel", "ddp") if n > 1 else "-"
        key = (o["backend"], *(o[k] for k in _SHAPE))
        if n in groups[key]:
            raise ValueError(f"two runs of {o['backend']} at N = {n} with the same shape; give one of each")
        groups[key][n] = {"backend": o["backend"], "parallel": parallel, "n": n, "step_ms": step_ms,
                          "tokens_per_s": tps, "shape": dict(zip(_SHAPE, key[1:]))}
    rows = []
    for key in sorted(groups):
        base = groups[key].get(1)
        for n in sorted(groups[key]):
            row = groups[key][n]
            row["efficiency"] = row["tokens_per_s"] / (n * base["tokens_per_s"]) if base else None
            rows.append(row)
    return rows


def format_scaling(rows: list[dict]) -> str:
    """The rows as a markdown table, the shape of each group in its backend cell."""
    body = []
    for r in rows:
        s = r["shape"]
        eff = f"{100 * r['efficiency']:.1f}%" if r["efficiency"] is not None else "-"
        body.append([r["backend"], f"{s['model']} ctx {s['ctx']} batch {s['batch']}/device {s['dtype']} "
                     f"{s['attention']} {s['device']}", r["parallel"], r["n"], f"{r['step_ms']:.3f}",
                     f"{r['tokens_per_s']:.0f}", eff])
    header = ["backend", "run", "parallel", "N", "step ms", "tokens/s", "efficiency"]
    note = ("efficiency: tokens/s at N over N x tokens/s at N = 1, the per-device batch fixed; "
            "step: the slowest rank's median step")
    return "\n".join([*markdown_table(header, body), "", note]) + "\n"
