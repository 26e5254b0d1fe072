"""Sweep models x context lengths x batches x backends x dtypes, one `harness.run` subprocess per cell.

    python -m harness.sweep --model small,medium --ctx 128,256,512 [--batch 4,8,16,32] \\
        [--backend torch,torch-compile,jax] [--data-parallel 1,2,4 [--parallel fsdp]]
        [--dtype fp32,bf16] [--nsys] [--warmup-study] [--resume] [--gpus 0,1] [--out results/<sweep>/]
    python -m harness.sweep --render results/<sweep>/

Each finished cell appends one line to <out>/cells.jsonl (`harness.sweeps.records`), so an
interrupted sweep continues with --resume without redoing any recorded cell; a resume may
add axis values (it says which). The report's "best MFU" table gives, per backend and
dtype, the cell (model, context, batch) with the highest step MFU; with --data-parallel
the report adds the scaling table (`harness.reports.scaling`) over the device counts. A cell that
runs out of memory, crashes, dies by a signal or passes --cell-timeout is recorded with
its reason and the sweep goes on; the exit code is 3 when any cell of the sweep failed
(0 otherwise, 2 for bad input). The report (report.md, report.html, cells.csv, plots) is
rendered from cells.jsonl after every sweep, or alone with --render.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from harness import backends
from harness.cli.dialect import (
    add_attention,
    add_backend,
    add_batch,
    add_ctx,
    add_data_parallel,
    add_device,
    add_device_memory,
    add_dtype,
    add_mode,
    add_model,
    add_nsys_bin,
    add_optimizer,
    add_out,
    add_steps,
    comma_list,
    fail,
    given_options,
    make_parser,
    parse_args,
    positive_int,
    refuse_with,
    select_platform,
)
from harness.common.errors import UsageError
from harness.common.results import dir_problem
from harness.reports.sweep import write_report
from harness.runs.sweep import run_sweep
from harness.sweeps.analysis import analyze
from harness.sweeps.records import FIXED, WARMUP_STUDY, grid, prepare
from harness.timing.runner import FAULT_PHASES


def gpu_index(value: str) -> str:
    if not value.isdigit():
        raise UsageError(f"--gpus: expected GPU indices like 0,1,2,3, got {value!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = make_parser("harness.sweep", __doc__)
    add_model(p, many=True, default=None, without="required unless --render")
    add_ctx(p, many=True, without="required unless --render")
    add_backend(p, many=True)
    add_dtype(p, many=True)
    add_batch(p, many=True)
    add_data_parallel(p, many=True)
    add_steps(p)
    add_attention(p)
    add_device(p)
    add_mode(p)
    add_optimizer(p)
    add_out(p, "the sweep folder", default="results/sweep/latest", metavar="DIR")
    p.add_argument("--resume", action="store_true",
                   help="continue the sweep in --out, skipping recorded cells; new axis values join its grid")
    p.add_argument("--cell-timeout", type=positive_int, default=None, metavar="S",
                   help="seconds per cell before it is killed (None: no limit)")
    p.add_argument("--gpus", type=comma_list(gpu_index), default=None, metavar="0,1,...",
                   help="run one cell per listed GPU side by side, each on its own slice of the CPUs")
    p.add_argument("--max-cells", type=positive_int, default=None, metavar="N", help="stop after N cells")
    p.add_argument("--nsys", action="store_true", help="run each cell under nsys profile; report kernel shares")
    add_nsys_bin(p)
    p.add_argument("--warmup-study", action="store_true",
                   help=f"also run the first model x ctx x dtype with {', '.join(map(str, WARMUP_STUDY))} "
                        "warm-up steps")
    add_device_memory(p, "device memory for the fit prediction (None: what the runs recorded, else the GPU's "
                         "datasheet memory, else 80)")
    p.add_argument("--render", metavar="DIR", help="only render the report of the sweep in DIR")
    p.add_argument("--fail-cell", default=None, help=argparse.SUPPRESS)  # "model:ctx:backend:dtype:phase"
    return p


def check(args: argparse.Namespace) -> None:
    """Options that argparse cannot check alone; a UsageError names the fix."""
    if args.model is None or args.ctx is None:
        raise UsageError("--model and --ctx are required (or --render DIR)")
    if args.backend is not None and (problem := backends.attention_problem_of(args.backend, args.attention)):
        raise UsageError(problem)
    if args.fail_cell is not None and args.fail_cell.rpartition(":")[2] not in FAULT_PHASES:
        raise UsageError(f"--fail-cell {args.fail_cell!r}: end with :{', :'.join(FAULT_PHASES)}")
    if args.nsys:
        from harness.trace.profile import ProfileError
        from harness.trace.sources.nsys import find_nsys

        try:
            find_nsys(args.nsys_bin)
        except ProfileError as exc:
            raise UsageError(str(exc)) from exc
    if problem := dir_problem(args.out, "--out"):
        raise UsageError(problem)


def render(out_dir: str, device_memory_gb: float | None) -> dict:
    """Analyze the sweep in `out_dir` and write its report there; returns the analysis."""
    data = analyze(out_dir, device_memory_gb)
    print(f"wrote {', '.join(os.path.join(out_dir, f) for f in write_report(data, out_dir))}")
    return data


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parse_args(parser, argv)
    try:
        if args.render:
            refuse_with(f"--render {args.render}", given_options(parser, args, keep=("render", "device_memory_gb")))
            render(args.render, args.device_memory_gb)
            return 0
        check(args)
        select_platform(args)
        args.backend = backends.choose_backends(args.backend, backends.defaults(), args.device, "sweep")
        if args.gpus and args.device == "cpu":
            raise UsageError("--gpus runs cells on GPUs; drop it for --device cpu")
        if args.gpus and max(args.data_parallel) > 1:
            raise UsageError("--gpus runs one-GPU cells side by side; drop it with --data-parallel above 1")
        from harness.backends.parallel import parallel_problem
        from harness.runs.distributed import check_devices

        for backend in args.backend:
            check_devices(backend, args.device, max(args.data_parallel))
            # a backend without the DDP/FSDP2 options runs without them (RunSpec.on)
            if backends.get(backend).wrap_options and (problem := parallel_problem(
                    backend, args.parallel, args.ddp_bucket_mb, args.ddp_static_graph, args.grad_comm,
                    args.fsdp_reshard_after_forward)):
                raise UsageError(problem)
        opts = {k: getattr(args, k) for k in FIXED}
        opts["batch"] = args.batch[0]
        axes = {"models": args.model, "ctx": args.ctx, "batches": args.batch, "backends": args.backend,
                "dtypes": args.dtype, "data_parallel": args.data_parallel}
        sweep = prepare(args.out, opts, axes, args.resume, args.warmup_study)
    except UsageError as exc:
        return fail(str(exc))
    base = sweep["options"]["batch"]
    cells = grid(args.model, args.ctx, args.backend, args.dtype, batches=args.batch, base_batch=base,
                 data_parallel=args.data_parallel)
    if args.warmup_study:
        cells += grid(args.model[:1], args.ctx[:1], args.backend, args.dtype[:1], warmup_study=True)
    try:
        run_sweep(cells, sweep["options"], args.out, timeout=args.cell_timeout, max_cells=args.max_cells,
                  fail_cell=args.fail_cell, gpus=args.gpus, nsys_bin=args.nsys_bin)
    except KeyboardInterrupt:
        print(f"[sweep] interrupted; cells still running were not recorded; continue with --resume --out {args.out}",
              file=sys.stderr)
        return 130
    return 3 if render(args.out, args.device_memory_gb)["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
