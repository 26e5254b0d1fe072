"""How much communication a data-parallel step hides under computation.

Per device and per stream that runs communication kernels (NCCL's `ncclDevKernel_*`,
XLA's collectives: `classify` says `communication`): the union of those kernels'
intervals, intersected with the union of the compute kernels' intervals on the device's
other streams, is the hidden communication time; the rest is exposed (the step waits for
it). Kernels of one stream never overlap, so a collective on the compute stream is
exposed by construction. Only the measured steps count: kernels inside the `step` /
`fused_step` ranges, or the whole profile where it has none. Memory copies and autotuning
are neither side. The interval arithmetic is `harness.trace.analyses.intervals`.

`rank_profiles` reads one profile per rank (`name.rank<r>.nsys-rep` and the like, as a
data-parallel run writes them) into one analysis: per-rank overlap and phase times.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from harness.trace.analyses.intervals import _CATS, _categories, _measured, hidden_communication
from harness.trace.kernels import Category
from harness.trace.profile import KERNEL, PHASES, STEP_RANGES, KernelTable, Profile, ProfileError, Range

if TYPE_CHECKING:
    from harness.trace.analyses.selection import Selection

RANK_FILE = re.compile(r"\.rank(\d+)\.")


def _step_of(kt: KernelTable, spans: Sequence[Range], kernels: np.ndarray) -> np.ndarray:
    """Per kernel, the index of the span (steps of one kind, which do not overlap) it runs
    inside from start to end, -1 for none or where `kernels` is False."""
    order = np.argsort([r.start for r in spans], kind="stable")
    starts = np.array([spans[i].start for i in order], np.int64)
    ends = np.array([spans[i].end for i in order], np.int64)
    i = np.searchsorted(starts, kt.start, side="right") - 1
    inside = kernels & (i >= 0) & (kt.end <= ends[np.maximum(i, 0)])
    return np.where(inside, order[np.maximum(i, 0)], -1)


def overlap(kt: KernelTable, ranges: Sequence[Range] = (), selected: Selection | None = None) -> list[dict]:
    """Per device: communication kernel time (per-stream unions, summed), the part hidden
    under compute on other streams, the exposed rest and the hidden share; ms. With step
    ranges, `per_step` gives the same per kind of step (`step`, JAX's `fused_step`): how many
    ran, their median length, the communication and exposed time of the mean step, and the
    exposed time of each step (`exposed_each_ms`, in order). So JAX's split and fused steps,
    which overlap differently, are not mixed, and one step's stall is told from every step's.
    The kernels counted are those executing inside the step `ranges`, or those `selected`
    counts (`harness.trace.analyses.selection.select`, for a user's profile: the measured
    steps less the first, each kernel in the step that launched it where the program does not
    synchronize)."""
    cats = _categories(kt)
    kernels = (kt.kind == KERNEL) & (cats != _CATS.index(Category.AUTOTUNING))
    is_comm = cats == _CATS.index(Category.COMMUNICATION)
    if selected is None:
        keep = _measured(kt, ranges) & kernels
        kinds = {name: [r for r in ranges if r.name == name] for name in STEP_RANGES}
        kinds = {name: (spans, _step_of(kt, spans, kernels)) for name, spans in kinds.items() if spans}
    else:
        keep = selected.kernels["measured"] & kernels
        kroot = selected.kernels["kroot"]
        kinds = {}
        for name, insts in selected.instances.items():
            if name in STEP_RANGES and insts:
                ids = np.asarray(insts)
                by = np.argsort(ids, kind="stable")
                j = np.minimum(np.searchsorted(ids[by], kroot), len(ids) - 1)
                kinds[name] = ([selected.ranges[i] for i in insts],
                               np.where(keep & (ids[by][j] == kroot), by[j], -1))
    out = []
    for device in np.unique(kt.device[keep]):
        on = np.flatnonzero(keep & (kt.device == device))
        total, hidden = hidden_communication(kt.start[on], kt.end[on], kt.stream[on], is_comm[on])
        rec = {"device": int(device), "communication_ms": total / 1e6, "hidden_ms": hidden / 1e6,
               "exposed_ms": (total - hidden) / 1e6, "hidden_share": hidden / total if total else None}
        if kinds:
            rec["per_step"] = {}
            for name, (spans, step_of) in kinds.items():
                mine = np.flatnonzero((step_of >= 0) & (kt.device == device))
                mine = mine[np.argsort(step_of[mine], kind="stable")]
                cuts = np.searchsorted(step_of[mine], np.arange(len(spans) + 1))
                each = [hidden_communication(kt.start[k], kt.end[k], kt.stream[k], is_comm[k])
                        for k in (mine[a:b] for a, b in zip(cuts[:-1], cuts[1:]))]
                comm, under = (sum(x) for x in zip(*each))
                n = len(spans)
                rec["per_step"][name] = {"steps": n, "step_ms": statistics.median(r.end - r.start for r in spans) / 1e6,
                                         "communication_ms": comm / n / 1e6, "exposed_ms": (comm - under) / n / 1e6,
                                         "exposed_each_ms": [(c - u) / 1e6 for c, u in each]}
        out.append(rec)
    return out


def per_step_exposure(analysis: dict, steps: int | None = None) -> dict[str, dict]:
    """Per kind of step: the communication and exposed time of the mean step, averaged over
    the devices (`exposed_max_ms`: the device that waits longest), the step's length (the
    median over devices of each device's median) and the exposed share of it. An analysis
    made before `per_step` existed gives it where each rank ran one kind of step and
    `steps`, the measured steps, is known (torch's `step`); JAX's split and fused steps
    were summed together there and cannot be told apart."""
    per: dict[str, list[dict]] = {}
    for r in analysis.get("ranks", []):
        for d in r["overlap"]:
            if "per_step" in d:
                for name, rec in d["per_step"].items():
                    per.setdefault(name, []).append({**rec, "rank": r.get("rank"), "device": d["device"]})
            elif steps and len(kinds := [k for k in STEP_RANGES if k in r["phases_ms"]]) == 1:
                per.setdefault(kinds[0], []).append({"steps": steps, "step_ms": r["phases_ms"][kinds[0]],
                                                     "communication_ms": d["communication_ms"] / steps,
                                                     "exposed_ms": d["exposed_ms"] / steps})
            else:
                return {}
    out = {}
    for name, recs in per.items():
        exposed = statistics.fmean(x["exposed_ms"] for x in recs)
        step = statistics.median(x["step_ms"] for x in recs)
        out[name] = {"devices": len(recs), "step_ms": step,
                     "communication_ms": statistics.fmean(x["communication_ms"] for x in recs),
                     "exposed_ms": exposed, "exposed_max_ms": max(x["exposed_ms"] for x in recs),
                     "exposed_share_of_step": exposed / step if step else None}
        if all(x.get("exposed_each_ms") for x in recs):
            out[name].update(_each_step(recs))
    return out


def _each_step(recs: list[dict]) -> dict:
    """From each device's exposed time per step: the median step's (each device's median,
    averaged over the devices) and the step that exposed the most, by rank, device and index
    among the measured steps. A mean well above the median is one step's stall (a rank that
    began it late), not the steady state."""
    worst = max(((x["exposed_each_ms"][i], i, x) for x in recs for i in range(len(x["exposed_each_ms"]))),
                key=lambda t: t[0])
    return {"exposed_median_ms": statistics.fmean(statistics.median(x["exposed_each_ms"]) for x in recs),
            "worst_step": {"exposed_ms": worst[0], "index": worst[1], "rank": worst[2]["rank"],
                           "device": worst[2]["device"]}}


def skewed(p: dict) -> bool:
    """Whether the mean step's exposed time is driven by a few steps: over 1.5x the median
    step's, by more than 1% of the step."""
    median = p.get("exposed_median_ms")
    return median is not None and p["exposed_ms"] > 1.5 * median and p["exposed_ms"] - median > 0.01 * p["step_ms"]


def phase_times(ranges: Sequence[Range]) -> dict[str, float]:
    """Median wall time (ms) of each harness phase range and the step, as a rank's timer saw it."""
    out = {}
    for name in (*PHASES, *STEP_RANGES):
        spans = [(r.end - r.start) / 1e6 for r in ranges if r.name == name]
        if spans:
            out[name] = statistics.median(spans)
    return out


def rank_of(path: str | Path) -> int:
    """The rank in a per-rank file name (`x.rank3.nsys-rep` -> 3)."""
    found = RANK_FILE.search(Path(path).name + ".")
    if not found:
        raise ProfileError(f"{path}: no .rank<N>. in the name; per-rank profiles are named name.rank<N>.<ext>")
    return int(found.group(1))


def rank_analysis(profiles: dict[int, Profile], bytes_per_step: dict[str, float] | None = None) -> dict:
    """One analysis of a data-parallel run's per-rank profiles: each rank's overlap and
    phase times, per phase the spread over ranks (straggler = slowest/fastest median), and
    communication split into transfer and waiting (`harness.trace.analyses.collectives`,
    with bandwidth where `bytes_per_step` gives the bytes of each collective kind)."""
    from harness.trace.analyses.collectives import profile_split

    ranks = []
    for rank in sorted(profiles):
        p = profiles[rank]
        ranks.append({"rank": rank, "overlap": overlap(p.kernels, p.ranges), "phases_ms": phase_times(p.ranges)})
    spread = {}
    for name in (*PHASES, *STEP_RANGES):
        medians = [r["phases_ms"][name] for r in ranks if name in r["phases_ms"]]
        if len(medians) == len(ranks) and medians:
            spread[name] = {"min_ms": min(medians), "max_ms": max(medians),
                            "straggler": max(medians) / min(medians) if min(medians) else None}
    comm = [d for r in ranks for d in r["overlap"]]
    total = sum(d["communication_ms"] for d in comm)
    hidden = sum(d["hidden_ms"] for d in comm)
    out = {"ranks": ranks, "spread": spread, "communication_ms": total, "hidden_ms": hidden,
           "exposed_ms": total - hidden, "hidden_share": hidden / total if total else None,
           "split": profile_split(profiles, bytes_per_step)}
    if per_step := per_step_exposure(out):
        out["per_step"] = per_step
    return out


def rank_profiles(paths: Sequence[str | Path], nsys_bin: str | None = None,
                  bytes_per_step: dict[str, float] | None = None) -> dict:
    """Load per-rank profiles (the rank read from each name; a lone profile without one is
    rank 0, as JAX's one process over every device) and analyse them together."""
    from harness.trace.sources.load import load_profile

    by_rank = {}
    for path in paths:
        rank = 0 if len(paths) == 1 and not RANK_FILE.search(Path(path).name) else rank_of(path)
        if rank in by_rank:
            raise ProfileError(f"{path}: a second profile of rank {rank}")
        by_rank[rank] = load_profile(path, f"rank{rank}", nsys_bin)
    return rank_analysis(by_rank, bytes_per_step)


def per_step_lines(per_step: dict[str, dict]) -> list[str]:
    """One line per kind of step: its communication and exposed time and the exposed share."""
    out = []
    for name, p in per_step.items():
        share = f"{100 * p['exposed_share_of_step']:.1f}%" if p["exposed_share_of_step"] is not None else "-"
        devices = f"{p['devices']} device" + ("s" if p["devices"] != 1 else "")
        out.append(f"per {name}: {p['communication_ms']:.3f} ms of communication, {p['exposed_ms']:.3f} ms exposed "
                   f"(mean over {devices}, at most {p['exposed_max_ms']:.3f}) in a {p['step_ms']:.3f} ms step: "
                   f"{share} of the step" + (f"; the median step {p['exposed_median_ms']:.3f} ms exposed"
                                             if "exposed_median_ms" in p else ""))
        if skewed(p):
            out.append(f"  {worst_text(name, p)}")
    return out


def worst_text(name: str, p: dict) -> str:
    """One sentence on a mean that one step drives (`skewed`)."""
    w = p["worst_step"]
    where = f"rank {w['rank']} (device {w['device']})" if w["rank"] is not None else f"device {w['device']}"
    return (f"the mean {name} is driven by a few: measured {name} {w['index']} exposed {w['exposed_ms']:.3f} ms on "
            f"{where}, the median one {p['exposed_median_ms']:.3f} ms: a stall or a rank that began the step late, "
            "not the steady state")


def format_overlap(analysis: dict) -> str:
    """Per rank and device: communication, hidden and exposed ms; then the run's totals."""
    lines = [f"{'rank':>4} {'device':>6} {'comm ms':>9} {'hidden ms':>10} {'exposed ms':>11} {'hidden':>7} "
             f"{'step ms':>8}"]
    for r in analysis["ranks"]:
        step = r["phases_ms"].get("step", r["phases_ms"].get("fused_step"))
        for d in r["overlap"]:
            share = f"{100 * d['hidden_share']:.1f}%" if d["hidden_share"] is not None else "-"
            lines.append(f"{r['rank']:>4} {d['device']:>6} {d['communication_ms']:>9.3f} {d['hidden_ms']:>10.3f} "
                         f"{d['exposed_ms']:>11.3f} {share:>7} {step if step is not None else float('nan'):>8.3f}")
    share = analysis["hidden_share"]
    if analysis.get("split"):
        from harness.trace.analyses.collectives import format_split

        lines += format_split(analysis["split"])
    lines += per_step_lines(per_step_exposure(analysis))
    lines.append(f"all: {analysis['communication_ms']:.3f} ms of communication, {analysis['exposed_ms']:.3f} ms "
                 f"exposed" + (f" ({100 * (1 - share):.1f}%)" if share is not None else ""))
    return "\n".join(lines) + "\n"
