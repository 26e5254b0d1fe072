"""The timeline of a diff: A's and B's profiles on one trace, steps aligned, with each phase's
largest move written over that phase (`harness.trace.timeline`)."""

from __future__ import annotations

from collections.abc import Sequence

from harness.diffs.decompose import Diff
from harness.diffs.inputs import InputError, Run
from harness.trace.analyses.breakdown import breakdown, load_profile
from harness.trace.analyses.hlo_join import hlo_dir, load_schedules
from harness.trace.timeline import Mark, build_timeline, timeline_run
from harness.trace.timeline import Run as TimelineRun


def marks(d: Diff, label: str) -> list[Mark]:
    """Per phase, the part that moved most, over B's range of that phase (labelled `label`)."""
    out = []
    for p in d.phases:
        if not p.parts:
            continue
        part = max(p.parts, key=lambda x: abs(x.delta_ms))
        out.append(Mark(f"{p.phase}: {part.name} {part.delta_ms:+.3f} ms per step "
                        f"({part.a_ms:.3f} -> {part.b_ms:.3f} ms)", label, p.b_phase))
    return out


def check_profiles(a: Run, b: Run) -> None:
    """InputError naming the runs without a profile file to lay out."""
    missing = [run.source for run in (a, b) if run.profile is None]
    if missing:
        raise InputError(f"--timeline: {', '.join(missing)} names no profile (a compare folder keeps none); "
                         "name the profiles: X.sqlite.gz, or X.harness.json with its profile beside it")


def timeline_runs(a: Run, b: Run, nsys_bin: str | None = None) -> list[TimelineRun]:
    """A's and B's profiles as timeline runs (labelled "A <label>", "B <label>")."""
    check_profiles(a, b)
    runs = []
    for side, run in (("A", a), ("B", b)):
        profile = load_profile(run.profile, f"{side} {run.label}", nsys_bin)
        hlo = hlo_dir(run.profile)
        schedules = load_schedules(hlo) if hlo.is_dir() else None
        runs.append(timeline_run(profile, breakdown(profile).attribution, schedules))
    return runs


def diff_timeline(d: Diff, runs: Sequence[TimelineRun], steps: Sequence[int] | str | None = None) -> dict:
    """The trace-event document of A's and B's `timeline_runs` with `marks`."""
    return build_timeline(runs, steps, marks(d, runs[1].label))
