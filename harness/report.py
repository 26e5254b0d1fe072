"""Kernel-breakdown report of one or several profiles, one column per profile.

    python -m harness.report torch.nsys-rep jax.nsys-rep --harness-json torch.json --harness-json jax.json \\
        --out kernels/

Inputs: ``.nsys-rep`` (exported with nsys first), ``.sqlite``/``.sqlite.gz`` exports, or
the framework-profiler fallback's traces (torch ``.json``, JAX ``.xplane.pb``). Columns
are labelled by the backend named in each file name, or by ``--label``. Writes
kernels.md, .csv, .json, .png and report.html into --out (kernels.md within about 300
lines at any number of ranks, a summary where the whole is longer, unless `--detail full`;
report.html every table; with a rank set, ranks.json and ranks.csv, one row per rank; with
--timeline, timeline.json.gz: the profiles on one trace, measured steps aligned,
`harness.trace.timeline`; per further registered analysis, `harness.trace.analyses.registry`,
its table in kernels.md and <name>.json). A profile that
cannot be analysed is reported in one line (exit status 2).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from harness.cli.dialect import (
    add_nsys_bin,
    add_out,
    fail,
    loaded_backends,
    make_parser,
    parse_args,
    positive_int,
)
from harness.cli.trace_options import add_detail, add_timeline, timeline_problem, timeline_steps_problem
from harness.common.answer import answer_markdown
from harness.common.html import write_html
from harness.common.progress import stage
from harness.common.results import write_text
from harness.reports.analyses import analysis_sections, write_analyses
from harness.reports.breakdown import bounded_markdown, write_report
from harness.reports.plot import Drawer
from harness.reports.ranks import render_ranks, write_ranks_csv
from harness.trace.analyses.breakdown import TOP_N
from harness.trace.analyses.findings import report_findings
from harness.trace.analyses.gpu_time import SCOPES
from harness.trace.analyses.ranks import report_inputs
from harness.trace.analyses.selection import ATTRIBUTIONS
from harness.trace.profile import ProfileError


def build_parser():
    p = make_parser("harness.report", __doc__)
    p.add_argument("files", nargs="+", help=".nsys-rep, .sqlite[.gz], torch .json or JAX .xplane.pb; a folder of "
                                            "one job's per-rank files, or X.rank0/X.rank1 files, are read as ranks")
    p.add_argument("--label", action="append", default=[], help="column label per file, in order")
    add_out(p, "output folder", default="kernel_report", metavar="DIR")
    p.add_argument("--harness-json", action="append", default=[], metavar="PATH",
                   help="the harness.run result JSON per file, in order (its forward time goes into answer (a))")
    p.add_argument("--require", action="append", default=[], metavar="RANGE", help="range name that must be present")
    p.add_argument("--top", type=positive_int, default=TOP_N, help="kernels listed per phase")
    p.add_argument("--no-plot", action="store_true", help="skip kernels.png (drawn by a second process beside the "
                                                            "analysis: a core and about 100 MB)")
    p.add_argument("--attribution", choices=ATTRIBUTIONS, default="auto",
                   help="kernels to ranges by execution interval, by launch call (CUPTI correlation), or auto: "
                        "execution where ranges end in synchronizations, else launch")
    p.add_argument("--force", action="store_true",
                   help="analyse an nsys export whose importer lost kernel records (XLA's TSL NVTX domain)")
    p.add_argument("--scope", choices=SCOPES, default="all",
                   help="GPU activities behind the temporal breakdown, overlap, launch and queue figures: all, or "
                        "hta (HolisticTraceAnalysis's default: drops the last ProfilerStep and activities launched "
                        "outside the trace, rounds to µs as it does)")
    add_detail(p)
    add_nsys_bin(p)
    add_timeline(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(build_parser(), argv)
    loaded_backends()  # the profiles are labelled by the backends named in their file names
    if len(args.label) > len(args.files) or len(args.harness_json) > len(args.files):
        return fail("--label/--harness-json: more of them than profile files; give at most one per file")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        return fail(f"--out {args.out}: a file, not a folder; name a folder for kernels.md/.csv/.json/.png")
    if problem := timeline_problem(args):
        return fail(problem)
    drawer = None if args.no_plot else Drawer()  # imports matplotlib while the profiles are read
    png = Path(args.out) / "kernels.png"

    def draw(bds) -> None:  # as soon as the breakdowns are known; a timeline's steps are checked first
        os.makedirs(args.out, exist_ok=True)
        drawer.draw(png, bds, args.top)

    try:
        inputs = report_inputs(args.files, args.label, args.harness_json, args.require, args.nsys_bin,
                               args.attribution, args.force, args.scope,
                               breakdowns_done=draw if drawer and not args.timeline else None)
        bds, answer_sets, ranks, figures = inputs.breakdowns, inputs.answers, inputs.ranks, inputs.figures
        if args.timeline:  # before anything is written: a step the profiles lack is refused
            from harness.trace.timeline import build_timeline, measured_steps, runs_from_inputs, write_timeline

            runs = runs_from_inputs(args.files, bds, args.label, args.nsys_bin, args.force)
            if problem := timeline_steps_problem(args.timeline_steps, measured_steps(runs),
                                                 "the profiles hold measured"):
                return fail(problem)
            with stage("report", f"laying {len(bds)} profiles on a timeline"):
                timeline = build_timeline(runs, args.timeline_steps)
        with stage("report", f"writing kernels.md, .csv, .json{'' if args.no_plot else ' and drawing kernels.png'}"):
            if drawer and not drawer.drawing:
                draw(bds)
            sections = {d: [*render_ranks(ranks, d), *analysis_sections(inputs, d)] for d in ("summary", "full")}
            md, full = bounded_markdown(bds, answer_sets, args.top, sections, args.detail,
                                        lead=answer_markdown(report_findings(bds, ranks)))
            paths = write_report(args.out, bds, answer_sets, args.top, png=False, markdown=md)
            paths["gpu_time"] = Path(args.out) / "gpu_time.json"
            write_text(paths["gpu_time"], json.dumps(figures, indent=1))
            paths |= write_analyses(args.out, inputs)
            if ranks:
                paths["ranks"] = Path(args.out) / "ranks.json"
                write_text(paths["ranks"], json.dumps(ranks, indent=1))
                paths["ranks_csv"] = write_ranks_csv(Path(args.out) / "ranks.csv", ranks)
            if drawer:
                paths["png"] = drawer.wait()
        with stage("report", "writing report.html"):
            paths["html"] = write_html(args.out, "kernels.md", text=full)  # the page holds every table
        if args.timeline:
            paths["timeline"] = write_timeline(Path(args.out) / "timeline.json.gz", timeline)
    except ProfileError as exc:
        return fail(str(exc))
    finally:
        if drawer:
            drawer.close()
    print("\n".join(str(p) for p in paths.values()))
    for warning in (w for bd in bds for w in bd.warnings if w.startswith("--harness-json")):
        print(f"warning: {warning}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
