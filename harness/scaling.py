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
from harness.common.results import file_problem
from harness.timing.scaling import format_scaling, scaling_rows


def load_run(path: str) -> dict:
    """One harness.run result document; a UsageError naming `path` for anything else (a
    folder, a binary file, other JSON, a document without the fields the table needs)."""
    fix = "give harness.run --out files"
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except IsADirectoryError:
        raise UsageError(f"{path}: is a folder; {fix}") from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot be read ({exc.strerror or exc}); {fix}") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise UsageError(f"{path}: not JSON; {fix}") from None
    try:
        scaling_rows([doc])
    except (KeyError, TypeError, AttributeError) as exc:
        raise UsageError(f"{path}: not a harness.run result document (no {exc}); {fix}") from None
    return doc


def main(argv: Sequence[str] | None = None) -> int:
    p = make_parser("harness.scaling", __doc__)
    p.add_argument("runs", nargs="+", metavar="RUN.json", help="harness.run result documents")
    add_out(p, "write the markdown table here (None: print it)")
    args = parse_args(p, argv)
    try:
        if args.out and (problem := file_problem(args.out, "--out")):
            raise UsageError(problem)
        docs = [load_run(path) for path in args.runs]
        rows = scaling_rows(docs)
    except UsageError as exc:
        return fail(str(exc))
    except ValueError as exc:  # two runs of one backend, N and shape
        return fail(str(exc))
    if not rows:
        return fail(f"none of {', '.join(args.runs)} finished (status ok); nothing to tabulate")
    emit(format_scaling(rows), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
