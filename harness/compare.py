"""Run the same training step in eager PyTorch, compiled PyTorch and JAX, check they agree,
report side by side.

    python -m harness.compare --model large --ctx 256 [--dtype bf16] [--attention fused] [--out results]
    python -m harness.compare --render results/<folder>/

By default torch, torch-compile and jax (--backend chooses; torch-compile is skipped, with
a line saying why, on a CPU without the C++ compiler Inductor needs). Each backend runs
`harness.run` in its own subprocess, then `harness.parity` compares each with eager torch
on the same weights and batch (library: `harness.runs.compare`). The result folder
<out>/<model>-ctx<N>-<dtype>[-<attention>]-<gpu>[-profiled]/ gets summary.json, report.md,
report.html and phases.png (with --timeline and --nsys or --profile, timeline.json.gz: the
backends' profiles on one trace, measured steps aligned). A result folder of that name
already there is refused before anything runs (--overwrite replaces it; another --out keeps
both), and so is a second compare of the same folder while the first runs. Ctrl-C or
SIGTERM keeps the finished backends' results and a partial summary in <name>-interrupted/
(or, after the runs and parity, the result folder without what was cut short) and says so. Exit status:
0 all good, 1 parity failed, 3 a run failed, 4 the kernel breakdown failed, 5 the runs finished
but their reports could not be written (the documents are kept in <name>-unrendered/), 2 bad
input, 130 interrupted. --render FOLDER runs nothing: it writes report.md and phases.png of an
existing result folder again from its summary.json with today's code, upgrading a document
written before the robust statistics (library: `harness.runs.upgrade`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence

from harness import backends
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
    given_options,
    make_parser,
    parse_args,
    refuse_with,
    select_platform,
)
from harness.cli.trace_options import add_timeline, timeline_problem, timeline_steps_problem
from harness.common.documents import runs_of
from harness.common.errors import UsageError
from harness.common.results import LockHeld, dir_problem, ensure_dir, held_lock
from harness.memory_model import fit_problem
from harness.reports.compare import format_table
from harness.run import add_layer_ranges, annotate_attention_problem, layer_ranges_problem
from harness.runs.compare import Interrupted, NotRendered, compare, expected_device, result_dir_name
from harness.timing.spec import Comparison, RunSpec


def build_parser() -> argparse.ArgumentParser:
    p = make_parser("harness.compare", __doc__)
    add_model_args(p, ctx_required=False)  # not needed with --render
    add_backend(p, many=True)
    add_steps(p)
    add_mode(p)
    add_optimizer(p)
    add_data_parallel(p)
    add_out(p, "parent folder of the result folder", default="results", metavar="DIR")
    add_overwrite(p, "result folder of the same name")
    p.add_argument("--no-parity", action="store_true", help="skip the parity check")
    p.add_argument("--nsys", action="store_true",
                   help="run each backend under nsys profile and add a kernel breakdown to the report")
    add_nsys_bin(p)
    p.add_argument("--profile", action="store_true",
                   help="kernel breakdown from nsys if found, else from each framework's own profiler")
    p.add_argument("--keep-profiles", metavar="DIR",
                   help="copy the raw profiles (and nsys's SQLite exports) into DIR")
    p.add_argument("--annotate-attention", action="store_true",
                   help="NVTX ranges inside naive attention (attribution runs: adds syncs)")
    add_layer_ranges(p)
    add_timeline(p)
    p.add_argument("--compile-cache", metavar="DIR",
                   help="persistent compile caches shared by the processes, kept for later runs: JAX's in DIR, "
                        "torch-compile's Inductor and Triton caches in DIR/inductor, DIR/triton "
                        "(None: temporary ones for this comparison)")
    p.add_argument("--render", metavar="FOLDER",
                   help="run nothing: write report.md and phases.png of the result folder FOLDER again from its "
                        "summary.json (an old document is upgraded, the original kept as summary-original.json)")
    p.add_argument("--fail-in", default=None, help=argparse.SUPPRESS)  # "backend:phase", for tests
    return p


def profiler(args: argparse.Namespace) -> str | None:
    """"nsys", "framework" (--profile without nsys) or None; --nsys without nsys is a UsageError."""
    if not (args.nsys or args.profile):
        return None
    from harness.trace.profile import ProfileError
    from harness.trace.sources.nsys import find_nsys

    try:
        nsys = find_nsys(args.nsys_bin)
        if not is_nsys(nsys):
            raise ProfileError(f"--nsys-bin {nsys}: `{nsys} --version` does not name NVIDIA Nsight Systems, so it "
                               "would not profile; name the nsys binary")
    except ProfileError as exc:
        if args.nsys or args.nsys_bin:
            raise UsageError(str(exc)) from exc
        return "framework"
    return "nsys"


def is_nsys(binary: str) -> bool:
    """Whether `binary --version` says it is Nsight Systems (a file named nsys may be anything)."""
    try:
        done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return False
    return "Nsight Systems" in done.stdout + done.stderr


def render(folder: str) -> int:
    """--render: the folder's report again from its summary.json; 2 with one line for a bad folder."""
    from harness.runs.upgrade import RenderError, rerender

    try:
        written = rerender(folder)
    except RenderError as exc:
        return fail(str(exc))
    print(f"wrote {', '.join(written)}")
    return 0


