"""The report's answer: findings derived from the breakdowns and the cross-rank tables
(`harness.common.answer` phrases them and states the rules).

Per column (a profile that is not one rank of a set): whether the host or the GPU sets the
step's pace, and the categories that hold the step. Per rank set: which rank the others
wait for and whether its host or its GPU made it late, the waiting against the transfer,
the stragglers, and the same verdicts over the ranks (each rank up to two, their spread
beyond). Then the steps measured and what the report doubts.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from harness.common.answer import (
    DOUBT_SHARE,
    HOST_BOUND,
    OUTLIER_STEPS,
    STRAGGLER,
    Finding,
    bound,
    bound_text,
    categories_text,
)
from harness.trace.analyses.answers import step_phase
from harness.trace.kernels import short_name
from harness.trace.stats import Breakdown, PhaseStats

SHOWN_RANKS = 2  # rank sets up to this size get a line per rank; larger ones their spread
WAITING = 0.25  # a rank waiting for another this share of its step is said to wait, not to be bound


def _step(bd: Breakdown) -> PhaseStats | None:
    """The phase that is the step: the step range, the one root holding the others, or
    (a profile whose only phase is the whole profile) that phase."""
    return step_phase(bd) or (next(iter(bd.phases.values())) if len(bd.phases) == 1 else None)


def step_times(bd: Breakdown) -> dict | None:
    """Per measured step (means): the step's wall ms, GPU-busy ms, exposed communication ms
    and the compute share (busy, less exposed communication, over the wall time)."""
    p = _step(bd)
    if p is None or not p.range_ns_per_step:
        return None
    wall = p.range_ns_per_step / 1e6
    busy = (p.busy_ns_per_step if p.busy_ns_per_step is not None else p.gpu_ns_per_step) / 1e6
    exposed = max(p.categories.get("communication", 0.0) - p.hidden_communication_ns_per_step, 0.0) / 1e6
    compute = max(min(busy, wall) - exposed, 0.0)
    return {"phase": p.phase, "wall_ms": wall, "busy_ms": busy, "exposed_ms": exposed, "compute_share": compute / wall,
            "median_ms": p.range_ns_median / 1e6,
            "lead_ms": p.lead_ns_per_step / 1e6 if p.lead_ns_per_step is not None else None}


def _categories(bd: Breakdown) -> Finding | None:
    p = _step(bd)
    if p is None or not p.gpu_ns_per_step:
        return None
    shares = sorted(((c, ns / p.gpu_ns_per_step) for c, ns in p.categories.items() if ns), key=lambda x: -x[1])
    top = (short_name(p.kernels[0].name, 50), p.kernels[0].share) if p.kernels else None
    return Finding("categories", categories_text(bd.label, shares, top), "Category shares; top kernels")


def _column(bd: Breakdown) -> list[Finding]:
    out = []
    if (t := step_times(bd)) and not bd.cpu_ops:
        out.append(Finding("bound", bound_text(bd.label, t["wall_ms"], t["busy_ms"], t["exposed_ms"], t["lead_ms"]),
                           "Per phase"))
    return out + [f for f in [_categories(bd)] if f]


def _median_categories(label: str, cols: Sequence[Breakdown]) -> Finding | None:
    steps = [p for bd in cols if (p := _step(bd)) and p.gpu_ns_per_step]
    if not steps:
        return None
    cats = {c for p in steps for c in p.categories}
    shares = sorted(((c, statistics.median(p.categories.get(c, 0.0) / p.gpu_ns_per_step for p in steps))
                     for c in cats), key=lambda x: -x[1])
    return Finding("categories", categories_text(f"the ranks of `{label}` (median)", [s for s in shares if s[1]]),
                   "Category shares")


def _rank_set(t: dict, cols: Sequence[Breakdown]) -> list[Finding]:
    out: list[Finding] = []
    times = {r: st for r, bd in zip(t["ranks"], cols) if (st := step_times(bd))}
    where = f"Ranks of `{t['name']}`"
    split = t.get("split")
    if split and split["last_rank"] is not None and split["last_share"] >= 0.5:
        last = split["last_rank"]
        late = (f", {split['late_ms']:.1f} ms late from its {split['late_phase']}" if split["late_phase"] else "")
        text = f"rank {last} paces the job: it arrives last at {split['last_share']:.0%} of the collectives{late}"
        if st := times.get(last):
            share = st["compute_share"]
            cause = ("its host, not its GPU, sets the pace" if share < HOST_BOUND else
                     "its GPU's own work sets the pace" if bound(share) == "GPU-bound" else
                     "its host and its GPU share the blame")
            text += (f"; its GPU computes {share:.1%} of its step ({share * st['wall_ms']:.1f} of "
                     f"{st['wall_ms']:.1f} ms): {cause}")
        out.append(Finding("communication", text, f"{where}: transfer and waiting"))
        waiter = max(split["ranks"], key=lambda r: r["waiting_ms_per_step"])
        if waiter["waiting_ms_per_step"] > 0:
            kinds = ", ".join(f"{k['kind']} {k['waiting_ms_per_step']:.1f} ms" for k in split["kinds"])
            out.append(Finding("communication", f"rank {waiter['rank']} waits {waiter['waiting_ms_per_step']:.1f} ms "
                               f"per step in collectives for rank {last}, against "
                               f"{waiter['transfer_ms_per_step']:.1f} ms of transfer (waiting by kind, mean over "
                               f"ranks: {kinds})", f"{where}: transfer and waiting"))
    elif times and (worst := max(times, key=lambda r: times[r]["exposed_ms"])) is not None \
            and times[worst]["exposed_ms"] > 0:
        st = times[worst]
        out.append(Finding("communication", f"exposed communication: up to {st['exposed_ms']:.1f} ms per step (rank "
                           f"{worst}, {st['exposed_ms'] / st['wall_ms']:.1%} of its step)", f"{where}: communication"))
    waits = {r["rank"]: r["waiting_ms_per_step"] for r in split["ranks"]} if split else {}
    if len(times) <= SHOWN_RANKS:
        for r, st in times.items():
            if waits.get(r, 0.0) >= WAITING * st["wall_ms"]:
                text = (f"rank {r}: waits for rank {split['last_rank']} {waits[r] / st['wall_ms']:.1%} of its step; "
                        f"its GPU computes {st['compute_share']:.1%} of it")
            else:
                text = bound_text(f"rank {r}", st["wall_ms"], st["busy_ms"], st["exposed_ms"])
            out.append(Finding("bound", text, "Per phase"))
    elif times:
        shares = {r: st["compute_share"] for r, st in times.items()}
        low = min(shares, key=shares.get)
        verdicts = [bound(s) for s in shares.values()]
        most = max(set(verdicts), key=verdicts.count)
        out.append(Finding("bound", f"{len(times)} ranks: {most} on {verdicts.count(most)}: their GPUs compute "
                           f"{min(shares.values()):.1%} to {max(shares.values()):.1%} of the step (median "
                           f"{statistics.median(shares.values()):.1%}; lowest rank {low})", "Per phase"))
    if f := _median_categories(t["name"], cols):
        out.append(f)
    step = next((n for n in t["straggler"] if any(st["phase"] == n for st in times.values())), None)
    if step and (s := t["straggler"][step])["ratio"]:
        text = (f"rank {s['rank']} is a straggler: its median step takes {s['range_ms']:.1f} ms, {s['ratio']:.2f}x "
                f"rank {s['fastest_rank']}'s" if s["ratio"] > STRAGGLER else
                f"no straggler: the ranks' median steps are within {s['ratio']:.3f}x of each other (slowest rank "
                f"{s['rank']}, {s['range_ms']:.1f} ms)")
        out.append(Finding("straggler", text, f"{where}: stragglers"))
    return out


def _steps(bds: Sequence[Breakdown]) -> list[Finding]:
    counts = sorted({p.steps for bd in bds if (p := _step(bd))})
    if not counts:
        return [Finding("steps", "no step range: the figures are per phase over the whole profile", "Steps")]
    kept_apart = (("warm-up ranges", "warmup"), ("the first step (compilation, allocation)", "first_step"))
    apart = [what for what, bucket in kept_apart if any(getattr(bd, bucket).count for bd in bds)]
    text = (f"steps: {'-'.join(map(str, counts))} measured per profile"
            + (f", {' and '.join(apart)} set apart" if apart else ", none set apart"))
    out = [Finding("steps", text, "the steps rule above each profile")]
    for bd in bds:
        t = step_times(bd)
        if t and t["median_ms"] and t["wall_ms"] / t["median_ms"] > OUTLIER_STEPS:
            out.append(Finding("steps", f"{bd.label}: outlier steps: the mean step ({t['wall_ms']:.1f} ms) is "
                               f"{t['wall_ms'] / t['median_ms']:.2f}x the median ({t['median_ms']:.1f} ms)",
                               "Per phase"))
    return out


def _doubts(bds: Sequence[Breakdown]) -> list[Finding]:
    out = []
    outside = [bd for bd in bds if bd.outside_share and bd.outside_share > DOUBT_SHARE]
    if outside:
        worst = max(outside, key=lambda bd: bd.outside_share)
        out.append(Finding("doubt", f"ranges do not end in synchronizations: up to {worst.outside_share:.1%} of "
                           f"in-range kernel time ran outside every range ({worst.label}); kernels are attributed "
                           "by launch", "attribution above each profile"))
    if n := sum(len(bd.warnings) for bd in bds):
        out.append(Finding("doubt", f"{n} warning{'s' if n > 1 else ''}", "Warnings"))
    return out


def report_findings(bds: Sequence[Breakdown], tables: Sequence[dict] = ()) -> list[Finding]:
    """The findings of a kernel report, in the order they are read: each rank set's, each
    other column's, then the steps and the doubts."""
    out: list[Finding] = []
    ranked: set[str] = set()
    for t in tables:
        cols = [bd for bd in bds if bd.label in t.get("labels", ())]
        ranked.update(bd.label for bd in cols)
        out += _rank_set(t, cols)
    for bd in bds:
        if bd.label not in ranked:
            out += _column(bd)
    return out + _steps(bds) + _doubts(bds)
