"""Options of the tools that read profiles: the timeline a report or compare lays out
(`--timeline`, `--timeline-steps`) and how much of a report kernels.md holds (`--detail`)."""

from __future__ import annotations

import argparse

from harness.cli.dialect import choice
from harness.common.errors import UsageError


def step_selection(value: str) -> tuple[int, ...] | str:
    """`--timeline-steps`: "all", or measured-step indices and ranges ("0,2-3"), sorted."""
    if value == "all":
        return value
    picked: set[int] = set()
    for part in value.split(","):
        lo, _, hi = part.strip().partition("-")
        try:
            first, last = int(lo), int(hi or lo)
        except ValueError:
            first, last = -1, -1
        if not 0 <= first <= last:
            raise UsageError(f"expected 'all' or measured-step indices like 0,2-3, got {value!r}")
        picked |= set(range(first, last + 1))
    return tuple(sorted(picked))


def add_timeline(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--timeline", action="store_true",
                        help="also write timeline.json.gz: every profile on one Chrome/Perfetto trace, measured "
                             "steps aligned (opens in ui.perfetto.dev and chrome://tracing)")
    parser.add_argument("--timeline-steps", type=step_selection, default=None, metavar="STEPS",
                        help="with --timeline: the measured steps to lay out, by index (0,2-3), or all (every "
                             "kernel and range of each profile); None: every measured step")


def timeline_problem(args: argparse.Namespace) -> str | None:
    """One line when --timeline-steps comes without --timeline, else None."""
    if args.timeline_steps is not None and not args.timeline:
        return "--timeline-steps: lays out the steps of --timeline; add --timeline"
    return None


def timeline_steps_problem(steps: tuple[int, ...] | str | None, measured: int, where: str) -> str | None:
    """One line when --timeline-steps picks a step index at or past `measured`, the number of
    measured steps there are, else None: such a step has nothing to lay out. `where` begins
    the sentence that says so ("--steps 3 measures", "the profiles hold measured")."""
    if not isinstance(steps, tuple) or max(steps) < measured:
        return None
    beyond = ",".join(str(k) for k in steps if k >= measured)
    held = f"steps 0-{measured - 1}" if measured > 1 else "step 0 only" if measured else "no step"
    return f"--timeline-steps {beyond}: {where} {held}; pick indices below {max(measured, 1)}"


DETAILS = ("summary", "full")


def add_detail(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--detail", type=choice("detail", DETAILS), default="summary",
                        help="summary: a report over about 300 lines, or with more than 8 columns (ranks), is "
                             "summarized in kernels.md (distributions beyond 8 ranks, the main phases, one column's "
                             "top kernels; report.html holds everything); full: every table, one column per rank")