def comparison_from_args(args: argparse.Namespace, chosen: Sequence[str], profiled: str | None) -> Comparison:
    """The comparison the parsed options describe, on the backends `chosen`, under `profiled`."""
    shared = {f.name: getattr(args, f.name) for f in dataclasses.fields(RunSpec)
              if hasattr(args, f.name) and f.name not in ("backend", "fail_in")}
    shared["fsdp_reshard_after_forward"] = args.fsdp_reshard_after_forward == "true"
    return Comparison(run=RunSpec(backend=chosen[0], **shared), backends=tuple(chosen), out=args.out,
                      profiler=profiled, nsys_bin=args.nsys_bin, compile_cache=args.compile_cache,
                      overwrite=args.overwrite, no_parity=args.no_parity, keep_profiles=args.keep_profiles,
                      fail_in=args.fail_in, timeline=args.timeline, timeline_steps=args.timeline_steps)


def default_backends(args: argparse.Namespace) -> list[str]:
    """The registry's default backends less those that cannot honour the options given, each named on
    stderr (a documented command such as --annotate-attention must not fail on a default)."""
    chosen = []
    for backend in backends.defaults():
        if args.annotate_attention and (problem := annotate_attention_problem(backend)):
            print(f"compare: skipping {backend}: {problem}", file=sys.stderr)
        elif args.layer_ranges and (problem := layer_ranges_problem(backend)):
            print(f"compare: skipping {backend}: {problem}", file=sys.stderr)
        else:
            chosen.append(backend)
    return chosen


def check_paths(args: argparse.Namespace) -> None:
    """Every folder compare writes, checked before any backend starts."""
    for option, folder in (("--out", args.out), ("--keep-profiles", args.keep_profiles),
                           ("--compile-cache", args.compile_cache)):
        if folder and (problem := dir_problem(folder, option)):
            raise UsageError(problem)


