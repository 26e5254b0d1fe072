"""Where a kernel's warps wait, instruction by instruction, from an Nsight Compute source export.

    ncu --section WarpStateStats --section SourceCounters --import-source no -k regex:NAME \\
        --launch-count 1 -o prof python ...
    ncu -i prof.ncu-rep --page source --print-source sass --csv > sass.csv
    python -m harness.ncu_source sass.csv [--top 25] [--out summary.md]

The analysis is `harness.attention.ncu_stalls` (its docstring says what it finds); this
entry point parses the options and prints or writes the summary.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from harness.attention.ncu_stalls import NcuSourceError, read_source, source_markdown
from harness.cli.dialect import add_out, emit, fail, make_parser, parse_args, positive_int


def main(argv: Sequence[str] | None = None) -> int:
    p = make_parser("harness.ncu_source", __doc__)
    p.add_argument("csv", type=Path, help="ncu source-page export (.csv or .csv.gz)")
    p.add_argument("--top", type=positive_int, default=25, help="instructions to list")
    p.add_argument("--min-share", type=float, default=0.01, help="smallest loop to list, as a share of samples")
    add_out(p, "write the markdown here (None: stdout)", metavar="PATH.md")
    args = parse_args(p, argv)
    if not 0 <= args.min_share < 1:
        p.error(f"argument --min-share: expected a share in [0, 1), got {args.min_share}")
    try:
        kernels = read_source(args.csv)
    except (OSError, UnicodeDecodeError, NcuSourceError) as exc:
        return fail(str(exc))
    text = "\n".join(source_markdown(k, args.csv.name, top=args.top, min_share=args.min_share)
                     for k in kernels if k.instructions)
    emit(text, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
