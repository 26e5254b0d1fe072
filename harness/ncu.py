"""Read an Nsight Compute details export and summarize what limits each kernel, or draw
its roofline.

    ncu --csv --page details [--set full | --section ...] -k regex:NAME python ... > kernels.csv
    python -m harness.ncu kernels.csv [--out summary.md]
    python -m harness.ncu --roofline --gpu H100 kernels.csv [--out DIR]    # roofline.md, roofline.png

`read_details` returns one record per profiled launch with every (section, metric) the
export holds; `summary` picks the figures that say whether a kernel is bound by memory,
by issue/latency or by occupancy; rendering is separate. Metrics a section set did not
collect are left out rather than guessed. The roofline needs FLOP counters and DRAM
bytes (`harness.attention.roofline` says which metrics, and the ncu command); an export
without them is refused in one line that names them.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from harness.attention import roofline
from harness.attention.ncu_details import NcuError, ncu_markdown, read_details, summary
from harness.cli.dialect import add_out, emit, fail, make_parser, parse_args


def build_parser():
    p = make_parser("harness.ncu", __doc__)
    p.add_argument("csv", type=Path, help="ncu --page details --csv export")
    add_out(p, "the summary: a markdown file; with --roofline: a folder for roofline.md and roofline.png "
               "(None: print the markdown)")
    p.add_argument("--roofline", action="store_true",
                   help="each kernel's FLOP/s against its FLOP per DRAM byte, under the GPU's roofs")
    p.add_argument("--gpu", default=None, metavar="NAME",
                   help="with --roofline: the GPU the export was captured on, as in harness/common/hardware.py "
                        "(H100, H200, A100 80GB...)")
    return p


def _roofline(args) -> int:
    if not args.gpu:
        return fail("--roofline needs --gpu NAME (H100, H200, ...): the export does not name the GPU model")
    launches = read_details(args.csv)
    roofs = roofline.roofs(args.gpu)
    pts = roofline.points(launches, roofline.compute_capabilities(args.csv))
    text = roofline.roofline_markdown(pts, roofs, args.csv.name)
    if args.out is None:
        print(text, end="")
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    emit(text, out / "roofline.md")
    roofline.plot(pts, roofs, out / "roofline.png")
    print(f"wrote {out / 'roofline.png'}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(build_parser(), argv)
    try:
        if args.roofline:
            return _roofline(args)
        launches = read_details(args.csv)
    except (OSError, NcuError) as exc:
        return fail(str(exc))
    emit(ncu_markdown([summary(x) for x in launches], args.csv.name), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
