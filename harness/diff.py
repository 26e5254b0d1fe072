"""Explain the gap between two runs: per phase, host time, GPU time per kernel category,
kernel counts and GEMM choices, adding up to B's time minus A's.

    python -m harness.diff A B [--out DIR] [--fail-if-slower PCT] [--force]
    python -m harness.diff A1,A2,A3 B1,B2,B3 ...                              # several runs a side
    python -m harness.diff results/main-job/large-ctx256-bf16-h200-profiled      # every pair of its backends

A and B name runs: ``FOLDER:BACKEND`` of a `harness.compare` result folder, a `harness.run`
JSON (``X.harness.json`` picks up the profile ``X.sqlite.gz``/``X.nsys-rep`` beside it) or
any profile (``.nsys-rep``, ``.sqlite[.gz]``, a torch.profiler ``.json[.gz]``, a JAX
``.xplane.pb[.gz]``, a folder of one job's per-rank profiles; a multi-process nsys profile
is its ranks). Several runs a side, joined by commas, are judged by the spread between runs
(`harness.diffs.repeats`). Runs of different model, ctx, batch, dtype, mode, GPU or rank count are
refused unless --force. Without --out the report goes to stdout; with --timeline (and
--out), timeline.json.gz lays A's and B's profiles on one trace, steps aligned, each
phase's largest move written over it. With --fail-if-slower the exit status is 1 when B's
step median is slower than A's by more than PCT percent and beyond the noise (a CI
regression gate), else 0.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Sequence
from pathlib import Path

from harness.cli.dialect import (
    add_nsys_bin,
    add_out,
    fail,
    loaded_backends,
    make_parser,
    non_negative_float,
    parse_args,
)
from harness.cli.trace_options import add_timeline, timeline_problem, timeline_steps_problem
from harness.common.html import svg_of, write_html
from harness.diffs.decompose import Diff, MismatchError, diff_runs, regression
from harness.diffs.inputs import InputError, Run, distinct, mismatch, resolve, resolve_one
from harness.diffs.repeats import check_sides, count_problem, representative, with_repeats
from harness.diffs.timeline import check_profiles, diff_timeline, timeline_runs
from harness.reports.diff import diff_markdown, plot_waterfall, render
from harness.trace.timeline import measured_steps, write_timeline


def build_parser():
    p = make_parser("harness.diff", __doc__)
    p.add_argument("runs", nargs="+", metavar="RUN",
                   help="A and B: FOLDER:BACKEND, a harness.run JSON or a profile, or several of them joined by commas "
                        "(A1,A2,A3 B1,B2,B3: judged by the spread between runs); one compare folder alone: "
                        "every pair of its backends")
    add_out(p, "folder for diff.md, diff.json, diff.png, report.html (one subfolder per pair when there are "
               "several); None: print diff.md", metavar="DIR")
    p.add_argument("--fail-if-slower", type=non_negative_float, default=None, metavar="PCT",
                   help="exit 1 when B's step is slower than A's by more than PCT percent, beyond the noise")
    p.add_argument("--force", action="store_true",
                   help="compare runs of different model, ctx, batch, dtype, mode, GPU or rank count")
    add_nsys_bin(p)
    add_timeline(p)
    return p


def _pairs(specs: list[str], nsys_bin: str | None) -> list[tuple[list[Run], list[Run]]]:
    """The (A runs, B runs) pairs the specs name: one run a side, or several joined by commas."""
    if len(specs) == 1 and "," not in specs[0]:
        runs = resolve(specs[0], nsys_bin)
        if len(runs) < 2:
            raise InputError(f"{specs[0]}: holds {len(runs)} run; name two runs A B")
        return [([a], [b]) for a, b in itertools.combinations(runs, 2)]
    if len(specs) != 2:
        raise InputError(f"RUN: got {len(specs)} runs; name two (A B), several a side (A1,A2 B1,B2) "
                         "or one compare folder")
    sides = [[part for part in spec.split(",") if part] for spec in specs]
    if not all(sides):
        raise InputError(f"RUN: {' '.join(specs)} leaves a side empty; name A B, or A1,A2 B1,B2")
    if problem := count_problem(*map(len, sides)):  # before any profile is loaded
        raise InputError(problem)
    a, b = ([resolve_one(spec, nsys_bin) for spec in side] for side in sides)
    check_sides(a, b)
    if len(a) == 1:
        a[0], b[0] = distinct(a[0], b[0])
    return [(a, b)]


def _diff(a: list[Run], b: list[Run], force: bool) -> Diff:
    """The diff of one run a side, or of each side's run nearest its median taken over the runs."""
    if len(a) == 1:
        return diff_runs(a[0], b[0], force=force)
    return with_repeats(diff_runs(representative(a), representative(b), force=force), a, b)


def write_diff(d: Diff, folder: Path, figures: bool = True) -> dict[str, Path]:
    """diff.md, diff.json and, with `figures`, diff.png and report.html of `d` in `folder`."""
    paths = render(d, folder, figures)
    if figures:
        paths["html"] = write_html(folder, "diff.md",
                                   {"diff.png": svg_of(lambda path, d=d: plot_waterfall(d, Path(path)))})
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(build_parser(), argv)
    loaded_backends()  # the runs' backends are read by name
    if problem := timeline_problem(args):
        return fail(problem)
    if args.timeline and args.out is None:
        return fail("--timeline: writes timeline.json.gz beside diff.md; add --out DIR")
    try:
        pairs = _pairs(args.runs, args.nsys_bin)
        unlike = [line for a, b in pairs for x in (*a[1:], *b) if (line := mismatch(a[0], x))]
        if unlike and not args.force:
            raise InputError(unlike[0])
        if args.timeline:
            for a, b in pairs:
                check_profiles(representative(a), representative(b))
        diffs = [_diff(a, b, args.force) for a, b in pairs]
        if args.timeline:  # before anything is written: a step the profiles lack is refused
            timelines = [timeline_runs(representative(a), representative(b), args.nsys_bin) for a, b in pairs]
            for runs in timelines:
                if problem := timeline_steps_problem(args.timeline_steps, measured_steps(runs),
                                                     "the profiles hold measured"):
                    return fail(problem)
    except (InputError, MismatchError) as exc:
        return fail(str(exc))
    for d in diffs:
        if args.out is None:
            print(diff_markdown(d))
            continue
        folder = Path(args.out) if len(diffs) == 1 else Path(args.out) / f"{d.a_label}-vs-{d.b_label}".replace(":", "-")
        paths = write_diff(d, folder)
        if args.timeline:
            paths["timeline"] = write_timeline(folder / "timeline.json.gz",
                                               diff_timeline(d, timelines[diffs.index(d)], args.timeline_steps))
        print("\n".join(str(p) for p in paths.values()))
    if args.fail_if_slower is not None:
        slower = [line for d in diffs if (line := regression(d, args.fail_if_slower))]
        if slower:
            print("\n".join(f"regression: {line}" for line in slower), file=sys.stderr)
            return 1
        print(f"no regression beyond {args.fail_if_slower:g}% and the noise", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
