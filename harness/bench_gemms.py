"""The step's GEMMs with torch's cuBLAS kernel, XLA's autotuned choice and every other candidate
cuBLASLt offers, each timed at the power cap (bf16, one CUDA GPU, torch and JAX installed).

    python -m harness.bench_gemms --model large --ctx 1024 --batch 32 --out gemms.json
    python -m harness.bench_gemms --render gemms.json      # its report again, from the document

For every linear layer's forward, input gradient and weight gradient at the step's token count
(`harness.timing.gemms`): the candidates of cuBLASLt's heuristic for the problem as torch poses
it, the kernel torch's `mm` runs, and the candidate XLA's compiled dot selected; each run back
to back for --seconds untimed and --seconds timed (the GPU at its power cap, as through a
training step), with NVML's energy per call and the SM clock held, over --rounds rounds in
rotating order. Writes the document at --out and its report (answer first) beside it (.md).
Ctrl-C or a stop signal keeps the GEMMs that finished.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from harness import backends, stopped_by
from harness.cli.dialect import (
    add_batch,
    add_ctx,
    add_model,
    add_out,
    add_overwrite,
    choice,
    comma_list,
    fail,
    given_options,
    gpu_available,
    make_parser,
    parse_args,
    positive_float,
    positive_int,
    refuse_with,
)
from harness.common.errors import UsageError
from harness.common.progress import say
from harness.common.results import environment, new_file_problem, save_json, write_text
from harness.config import get_config
from harness.reports.gemms import markdown
from harness.timing.gemms import LAYERS, PASSES, gemm_problems

TOOL = "harness.bench_gemms"


def build_parser():
    p = make_parser(TOOL, __doc__)
    add_model(p, default="large")
    add_ctx(p, default=1024)
    add_batch(p, default=32)
    p.add_argument("--layers", type=comma_list(choice("layer", list(LAYERS))), default=list(LAYERS),
                   help=f"comma-separated, from {', '.join(LAYERS)}")
    p.add_argument("--passes", type=comma_list(choice("pass", list(PASSES))), default=list(PASSES),
                   help=f"comma-separated, from {', '.join(PASSES)}")
    p.add_argument("--rounds", type=positive_int, default=3, help="rounds over every kernel, in rotating order")
    p.add_argument("--seconds", type=positive_float, default=0.4,
                   help="each kernel runs this long untimed (to the power cap), then this long timed")
    add_out(p, "write the JSON document here, and its report beside it (.md)", metavar="PATH.json")
    add_overwrite(p, "document")
    p.add_argument("--render", metavar="PATH.json", default=None,
                   help="write the report of this document again (PATH.md) and run nothing")
    return p


def _check(args) -> None:
    """One line naming the option and the fix for input that cannot run, before any work."""
    if args.out and (problem := new_file_problem(args.out, overwrite=args.overwrite)):
        raise UsageError(problem)
    if args.out and not args.out.endswith(".json"):
        raise UsageError(f"--out {args.out}: name a .json file (the report goes beside it as .md)")
    if importlib.util.find_spec("jax") is None:
        raise UsageError("XLA's choice is half of the comparison and jax is not installed: pip install jax[cuda13]")
    if not gpu_available():
        raise UsageError("no CUDA GPU is visible to this process: the tool times cuBLAS kernels on one; "
                         "run it on a machine with a GPU")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parse_args(parser, argv)
    if args.render:
        try:
            refuse_with("--render", given_options(parser, args, keep=("render",)))
        except UsageError as exc:
            return fail(str(exc))
        path = Path(args.render)
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            doc = None
        if not isinstance(doc, dict) or not {"problems", "options"} <= doc.keys():
            return fail(f"--render {path}: not a {TOOL} document; give the .json the tool wrote")
        write_text(out := path.with_suffix(".md"), markdown(doc))
        print(f"wrote {out}")
        return 0
    try:
        _check(args)
    except UsageError as exc:
        return fail(str(exc))
    import torch

    from harness.timing.cublaslt import REQUESTED, version
    from harness.timing.gemms import measure

    problems = gemm_problems(get_config(args.model), args.batch, args.ctx, args.layers, args.passes)
    done: list[dict] = []
    doc = {"options": {"model": args.model, "ctx": args.ctx, "batch": args.batch, "layers": args.layers,
                       "passes": args.passes, "rounds": args.rounds, "seconds": args.seconds,
                       "requested": REQUESTED},
           "problems": done}
    try:
        versions = {lib: importlib.import_module(lib).__version__ for lib in backends.libraries()}
        doc["environment"] = environment({"device": torch.cuda.get_device_name(), **versions, "cublaslt": version()})
        measure(problems, args.rounds, args.seconds, lambda text: say(TOOL, text), done)
    except KeyboardInterrupt as exc:
        finished = ", ".join(f"{p['layer']} {p['pass']}" for p in done) or "none"
        doc["interrupted"] = f"stopped by {stopped_by(exc)}; finished: {finished}"
    except (RuntimeError, torch.cuda.OutOfMemoryError) as exc:
        doc["interrupted"] = f"failed: {str(exc).splitlines()[0]}"
    if not done:
        return fail(doc.get("interrupted", "no GEMM finished"), 130 if "stopped" in doc.get("interrupted", "") else 1)
    text = markdown(doc)
    if args.out:
        if problem := save_json(args.out, doc):
            print(problem, file=sys.stderr)
        else:
            write_text(Path(args.out).with_suffix(".md"), text)
    print(text, end="")
    if stopped := doc.get("interrupted"):
        return fail(f"{stopped}; the finished GEMMs are kept" + (f" in {args.out}" if args.out else ""),
                    130 if stopped.startswith("stopped") else 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
