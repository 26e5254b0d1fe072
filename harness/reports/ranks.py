"""Sections of the kernel report beyond the per-profile tables: the cross-rank tables
(`harness.trace.analyses.ranks.cross_rank`) and HTA's figures per column
(`harness.trace.analyses.gpu_time`). Up to 8 ranks (`MAX_COLUMNS`) one column or row per
rank; beyond, each row is the distribution over the ranks with its outliers named
(`harness.common.spread`), and `write_ranks_csv` holds every rank's figures. In the
summary (`detail`), the first `SUMMARY_PHASES` phases."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

from harness.common.spread import HEADER, MAX_COLUMNS, RULE, spread_cells
from harness.common.tables import markdown_table

SUMMARY_PHASES = 6  # phases the summary's cross-rank tables show


def _shown(phases: Sequence[str], detail: str) -> tuple[list[str], list[str]]:
    """The phases a table shows, and the lines saying which it leaves to the full report."""
    if detail == "full" or len(phases) <= SUMMARY_PHASES:
        return list(phases), []
    rest = list(phases)[SUMMARY_PHASES:]
    names = ", ".join(f"`{p}`" for p in rest[:8]) + (f" and {len(rest) - 8} more" if len(rest) > 8 else "")
    return list(phases)[:SUMMARY_PHASES], [f"{len(rest)} more phases in report.html (or `--detail full`): {names}.",
                                           ""]


def render_ranks(tables: Sequence[dict], detail: str = "full") -> list[str]:
    """Markdown lines: per rank set, the per-phase medians per rank, the stragglers, and
    communication per rank (hidden under compute, exposed); beyond `MAX_COLUMNS` ranks,
    their distributions."""
    out: list[str] = []
    for t in tables:
        ranks = t["ranks"]
        many = detail == "summary" and len(ranks) > MAX_COLUMNS
        out += [f"## Ranks of `{t['name']}`", "", f"Ranks from {t['rank_source']}. Each rank's kernels and ranges are "
                "its own process's; medians over each rank's measured steps.", ""]
        if many:
            out += [f"{len(ranks)} ranks. {RULE}", ""]
        phases, more = _shown(list(t["phases"]), detail)
        rows = []
        for phase in phases:
            per_rank = t["phases"][phase]
            for metric, key in (("GPU ms/step (median)", "gpu_ms"), ("range ms/step (median)", "range_ms")):
                if many:
                    rows.append([phase, metric, f"{len(per_rank)}",
                                 *spread_cells({r: v[key] for r, v in per_rank.items()})])
                else:
                    rows.append([phase, metric, *(f"{per_rank[r][key]:.3f}" if r in per_rank else "-" for r in ranks)])
        head = ["phase", "metric", "ranks", *HEADER] if many else ["phase", "metric", *(f"rank{r}" for r in ranks)]
        out += [*markdown_table(head, rows), "", *more]
        if t["straggler"]:
            rows = [[phase, f"rank{s['rank']}", f"{s['range_ms']:.3f}", f"rank{s['fastest_rank']}",
                     f"{s['ratio']:.3f}" if s["ratio"] else "-"] for phase, s in t["straggler"].items()
                    if phase in phases]
            out += ["Stragglers (the rank with the longest median range per phase):", "",
                    *markdown_table(["phase", "slowest", "range ms", "fastest", "slowest/fastest"], rows), ""]
        out += _communication(t, many)
    return out


def write_ranks_csv(path: str | Path, tables: Sequence[dict]) -> Path:
    """One row per rank of every rank set: per phase its median GPU and range ms per step,
    its communication (ms over the measured steps: all, hidden, exposed) and, where the
    ranks were aligned, its transfer and waiting ms per step."""
    path = Path(path)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        phases = list(dict.fromkeys(p for t in tables for p in t["phases"]))
        w.writerow(["set", "rank", *(f"{p} {k}" for p in phases for k in ("gpu_ms", "range_ms")),
                    "communication_ms", "hidden_ms", "exposed_ms", "transfer_ms_per_step", "waiting_ms_per_step"])
        for t in tables:
            split = {r["rank"]: r for r in (t["split"] or {}).get("ranks", [])}
            for r in t["ranks"]:
                c, s = t["communication"].get(r, {}), split.get(r, {})
                w.writerow([t["name"], r, *(t["phases"].get(p, {}).get(r, {}).get(k, "") for p in phases
                                           for k in ("gpu_ms", "range_ms")),
                            *(c.get(k, "") for k in ("communication_ms", "hidden_ms", "exposed_ms")),
                            *(s.get(k, "") for k in ("transfer_ms_per_step", "waiting_ms_per_step"))])
    return path


def _communication(t: dict, many: bool = False) -> list[str]:
    """Per rank (and kind of step): communication, hidden and exposed ms per measured step,
    the exposed share of the step; then the transfer/waiting split where the ranks' clocks
    are one."""
    if many:
        return _communication_spread(t)
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
    out = [_COMM_WHAT, "",
           *markdown_table(["rank", "step", "comm ms/step", "hidden ms/step", "exposed ms/step", "hidden",
                            "exposed share of the step", "measured steps"], rows), ""]
    if t.get("split"):
        from harness.trace.analyses.collectives import format_split

        out += ["Transfer and waiting: the k-th collective of each kind aligned across the ranks on the clock they "
                "share; the part of a rank's collective before the last rank's starts is waiting for that rank, the "
                "rest transfer.", "", "```", *format_split(t["split"]), "```", ""]
    return out


_COMM_WHAT = ("Communication kernels (NCCL, collectives) of the measured steps (those of the per-step figures above), "
              "per step: hidden = under compute kernels on the device's other streams; exposed = the rest, which the "
              "step waits for.")


def _communication_spread(t: dict) -> list[str]:
    """`_communication` as distributions over the ranks, per kind of step."""
    comm = t["communication"]
    kinds = list(dict.fromkeys(k for c in comm.values() for k in (c.get("per_step") or {"whole profile": None})))
    rows = []
    for kind in kinds:
        per = {r: (c.get("per_step") or {}).get(kind) for r, c in comm.items()}
        if kind == "whole profile":
            per = {r: {"communication_ms": c["communication_ms"], "exposed_ms": c["exposed_ms"],
                       "exposed_share_of_step": None} for r, c in comm.items() if not c.get("per_step")}
        per = {r: p for r, p in per.items() if p}
        for metric, get in (("comm ms/step", lambda p: p["communication_ms"]),
                            ("hidden ms/step", lambda p: p["communication_ms"] - p["exposed_ms"]),
                            ("exposed ms/step", lambda p: p["exposed_ms"])):
            rows.append([kind, metric, str(len(per)), *spread_cells({r: get(p) for r, p in per.items()})])
        shares = {r: p["exposed_share_of_step"] for r, p in per.items() if p["exposed_share_of_step"] is not None}
        if shares:
            rows.append([kind, "exposed share of the step", str(len(shares)),
                         *spread_cells(shares, "{:.1%}")])
    out = [_COMM_WHAT, "", *markdown_table(["step", "metric", "ranks", *HEADER], rows), ""]
    if split := t.get("split"):
        from harness.trace.analyses.collectives import format_split

        rows = [[metric, str(len(split["ranks"])), *spread_cells({r["rank"]: r[key] for r in split["ranks"]})]
                for metric, key in (("comm ms/step", "communication_ms_per_step"),
                                    ("transfer ms/step", "transfer_ms_per_step"),
                                    ("waiting ms/step", "waiting_ms_per_step"))]
        out += ["Transfer and waiting: the k-th collective of each kind aligned across the ranks on the clock they "
                "share; the part of a rank's collective before the last rank's starts is waiting for that rank, the "
                "rest transfer.", "", *markdown_table(["metric", "ranks", *HEADER], rows), "", "```",
                *format_split(dict(split, ranks=[]))[1:], "```", ""]
    return out


def render_gpu_time(figures: Sequence[dict], detail: str = "full") -> list[str]:
    """Markdown lines: temporal breakdown, overlap, launch statistics and queue length per column
    (in the summary, beyond `MAX_COLUMNS` columns, their distributions)."""
    if not figures:
        return []
    scope = figures[0]["scope"]
    what = ("HTA's scope (`--scope hta`): the last ProfilerStep and GPU activities launched outside the trace left "
            "out where there are two steps or more, synchronization records on streams counted, µs as HTA rounds "
            "them" if scope == "hta" else "every GPU activity of the profile (`--scope all`; "
            "`--scope hta` gives HTA's figures exactly)")
    if detail == "summary" and len(figures) > MAX_COLUMNS:
        return _gpu_time_spread(figures, what)
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
    return [_GPU_TIME, "", f"Over {what}. {_GPU_TIME_WHAT}", "",
            *markdown_table(["profile", "activities", "span ms", "compute", "non-compute", "idle", "overlap",
                             "mean launch delay µs", "short kernels", "max queue"], rows), ""]


_GPU_TIME = "## GPU time (Holistic Trace Analysis's definitions)"
_GPU_TIME_WHAT = ("Compute: kernels other than communication; non-compute: communication, memcpys and "
                  "memsets; idle: no GPU activity. Overlap: the share of communication time with a compute kernel "
                  "running. Launch delay: GPU start minus the end of its launch call; short: kernels that ran shorter "
                  "than their launch call. Queue: the most launches waiting on one stream (needs launch records: "
                  "torch.profiler).")


def _gpu_time_spread(figures: Sequence[dict], what: str) -> list[str]:
    """`render_gpu_time` as distributions over the columns, one row per figure."""
    def share(key):
        return lambda f: f["temporal"][key] / f["temporal"]["kernel_time_us"] if f["temporal"]["kernel_time_us"] \
            else None
    metrics = [("activities", "{:.0f}", lambda f: f["activities"]),
               ("span ms", "{:.3f}", lambda f: f["temporal"]["kernel_time_us"] / 1e3),
               ("compute", "{:.1%}", share("compute_time_us")),
               ("non-compute", "{:.1%}", share("non_compute_time_us")), ("idle", "{:.1%}", share("idle_time_us")),
               ("overlap", "{:.2%}", lambda f: f["overlap"]),
               ("mean launch delay µs", "{:.1f}",
                lambda f: f["launch"]["launch_delay_sum_us"] / f["launch"]["events"] if f["launch"] else None),
               ("short kernels", "{:.0f}", lambda f: f["launch"]["gpu_shorter_than_cpu"] if f["launch"] else None),
               ("max queue", "{:.0f}", lambda f: max(q["max"] for q in f["queue"].values()) if f["queue"] else None)]
    rows = []
    for name, fmt, get in metrics:
        values = {f["label"]: v for f in figures if (v := get(f)) is not None}
        if values:
            rows.append([name, str(len(values)), *spread_cells(values, fmt, prefix="")])
    return [_GPU_TIME, "", f"Over {what}, {len(figures)} profiles. {_GPU_TIME_WHAT} {RULE}", "",
            *markdown_table(["figure", "profiles", *HEADER], rows), ""]
