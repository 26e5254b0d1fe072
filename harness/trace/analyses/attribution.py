"""Which range each kernel belongs to: vectorized interval joins on sorted arrays.

Two rules, each giving every kernel its *innermost* range (or -1):

- by execution: the shortest range whose ``[start, end]`` contains the kernel's execution
  interval on the GPU. Sound where every range ends in a device synchronization (the
  harness's own runs): a range's GPU work then finishes inside it.
- by launch: the shortest range containing the start of the CUDA API call that launched
  the kernel (CUPTI correlation), among the ranges pushed on the launching thread; where
  that thread has none (PyTorch launches the backward from its autograd thread, while the
  ``backward`` range is pushed on the main thread), among the ranges of any thread of the
  same process. Sound where programs do not synchronize: the kernel ran later, but it
  was asked for inside the range.

A range then holds the kernels whose innermost range is itself or a range nested in it
(`range_parents` gives the nesting, by interval containment, whatever the thread).

Each join walks the ranges (hundreds, not hundreds of thousands) from the longest to the
shortest and assigns, with two binary searches into the kernels sorted by time, every
kernel inside: a shorter range overwrites a longer one, so the innermost wins. The work
is the number of kernels times the nesting depth, in NumPy.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from harness.trace.profile import PROCESS_SHIFT, UNKNOWN, KernelTable, ProfileError, Range

TID_PROCESS_SHIFT = PROCESS_SHIFT  # nsys's globalTid holds the process id above bit 24
OUTSIDE_WARN_SHARE = 0.03  # kernel time run outside its launching range above this: warn, attribute by launch


def range_parents(ranges: Sequence[Range]) -> np.ndarray:
    """For each range (sorted by start, longest first on ties), the innermost other range
    containing it, or -1."""
    parents = np.full(len(ranges), -1, np.int64)
    stack: list[int] = []
    for i, r in enumerate(ranges):
        while stack and ranges[stack[-1]].end < r.end:
            stack.pop()
        if stack:
            parents[i] = stack[-1]
        stack.append(i)
    return parents


def _longest_first(ranges: Sequence[Range]) -> list[int]:
    return sorted(range(len(ranges)), key=lambda i: (ranges[i].start - ranges[i].end, i))


def by_execution(kernels: KernelTable, ranges: Sequence[Range]) -> np.ndarray:
    """Innermost range containing each kernel's execution interval (-1: none)."""
    inner = np.full(len(kernels), -1, np.int64)
    start, end = kernels.start, kernels.end  # sorted by start
    for i in _longest_first(ranges):
        r = ranges[i]
        lo, hi = np.searchsorted(start, r.start, "left"), np.searchsorted(start, r.end, "right")
        if lo < hi:
            window = inner[lo:hi]
            window[end[lo:hi] <= r.end] = i
    return inner


def by_launch(kernels: KernelTable, ranges: Sequence[Range], any_thread: bool = True) -> np.ndarray:
    """Innermost range containing each kernel's launch call, on the launching thread first,
    else (with `any_thread`) on any thread of its process (-1: no range, or launch not
    recorded)."""
    known = np.flatnonzero((kernels.launch != UNKNOWN) & (kernels.thread != UNKNOWN))
    order = known[np.argsort(kernels.launch[known], kind="stable")]
    at, thread = kernels.launch[order], kernels.thread[order]
    process = thread >> TID_PROCESS_SHIFT
    own = np.full(len(order), -1, np.int64)
    same_process = np.full(len(order), -1, np.int64)
    for i in _longest_first(ranges):
        r = ranges[i]
        if r.thread is None:
            continue
        lo, hi = np.searchsorted(at, r.start, "left"), np.searchsorted(at, r.end, "right")
        if lo < hi:
            own[lo:hi][thread[lo:hi] == r.thread] = i
            same_process[lo:hi][process[lo:hi] == r.thread >> TID_PROCESS_SHIFT] = i
    inner = np.full(len(kernels), -1, np.int64)
    inner[order] = np.where(own >= 0, own, same_process) if any_thread else own
    return inner


def has_launches(kernels: KernelTable) -> bool:
    """True when the profile records who launched its kernels and when (nsys with CUPTI)."""
    return bool(len(kernels)) and bool(np.any(kernels.launch != UNKNOWN))


def spill(dur: np.ndarray, by_exec: np.ndarray, by_launch: np.ndarray | None,
           ranges: Sequence[Range], kt: KernelTable) -> tuple[float, float | None]:
    """(share of the kernel time outside every range, share whose range differs by rule),
    over the kernels launched inside a range (without launch records: over those that
    started within the ranges' span)."""
    if by_launch is not None:
        inside = by_launch >= 0
    else:
        lo, hi = min(r.start for r in ranges), max(r.end for r in ranges)
        inside = (kt.start >= lo) & (kt.start <= hi)
    total = dur[inside].sum()
    if not total:
        return 0.0, None
    outside = float(dur[inside & (by_exec < 0)].sum() / total)
    moved = None if by_launch is None else float(dur[inside & (by_exec != by_launch)].sum() / total)
    return outside, moved


def choose(requested: str, outside: float, moved: float | None, launches: bool) -> tuple[str, str]:
    """The attribution rule and, in words, why."""
    spill = (f"{outside:.1%} of the kernel time launched inside ranges ran outside every range"
             + (f", {moved:.1%} in another range than it was launched in" if moved is not None else ""))
    if requested == "launch" and not launches:
        raise ProfileError("--attribution launch: this profile does not record kernel launches (CUPTI "
                           "runtime API); use --attribution execution")
    if requested != "auto":
        return requested, f"--attribution {requested} ({spill})"
    if launches and max(outside, moved or 0.0) > OUTSIDE_WARN_SHARE:
        return "launch", f"by launch, chosen because {spill}: the ranges do not end in synchronizations"
    return "execution", f"by execution interval, chosen because only {spill}"
