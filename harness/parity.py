"""Parity of the backends against eager torch: same weights, same batch, same numbers?

    python -m harness.parity --model tiny --device cpu [--backend jax,torch-compile] [--out parity.json]

Compares each backend's logits, loss, every gradient, and every parameter and parameter
update after --steps AdamW steps with eager torch's by relative error against the
tolerance tables of `harness.timing.parity`; exit status 1 when any tensor is over its
bound. By default every backend that can run here is compared: on a GPU all three, on a
CPU jax and torch-compile (torch-compile-cg replays CUDA graphs, so it is no CPU backend);
torch-compile on CPU needs a C++ compiler and, without one, is skipped with a line on stderr.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from harness import backends, stopped_by
from harness.cli.dialect import (
    add_model_args,
    add_out,
    add_overwrite,
    choice,
    comma_list,
    fail,
    make_parser,
    parse_args,
    positive_int,
    select_platform,
)
from harness.common.documents import Status
from harness.common.errors import UsageError, describe_failure, is_oom
from harness.common.results import new_file_problem, save_json
from harness.config import get_config
from harness.memory_model import fit_problem
from harness.timing.parity import check_parity, format_table


def default_backends(device: str) -> tuple[str, ...]:
    """The backends compared when --backend is not given: those made for `device` (a
    GPU-only one, such as the CUDA-graph one, on a GPU only)."""
    return tuple(b for b in backends.compared() if device in backends.get(b).devices)


def build_parser() -> argparse.ArgumentParser:
    p = make_parser("harness.parity", __doc__)
    add_model_args(p, ctx_default=64, batch_default=2)
    p.add_argument("--steps", type=positive_int, default=5, help="AdamW steps before comparing parameters")
    compared = backends.compared()
    p.add_argument("--backend", type=comma_list(choice("backend", compared)), default=None,
                   help=f"comma-separated backends compared with eager torch: {', '.join(compared)} "
                        "(None: every one that can run here; a GPU-only one such as torch-compile-cg on a GPU only)")
    add_out(p, "also write the result as JSON here", metavar="PATH.json")
    add_overwrite(p, "--out file")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(build_parser(), argv)
    try:
        if args.out and (problem := new_file_problem(args.out, "--out", args.overwrite)):
            raise UsageError(problem)
        select_platform(args)
        args.backend = backends.choose_backends(args.backend, default_backends(args.device), args.device, "parity")
        if problem := fit_problem(args.model, args.ctx, args.batch, args.dtype, args.attention, "train", args.device):
            raise UsageError(problem)
    except UsageError as exc:
        return fail(str(exc))
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # torch shares the GPU here
    config = get_config(args.model, attention=args.attention)
    try:
        result = check_parity(config, batch=args.batch, ctx=args.ctx, device=args.device, dtype=args.dtype,
                              seed=args.seed, steps=args.steps, backends=tuple(args.backend))
    except KeyboardInterrupt as exc:
        return fail(f"interrupted by {stopped_by(exc)} before parity was checked; nothing was written", 130)
    except Exception as exc:  # an OOM or a backend failure is reported, not a traceback
        message = describe_failure(exc, "parity", args)
        status = (Status.OOM if is_oom(exc) else Status.ERROR).value
        if args.out and (kept_elsewhere := save_json(args.out, {"ok": None, "status": status,
                                                                "error": message, "batch": args.batch}, "--out")):
            print(f"error: {kept_elsewhere}", file=sys.stderr)
        return fail(message)
    print(format_table(result))
    if args.out and (kept_elsewhere := save_json(args.out, result.to_json(), "--out")):
        return fail(kept_elsewhere)
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
