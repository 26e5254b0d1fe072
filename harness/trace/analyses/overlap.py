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

from harness.trace.analyses.intervals import _CATS, _categories, _measured, covered_measure, union
from harness.trace.kernels import Category
from harness.trace.profile import KERNEL, PHASES, STEP_RANGES, KernelTable, Profile, ProfileError, Range

if TYPE_CHECKING:
    from harness.trace.analyses.selection import Selection

RANK_FILE = re.compile(r"\.rank(\d+)\.")


def _hidden(kt: KernelTable, comm: np.ndarray, compute: np.ndarray, on: np.ndarray) -> tuple[int, int]:
    """(communication ns, hidden ns) of one device (`on`): per communication stream, the
    union of its kernels, and the part of it under compute kernels on the device's other streams."""
    total = hidden = 0
    for stream in np.unique(kt.stream[comm & on]):
        mine = comm & on & (kt.stream == stream)
        others = compute & on & (kt.stream != stream)
        c = union(kt.start[mine], kt.end[mine])
        total += int(np.sum(c[1] - c[0]))
        hidden += covered_measure(c, union(kt.start[others], kt.end[others]))
    return total, hidden


def overlap(kt: KernelTable, ranges: Sequence[Range] = (), selected: Selection | None = None) -> list[dict]:
    """Per device: communication kernel time (per-stream unions, summed), the part hidden
    under compute on other streams, the exposed rest and the hidden share; ms. With step
    ranges, `per_step` gives the same per kind of step (`step`, JAX's `fused_step`): how many
    ran, their median length, and the communication and exposed time of the mean step, so
    that JAX's split and fused steps, which overlap differently, are not mixed. The kernels
    counted are those executing inside the step `ranges`, or those `selected` counts
    (`harness.trace.analyses.selection.select`, for a user's profile: the measured steps
    less the first, each kernel in the step that launched it where the program does not
    synchronize)."""
    cats = _categories(kt)
    kernels = (kt.kind == KERNEL) & (cats != _CATS.index(Category.AUTOTUNING))
    is_comm = cats == _CATS.index(Category.COMMUNICATION)
    if selected is None:
        keep = _measured(kt, ranges) & kernels
        kinds = {name: [r for r in ranges if r.name == name] for name in STEP_RANGES}
        kinds = {name: (spans, _measured(kt, spans) & kernels) for name, spans in kinds.items() if spans}
    else:
        keep = selected.kernels["measured"] & kernels
        kroot = selected.kernels["kroot"]
        kinds = {name: ([selected.ranges[i] for i in insts], keep & np.isin(kroot, insts))
                 for name, insts in selected.instances.items() if name in STEP_RANGES and insts}
    out = []
    for device in np.unique(kt.device[keep]):
        on = kt.device == device
        total, hidden = _hidden(kt, keep & is_comm, keep & ~is_comm, on)
        rec = {"device": int(device), "communication_ms": total / 1e6, "hidden_ms": hidden / 1e6,
               "exposed_ms": (total - hidden) / 1e6, "hidden_share": hidden / total if total else None}
        if kinds:
            rec["per_step"] = {}
            for name, (spans, k) in kinds.items():
                comm, under = _hidden(kt, k & is_comm, k & ~is_comm, on)
                n = len(spans)
                rec["per_step"][name] = {"steps": n, "step_ms": statistics.median(r.end - r.start for r in spans) / 1e6,
                                         "communication_ms": comm / n / 1e6, "exposed_ms": (comm - under) / n / 1e6}
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
                    per.setdefault(name, []).append(rec)
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
    return out


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
                   f"{share} of the step")
    return out


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
