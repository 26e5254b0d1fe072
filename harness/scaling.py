"""Scaling table of data-parallel runs: step time, tokens/s and efficiency per backend.

    python -m harness.scaling torch-n1.json torch-n2.json jax-n1.json jax-n2.json [--out scaling.md]
    python -m harness.scaling torch-n1.json torch-n2.json torch-n4.json --project 4,8,16,64 \
        [--inter-node-gbps 400] [--devices-per-node 8] [--busbw-gbps GB/s]

Each file is a `harness.run --out` document (N = 1, 2, 4, 8 with `--data-parallel`,
the same per-device `--batch`), or a `harness.compare` folder (or its summary.json), which
stands for its runs; failed runs are left out. The library is
`harness.reports.scaling`. `--project` adds, per backend, shape and strategy (its options
and settings, as the table's rows group), the step time, exposed communication and
efficiency the model of `harness.reports.projection` predicts at those N from the N = 1
run and the group's smallest N > 1, beside the group's measured step at any N also
given (predict N = 4 from N = 1 and 2, and give the N = 4 run to check it).
"""

from __future__ import annotations

import json
import os
import sys
from collections import defaultdict
from collections.abc import Sequence

from harness.cli.dialect import (
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
from harness.common.answer import answer_markdown
from harness.common.documents import COMPARE_SCHEMA, DocumentError, RunDocument, is_document
from harness.common.errors import UsageError
from harness.common.results import file_problem
from harness.reports.projection import format_projection, project
from harness.reports.scaling import format_growth, format_scaling
from harness.reports.scaling_answer import RULES, scaling_findings
from harness.timing.scaling import SHAPE, program_settings, scaling_rows, step_figures, strategy


def load_runs(path: str) -> list[dict]:
    """The harness.run result documents `path` holds: the document itself, or the runs of a
    harness.compare summary (its summary.json or its folder); a UsageError naming `path`
    for anything else (a folder without a summary, a binary file, other JSON, a document
    without the fields the table needs)."""
    fix = "give harness.run --out files or harness.compare folders"
    folder = os.path.isdir(path)
    try:
        with open(os.path.join(path, "summary.json") if folder else path, encoding="utf-8") as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise UsageError(f"{path}: {'is a folder without a summary.json' if folder else 'no such file'}; {fix}") \
            from None
    except IsADirectoryError:
        raise UsageError(f"{path}: is a folder; {fix}") from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot be read ({exc.strerror or exc}); {fix}") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise UsageError(f"{path}: not JSON; {fix}") from None
    compare = is_document(doc, COMPARE_SCHEMA)
    if folder and not compare:
        raise UsageError(f"{path}: is a folder whose summary.json is no harness.compare summary; {fix}")
    docs = list((doc.get("runs") or {}).values()) if compare else [doc]
    try:
        scaling_rows(docs)
    except (KeyError, TypeError, AttributeError) as exc:
        raise UsageError(f"{path}: not a harness.run result document (no {exc}); {fix}") from None
    except DocumentError as exc:
        raise UsageError(f"{path}: not a harness.run result document ({exc}); {fix}") from None
    return docs


def scaling_markdown(rows: list[dict]) -> str:
    """The answer, then the scaling table and the growth of each phase, of `scaling_rows`' rows."""
    text = "\n".join(answer_markdown(scaling_findings(rows), RULES)) + "\n" + format_scaling(rows)
    if growth := format_growth(rows):
        text += "\n" + growth
    return text


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
        docs = [doc for path in args.runs for doc in load_runs(path)]
        rows = scaling_rows(docs)
    except UsageError as exc:
        return fail(str(exc))
    except ValueError as exc:  # two runs of one backend, N and shape
        return fail(str(exc))
    if not rows:
        return fail(f"none of {', '.join(args.runs)} finished (status ok); nothing to tabulate")
    text = scaling_markdown(rows)
    if args.project:
        try:
            text += "".join("\n" + format_projection(p) for p in projections(docs, args))
        except ValueError as exc:
            return fail(f"--project: {exc}")
    emit(text, args.out)
    return 0


def projections(docs: list[dict], args) -> list[dict]:
    """One projection per group of data-parallel runs (backend, shape and `strategy`: the
    strategy with its options and settings, as the table's rows group), each fitted from the
    backend's N = 1 run of that shape under the same compiler settings and the group's
    smallest N, with the group's larger N beside the prediction as measured."""
    ones: dict[tuple, dict] = {}
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for doc in docs:
        if RunDocument.from_dict(doc, need_schema=False).ok:
            o = doc["options"]
            shape = (o["backend"], *(o[k] for k in SHAPE))
            if step_figures(doc)[0] == 1:
                ones.setdefault((shape, program_settings(doc)), doc)
            else:
                groups[(shape, strategy(doc), program_settings(doc))].append(doc)
    if not groups:
        raise ValueError("no run at N > 1: give an N = 1 run and one at N > 1 to fit the model")
    out = []
    for (shape, parallel, settings), group in groups.items():
        base = ones.get((shape, settings))
        if base is None:
            raise ValueError(f"{shape[0]} ({parallel}) {shape[1]} ctx {shape[2]}: give an N = 1 run of that backend "
                             "and shape under the same compiler settings to fit the model")
        by_n = {step_figures(d)[0]: d for d in group}
        larger = sorted(by_n)
        p = project(base, by_n[larger[0]], args.project, args.busbw_gbps, args.devices_per_node,
                    args.inter_node_gbps, [by_n[n] for n in larger[1:]])
        out.append({**p, "strategy": parallel})
    return out

if __name__ == "__main__":
    sys.exit(main())
