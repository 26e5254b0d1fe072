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

import numpy as np

from harness.trace.analyses.intervals import _CATS, _categories, _measured, covered_measure, union
from harness.trace.kernels import Category
from harness.trace.profile import KERNEL, PHASES, STEP_RANGES, KernelTable, Profile, ProfileError, Range

RANK_FILE = re.compile(r"\.rank(\d+)\.")


def overlap(kt: KernelTable, ranges: Sequence[Range] = ()) -> list[dict]:
    """Per device: communication kernel time (per-stream unions, summed), the part hidden
    under compute on other streams, the exposed rest and the hidden share; ms."""
    cats = _categories(kt)
    keep = _measured(kt, ranges) & (kt.kind == KERNEL) & (cats != _CATS.index(Category.AUTOTUNING))
    comm = keep & (cats == _CATS.index(Category.COMMUNICATION))
    compute = keep & ~comm
    out = []
    for device in np.unique(kt.device[keep]):
        on = kt.device == device
        total = hidden = 0
        for stream in np.unique(kt.stream[comm & on]):
            mine = comm & on & (kt.stream == stream)
            others = compute & on & (kt.stream != stream)
            c = union(kt.start[mine], kt.end[mine])
            total += int(np.sum(c[1] - c[0]))
            hidden += covered_measure(c, union(kt.start[others], kt.end[others]))
        out.append({"device": int(device), "communication_ms": total / 1e6, "hidden_ms": hidden / 1e6,
                    "exposed_ms": (total - hidden) / 1e6, "hidden_share": hidden / total if total else None})
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
    return {"ranks": ranks, "spread": spread, "communication_ms": total, "hidden_ms": hidden,
            "exposed_ms": total - hidden, "hidden_share": hidden / total if total else None,
            "split": profile_split(profiles, bytes_per_step)}


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
    lines.append(f"all: {analysis['communication_ms']:.3f} ms of communication, {analysis['exposed_ms']:.3f} ms "
                 f"exposed" + (f" ({100 * (1 - share):.1f}%)" if share is not None else ""))
    return "\n".join(lines) + "\n"
