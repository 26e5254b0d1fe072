"""Read an Nsight Compute details export and summarize what limits each kernel.

    ncu --csv --page details [--set full | --section ...] -k regex:NAME python ... > kernels.csv
    python -m harness.ncu kernels.csv [--out summary.md]

`read_details` returns one record per profiled launch with every (section, metric) the
export holds; `summary` picks the figures that say whether a kernel is bound by memory,
by issue/latency or by occupancy; rendering is separate. Metrics a section set did not
collect are left out rather than guessed.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from harness.attention.ncu import NcuError, read_details, render_markdown, summary
from harness.common.cli import emit, make_parser


def main(argv: Sequence[str] | None = None) -> int:
    p = make_parser("harness.ncu", __doc__)
    p.add_argument("csv", type=Path, help="ncu --page details --csv export")
    p.add_argument("--out", type=Path, default=None, metavar="PATH.md", help="write the markdown here (None: stdout)")
    args = p.parse_args(argv)
    try:
        launches = read_details(args.csv)
    except (OSError, NcuError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    text = render_markdown([summary(x) for x in launches], args.csv.name)
    emit(text, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
