"""Scaling table of data-parallel runs: step time, tokens/s and efficiency per backend.

    python -m harness.scaling torch-n1.json torch-n2.json jax-n1.json jax-n2.json [--out scaling.md]

Each file is a `harness.run --out` document (N = 1, 2, 4, 8 with `--data-parallel`,
the same per-device `--batch`); failed runs are left out. The library is
`harness.timing.scaling`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

from harness.common.cli import UsageError, add_out, emit, fail, make_parser, parse_args
from harness.timing.scaling import format_scaling, scaling_rows


def main(argv: Sequence[str] | None = None) -> int:
    p = make_parser("harness.scaling", __doc__)
    p.add_argument("runs", nargs="+", metavar="RUN.json", help="harness.run result documents")
    add_out(p, "write the markdown table here (None: print it)")
    args = parse_args(p, argv)
    docs = []
    try:
        for path in args.runs:
            try:
                with open(path) as f:
                    docs.append(json.load(f))
            except (OSError, json.JSONDecodeError) as exc:
                raise UsageError(f"RUN.json {path}: not a readable result document ({exc.__class__.__name__}); "
                                 "give harness.run --out files") from exc
        rows = scaling_rows(docs)
    except UsageError as exc:
        return fail(str(exc))
    except ValueError as exc:
        return fail(f"RUN.json: {exc}")
    except KeyError as exc:
        return fail(f"RUN.json: a document lacks {exc}; give harness.run --out files")
    if not rows:
        return fail("RUN.json: no run finished; nothing to tabulate")
    emit(format_scaling(rows), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
