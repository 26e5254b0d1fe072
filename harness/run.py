"""Time one backend's training step, phase by phase, under NVTX ranges.

    python -m harness.run --backend torch --model tiny --ctx 64 --device cpu [--out torch.json]

Each measured step is an NVTX range `step` holding `forward`, `backward` and
`optimizer` (warm-up steps: `warmup`); every phase ends with a device synchronization.
This is the program that `nsys profile` wraps; the library is `harness.timing.runner`.
Exit status 3 when the run failed (out of memory or an error; the result says which).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Sequence

from harness import backends, stopped_by
from harness.cli.dialect import (
    add_backend,
    add_data_parallel,
    add_mode,
    add_model_args,
    add_nsys_bin,
    add_optimizer,
    add_out,
    add_overwrite,
    add_steps,
    fail,
    make_parser,
    non_negative_int,
    parse_args,
    positive_int,
    select_platform,
)
from harness.common.documents import RunDocument
from harness.common.errors import UsageError
from harness.common.results import dir_problem, new_file_problem, save_json
from harness.memory_model import fit_problem
from harness.reports.run import format_data_parallel, format_result
from harness.timing.runner import FAULT_PHASES, run
from harness.timing.spec import RunSpec
from harness.trace.analyses.hlo_join import hlo_dir


def build_parser() -> argparse.ArgumentParser:
    p = make_parser("harness.run", __doc__)
    add_backend(p)
    add_model_args(p)
    add_steps(p)
    add_mode(p)
    add_optimizer(p)
    add_data_parallel(p)
    p.add_argument("--nsys-ranks", metavar="STEM",
                   help="torch with --data-parallel: run each rank under nsys profile, writing "
                        "STEM.rank<r>.nsys-rep (None: no profile; for JAX's one process wrap harness.run in nsys)")
    add_nsys_bin(p)
    add_out(p, "write the result document here", metavar="PATH.json")
    add_overwrite(p, "--out file")
    p.add_argument("--compile-cache", metavar="DIR",
                   help="persistent compile caches in DIR, kept for later runs: JAX's, and torch-compile's "
                        "Inductor (DIR/inductor) and Triton (DIR/triton) caches (None: the compilers' defaults)")
    p.add_argument("--annotate-attention", action="store_true",
                   help="NVTX ranges attn_scores/attn_softmax/attn_values inside naive attention "
                        "(synchronizes inside the forward; JAX then runs op by op)")
    add_layer_ranges(p)
    p.add_argument("--wide-layer", type=non_negative_int, default=None, metavar="I",
                   help="plant a wide block for attribution tests: block I's FFN is --wide-factor times d_ff "
                        "(None: all blocks alike)")
    p.add_argument("--wide-factor", type=positive_int, default=8, metavar="F",
                   help="how much wider the FFN of --wide-layer is")
    p.add_argument("--framework-profile", metavar="PATH",
                   help="record the run with the framework's own profiler (torch: a .json trace; "
                        "jax: a trace directory) for harness.report, where nsys is not available")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--fail-in", default=None, help=argparse.SUPPRESS)  # fault injection for tests
    # a sweep's cell: run where the memory model predicts no fit too (the sweep records the OOM)
    p.add_argument("--allow-oom", action="store_true", help=argparse.SUPPRESS)
    return p


def add_layer_ranges(p: argparse.ArgumentParser) -> None:
    """--layer-ranges, shared with harness.compare."""
    p.add_argument("--layer-ranges", action="store_true",
                   help="record each block's and sub-module's work for a per-layer breakdown under nsys: NVTX "
                        "ranges from module hooks (torch eager; no synchronizations, overhead measured and "
                        "reported), named scopes (jax)")


def annotate_attention_problem(backend: str, data_parallel: int = 1, attention: str = "naive") -> str | None:
    """Why --annotate-attention cannot run with `backend` on `data_parallel` devices and
    `attention`, or None."""
    if attention != "naive":
        return (f"--annotate-attention times the three steps of naive attention, and --attention {attention} runs "
                "one fused kernel instead; add --attention naive or drop --annotate-attention")
    if backends.get(backend).annotate_attention is None:
        able = [b.name for b in backends.all_backends() if b.annotate_attention is not None]
        return (f"--annotate-attention with --backend {backend}: it synchronizes inside attention, which a "
                f"compiled graph cannot hold; use --backend {' or '.join(able)}")
    if data_parallel > 1:
        return ("--annotate-attention synchronizes inside attention, which stalls the other ranks; drop it or use "
                "--data-parallel 1")
    return None


def layer_ranges_problem(backend: str) -> str | None:
    """Why --layer-ranges cannot run with `backend`, or None."""
    record = backends.get(backend)
    return None if record.layer_ranges else f"--layer-ranges with --backend {backend}: {record.layer_ranges_problem}"


def options_from_args(args: argparse.Namespace) -> RunSpec:
    fields = {f.name for f in dataclasses.fields(RunSpec)}
    opts = {k: v for k, v in vars(args).items() if k in fields}
    if args.wide_layer is None:
        opts["wide_factor"] = 1
    opts["fsdp_reshard_after_forward"] = args.fsdp_reshard_after_forward == "true"
    if args.layer_ranges and backends.get(args.backend).layer_ranges == "hlo" and args.out:
        opts["hlo_dir"] = str(hlo_dir(args.out))  # the report joins kernels to layers through it
    return RunSpec(**opts)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(build_parser(), argv)
    try:
        select_platform(args)
        if problem := backends.attention_problem(args.backend, args.attention):
            raise UsageError(problem)
        if args.annotate_attention and (problem := annotate_attention_problem(args.backend, args.data_parallel,
                                                                              args.attention)):
            raise UsageError(problem)
        backends.choose_backends([args.backend], (), args.device, "run")
        if args.layer_ranges and (problem := layer_ranges_problem(args.backend)):
            raise UsageError(problem)
        if args.wide_layer is not None:
            from harness.config import get_config
            from harness.timing.plants import wide_block

            try:
                wide_block(get_config(args.model), args.wide_layer, args.wide_factor)
            except ValueError as exc:
                raise UsageError(f"--wide-layer: {exc}") from None
        if not args.allow_oom and (problem := fit_problem(args.model, args.ctx, args.batch, args.dtype, args.attention,
                                                          args.mode, args.device, args.data_parallel,
                                                          backend_names=[args.backend])):
            raise UsageError(problem)
        if args.fail_in is not None and args.fail_in not in FAULT_PHASES:
            raise UsageError(f"--fail-in {args.fail_in!r}: choose {', '.join(FAULT_PHASES)}")
        if args.out and (problem := new_file_problem(args.out, "--out", args.overwrite)):
            raise UsageError(problem)
        if args.framework_profile and (problem := dir_problem(os.path.dirname(os.path.abspath(args.framework_profile)),
                                                              "--framework-profile")):
            raise UsageError(problem)
        if args.compile_cache and (problem := dir_problem(args.compile_cache, "--compile-cache")):
            raise UsageError(problem)
        from harness.backends.parallel import parallel_problem

        if args.data_parallel > 1:
            from harness.runs.distributed import check_devices

            check_devices(args.backend, args.device, args.data_parallel)
        if problem := parallel_problem(args.backend, args.parallel, args.ddp_bucket_mb, args.ddp_static_graph,
                                       args.grad_comm, args.fsdp_reshard_after_forward):
            raise UsageError(problem)
        if args.nsys_ranks and (args.data_parallel == 1 or backends.get(args.backend).one_process):
            raise UsageError("--nsys-ranks profiles torch's ranks of --data-parallel 2 or more; for one process "
                             "run nsys profile around harness.run")
        if args.nsys_ranks:
            from harness.trace.profile import ProfileError
            from harness.trace.sources.nsys import find_nsys

            try:
                find_nsys(args.nsys_bin)
            except ProfileError as exc:
                raise UsageError(f"--nsys-ranks: {exc}") from exc
    except UsageError as exc:
        return fail(str(exc))
    if args.compile_cache:
        from harness.timing.spec import compile_cache_env

        os.environ.update(compile_cache_env(args.compile_cache))
    progress = (lambda m: None) if args.quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    opts = options_from_args(args)
    try:
        if opts.data_parallel > 1:  # a signal stops the ranks too (`launch`)
            from harness.runs.distributed import nsys_per_rank, run_data_parallel

            wrap = nsys_per_rank(args.backend, args.nsys_ranks, args.nsys_bin) if args.nsys_ranks else None
            doc = run_data_parallel(opts, progress, quiet=args.quiet, wrap=wrap)
        else:
            doc = run(opts, progress)
    except KeyboardInterrupt as exc:
        return fail(f"interrupted by {stopped_by(exc)} before the run finished; nothing was written", 130)
    kept_elsewhere = save_json(args.out, doc, "--out") if args.out else None
    print(format_result(doc))
    finished = RunDocument.from_dict(doc, "the run's document").ok
    if opts.data_parallel > 1 and finished:
        print("\n".join(format_data_parallel(doc)))
    if kept_elsewhere:
        return fail(kept_elsewhere)
    return 0 if finished else 3


if __name__ == "__main__":
    sys.exit(main())