def check(args: argparse.Namespace) -> Comparison:
    """Every option against the others and against this machine, before anything runs; a
    UsageError names the option and the fix. Resolves --device, --backend and the profiler
    into the comparison to run."""
    if args.ctx is None:
        raise UsageError("--ctx is required (or --render FOLDER to re-render a result folder)")
    if problem := timeline_problem(args):
        raise UsageError(problem)
    if args.timeline and not (args.nsys or args.profile):
        raise UsageError("--timeline: lays out the profiles of --nsys or --profile; add one of them")
    if problem := timeline_steps_problem(args.timeline_steps, args.steps, f"--steps {args.steps} measures"):
        raise UsageError(problem)
    select_platform(args)
    if args.annotate_attention:
        for backend in args.backend or (backends.reference(),):  # --data-parallel refuses it for every backend
            if problem := annotate_attention_problem(backend, args.data_parallel, args.attention):
                raise UsageError(problem)
    if args.layer_ranges:  # a backend asked for by name is refused; a default one is left out (default_backends)
        for backend in args.backend or ():
            if problem := layer_ranges_problem(backend):
                raise UsageError(problem)
    args.backend = backends.choose_backends(args.backend, default_backends(args), args.device, "compare")
    if not args.backend:
        raise UsageError("no backend can run here with these options; name one with --backend")
    if problem := backends.attention_problem_of(args.backend, args.attention):
        raise UsageError(problem)
    if problem := fit_problem(args.model, args.ctx, args.batch, args.dtype, args.attention, args.mode, args.device,
                              args.data_parallel, backend_names=args.backend):
        raise UsageError(problem)
    if args.data_parallel > 1:
        from harness.backends.parallel import parallel_problem
        from harness.runs.distributed import check_devices

        for backend in args.backend:
            check_devices(backend, args.device, args.data_parallel)
            # a backend without the DDP/FSDP2 options runs without them (RunSpec.on)
            if backends.get(backend).wrap_options and (problem := parallel_problem(
                    backend, args.parallel, args.ddp_bucket_mb, args.ddp_static_graph, args.grad_comm,
                    args.fsdp_reshard_after_forward)):
                raise UsageError(problem)
    check_paths(args)
    comparison = comparison_from_args(args, args.backend, profiler(args))
    device = expected_device(args.device)
    existing = os.path.join(args.out, result_dir_name(comparison, device)) if device else None
    if existing and os.path.exists(existing) and not args.overwrite:
        raise UsageError(f"--out {args.out}: {existing} already holds a comparison; pass --overwrite to replace "
                         "it, or another --out to keep both")
    return comparison


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parse_args(parser, argv)
    try:
        if args.render:
            refuse_with(f"--render {args.render}", given_options(parser, args, keep=("render",)))
            return render(args.render)
        comparison = check(args)
    except UsageError as exc:
        return fail(str(exc))
    except KeyboardInterrupt:
        return fail("interrupted before any backend started; nothing was written", 130)
    try:
        with result_lock(comparison):
            summary, path = compare(comparison)
    except UsageError as exc:
        return fail(str(exc))
    except Interrupted as exc:
        return fail(str(exc), 130)
    except NotRendered as exc:
        return fail(str(exc), 5)
    return report(summary, path)


@contextlib.contextmanager
def result_lock(comparison: Comparison) -> Iterator[None]:
    """Hold --out's lock of the comparison's result folder while it runs, so that a second
    compare of the same folder name is refused before it starts (UsageError) instead of
    replacing, or racing, the first one's result."""
    name = result_dir_name(comparison, expected_device(comparison.run.device))
    try:
        ensure_dir(comparison.out)
        with held_lock(os.path.join(comparison.out, f".{name}.lock")):
            yield
    except LockHeld as exc:
        who = f"process {exc.holder}" if exc.holder else "another process"
        raise UsageError(f"--out {comparison.out}: another compare ({who}) is writing {name} there now; wait for it "
                         "to finish, or pass another --out to run both") from None


def report(summary: dict, path: str) -> int:
    """The terminal's answer and table, and the exit code of a finished comparison."""
    from harness.reports.compare_answer import compare_findings

    print("the answer:", *(f"- {f.text}" for f in compare_findings(summary)), "", sep="\n")
    print(format_table(summary))
    if summary.get("overlap"):
        from harness.trace.analyses.overlap import format_overlap

        for backend, analysis in summary["overlap"].items():
            print(f"{backend}: communication hidden under compute, per rank and device\n{format_overlap(analysis)}",
                  end="")
    print(f"wrote {path}")
    if not all(r.ok for r in runs_of(summary).values()):
        return 3
    if summary["parity"] is not None and not summary["parity"].get("ok"):
        return 1
    if summary.get("kernel_breakdown_error"):
        return fail(f"kernel breakdown failed: {summary['kernel_breakdown_error']}", 4)
    return 0


if __name__ == "__main__":
    sys.exit(main())
