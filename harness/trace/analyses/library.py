"""Library ranges inside the program's phases (`harness.trace.library_ranges`).

The breakdown's phases are the program's own ranges; the ranges a framework opens inside
them (``FSDP::all_gather (blocks.0)``, ``nccl:all_reduce``...) are sub-ranges of the
innermost of them that contains each one (by interval, whatever the thread: FSDP opens its
backward ranges on autograd's thread, inside the main thread's ``backward``). Per phase and
range name (module indices folded, `group_name`), the breakdown keeps how many there are per
step and the GPU time of the kernels in them: those the phase counts whose launch call lies
inside one on the same thread (by execution interval where the breakdown attributes by
execution). A range holds the kernels of the library ranges nested in it; a kernel counts
once per name.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from collections.abc import Mapping, Sequence

import numpy as np

from harness.trace.analyses import attribution as attr
from harness.trace.library_ranges import group_name, library_of
from harness.trace.profile import KernelTable, Range
from harness.trace.stats import PhaseStats, SubRange

LISTED = 4  # names listed per library in the one line of a profile without ranges of its own


def _library(name: str) -> str:
    """The library of a library range: by name, else a ProfilerStep inside the program's step."""
    return library_of(name) or "torch.profiler"


def holders(own: Sequence[Range], library: Sequence[Range]) -> np.ndarray:
    """Per library range, the innermost of the program's ranges `own` that contains it (-1:
    none; of equal spans, the program's holds the library's). One pass over both sorted by
    start: a stack of the nested own ranges open there, whose ends fall from bottom to top."""
    out = np.full(len(library), -1, np.int64)
    events = sorted([(r.start, -r.end, 0, i) for i, r in enumerate(own)]
                    + [(r.start, -r.end, 1, i) for i, r in enumerate(library)])
    stack: list[int] = []
    ends: list[int] = []  # -end of each stacked range: rising from bottom to top
    for _, neg_end, kind, i in events:
        if kind == 0:
            while ends and -ends[-1] < -neg_end:
                stack.pop()
                ends.pop()
            stack.append(i)
            ends.append(neg_end)
        elif (j := bisect_right(ends, neg_end) - 1) >= 0:
            out[i] = stack[j]
    return out


def sub_ranges(kt: KernelTable, library: Sequence[Range], phase_of: Sequence[str | None], counted: np.ndarray,
               mode: str, phases: Mapping[str, PhaseStats]) -> dict[str, list[SubRange]]:
    """Per phase, its library sub-ranges, most GPU time first: `phase_of` names the phase
    each library range lies in (None: outside the measured steps), `counted` marks the
    kernels the phases count, `mode` is the breakdown's attribution ("launch": by launch
    call on the range's own thread; else by execution interval)."""
    keys: dict[tuple[str, str], int] = {}
    group = np.full(len(library), -1, np.int64)
    count: dict[int, int] = defaultdict(int)
    for i, r in enumerate(library):
        if phase_of[i] in phases:
            group[i] = keys.setdefault((phase_of[i], group_name(r.name)), len(keys))
            count[int(group[i])] += 1
    if not keys:
        return {}
    inner = attr.by_launch(kt, library, any_thread=False) if mode == "launch" else attr.by_execution(kt, library)
    parents = attr.range_parents(library)
    idx = np.flatnonzero(counted & (inner >= 0))
    cur, pairs = inner[idx], []
    while len(idx):  # each kernel to every library range holding it, up the nesting
        g = group[cur]
        pairs.append(idx[g >= 0] * len(keys) + g[g >= 0])
        up = parents[cur] >= 0
        idx, cur = idx[up], parents[cur][up]
    kernel, g = np.divmod(np.unique(np.concatenate(pairs)) if pairs else np.empty(0, np.int64), len(keys))
    ns = np.bincount(g, weights=kt.duration[kernel].astype(np.float64), minlength=len(keys))
    out: dict[str, list[SubRange]] = defaultdict(list)
    for (phase, name), j in keys.items():
        p = phases[phase]
        per_step = ns[j] / (max(p.steps, 1) * p.devices)
        out[phase].append(SubRange(name=name, library=_library(name),
                                   per_step=count[j] / max(p.steps, 1), gpu_ns_per_step=float(per_step),
                                   share=float(per_step / p.gpu_ns_per_step) if p.gpu_ns_per_step else 0.0))
    return {phase: sorted(out[phase], key=lambda s: (-s.gpu_ns_per_step, s.name)) for phase in phases if phase in out}


def only_library(library: Sequence[Range], whole: bool) -> str:
    """The one line a profile gets whose ranges are all a library's (and steps): what the
    tables then cover, and the library ranges, a few names per library."""
    names: dict[str, dict[str, None]] = defaultdict(dict)
    for r in library:
        names[_library(r.name)][group_name(r.name)] = None
    listed = "; ".join(f"{lib}: " + ", ".join(f"`{n}`" for n in list(ns)[:LISTED])
                       + (f" and {len(ns) - LISTED} more" if len(ns) > LISTED else "") for lib, ns in names.items())
    cover = ("the tables cover the whole profile (one \"step\")" if whole
             else "each step reads as one phase, the whole step")
    return (f"no phase ranges of the program's own, only library ranges ({listed}): {cover}; they are listed "
            "under \"Library ranges inside each phase\"")
