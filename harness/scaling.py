"""Scaling table of data-parallel runs: step time, tokens/s and efficiency per backend.

    python -m harness.scaling torch-n1.json torch-n2.json jax-n1.json jax-n2.json [--out scaling.md]
    python -m harness.scaling torch-n1.json torch-n2.json torch-n4.json --project 4,8,16,64 \
        [--inter-node-gbps 400] [--devices-per-node 8] [--busbw-gbps GB/s]

Each file is a `harness.run --out` document (N = 1, 2, 4, 8 with `--data-parallel`,
the same per-device `--batch`); failed runs are left out. The library is
`harness.timing.scaling`. `--project` adds, per backend and shape, the step time,
exposed communication and efficiency the model of `harness.timing.projection` predicts
at those N from the N = 1 run and the smallest N > 1, beside the measured step at any N
also given (predict N = 4 from N = 1 and 2, and give the N = 4 run to check it).
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from collections.abc import Sequence

from harness.common.answer import answer_markdown
from harness.common.cli import (
    UsageError,
    add_out,
    comma_list,
    emit,
    fail,
    loaded_backends,
    make_parser,
    parse_args,
    positive_float,
    positive_int,
)
from harness.common.results import file_problem
from harness.timing.projection import format_projection, project
from harness.timing.scaling import SHAPE, format_growth, format_scaling, scaling_rows, step_figures
from harness.timing.scaling_answer import RULES, scaling_findings


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
    p.add_argument("--project", type=comma_list(positive_int), default=None, metavar="N,N...",
                   help="predict the step at these device counts (None: no projection)")
    p.add_argument("--inter-node-gbps", type=positive_float, default=None, metavar="GBIT",
                   help="inter-node bandwidth per device in Gbit/s, for N above --devices-per-node (None: one node)")
    p.add_argument("--devices-per-node", type=positive_int, default=8, metavar="D", help="devices per node")
    p.add_argument("--busbw-gbps", type=positive_float, default=None, metavar="GB/S",
                   help="the all-reduce bus bandwidth in GB/s (None: the link the N > 1 run measured)")
    args = parse_args(p, argv)
    loaded_backends()  # the runs' backends are read by name
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
    text = "\n".join(answer_markdown(scaling_findings(rows), RULES)) + "\n" + format_scaling(rows)
    if growth := format_growth(rows):
        text += "\n" + growth
    if args.project:
        try:
            text += "".join("\n" + format_projection(p) for p in projections(docs, args))
        except ValueError as exc:
            return fail(f"--project: {exc}")
    emit(text, args.out)
    return 0


def projections(docs: list[dict], args) -> list[dict]:
    """One projection per backend and shape with an N = 1 run and one at N > 1."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for doc in docs:
        if doc.get("status") == "ok":
            o = doc["options"]
            groups[(o["backend"], *(o[k] for k in SHAPE))].append(doc)
    out = []
    for key, group in groups.items():
        by_n = {step_figures(d)[0]: d for d in group}
        larger = sorted(n for n in by_n if n > 1)
        if 1 not in by_n or not larger:
            raise ValueError(f"{key[0]} {key[1]} ctx {key[2]}: give an N = 1 run and one at N > 1 to fit the model")
        out.append(project(by_n[1], by_n[larger[0]], args.project, args.busbw_gbps, args.devices_per_node,
                           args.inter_node_gbps, [by_n[n] for n in larger[1:]]))
    return out


if __name__ == "__main__":
    sys.exit(main())
