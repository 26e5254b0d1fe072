"""Several runs a side: the gap between two sets of runs, judged by the spread between runs.

A run's own p10-p90 covers step-to-step noise inside one process. Runs of identical code
in separate processes can differ by more: where the step is bound by the host (launches,
Python), the host's state at the time sets its speed. With several runs named on each side
(``harness.diff A1,A2,A3 B1,B2,B3``), each phase's time on a side is the median of its
runs' timer medians, and a gap is beyond the noise where the two sides' ranges of run
medians do not overlap and so few orders of the runs would part them that chance does not
explain it: runs of identical code are exchangeable, and 2 of the C(n+m, n) orders of n and
m runs put one side wholly above the other (2v2: one in three; 3v3: one in ten, the most
taken as beyond the noise, `BEYOND_CHANCE`). Ranges apart with fewer runs are no verdict
(`in_noise` None): more runs can tell. The decomposition into parts stays that of one run a side: the run
whose step median is nearest its side's median (the first on a tie).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from harness.diffs.changes import run_changes
from harness.diffs.clocks import step_clocks
from harness.diffs.decompose import Diff, timing
from harness.diffs.inputs import InputError, Run

STEP_PHASES = ("fused_step", "step")  # the whole step, JAX's fused one first where a run has both
BEYOND_CHANCE = 0.1  # the largest share of orders of identical code's runs that part them, called beyond the noise


@dataclass(frozen=True)
class SideRuns:
    """One side's runs of one phase: each run's label and its timer median."""

    labels: tuple[str, ...]
    medians_ms: tuple[float, ...]

    @property
    def median_ms(self) -> float:
        return statistics.median(self.medians_ms)

    @property
    def lo_ms(self) -> float:
        return min(self.medians_ms)

    @property
    def hi_ms(self) -> float:
        return max(self.medians_ms)


def parting_chance(n: int, m: int) -> float:
    """The share of orders of n and m runs of identical code that put one side's runs all above
    the other's: 2 / C(n + m, n)."""
    return 2 / math.comb(n + m, n)


def count_problem(a: int, b: int) -> str | None:
    """Why `a` runs cannot be set against `b` runs (one line naming the fix), or None. One run
    each is a plain diff; several need several on both sides, since one run has no spread
    between runs to set against the other side's."""
    if (a > 1) != (b > 1):
        one, many = ("A", "B") if a == 1 else ("B", "A")
        return (f"RUN: {many} names {max(a, b)} runs and {one} one; the noise between runs needs several on "
                "each side (A1,A2 B1,B2), or name one run each")
    return None


def _step_median(run: Run) -> float | None:
    """The run's whole-step timer median: JAX's fused step where it has one, else its step."""
    for phase in STEP_PHASES:
        if t := timing(run, phase):
            return t.median_ms
    return None


def representative(runs: Sequence[Run]) -> Run:
    """The run whose step median is nearest the median of the runs' step medians."""
    medians = [_step_median(r) for r in runs]
    middle = statistics.median(medians)
    return runs[min(range(len(runs)), key=lambda i: abs(medians[i] - middle))]


def with_repeats(d: Diff, a: Sequence[Run], b: Sequence[Run]) -> Diff:
    """`d`, the diff of each side's representative run, with every phase that all runs timed
    taken over the runs: its time on each side the median of the runs' medians, its noise
    the overlap of the two ranges of run medians. Returns `d`."""
    for p in d.phases:
        sides = {}
        for side, runs, phase in (("a", a, p.a_phase), ("b", b, p.b_phase)):
            times = [timing(r, phase) for r in runs]
            if any(t is None for t in times):
                break
            sides[side] = SideRuns(tuple(r.source for r in runs), tuple(t.median_ms for t in times))
        else:
            ra, rb = sides["a"], sides["b"]
            p.runs = sides
            p.a_ms, p.b_ms = ra.median_ms, rb.median_ms
            apart = ra.hi_ms < rb.lo_ms or rb.hi_ms < ra.lo_ms
            p.in_noise = (not apart) or (None if parting_chance(len(a), len(b)) > BEYOND_CHANCE else False)
            p.whole = f"harness timer, median of {len(ra.medians_ms)} and {len(rb.medians_ms)} runs' medians"
    d.clocks = step_clocks((d.step.a_phase, d.step.b_phase) if d.step else None, list(a), list(b))
    d.changes = run_changes(a, b)
    for side, runs in (("A", a), ("B", b)):
        d.notes.append(f"{side}: {len(runs)} runs; the parts and tables below are of the run nearest their median, "
                       f"{representative(runs).source}")
    return d


def check_sides(a: Sequence[Run], b: Sequence[Run]) -> None:
    """Raise `InputError` (one line naming the fix) where the runs cannot be set side against
    side: unequal counts (`count_problem`), or, with several a side, a run without a timed step."""
    if problem := count_problem(len(a), len(b)):
        raise InputError(problem)
    if len(a) > 1 and (missing := [r.source for r in (*a, *b) if _step_median(r) is None]):
        raise InputError(f"RUN {missing[0]}: records no timed step; several runs a side are judged by their timer's "
                         "step medians, so name harness.run documents or compare folders' backends")
