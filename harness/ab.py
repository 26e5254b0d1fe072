"""Time a change against a commit, or a setting against none: `harness.run` of one cell from both
sides, interleaved on one machine, then `harness.diff` of the two sides.

    python -m harness.ab --base main --runs 3 --out ab/my-change -- --backend jax --model large \\
        --ctx 1024 --batch 32 --dtype bf16 --attention fused --device cuda
    python -m harness.ab --env-b XLA_FLAGS=--xla_gpu_enable_command_buffer= --out ab/no-graphs -- ...

A is the tree of --base (its shipped packages and pyproject.toml, unpacked from git once into
.ab-trees/<commit> at the repository's root), B the working tree as it is now, uncommitted
changes included; without --base both sides run the working tree. --env-a and --env-b set
environment variables for one side's runs only (an empty value removes one), among those the run
documents record (compiler flags, allocator and NCCL settings), so that the diff names them
among what differs. The runs go A B B A A B ..., so that what drifts over a session (the GPU's
clock under its power cap, the host's load) falls on both sides alike, and each writes
DIR/runs/{a,b}-N.json with its log in DIR/logs/. A run whose document is already there is kept:
a command stopped by a signal or a machine's time limit goes on where it stopped when given
again; a kept document that ran other options, another tree or other settings than this A/B
would ends it before any run. Once every run is done, DIR holds `harness.diff`'s diff.md and
diff.json of the two sides (judged by the spread between runs from three a side;
`docs/diff.md`), rendered again by `harness.regenerate` from the documents beside them.
Everything after `--` goes to `harness.run` as it is, checked before any run starts.
"""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Sequence
from pathlib import Path

from harness import started, stopped_by
from harness.cli.dialect import add_out, fail, make_parser, parse_args, positive_int
from harness.runs.ab import (
    finished_count,
    kept_problem,
    order,
    parse_setting,
    resolve_base,
    run_sides,
    unpack_tree,
)


def build_parser():
    p = make_parser("harness.ab", __doc__)
    p.add_argument("--base", default=None, metavar="REF",
                   help="A: a commit, branch or tag of this repository, run from its own tree (B: the working tree); "
                        "None: both sides run the working tree, told apart by --env-a/--env-b")
    for side in "ab":
        p.add_argument(f"--env-{side}", action="append", default=[], metavar="NAME=VALUE",
                       help=f"an environment variable for {side.upper()}'s runs only (repeatable; NAME= removes it "
                            "there): XLA_*, JAX_*, TORCHINDUCTOR_*, NCCL_* and the other settings a run records")
    p.add_argument("--runs", type=positive_int, default=3, metavar="N",
                   help="harness.run calls a side, interleaved A B B A ...; three or more let the diff judge the "
                        "gap against the spread between runs")
    p.add_argument("--timeout", type=positive_int, default=None, metavar="S",
                   help="seconds one run may take before it is stopped and the A/B with it")
    p.add_argument("--unpack-only", action="store_true",
                   help="unpack --base's tree into .ab-trees/ and stop: a copy of the working tree carried with "
                        "it to a machine without the repository's history runs --base <that full commit> there")
    add_out(p, "folder for runs/, logs/, diff.md and diff.json", default="ab", metavar="DIR")
    p.usage = (f"{p.prog} [--base REF] [--env-a NAME=VALUE] [--env-b NAME=VALUE] [--runs N] [--timeout S] "
               f"[--out DIR] -- RUN_ARGS (harness.run's, all but --out)\n       {p.prog} --base REF --unpack-only")
    return p


def split_argv(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """harness.ab's own options, and harness.run's after `--`."""
    argv = list(argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    return argv[:cut], argv[cut + 1:]


def check_run_args(run_args: Sequence[str]) -> None:
    """harness.run's own parser on the cell's options, before any run: a bad one ends here with
    harness.run's one-line message; --out is harness.ab's to set (ValueError)."""
    from harness.run import build_parser as run_parser

    if any(a == "--out" or a.startswith("--out=") for a in run_args):
        raise ValueError("RUN_ARGS: --out is set by harness.ab (DIR/runs/{a,b}-N.json); leave it out")
    parse_args(run_parser(), list(run_args))


def diff_sides(out: Path, runs: int) -> int:
    """`harness.diff` of the sides inside `out`, with paths relative to it (as `harness.regenerate`
    renders it again), and its answer on the terminal."""
    from harness.diff import main as diff_main

    sides = [",".join(f"runs/{side}-{i}.json" for i in range(1, runs + 1)) for side in "ab"]
    with contextlib.chdir(out), contextlib.redirect_stdout(io.StringIO()):
        code = diff_main([*sides, "--out", "."])
    if code == 0:
        answer = (out / "diff.md").read_text().split("## The answer", 1)[-1].split("\nRules:", 1)[0]
        print("the answer:" + answer.rstrip() + f"\n\nwrote {out / 'diff.md'}")
    return code


def main(argv: Sequence[str] | None = None) -> int:
    own, run_args = split_argv(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    started()  # from here on Ctrl-C and the stop signals reach the runs' loop
    args, unknown = parser.parse_known_args(own)
    if unknown:
        return fail(f"unrecognized arguments: {' '.join(unknown)}; harness.run's options go after -- "
                    f"(see {parser.prog} --help)")
    try:
        settings = {side: dict(parse_setting(f"--env-{side}", text) for text in getattr(args, f"env_{side}"))
                    for side in "ab"}
        if args.base is None:
            if args.unpack_only:
                raise ValueError("--unpack-only unpacks --base's tree: give --base REF")
            if settings["a"] == settings["b"]:
                raise ValueError("the two sides would run the same: give --base REF (A runs that commit's tree) "
                                 "or settings that differ (--env-a/--env-b NAME=VALUE)")
        commit = None if args.base is None else resolve_base(args.base)
        if args.unpack_only:
            print(f"{unpack_tree(commit)}: the tree of {commit}; elsewhere, --base {commit}")
            return 0
        check_run_args(run_args)
        if problem := kept_problem(commit, run_args, Path(args.out), args.runs, settings):
            raise ValueError(problem)
    except ValueError as exc:
        return fail(str(exc))
    out = Path(args.out)
    progress = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    try:
        base = None if commit is None else (commit, unpack_tree(commit))
        problem = run_sides(base, run_args, out, args.runs, args.timeout, progress, settings)
    except KeyboardInterrupt as exc:
        return fail(f"stopped by {stopped_by(exc)}: {finished_count(out, args.runs)} of {len(order(args.runs))} runs "
                    f"done in {out / 'runs'}; give the same command again to go on", 130)
    if problem:
        return fail(f"{problem}; the finished runs stay in {out / 'runs'}", 3)
    return diff_sides(out, args.runs)


if __name__ == "__main__":
    sys.exit(main())
