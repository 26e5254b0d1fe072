"""Tile-size search for our attention kernels: which block sizes are fastest, per shape and pass.

    python -m harness.tune_attention --kernel mosaic --shapes fa3 --head-dim 64 --out results/attention/tune-h200
    python -m harness.tune_attention --render results/attention/tune-h200/mosaic-d64.jsonl

Each candidate (`harness.attention.tune.CANDIDATES`) is the kernel family's default block sizes
with a few fields changed, timed on its pass and checked against the default's output.
Rows are appended to <out>/<name>.jsonl as they are measured; <name>.md ranks them.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from harness.attention.bench import REPO_ROOT, environment
from harness.attention.catalog import KERNEL_PASSES, resolve_shapes
from harness.attention.options import TuneOptions, add_kernel, add_shape_args, add_timing_args
from harness.attention.tune import CANDIDATES, IMPL, read_rows, run, tune_markdown
from harness.cli.dialect import add_device, add_out, choice, comma_list, emit, fail, make_parser
from harness.cli.dialect import parse_args as parse_cli
from harness.common.results import gpu_slug


def build_parser() -> argparse.ArgumentParser:
    p = make_parser("harness.tune_attention", __doc__)
    add_kernel(p, tuple(IMPL), "mosaic", "our kernel family whose block sizes to search")
    p.add_argument("--passes", type=comma_list(choice("pass", KERNEL_PASSES)), default=list(KERNEL_PASSES),
                   help=f"comma-separated: {', '.join(KERNEL_PASSES)}")
    add_shape_args(p, shapes="fa3", dtype=["bf16"])
    add_timing_args(p, warmup=2, iters=7)
    add_device(p, "cuda", cpu_means="interpret mode on tiny shapes (checks the search, not the speed)")
    p.add_argument("--only", default=None, metavar="FIELD",
                   help="measure only the candidates that set FIELD (the default is always measured)")
    add_out(p, "folder of the results (None: results/attention/tune-<gpu>/)", metavar="DIR")
    p.add_argument("--name", default=None, help="stem of the .jsonl/.md files (None: <kernel>-d<head_dims>)")
    p.add_argument("--render", type=Path, default=None, metavar="JSONL", help="render an existing .jsonl and exit")
    return p


def parse_args(argv: Sequence[str] | None = None) -> TuneOptions:
    """The options, with the shape set's lengths and head dims and the file stem filled in."""
    p = build_parser()
    args = parse_cli(p, argv)
    if args.render is not None:
        return TuneOptions.from_args(args)
    if len(args.dtype) != 1:
        p.error(f"--dtype {','.join(args.dtype)}: the search takes one dtype")
    if args.only is not None and not any(args.only in c for (b, ps), cs in CANDIDATES.items()
                                         if b == args.kernel and ps in args.passes for c in cs):
        p.error(f"--only {args.only!r}: no {args.kernel} candidate of these passes sets it")
    if args.shapes == "fa3" and args.seq is None:
        args.seq = [1024, 4096, 16384]
    try:
        args.seq, args.head_dim = resolve_shapes(args.shapes, args.seq, args.head_dim)
    except ValueError as exc:
        p.error(str(exc))
    return TuneOptions.from_args(args)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render is not None:
        if not args.render.is_file():
            return fail(f"--render {args.render}: no such file (give the .jsonl a run wrote)")
        rows, env = read_rows(args.render)
        emit(tune_markdown(rows, env), args.render.with_suffix(".md"))
        return 0
    import jax

    if args.device == "cuda" and jax.devices()[0].platform != "gpu":
        print("tune_attention: no GPU visible to JAX; use --device cpu for a tiny interpret-mode run",
              file=sys.stderr)
        return 2
    out = args.out or REPO_ROOT / "results" / "attention" / f"tune-{gpu_slug(jax.devices()[0].device_kind)}"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{args.name}.jsonl"
    env = environment(args, interleaved=False)
    with path.open("w") as f:
        f.write(json.dumps({"environment": env}) + "\n")
    rows = run(args, path)
    emit(tune_markdown(rows, env), path.with_suffix(".md"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
