"""Kernel-breakdown report of one or several profiles, one column per profile.

    python -m harness.report torch.nsys-rep jax.nsys-rep --harness-json torch.json --harness-json jax.json \\
        --out kernels/

Inputs: ``.nsys-rep`` (exported with nsys first), ``.sqlite``/``.sqlite.gz`` exports, or
the framework-profiler fallback's traces (torch ``.json``, JAX ``.xplane.pb``). Columns
are labelled by the backend named in each file name, or by ``--label``. Writes
kernels.md, .csv, .json and .png into --out. A profile that cannot be analysed is
reported in one line (exit status 2).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from harness.common.cli import add_nsys_bin, add_out, fail, make_parser, parse_args, positive_int
from harness.trace.analyses.breakdown import ATTRIBUTIONS, TOP_N, breakdown_files
from harness.trace.profile import ProfileError
from harness.trace.render import write_report


def build_parser():
    p = make_parser("harness.report", __doc__)
    p.add_argument("files", nargs="+", help=".nsys-rep, .sqlite[.gz], torch .json or JAX .xplane.pb")
    p.add_argument("--label", action="append", default=[], help="column label per file, in order")
    add_out(p, "output folder", default="kernel_report", metavar="DIR")
    p.add_argument("--harness-json", action="append", default=[], metavar="PATH",
                   help="the harness.run result JSON per file, in order (its forward time goes into answer (a))")
    p.add_argument("--require", action="append", default=[], metavar="RANGE", help="range name that must be present")
    p.add_argument("--top", type=positive_int, default=TOP_N, help="kernels listed per phase")
    p.add_argument("--no-plot", action="store_true", help="skip kernels.png (drawing it takes about as long as the "
                                                            "analysis itself)")
    p.add_argument("--attribution", choices=ATTRIBUTIONS, default="auto",
                   help="kernels to ranges by execution interval, by launch call (CUPTI correlation), or auto: "
                        "execution where ranges end in synchronizations, else launch")
    p.add_argument("--force", action="store_true",
                   help="analyse an nsys export whose importer lost kernel records (XLA's TSL NVTX domain)")
    add_nsys_bin(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(build_parser(), argv)
    if len(args.label) > len(args.files) or len(args.harness_json) > len(args.files):
        return fail("--label/--harness-json: more of them than profile files; give at most one per file")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        return fail(f"--out {args.out}: a file, not a folder; name a folder for kernels.md/.csv/.json/.png")
    try:
        bds, answer_sets = breakdown_files(args.files, args.label, args.harness_json, args.require, args.nsys_bin,
                                           args.attribution, args.force)
        paths = write_report(args.out, bds, answer_sets, args.top, png=not args.no_plot)
    except ProfileError as exc:
        return fail(str(exc))
    print("\n".join(str(p) for p in paths.values()))
    for warning in (w for bd in bds for w in bd.warnings if w.startswith("--harness-json")):
        print(f"warning: {warning}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
