"""Attention kernel benchmark: our Pallas FlashAttention kernels against XLA, cuDNN,
JAX's Pallas `mha` and PyTorch SDPA backends (library: `harness.attention.bench`).

    python -m harness.bench_attention --seq 1024,4096 --head-dim 64 --dtype bf16
    python -m harness.bench_attention --shapes fa3 --dtype bf16      # FA3 paper's shape set
    python -m harness.bench_attention --shapes leaderboard            # 16 x 16384 x 64, causal

Our kernels appear twice: `pallas` is the portable kernel (Triton lowering,
forced), `pallas_mosaic` the Hopper kernel (Pallas Mosaic GPU, forced; needs
compute capability 9.x).

Times forward, backward (given saved residuals) and forward+backward, each the
median over `--iters` repeats of back-to-back launches (after warm-up), with
the min-max spread. A repeat launches enough calls to last `--min-batch-ms`,
so its fixed cost (first launch, final sync) is spread thin; the
implementations of one cell take their repeats in rotating rounds, so drift
over the run (temperature) falls on all of them alike. Each timed repeat
follows `--lead-in-ms` of untimed calls of the same pass: a GPU at its power
limit sets its clock from the power drawn over roughly the last 100 ms, so
without a lead-in a 25 ms repeat runs at a clock set by whatever ran before
it, and in a fixed rotation that is always the same neighbour (on an H100 one
reference's forward measured 10% faster in the rounds than in its own
steady state, ours 2%). With it, each pass is timed at its own steady state,
as it would run in a loop of its own.

FLOP convention: forward = 4*B*H*S^2*D (QK^T and PV), halved when causal;
backward = 2.5x forward (five matmuls instead of two); forward+backward =
3.5x forward. D is the true head_dim, not the padded one.
Ratios are time / time of the fastest PyTorch SDPA backend for the same cell
and pass (measured in the same run), so < 1 means faster than SDPA. The
`<pass>_speedup_vs_best` fields are the other way round, a throughput ratio
against the fastest of all SDPA backends and cuDNN through JAX: >= 1 means at
least as fast as the best reference.

Shape sets (--shapes): `grid` (default) crosses --seq, --head-dim with the
fixed --batch and --heads; `fa3` is the FlashAttention-3 paper's set, seq 512
to 16384 (filtered by --seq) with batch*seq = 16384 tokens and
heads*head_dim = 2048; `leaderboard` is q, k, v of 16 x 16384 x 64 (batch 16,
one head), causal.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from harness.attention.bench import PASSES, measure_cell, render_results, render_table, run_benchmark, write_results
from harness.attention.catalog import IMPLS, resolve_shapes
from harness.attention.options import BenchOptions, add_shape_args, add_timing_args
from harness.cli.dialect import add_device, add_out, choice, comma_list, make_parser
from harness.cli.dialect import parse_args as parse_cli
from harness.common.results import dir_problem

# What tests and scripts reach through this entry point.
__all__ = ["PASSES", "main", "measure_cell", "parse_args", "run_benchmark", "write_results"]


def build_parser() -> argparse.ArgumentParser:
    p = make_parser("harness.bench_attention", __doc__)
    add_shape_args(p, shapes="grid", dtype=["bf16", "fp32"])
    p.add_argument("--impl", type=comma_list(choice("impl", IMPLS)), default=list(IMPLS),
                   help=f"comma-separated: {', '.join(IMPLS)}")
    add_timing_args(p, warmup=3, iters=15)
    add_device(p, "cuda", cpu_means="tiny smoke runs (Pallas in interpret mode, GPU-only impls marked unsupported)")
    add_out(p, "folder of the results (None: results/attention/<gpu>/)", metavar="DIR")
    p.add_argument("--name", default="attention", help="stem of the .json/.md/.png files written into --out")
    p.add_argument("--render", type=Path, nargs="+", default=None, metavar="JSON",
                   help="run nothing: rewrite the .md and .png of these results JSON files from them alone")
    return p


def parse_args(argv: Sequence[str] | None = None) -> BenchOptions:
    """The options, with the shape set's default lengths and head dims filled in;
    an --out that cannot become the results folder is refused before anything runs."""
    p = build_parser()
    args = parse_cli(p, argv)
    try:
        args.seq, args.head_dim = resolve_shapes(args.shapes, args.seq, args.head_dim)
    except ValueError as exc:
        p.error(str(exc))
    if args.out is not None and (problem := dir_problem(Path(args.out), "--out")):
        p.error(problem)
    return BenchOptions.from_args(args)


def _render_only(paths: list[Path]) -> int:
    for path in paths:
        try:
            written = render_results(path)
        except FileNotFoundError:
            print(f"bench_attention: --render {path}: no such file (pass a .json written by this benchmark)",
                  file=sys.stderr)
            return 2
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            print(f"bench_attention: --render {path}: not a results JSON of this benchmark ({exc!r}); "
                  "pass the .json it wrote", file=sys.stderr)
            return 2
        print(f"wrote {written['md']} and {written['png']}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render:
        return _render_only(args.render)
    import jax

    platform_name = jax.devices()[0].platform
    if args.device == "cuda" and platform_name != "gpu":
        print(f"bench_attention: no GPU visible to JAX (platform {platform_name!r}); "
              "use --device cpu for a tiny smoke run", file=sys.stderr)
        return 2
    rows = run_benchmark(args, measure_cell)  # Ctrl-C or SIGTERM (`harness.started`) keeps the cells measured
    print(render_table(rows))
    for kind, path in write_results(rows, args).items():
        print(f"wrote {kind}: {path}")
    return 0 if rows.stopped_after is None else 1


if __name__ == "__main__":
    sys.exit(main())
